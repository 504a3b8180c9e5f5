"""Reading and tokenizing training data: files and remote sources (load), streams (stream), fast
encoding and grouping (tokens), and the prepared-data cache (prepared).

May import config, storage and the bottom layer (errors, console, metrics, distributed)."""
