"""What the join and leave tests share: a project whose inventory `inv.yaml` names hosts at
10.0.0.1, 10.0.0.2, ... in order (none is contacted: the tests stand in for the hosts' answers)."""

from __future__ import annotations

from pathlib import Path

from meshrun.deploy.project import Project


def member_project(root: Path, *names: str) -> Project:
    lines = "".join(f"  {name}: {{address: 10.0.0.{i}}}\n" for i, name in enumerate(names, 1))
    (root / "inv.yaml").write_text("hosts:\n" + lines)
    return Project(root, root / "runs")
