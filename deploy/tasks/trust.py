from __future__ import annotations

import sys

from fabric import task

from deploy.cli import guarded
from deploy.render import Renderer
from deploy.tasks import DEBUG_HELP, HOSTS_HELP, INVENTORY_HELP


def _ask(question: str) -> bool:
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


@task(help={
    "hosts": HOSTS_HELP, "inventory": INVENTORY_HELP, "yes": "trust new keys without asking (check the fingerprints!)",
    "timeout": "connect timeout per host in seconds", "debug": DEBUG_HELP,
})
@guarded
def trust(c, hosts="", inventory="", yes=False, timeout=10, debug=False):
    """Show each host's SSH key fingerprint and add new keys to the inventory's known_hosts (asks first)."""
    from deploy.commands.trust import TrustRequest, trust as run_trust

    request = TrustRequest(inventory or None, hosts or None, bool(yes), float(timeout))
    run_trust(request, Renderer(), sys.stdin.isatty(), _ask)
