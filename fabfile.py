"""meshrun's fab tasks (`fab -l`). Thin: their flags live in deploy/tasks.py, their behaviour in
deploy/commands/<task>.py."""

from deploy.tasks import (check_network, fetch_checkpoints, firewall, join, leave, logs, report, setup,  # noqa: F401
                          status, stop, sync, train, trust)
