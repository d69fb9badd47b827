"""Fabric executor for meshrun (selected by `fabric.yaml`: tasks.executor_class).

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
