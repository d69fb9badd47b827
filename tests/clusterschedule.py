"""pytest-xdist scheduling for a machine with a simulated cluster per worker slot (tests/conftest.py).

Work units: slot 0's tests by module (its cluster tests, and the pure tests of their modules,
which compare slot 0's names exactly; module fixtures stay in one process), the either-cluster
tests by module (those of the split modules one by one), every other test alone.
A worker asks for work when it has at most two tests left; it gets, in order of preference:
  gw0: a slot-0 unit, an either-cluster unit, a pure test;
  gwN (N < slots): an either-cluster unit, a pure test;
  past the last slot: pure tests only.
So the two clusters run at the same time and the pure tests, CPU-bound and short, fill both
workers at the end. A worker that can take none of what is left stops once its own tests are done.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xdist.scheduler import LoadScopeScheduling

from tests.testbed.layout import slot_of_worker

SLOT0, EITHER = "cluster-slot0::", "cluster-either::"


class ClusterScheduling(LoadScopeScheduling):
    def __init__(self, config: Any, log: Any, listing: Path, split_modules: frozenset[str], slots: int) -> None:
        super().__init__(config, log)
        self.listing = listing
        self.split_modules = split_modules
        self.slots = slots
        self.kinds: dict[str, str] | None = None  # nodeid -> "0" or "*", cluster tests only

    def _split_scope(self, nodeid: str) -> str:
        if self.kinds is None:  # read once: the workers have collected when scheduling starts
            lines = self.listing.read_text().splitlines()
            self.kinds = {line[2:]: line[0] for line in lines}
        kind = self.kinds.get(nodeid)
        module = nodeid.split("::", 1)[0]
        if kind == "0":
            return SLOT0 + module
        if kind == "*":
            return EITHER + (nodeid if module in self.split_modules else module)
        return nodeid

    def _next_scope(self, node: Any) -> str | None:
        slot = slot_of_worker(str(node.gateway.id))
        wanted = ([SLOT0] if slot == 0 else []) + ([EITHER] if slot is not None else []) + [""]
        for prefix in wanted:
            for scope in self.workqueue:
                if scope.startswith(prefix) and (prefix or not scope.startswith((SLOT0, EITHER))):
                    return scope
        return None

    def _assign_work_unit(self, node: Any) -> None:
        scope = self._next_scope(node)
        if scope is None:
            return
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down:
            return
        pending = self._pending_of(self.assigned_work.get(node, {}))
        if self._next_scope(node) is None:
            if pending == 0:
                node.shutdown()
            return
        if pending <= 2:
            self._assign_work_unit(node)
