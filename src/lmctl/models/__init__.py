"""The model config (config), tokenizer (tokenizer) and model (build, adapters) of a run, all
loaded by name through pretrained; custom architectures from modules or entry points
(plugins).

May import config, storage and the bottom layer; never the objectives (they hand themselves in)."""
