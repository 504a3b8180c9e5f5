"""The run directory and its life: where it lives and its config (rundir), what it records
(history), its checkpoints (checkpoints) and model card (card), continuing a run (resume,
restarts), the launcher of --nproc (launch) and stop signals (signals).

May import objectives, data, models, config, storage and the bottom layer."""
