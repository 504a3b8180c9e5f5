"""Run directories on object storage: written into a local copy and uploaded as they go
(:mod:`~lmctl.mirror.upload`), read back to resume or list them (:mod:`~lmctl.mirror.fetch`)."""
