"""The only code that both halves import — the controller (`deploy/`, its host agent included) and
the trainer (`train/`): the run layout contract and crash-safe file helpers. Standard library only."""
