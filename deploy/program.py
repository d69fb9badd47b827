"""`meshrun TASK [--flags] [-- ARGS]`: the fab tasks for projects without a fabfile, from any
directory. The same tasks, flags and help as `fab`, on Fabric's own Program class (invoke's
Program with Fabric's core options, which Fabric's executor reads): `meshrun --list`,
`meshrun train --help`, `meshrun --version`."""

from __future__ import annotations

from fabric.config import Config
from fabric.main import Fab
from invoke import Collection

from meshrun import __version__
from meshrun.deploy import tasks
from meshrun.deploy.fabexec import MeshrunExecutor, guard_parsing

program = Fab(name="meshrun", binary="meshrun", version=__version__,
              namespace=Collection.from_module(tasks), executor_class=MeshrunExecutor, config_class=Config)
guard_parsing(program)  # a flag invoke cannot parse, or Fabric's own before a task: exit 2


def main() -> None:
    program.run()
