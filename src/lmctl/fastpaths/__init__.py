"""lmctl's fast training paths: the table that decides where each runs (table), the one
installer handed that decision (install), and the paths: the training losses (losses),
skip-padding (padding), sparse-embedding (embedding), fast-dropout (dropout), fused-gelu
(activations) and the allocator (allocator); fused-adamw is the engines' choice of optimizer.

Each computes what the model's and PyTorch's own code computes, in less time where it was
measured (README.md, "Performance", says how each is decided). A path changes the model it is
installed on, but for two process-wide settings that last until the process exits: the
allocator's glibc thresholds, and the name fast-dropout registers its attention function under
with transformers (used only by the models set to it).

May import config and the bottom layer; models, objectives and the pipeline import it.
"""
