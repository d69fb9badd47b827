"""`fab join` and `fab leave`: grow or shrink a running elastic run."""

from __future__ import annotations

from fabric import task

from deploy.cli import guarded
from deploy.errors import InputError
from deploy.render import Renderer
from deploy.tasks import DEBUG_HELP, ROOT


def _act(action: str, run: str, hosts: str) -> None:
    from deploy.commands.membership import join_or_leave
    from deploy.runs import load_record

    if not run or not hosts:
        raise InputError(f"fab {action} needs --run ID and --hosts NAME[,NAME...]")
    renderer = Renderer()
    for message in join_or_leave(ROOT, load_record(ROOT, run), action, hosts.split(","), renderer):
        renderer.info(message)


@task(help={"run": "the elastic run's id", "hosts": "hosts to add", "debug": DEBUG_HELP})
@guarded
def join(c, run="", hosts="", debug=False):
    """Add hosts to a running elastic run: same rendezvous, the world grows."""
    _act("join", run, hosts)


@task(help={"run": "the elastic run's id", "hosts": "hosts to remove", "debug": DEBUG_HELP})
@guarded
def leave(c, run="", hosts="", debug=False):
    """Remove hosts from a running elastic run gracefully; it goes on while its minimum holds."""
    _act("leave", run, hosts)
