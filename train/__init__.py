"""meshrun's DDP trainer: run it as ``python -m meshrun.train`` (alone or under torchrun)."""
