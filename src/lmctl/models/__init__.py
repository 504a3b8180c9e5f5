"""Building or loading the model and tokenizer (build), custom architectures from modules or
entry points (plugins), and LoRA adapters (adapters).

May import config, storage and the bottom layer; never the objectives (they hand themselves in)."""
