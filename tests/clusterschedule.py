"""pytest-xdist scheduling for a machine with a simulated cluster per worker slot (tests/conftest.py).

Work units: slot 0's tests by module (its cluster tests, and the pure tests of their modules,
which compare slot 0's names exactly; module fixtures stay in one process), the either-cluster
tests by module (those of the split modules one by one), the alone-cluster tests by module,
every other test alone.
A worker asks for work when it has at most two tests left; it gets, in order of preference:
  gw0: an alone unit, a slot-0 unit, an either-cluster unit, a pure test;
  gwN (N < slots): an alone unit, an either-cluster unit, a pure test;
  past the last slot: pure tests only;
  holding an alone unit: a pure test first.
Of the pure tests, those marked `waits` come first (they wait on deadlines and stand-in hosts that
never answer: taken last, they held a CI run's last minute with its cores idle).
An alone unit (16 or 32 simulated hosts: their torch imports take every core for minutes) goes
only to a worker while no other worker has cluster tests left, and while it runs the other workers
get pure tests only: a timed cluster test beside it would starve (a CI run lost two that way).
Asked first, it runs at the start, beside the pure tests. So the clusters otherwise run at the same
time, the workers past the last slot (tests/run starts four, three slots) run pure tests beside them from the start (cluster
tests mostly wait on timeouts and sleeping steps), and the pure tests, CPU-bound
and short, fill every worker at the end. A worker that waits
for an alone unit to end is woken when any test completes; one that can take none of what is left,
ever, stops once its own tests are done.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xdist.scheduler import LoadScopeScheduling

from tests.testbed.layout import slot_of_worker

SLOT0, EITHER, ALONE = "cluster-slot0::", "cluster-either::", "cluster-alone::"
CLUSTER = (SLOT0, EITHER, ALONE)
PURE, WAITS = "", "waits::"  # every pure test's scope matches PURE; a waiting one's WAITS too
# The listing's kinds (tests/conftest.py writes it): slot 0, either cluster, alone, a pure test that waits.
PREFIX_OF_KIND = {"0": SLOT0, "*": EITHER, "!": ALONE, "~": WAITS}


class ClusterScheduling(LoadScopeScheduling):
    def __init__(self, config: Any, log: Any, listing: Path, split_modules: frozenset[str], slots: int) -> None:
        super().__init__(config, log)
        self.listing = listing
        self.split_modules = split_modules
        self.slots = slots
        self.kinds: dict[str, str] | None = None  # nodeid -> a key of PREFIX_OF_KIND, cluster tests only

    def _split_scope(self, nodeid: str) -> str:
        if self.kinds is None:  # read once: the workers have collected when scheduling starts
            lines = self.listing.read_text().splitlines()
            self.kinds = {line[2:]: line[0] for line in lines}
        prefix = PREFIX_OF_KIND.get(self.kinds.get(nodeid, ""))
        if prefix is None:
            return nodeid
        module = nodeid.split("::", 1)[0]
        return prefix + (nodeid if prefix == WAITS or (prefix == EITHER and module in self.split_modules) else module)

    def _cluster_work(self, node: Any, elsewhere: bool) -> set[str]:
        """The prefixes of the cluster units other workers (or this one) have not finished."""
        return {prefix for other, units in self.assigned_work.items() if (other is not node) == elsewhere
                for scope, unit in units.items() if not all(unit.values())
                for prefix in CLUSTER if scope.startswith(prefix)}

    def _wanted(self, node: Any, busy: set[str], own: set[str] = frozenset()) -> list[str]:
        """The prefixes this worker may take, in order, while other workers hold `busy` and it holds
        `own`. Holding an alone unit, it asks for a pure test first: the worker needs a next test
        to run its last one, and a cluster unit queued there would wait for the alone unit's end."""
        slot = slot_of_worker(str(node.gateway.id), self.slots)
        if slot is None or ALONE in busy:
            return [WAITS, PURE]
        cluster = ([] if busy else [ALONE]) + ([SLOT0] if slot == 0 else []) + [EITHER]
        return [WAITS, PURE] + cluster if ALONE in own else cluster + [WAITS, PURE]

    def _next_scope(self, node: Any) -> str | None:
        return self._first_in_queue(self._wanted(node, self._cluster_work(node, elsewhere=True),
                                                 self._cluster_work(node, elsewhere=False)))

    def _first_in_queue(self, wanted: list[str]) -> str | None:
        for prefix in wanted:
            for scope in self.workqueue:
                if scope.startswith(prefix) and (prefix or not scope.startswith(CLUSTER)):
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
            if pending == 0 and self._first_in_queue(self._wanted(node, set())) is None:
                node.shutdown()  # nothing left it could ever take
            return
        if pending <= 2:
            self._assign_work_unit(node)

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        super().mark_test_complete(node, item_index, duration)
        for other in self.nodes:  # a worker may be waiting for this one's alone or cluster unit
            if other is not node:
                self._reschedule(other)
