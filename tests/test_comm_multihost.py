"""Every comm hook trains digits across 3 simulated hosts to within 1 point of plain DDP, and
`fab train --comm auto` measures the links, logs its choice and records the floor.

One test function runs all hooks in turn (one cluster, code synced once) to stay near 3 minutes.
"""

from __future__ import annotations

import json
import platform
import re
import time
from pathlib import Path

import pytest

from meshrun.layout import CHECKPOINT_MANIFEST, checkpoint_step
from tests.fabrun import ROOT, FabProcess, fab, run_id_of
from tests.runrecords import summary_of

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.either_cluster]

TRAIN = ("epochs=6", "log.tensorboard=false", "comm.start_iter=5", "comm.powersgd_rank=4")
HIER_EPOCHS = 10


def test_each_hook_trains_within_one_point_of_plain_ddp(testbed, inventory: Path) -> None:
    auto = fab("train", "--inventory", str(inventory), "--comm", "auto", "--", *TRAIN, timeout=300)
    assert auto.returncode == 0, auto.stdout[-3000:] + auto.stderr[-2000:]
    # Unshaped veth links are fast and the digits MLP is 0.2 MB: plain all-reduce fits the budget.
    assert "comm: auto: 0.20 MB of gradients, 3 nodes, " in auto.stdout
    assert ": comm.hook=none" in auto.stdout
    base = summary_of(run_id_of(auto.stdout))
    assert base["comm"]["hook"] == "none" and base["comm"]["floor_s"] > 0
    assert base["comm"]["measured_s"] is not None and base["comm"]["nodes"] == 3
    assert (ROOT / "runs" / base["run_id"] / "commplan.json").exists()
    accuracy = {"none": base["metrics"]["test_acc"]}
    for hook in ("fp16", "bf16", "powersgd", "localsgd"):
        done = fab("train", "--inventory", str(inventory), "--skip-checks", "--no-sync", "--",
                   *TRAIN, f"comm.hook={hook}", timeout=300)
        assert done.returncode == 0, hook + done.stdout[-3000:] + done.stderr[-2000:]
        summary = summary_of(run_id_of(done.stdout))
        assert summary["world_size"] == 3
        accuracy[hook] = summary["metrics"]["test_acc"]
    print(f"final test accuracy per hook: {accuracy}")
    assert accuracy["none"] >= 0.9
    for hook, acc in accuracy.items():
        assert abs(acc - accuracy["none"]) <= 0.01, (hook, accuracy)


def test_comm_flag_rejects_unknown_hooks_and_scripts(tmp_path: Path) -> None:
    bad = fab("train", "--comm", "zip", "--", "epochs=1")
    assert bad.returncode == 2 and ("--comm 'zip': expected one of auto, none, fp16, bf16, powersgd, localsgd, "
                                    "diloco, diloco-overlap") in bad.stderr
    script = fab("train", "--comm", "fp16", "--script", "bench/barrier_probe.py")
    assert script.returncode == 2 and "--comm applies to the built-in trainer, not to --script" in script.stderr


def wait_for_listed_checkpoint_after(directory: Path, step: int, timeout: float) -> None:
    """Return once `directory`'s manifest lists a save after `step` (the trainer lists a file
    after writing it, and a resume takes the newest listed: one listed after the resume's step
    is the new world's)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        manifest = directory / CHECKPOINT_MANIFEST
        listed = manifest.read_text().split() if manifest.exists() else []
        if any(n is not None and n > step for n in map(checkpoint_step, listed)):
            return
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint after step {step} listed in {directory} within {timeout} s")


def test_hier_trains_by_site_and_records_the_matrix(testbed, make_inventory) -> None:
    """`--comm hier` on h1, h2 at `office` and h3 at `home`: the inventory's sites reach every rank
    (MESHRUN_SITE), the trainer builds them, and commplan.json holds the measured matrix, the
    sites and hier's floor. The run is elastic (`--nnodes 1:3`): h2, inside the two-host site, is
    killed mid-run (everything of the run on it, its sshd sessions too), and h1 and h3 go on as two
    sites of one host, rebuilt by the trainer, from the checkpoint saved on 2 + 1 hosts; then h3,
    the whole `home` site, is killed, and h1 finishes alone, one site, from the 2 hosts' checkpoint."""
    sites = {"h1": "office", "h2": "office", "h3": "home"}
    inventory = make_inventory(host_overrides={h: {"site": s} for h, s in sites.items()})
    run_id, out = run_hier_losing_h2_then_h3(testbed, inventory)
    assert "comm: comm.hook=hier, floor " in out
    assert_the_sites_shrank(out)
    plan = json.loads((ROOT / "runs" / run_id / "commplan.json").read_text())
    assert plan["hook"] == "hier" and plan["site_links"]["sites"] == [["office", ["h1", "h2"]], ["home", ["h3"]]]
    assert sorted((k["source"], k["target"]) for k in plan["links"]) == sorted(
        (a, b) for a in sites for b in sites if a != b)
    hier = next(f for f in plan["floors"] if f["hook"] == "hier")
    assert hier["floor_s"] == hier["inside_s"] + hier["between_s"] > 0
    summary = summary_of(run_id)
    assert summary["comm"]["hook"] == "hier" and summary["status"] == "succeeded"
    assert summary["world_size"] == 1 and summary["lost_hosts"] == ["h2", "h3"] and summary["restarts"] >= 2
    assert fab("fetch-checkpoints", "--run", run_id).returncode == 0
    lines = [json.loads(x) for x in (ROOT / "runs" / run_id / "hosts/h1/metrics.jsonl").read_text().splitlines()]
    resumes = [r for r in lines if r.get("kind") == "resume"]
    assert [(r["world_size"], r["saved_world_size"]) for r in resumes][-2:] == [(2, 3), (1, 2)], resumes
    epochs = [r for r in lines if r.get("kind") == "epoch"]
    assert [r["epoch"] for r in epochs][-1] == HIER_EPOCHS and (epochs[0]["world_size"], epochs[-1]["world_size"]) == (3, 1)
    assert_provenance_holds_the_matrix(summary["provenance"], plan)
    # It learns (87.5 % at 6 epochs when written); the accuracy bar against plain
    # DDP is tests/test_train_hier.py's, at digits' 20 epochs.
    assert summary["metrics"]["test_acc"] >= 0.8, summary["metrics"]


def run_hier_losing_h2_then_h3(testbed, inventory: Path) -> tuple[str, str]:
    """The elastic `--comm hier` run of the test above, h2 and then h3 killed: (run id, output)."""
    # 10 epochs, not TRAIN's 6: h3 must die mid-run. At 6, the two hosts' last epoch and a half
    # (about a second) once ended before the kill landed (CI, 2026-12-03), and the run ended at 2 hosts.
    run = FabProcess("train", "--inventory", str(inventory), "--skip-checks", "--nnodes", "1:3", "--comm", "hier",
                     "--", *TRAIN, f"epochs={HIER_EPOCHS}", "checkpoint.every_steps=5")
    try:
        run_id = run_id_of(run.wait_for(r"\[h1:0\] epoch 3 step", timeout=240))
        assert testbed.kill_processes(2)
        # h3 dies once the world of h1 and h3 has saved. Not on a line of its: lines reach the
        # controller late, and on a loaded machine the 3 hosts' "epoch 5" once came after h2's
        # kill, h3 died with h2, and h1 went on alone (CI, 2026-12-04).
        resumed = run.wait_for(r"saved at world size 3; now world size 2", timeout=240)
        step = int(re.findall(r"resumed from step (\d+) .*saved at world size 3; now world size 2", resumed)[-1])
        checkpoints = testbed.paths.home(testbed.host(1)) / "meshrun" / "runs" / run_id / "checkpoints"
        wait_for_listed_checkpoint_after(checkpoints, step, timeout=120)
        assert testbed.kill_processes(3)
        assert run.finish(timeout=300) == 0, run.output[-4000:]
    finally:
        run.close()
    return run_id, run.output


def assert_the_sites_shrank(out: str) -> None:
    # The trainer's sites (rank 0 says them): 2 + 1 ranks, then, after each loss, the survivors'
    # sites gathered again by the new world (which rank lands where is the rendezvous's choice).
    built = [sorted((name, len(ranks.split(","))) for name, ranks in re.findall(r"(\w+) ranks \[([\d, ]+)\]", line))
             for line in re.findall(r"\] comm: hier: \d sites?: (.*?);", out)]
    assert built[0] == [("home", 1), ("office", 2)] and built[-1] == [("office", 1)], built
    assert [("home", 1), ("office", 1)] in built, built
    assert "meshrun: h2 lost" in out and "meshrun: h3 lost" in out
    for before, after in ((3, 2), (2, 1)):
        assert re.search(rf"comm: world size changed \({before} -> {after}\): hier outer state restored; the "
                         rf"interrupted round was completed from the {before} saved replicas", out), out[-4000:]


def assert_provenance_holds_the_matrix(prov: dict, plan: dict) -> None:
    """Issue 23: the provenance holds the measured matrix and, with --skip-checks, each host's versions."""
    assert prov["links"]["matrix"] == [{k: link[k] for k in ("source", "target", "mbit_s", "rtt_ms")}
                                       for link in plan["links"]] and prov["links"]["hook"] == "hier"
    assert sorted(prov["hosts"]) == ["h1", "h2", "h3"]
    assert all(h["python"] == platform.python_version() and h["torch"] and h["gpus"] == []
               and h["meshrun"] == f"{prov['meshrun']['version']} (build {prov['meshrun']['build']})"
               for h in prov["hosts"].values()), prov["hosts"]
