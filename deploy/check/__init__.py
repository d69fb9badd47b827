"""The check wing (controller, pure): host facts → PASS/WARN/FAIL verdicts, ZeroTier and WireGuard parsing, findings. Its effectful side is deploy/edges/check_probes.py."""
