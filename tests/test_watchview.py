"""`fab status --watch`'s figures by exact equality (issue 23, item 1): the trainer's progress →
samples/s now and on average, each host's share, the ETA (deploy/run/progress.py); nvidia-smi's
CSV, the usage answer's extra fields and the run's events (deploy/host/usage.py,
deploy/run/hostusage.py); the whole view (deploy/run/watchview.py). The host-side parts that need
no GPU run for real here: a TCP connect's round trip, a pidfile's endpoint, the events file's tail,
the run's resident memory. The real runs: tests/test_fab_local.py (a local run's frames and
--json) and tests/test_elastic.py (a cut host)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from meshrun.deploy.host import usage
from meshrun.deploy.run import progress
from meshrun.deploy.run.hoststate import HostState, parse_status
from meshrun.deploy.run.hostusage import Event, Gpu, HostUsage, agent_event, controller_events, read_host_usage
from meshrun.deploy.run.idle import Usage
from meshrun.deploy.run.progress import Progress, parse_progress
from meshrun.deploy.run.watchview import HostSeen, WatchRow, WatchView, duration, view

# nvidia-smi's answer to usage.GPU_QUERY (`--format=csv,noheader,nounits`): one line per GPU, values
# joined by ", ", `[N/A]` or `[Not Supported]` where a board cannot say. Mocked: no GPU exists on
# this machine, so these lines are written in that format, not captured from a real board.
NVIDIA_SMI = ("0, 87, 31234, 81559, 65\n"
              "1, 91, 30112, 81559, 71\n"
              "2, 0, 3, 81559, [N/A]\n"
              "3, [Not Supported], 10, 16384, 40\n"
              "No devices were found\n")

P1 = {"epoch": 2, "step_in_epoch": 10, "steps_per_epoch": 50, "global_step": 110, "world_size": 4, "time": 1000.0,
      "samples_seen": 3840, "epochs": 4, "restarts": 1, "host_batches": {"h1": [16, 16], "h2": [16], "h3": [16]},
      "since": [850.0, 55, 0]}
P2 = {**P1, "step_in_epoch": 30, "global_step": 130, "time": 1010.0, "samples_seen": 5120}


def test_nvidia_smi_lines_are_read_exactly() -> None:
    """Mocked nvidia-smi output (no GPU here): the GPUs the workers see, N/A as null."""
    assert usage.parse_gpus(NVIDIA_SMI, {0, 1, 2}) == [[0, 87, 31234, 81559, 65], [1, 91, 30112, 81559, 71],
                                                       [2, 0, 3, 81559, None]]
    assert usage.parse_gpus(NVIDIA_SMI, None)[3] == [3, None, 10, 16384, 40]
    assert usage.parse_gpus("", None) == [] and usage.parse_gpus("0, 1, 2\n", None) == []
    answer = json.dumps({"time": 5, "cpu_s": 1, "procs": 2, "gpus": usage.parse_gpus(NVIDIA_SMI, {0, 1, 2}),
                         "rss": 3 << 30, "rtt_ms": 0.42, "rtt_missed": False, "checkpoint": 40,
                         "checkpoint_time": 4.5, "events": []})
    assert read_host_usage("h1", answer) == HostUsage(
        (Gpu(0, 87, 31234, 81559, 65), Gpu(1, 91, 30112, 81559, 71), Gpu(2, 0, 3, 81559, None)), 3 << 30, 0.42,
        False, 40, 4.5, ())


def test_progress_gives_rates_shares_and_eta() -> None:
    first, now = parse_progress(P1, 1001.0), parse_progress(P2, 1012.0)
    assert now == Progress(2, 30, 50, 130, 4, 1010.0, 5120, 4, 1,
                           (("h1", (16, 16)), ("h2", (16,)), ("h3", (16,))), (850.0, 55, 0), 2.0)
    assert progress.rate(first, now) == 128.0 and progress.average(now) == 32.0
    assert [progress.share(now, h) for h in ("h1", "h2", "h4")] == [0.5, 0.25, 0.0]
    assert [progress.ranks(now, h) for h in ("h1", "h2", "h4")] == [2, 1, 0]
    assert progress.eta_s(now) == 70 * 160 / 75 and duration(progress.eta_s(now)) == "2 min 29 s"
    assert progress.eta_s(parse_progress({**P2, "epoch": 4, "step_in_epoch": 0})) == 0.0
    assert progress.rate(parse_progress({**P1, "since": [900.0, 0, 0]}), now) is None  # another start
    # An older trainer's record (the six core fields): no rates, no ETA, no shares.
    old = parse_progress({k: P2[k] for k in ("epoch", "step_in_epoch", "steps_per_epoch", "global_step",
                                             "world_size", "time")})
    assert old == Progress(2, 30, 50, 130, 4, 1010.0)
    assert (progress.average(old), progress.eta_s(old), progress.ranks(old, "h1")) == (None, None, None)
    # A host's progress is data: wrong shapes drop the field (or the record), never raise.
    assert parse_progress({**P2, "global_step": "130"}) is None and parse_progress([P2]) is None
    assert parse_progress({**P2, "time": float("nan")}) is None
    odd = parse_progress({**P2, "host_batches": {"h1": [16, -1]}, "since": [1, 2], "epochs": 10**30, "restarts": True})
    assert (odd.host_batches, odd.since, odd.epochs, odd.restarts) == ((), None, None, None)
    assert parse_progress({**P2, "host_batches": {f"h{i}": [1] * 5 for i in range(1000)}}).host_batches == ()
    assert duration(42.9) == "42 s" and duration(7260) == "2 h 01 min"


def _status(host: str, prog: dict | None, now: float) -> HostState:
    return parse_status("r1", host, json.dumps([{"run_id": "r1", "state": "running", "started": 900.0,
                                                 "progress": prog, "generation": 0, "now": now}]))


def test_the_view_rows_run_line_and_events() -> None:
    """Four hosts: h1 (rank 0's, GPUs), h2 (CPU, its store connect unanswered), h3 silent, h4 outside
    the world; the events of the controller, of h2's agent, and the checkpoint both hold."""
    gpus = read_host_usage("h1", json.dumps({"gpus": usage.parse_gpus(NVIDIA_SMI, {0, 1}), "rtt_ms": 0.42,
                                             "checkpoint": 100, "checkpoint_time": 90.0}))
    h2_said = json.dumps({"rss": 1610612736, "rtt_ms": None, "rtt_missed": True, "checkpoint": 100,
                          "checkpoint_time": 90.5, "events": [
                              {"time": 96.0, "event": "workers_restarted", "text": "a peer was lost; 1 worker(s) restarted"},
                              {"time": 97.0, "event": "peers_lost", "text": "h1 lost\x1b[2J"},
                              {"time": 98.0, "event": "pwned", "text": "x"}, "garbage", {"time": "soon"}]})
    seen = {"h1": HostSeen(_status("h1", P2, 1012.0), Usage(20, 0, 2, (87, 91)), None, 100.0, None, gpus,
                           parse_progress(P1, 1001.0)),
            "h2": HostSeen(_status("h2", None, 1012.0), Usage(20, 0, 1, None, ((5, 9.0),)),
                           Usage(18, 0, 1, None, ((5, 8.0),)), 99.0, None, read_host_usage("h2", h2_said)),
            "h3": HostSeen(HostState("r1", "h3", "running", epoch=1, step=90), None, None, 85.0, "timed out"),
            "h4": HostSeen(_status("h4", None, 1012.0), None, None, 100.0)}
    mine = controller_events("\n".join([
        json.dumps({"time": 50.0, "event": "started", "host": "h1", "world_size": 4, "detail": None}),
        "not json", json.dumps({"time": 1, "event": "pwned", "host": "h1"}),
        json.dumps({"time": 95.5, "event": "lost", "host": "h3", "world_size": 3, "detail": "stopped answering"})]))
    assert view(["h1", "h2", "h3", "h4"], seen, 100.0, mine) == WatchView(
        [WatchRow("h1", "running", "2", "0", "2", "130", "64 / 16", "2 s ago", "0.4 ms", "GPU 89%",
                  "GPU 59.9/159", "71 °C", "0 s ago", ""),
         WatchRow("h2", "running", "1", "0", "2", "130", "32 / 8", "2 s ago", "no answer", "CPU 50%",
                  "RSS 1.5", "-", "1 s ago", ""),
         WatchRow("h3", "not answering", "-", "-", "1", "90", "-", "-", "-", "-", "-", "-", "15 s ago", "timed out"),
         WatchRow("h4", "running", "0", "0", "-", "-", "-", "-", "-", "-", "-", "-", "0 s ago", "")],
        "world 4 rank(s) on 3 host(s) · epoch 2/4 · step 130 (30/50 of the epoch) · 128 / 32 samples/s (now / average)"
        " · 1 restart(s) · ETA 2 min 29 s (progress from h1, 2 s old)",
        ["h1 started; world size 4", "checkpoint saved at step 100 (h1, h2)", "h3 lost (stopped answering); world size 3",
         "h2 restarted its workers: a peer was lost; 1 worker(s) restarted", "h2 saw peers lost: h1 lost\\x1b[2J"],
        [50.0, 90.0, 95.5, 96.0, 97.0])
    # Nobody has reported progress yet: the run's line says so and every figure is `-`.
    assert view(["h4"], {"h4": seen["h4"]}, 100.0) == WatchView(
        [WatchRow("h4", "running", "-", "0", "-", "-", "-", "-", "-", "-", "-", "-", "0 s ago", "")],
        "no training progress reported yet", [], [])


def test_a_hosts_usage_answer_is_bounded_and_speaks_for_itself() -> None:
    """A hostile usage answer: wrong shapes drop their field, 500 events keep the last 20, and a
    host's event is shown under its own name, escaped."""
    flood = [{"time": float(i), "event": "ended", "text": f"claims h{i}"} for i in range(500)]
    found = read_host_usage("h2", json.dumps({"gpus": [[0, 900, -1, "x", 20]] * 100 + [["a"]], "rss": -5,
                                              "rtt_ms": float("inf"), "rtt_missed": "yes", "checkpoint": 10**12,
                                              "checkpoint_time": -1, "events": flood}))
    assert found == HostUsage((), None, None, False, None, None, tuple(
        Event(float(i), "h2", f"h2 ended: claims h{i}") for i in range(480, 500)))
    assert read_host_usage("h2", json.dumps({"gpus": [[0, 900, -1, "x", 20]]})).gpus == (Gpu(0, None, None, None, 20),)
    assert read_host_usage("h2", "[1, 2]") == HostUsage() == read_host_usage("h2", "")
    assert controller_events(json.dumps({"time": 5.0, "event": "lost", "host": "h\x1b]0;x\x07", "detail": 7})) == (
        Event(5.0, "h\\x1b]0;x\\x07", "h\\x1b]0;x\\x07 lost"),)


def test_the_host_side_measures_for_real(tmp_path, monkeypatch) -> None:
    """Real, no GPU needed: one TCP connect to a listening store (and to a closed port), the current
    generation's endpoint read from the agent's pidfile, the events file's tail, the run's RSS."""
    monkeypatch.chdir(tmp_path)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        rtt, missed = usage.rtt_ms(f"127.0.0.1:{port}")
    finally:
        listener.close()
    assert rtt is not None and rtt >= 0 and missed is False
    assert usage.rtt_ms(f"127.0.0.1:{port}") == (None, True)  # nothing listens there now: refused
    assert usage.rtt_ms(None) == (None, False) and usage.rtt_ms("nonsense") == (None, True)
    folder = tmp_path / "runs" / "r1" / "hosts" / "h1"
    folder.mkdir(parents=True)
    assert usage.rendezvous_endpoint("r1", "h1") is None and usage.recent_events("r1", "h1") == []
    (folder / "agent.json").write_text(json.dumps({"command": ["torchrun", "--rdzv-endpoint", "10.0.0.1:29400"]}))
    assert usage.rendezvous_endpoint("r1", "h1") == "10.0.0.1:29400"
    (folder / "agent.json").write_text(json.dumps({"command": ["torchrun", "--standalone"]}))
    assert usage.rendezvous_endpoint("r1", "h1") is None
    lines = [json.dumps({"time": i, "event": "started", "text": "x" * 100}) for i in range(1000)]
    (folder / "events.jsonl").write_text("\n".join(lines) + "\nnot json\n")
    assert usage.recent_events("r1", "h1") == [json.loads(line) for line in lines[-19:]]
    env = {**os.environ, "MESHRUN_RUN_ID": "r1", "MESHRUN_HOST": "h1"}
    worker = subprocess.Popen([sys.executable, "-c", "b = bytearray(64 << 20); import time; time.sleep(30)"],
                              env=env, stdout=subprocess.PIPE)
    try:
        for _ in range(100):  # until the child has its 64 MiB
            if usage.rss_bytes([worker.pid]) > 64 << 20:
                break
            subprocess.run(["sleep", "0.1"])
        answer = usage.usage("r1", "h1")
    finally:
        worker.kill()
        worker.wait()
    assert answer["rss"] > 64 << 20 and answer["gpus"] is None and answer["rtt_ms"] is None  # no nvidia-smi here
    assert read_host_usage("h1", json.dumps(answer)).events[-1] == Event(999.0, "h1", "h1 started: " + "x" * 100)


def test_every_event_a_detached_agent_journals_is_shown() -> None:
    """The agent's journal names (deploy/host/agent.py) each have words in the view; `peers_back`
    (a lost peer answering again), `idle` (a detached run's idle rule, issue 23) and
    `exit_barrier_left` (deploy/host/exitbarrier.py) were added."""
    said = [agent_event("h1", {"time": 1.0, "event": name, "text": "t"}) for name in
            ("started", "rejoined", "peers_lost", "peers_back", "idle", "rendezvous_moved", "workers_restarted",
             "exit_barrier_left", "ended")]
    assert [e.text if e else None for e in said] == [
        "h1 started: t", "h1 rejoined: t", "h1 saw peers lost: t", "h1 saw peers back: t", "h1 idle: t", "h1 succession: t",
        "h1 restarted its workers: t", "h1 stopped waiting for a gone peer: t", "h1 ended: t"]
    agent = (Path(__file__).resolve().parents[1] / "deploy" / "host" / "agent.py").read_text()
    names = {n for call in re.findall(r"self\.journal\((.*?), ", agent) for n in re.findall(r'"(\w+)"', call)}
    assert sorted(names) == sorted(
        ["started", "rejoined", "peers_lost", "peers_back", "idle", "rendezvous_moved", "workers_restarted",
         "exit_barrier_left", "ended"])
