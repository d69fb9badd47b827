"""meshrun's fab tasks (`fab -l`). Thin: each lives in deploy/tasks/<name>.py."""

from deploy.tasks.fetch import fetch_checkpoints  # noqa: F401
from deploy.tasks.membership import join, leave  # noqa: F401
from deploy.tasks.report import report  # noqa: F401
from deploy.tasks.runs import logs, status, stop  # noqa: F401
from deploy.tasks.check import check_network  # noqa: F401
from deploy.tasks.setup import setup  # noqa: F401
from deploy.tasks.sync import sync  # noqa: F401
from deploy.tasks.train import train  # noqa: F401
from deploy.tasks.trust import trust  # noqa: F401
