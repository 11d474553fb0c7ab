"""Engine and data contracts every layer above shares: the student, adapter kinds, losses, the
adapter GGUF, shards and their stream, checkpoints, the corpus files and their sources."""
