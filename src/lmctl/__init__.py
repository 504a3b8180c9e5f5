"""lmctl: train, fine-tune, evaluate, resume and publish transformer language models."""

__version__ = "0.1.0"
