"""meshrun's DDP trainer: run it as ``python -m train`` (alone or under torchrun)."""
