"""Fabric executor for meshrun: `meshrun` is built with it, and `fab` adopts it when it loads the tasks.

Stock Fabric turns anything after `--` into an anonymous shell command to run on `-H` hosts
and refuses when there are none. meshrun's `fab train --script FILE -- ARGS` passes those
arguments to the user's script instead, so they are taken out of Fabric's hands here and
read back, unsplit and unjoined, by `deploy.cli.remainder()`.
"""

from __future__ import annotations

import re
from typing import Any

from fabric.executor import Executor
from invoke.exceptions import Exit, ParseError

# invoke's words for a flag given without its value: "Flag <Argument: lines (l)> needed value and was not given one!"
_NEEDED_VALUE = re.compile(r"Flag <Argument: ([A-Za-z0-9_]+)[^>]*> needed value")


class MeshrunExecutor(Executor):
    def expand_calls(self, calls, apply_hosts=True):  # type: ignore[no-untyped-def]
        saved, self.core.remainder = self.core.remainder, ""
        try:
            return super().expand_calls(calls, apply_hosts)
        finally:
            self.core.remainder = saved


def bad_flags_exit_2(program: Any) -> None:
    """A task flag invoke cannot parse (unknown, or given without its value) is bad input: one line and
    exit status 2, as every other bad input (invoke prints it and exits 1)."""
    parse_tasks = program.parse_tasks

    def parse_tasks_or_exit_2() -> None:
        try:
            parse_tasks()
        except ParseError as err:
            needed = _NEEDED_VALUE.match(str(err))
            text = f"--{needed.group(1).replace('_', '-')} needs a value" if needed else str(err).rstrip("!")
            raise Exit(f"error: {text}; see --help", code=2) from None

    program.parse_tasks = parse_tasks_or_exit_2


def adopt_running_fab() -> None:
    """Make the running `fab` use MeshrunExecutor, so a project's fabfile needs only its one
    import line and no fabric.yaml. The `fab` command is `fabric.main.program.run()`; it imports
    the fabfile (and so this module) before it creates its executor, from `executor_class`
    (a `tasks.executor_class` in a project's own Fabric config still wins, as Fabric documents)."""
    import sys

    program = getattr(sys.modules.get("fabric.main"), "program", None)
    if program is not None and getattr(program, "executor_class", None) is Executor:
        program.executor_class = MeshrunExecutor
        bad_flags_exit_2(program)
