"""A compromised member of a live run writes a pickle into torch's rendezvous store (issue 20):
every torchrun reads the state as data, nothing runs anywhere, and the run fails in one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fabrun import REPO, FabProcess, run_id_of
from tests.runrecords import ELASTIC_TRAIN, summary_of

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.either_cluster]



def test_a_member_planting_a_pickle_in_the_live_store_runs_nothing_anywhere(testbed, inventory: Path,
                                                                              tmp_path: Path) -> None:
    """Issue 20: h3 plays a compromised member. While the run trains, a process on h3 writes into h1's
    store (and h2's, where generation 1 would rendezvous) a pickle that would create a file, under
    the run's rendezvous key and the next generations' (tests/rdzv_attacker.py). Every torchrun reads
    the state as data (deploy/host/torchrun.py): nothing runs anywhere, and the run fails in one line
    naming the rendezvous host."""
    marks = tmp_path / "planted"
    marks.mkdir()
    stores = [f"{testbed.host(i).address}:29400" for i in (1, 2)]
    go = tmp_path / "go"
    # Started first, told when to write: its python and torch import run beside the run's own start.
    attacker = testbed.popen(3, [sys.executable, str(REPO / "tests" / "rdzv_attacker.py"), str(marks), "h3",
                                 "400", str(go), *stores], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    run = FabProcess("train", "--inventory", str(inventory), "--nnodes", "2:3", "--", *ELASTIC_TRAIN)
    try:
        run_id = run_id_of(run.wait_for(r"\[h1:0\] epoch 1 step", timeout=240))
        go.touch()  # the run trains: plant now
        code = run.finish(timeout=300)
        planted = json.loads(attacker.communicate(timeout=120)[0].splitlines()[-1])
    finally:
        run.close()
        if attacker.poll() is None:
            attacker.kill()
            attacker.wait()
    assert sorted(p.name for p in marks.iterdir()) == []  # on the old code: ran-h1-<pid>, ran-h2-..., ran-h3-...
    assert planted["rdzv_id"] == run_id and planted["landed"][stores[0]] >= 1, planted
    assert code == 1, run.output[-3000:]
    # A line names the store refused. The first member to refuse prints it after REFUSAL_LINGER_S and
    # ends, which may end the run before another prints its own: a CI run with three test workers had
    # no line from h1, which reads its own store. A member that found h1's store already gone moves on
    # to h2's and refuses what was planted there: either way the run fails, and nothing runs.
    named = "|".join(f"host 'h{i}' \\({re.escape(store)}\\)" for i, store in enumerate(stores, 1))
    refusal = re.compile(r"\[h[123]\] meshrun: the rendezvous store on (" + named + r") holds a rendezvous state "
                         r"that no torchrun of this run wrote \(not JSON\): refused; a member of the run may be compromised")
    assert refusal.search(run.output), run.output[-3000:]
    assert "internal error" not in run.output
    summary = summary_of(run_id)
    events = [(e["event"], e["host"], e["detail"]) for e in summary["timeline"]]
    assert summary["status"] == "failed" and not [e for e in events if e[0] == "succession"], events
    # Each host that refused is recorded as lost for that reason; which ones the controller records
    # before the run falls below its minimum depends on who read the state first (h1 lingers 5 s).
    refused = "it refused the rendezvous state: a member of the run may be compromised"
    lost = [e for e in events if e[0] == "lost"]
    assert lost and all(e[2] == refused for e in lost), events
