"""What the join and leave tests share: a project whose inventory `inv.yaml` names hosts at
10.0.0.1, 10.0.0.2, ... in order, and the SSH side of a detached join stood in (no host is
contacted: what is under test is what membership decides and records from the hosts' answers)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest

from meshrun.deploy.commands import membership
from meshrun.deploy.edges import agents
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.edges.transport import CommandResult
from meshrun.deploy.project import Project
from meshrun.deploy.run.hoststate import HostState


def member_project(root: Path, *names: str) -> Project:
    lines = "".join(f"  {name}: {{address: 10.0.0.{i}}}\n" for i, name in enumerate(names, 1))
    (root / "inv.yaml").write_text("hosts:\n" + lines)
    return Project(root, root / "runs")


class StoodIn:
    """A detached join's SSH side: `answer(record)` is what host_states says of the run's hosts; each
    host asked, prepared and started is recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, answer: Callable[[RunRecord], list[HostState]]) -> None:
        self.asked: list[tuple[str, ...]] = []
        self.prepared: list[str] = []
        self.started: list[str] = []

        def host_states(record: RunRecord, root: Path) -> list[HostState]:
            self.asked.append(record.hosts)
            return answer(record)

        def prepare(record, inventory, name, project, renderer, detach):  # type: ignore[no-untyped-def]
            self.prepared.append(name)
            return SimpleNamespace(name=name), SimpleNamespace(close=lambda: None)

        def start(session, launch) -> CommandResult:  # type: ignore[no-untyped-def]
            self.started.append(launch.name)
            return CommandResult(0, "{}", "")

        monkeypatch.setattr(agents, "host_states", host_states)
        monkeypatch.setattr(membership, "prepare_joiner", prepare)
        monkeypatch.setattr(membership, "at_generation", lambda launch, generation: launch)
        monkeypatch.setattr(membership, "run_detached_agent", start)
