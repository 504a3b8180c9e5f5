"""Building or loading the model and tokenizer (build) and custom architectures from modules or
entry points (plugins).

May import config, storage and the bottom layer; never the objectives (they hand themselves in)."""
