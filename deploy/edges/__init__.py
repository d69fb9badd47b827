"""The controller's effectful edges: SSH sessions (Fabric/paramiko), parallel fan-out, host keys, the launcher, the check's probes, rsync of code, data and checkpoints, and the local run records."""
