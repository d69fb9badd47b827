"""Notifications, pure: which receivers (`--notify URL`, the inventory's `notify:`), and the event a
membership change makes. The bodies are `common/events.py` (`meshrun.events`) (a detached run's agents build the
same); delivery is `deploy/host/notify.Sender`. A receiver URL is a secret: nothing here puts it in
a message; a bad one is named by its position.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.fields import url_problem
from meshrun import events
from meshrun.deploy.run.membership import Change, MembershipEvent

MAX_RECEIVERS = 8


def receivers(flag_urls: Iterable[str], inventory_urls: Iterable[str] = ()) -> tuple[str, ...]:
    """The receivers of a run, each once, in the order given (flags first); a bad one is one line that
    names it by position (`--notify #2`), never by its text."""
    found: list[str] = []
    for where, urls in (("--notify", list(flag_urls)), ("inventory notify:", list(inventory_urls))):
        for number, url in enumerate(urls, 1):
            problem = url_problem(url)
            if problem:
                raise InputError(f"{where} #{number}: {problem}; give an http:// or https:// URL "
                                 "(it is not shown here: it may hold a token)")
            if url not in found:
                found.append(url)
    if len(found) > MAX_RECEIVERS:
        raise InputError(f"--notify: {len(found)} receivers; at most {MAX_RECEIVERS}")
    return tuple(found)


started, ended = events.started, events.ended


def membership(run_id: str, change: MembershipEvent) -> dict[str, Any] | None:
    """The event a membership change makes, or None (a host's own start and finish are not news:
    the run's `started` and `finished` are)."""
    kind = {Change.LOST: "host_lost", Change.LEFT: "host_left", Change.SUCCESSION: "rendezvous_moved",
            Change.JOINED: "host_back" if "came back" in (change.detail or "") else "host_joined"}.get(change.event)
    if kind is None:
        return None
    return events.host_event(kind, run_id, change.time, change.host, change.world_size, change.detail)


def agent_block(env: Mapping[str, str], urls: tuple[str, ...], head: str, hosts: list[str],
                every_checkpoint: bool = False) -> bytes | None:
    """A detached agent's first stdin line with the run's receivers added under `events.NOTIFY_KEY` (the
    agent takes them out before the env reaches any process; `deploy/host/notify.AgentNotices`); None
    without receivers (the plain env block then goes)."""
    if not urls:
        return None
    fields = {"urls": list(urls), "head": head, "hosts": hosts, **({"every_checkpoint": True} if every_checkpoint else {})}
    spec = json.dumps(fields, separators=(",", ":"))
    return json.dumps({**dict(env), events.NOTIFY_KEY: spec}, separators=(",", ":")).encode() + b"\n"
