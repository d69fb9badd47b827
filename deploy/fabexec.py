"""Fabric executor for meshrun: `meshrun` is built with it, and `fab` adopts it when it loads the tasks.

Stock Fabric turns anything after `--` into an anonymous shell command to run on `-H` hosts
and refuses when there are none. meshrun's `fab train --script FILE -- ARGS` passes those
arguments to the user's script instead, so they are taken out of Fabric's hands here and
read back, unsplit and unjoined, by `deploy.cli.remainder()`.
"""

from __future__ import annotations

from fabric.executor import Executor


class MeshrunExecutor(Executor):
    def expand_calls(self, calls, apply_hosts=True):  # type: ignore[no-untyped-def]
        saved, self.core.remainder = self.core.remainder, ""
        try:
            return super().expand_calls(calls, apply_hosts)
        finally:
            self.core.remainder = saved


def adopt_running_fab() -> None:
    """Make the running `fab` use MeshrunExecutor, so a project's fabfile needs only its one
    import line and no fabric.yaml. The `fab` command is `fabric.main.program.run()`; it imports
    the fabfile (and so this module) before it creates its executor, from `executor_class`
    (a `tasks.executor_class` in a project's own Fabric config still wins, as Fabric documents)."""
    import sys

    program = getattr(sys.modules.get("fabric.main"), "program", None)
    if program is not None and getattr(program, "executor_class", None) is Executor:
        program.executor_class = MeshrunExecutor
