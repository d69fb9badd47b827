"""Uneven per-host batch sizes end to end on the simulated cluster: `fab train` on 3 hosts with
batch sizes 16/32/48, and with `batch_size: auto`. Proof of coverage comes from the metrics the
trainer wrote on the hosts: rank 0's epoch records and every rank's own step records."""

from __future__ import annotations

import json

import pytest

from tests.fabrun import fab, run_id_of

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.either_cluster]

DIGITS_TRAIN = 1438  # 14 global steps of 96, then 94 split 16:31:47


def host_jsonl(testbed, host: int, run_id: str, name: str) -> list[dict]:
    text = testbed.exec(host, ["cat", f"/root/meshrun/runs/{run_id}/{name}"]).stdout
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_batches_16_32_48_train_digits_and_use_every_sample_once(testbed, make_inventory) -> None:
    inv = make_inventory(host_overrides={"h1": {"batch_size": 16}, "h2": {"batch_size": 32},
                                         "h3": {"batch_size": 48}})
    done = fab("train", "--inventory", str(inv), "--", "epochs=10", timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    run_id = run_id_of(done.stdout)
    assert "[h1:0] batch sizes (inventory, global 96): h1/r0 16, h2/r1 32, h3/r2 48" in done.stdout
    result = json.loads(testbed.exec(1, ["cat", f"/root/meshrun/runs/{run_id}/result.json"]).stdout)
    assert result["metrics"]["test_acc"] >= 0.95, result
    assert result["batch_sizes"] == [16, 32, 48] and result["rank_hosts"] == ["h1", "h2", "h3"]
    assert set(result["samples_per_s"]) == {"h1", "h2", "h3"}

    epochs = [r for r in host_jsonl(testbed, 1, run_id, "metrics.jsonl") if r["kind"] == "epoch"]
    assert [e["epoch"] for e in epochs] == list(range(1, 11))
    for e in epochs:
        assert (e["coverage_min"], e["coverage_max"]) == (1, 1)  # each sample exactly once
        assert e["rank_samples"] == [14 * 16 + 16, 14 * 32 + 31, 14 * 48 + 47]
        assert sum(e["rank_samples"]) == DIGITS_TRAIN and e["global_step"] == 15 * e["epoch"]
    for rank in range(3):  # each rank's own step records agree, epoch by epoch
        steps = [r for r in host_jsonl(testbed, rank + 1, run_id, f"metrics.rank{rank}.jsonl")
                 if r["kind"] == "step"]
        for e in epochs:
            used = sum(s["samples"] for s in steps if s["epoch"] == e["epoch"] - 1)
            assert used == e["rank_samples"][rank]


def test_auto_probe_sizes_are_logged_and_used(testbed, make_inventory) -> None:
    inv = make_inventory(defaults_overrides={"batch_size": "auto"})
    done = fab("train", "--inventory", str(inv), "--", "epochs=2", "data.global_batch_size=120",
               timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    run_id = run_id_of(done.stdout)
    rows = host_jsonl(testbed, 1, run_id, "metrics.jsonl")
    balance = next(r for r in rows if r["kind"] == "balance")
    sizes = balance["batch_sizes"]
    assert sum(sizes) == 120 and min(sizes) >= 1 and balance["sources"] == ["auto"] * 3
    assert all(p["samples_per_s"] > 0 and p["sizes"] for p in balance["probes"])
    assert "[h1:0] batch sizes (auto, global 120): " in done.stdout
    for rank, size in enumerate(sizes):
        assert f"h{rank + 1}/r{rank} {size} (probe " in done.stdout
    for e in (r for r in rows if r["kind"] == "epoch"):
        assert e["batch_sizes"] == sizes and (e["coverage_min"], e["coverage_max"]) == (1, 1)
    result = json.loads(testbed.exec(1, ["cat", f"/root/meshrun/runs/{run_id}/result.json"]).stdout)
    assert result["batch_sizes"] == sizes and result["batch_source"] == "auto"
