"""A fetch that brought nothing says so (findings day2 #10a): with no host answering (the run's only
host down, or no longer in the inventory), no table, no `verified` checkpoints line, no resume hint
and no "the other hosts' files are home"; a host the inventory no longer names is not one to wait
for ("fetch again when h1 is back"): its own line says to put it back."""

from __future__ import annotations

import time
from pathlib import Path

from meshrun.deploy.commands.fetch import Fetched, failure_lines
from meshrun.deploy.edges.fetch import FetchReport
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.errors import MeshrunError
from tests.clirun import run_meshrun, trap_project

RUN = "20261206-180903-209b"
DOWN = MeshrunError("host 'h1': fetch failed (rsync exit 255): connection refused")
GONE = MeshrunError("host 'h3' of run r is no longer in inv.yaml; put it back in that inventory to reach it")
HOME = "runs/r/checkpoints"


def test_no_host_answered_says_nothing_was_fetched() -> None:
    assert failure_lines(Fetched([], {"h1": DOWN}, -1), HOME) == [
        str(DOWN), "no host answered: nothing was fetched; fetch again when h1 is back to bring its files home"]
    # What an earlier fetch verified is still home: said as that, never as this fetch's.
    assert failure_lines(Fetched([], {"h1": DOWN}, 500), HOME) == [
        str(DOWN), "no host answered: nothing was fetched (runs/r/checkpoints/ lists verified checkpoints up to "
                   "step 500, from an earlier fetch); fetch again when h1 is back to bring its files home"]


def test_a_host_no_longer_in_the_inventory_is_not_waited_for() -> None:
    assert failure_lines(Fetched([], {"h3": GONE}, -1, missing=("h3",)), HOME) == [
        str(GONE), "no host answered: nothing was fetched"]
    answered = [FetchReport("h2", Path("runs/r/hosts/h2"))]
    assert failure_lines(Fetched(answered, {"h1": DOWN, "h3": GONE}, 700, missing=("h3",)), HOME) == [
        str(DOWN), str(GONE), "not fetched: h1, h3; the other hosts' files are home and runs/r/checkpoints/ lists "
                              "verified checkpoints up to step 700; fetch again when h1 is back to bring its files home"]


def _fetch(tmp_path: Path, hosts: tuple[str, ...]) -> tuple[int, str, str]:
    """`meshrun fetch-checkpoints` of a run of `hosts`; the inventory names gpu1 only, at a port
    nothing listens on (refused at once)."""
    root, _key, _host = trap_project(tmp_path, 1)
    RunRecord(RUN, str(root / "inventory/hosts.yaml"), hosts, time.time(), True, "gpu1:29500").save(root / "runs")
    done = run_meshrun(root, "fetch-checkpoints", "--run", RUN, env={"COLUMNS": "400"})
    return done.returncode, " ".join(done.stdout.split()), " ".join(done.stderr.split())


def _nothing_claimed(out: str, err: str) -> None:
    assert "error: no host answered: nothing was fetched" in err
    assert "fetched run" not in out and "verified" not in out + err and "resume this run" not in out
    assert "other hosts" not in err


def test_a_fetch_whose_only_host_is_down(tmp_path: Path) -> None:
    rc, out, err = _fetch(tmp_path, ("gpu1",))
    assert rc == 1
    _nothing_claimed(out, err)
    assert "host 'gpu1': fetch failed" in err and "fetch again when gpu1 is back" in err


def test_a_fetch_whose_only_host_left_the_inventory(tmp_path: Path) -> None:
    rc, out, err = _fetch(tmp_path, ("h1",))
    assert rc == 1
    _nothing_claimed(out, err)
    assert f"host 'h1' of run {RUN} is no longer in" in err and "put it back in that inventory" in err
    assert "when h1 is back" not in err
