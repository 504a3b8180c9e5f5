"""The run directory and its life: files and checkpoints (rundir), continuing a run (resume),
and stop signals (signals).

May import objectives, data, models, config, storage and the bottom layer."""
