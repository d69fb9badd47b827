"""Idle detection's rule (deploy/run/idle.py) by exact equality; the real run is
tests/test_fab_local.py::test_an_idle_run_is_warned_about_then_stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.edges.idle import IdleWatcher
from meshrun.deploy.host import usage
from meshrun.deploy.host.idle import UsageFeed
from meshrun.deploy.run import idle
from meshrun.deploy.run.idle import IdlePolicy, Usage
from meshrun.layout import AGENT_USAGE_PREFIX, ENV_HOST, ENV_RUN_ID


def test_utilisation_from_two_answers() -> None:
    assert idle.utilisation(Usage(10, 5.0, 2, None), Usage(20, 15.0, 2, None)) == 0.5
    assert idle.utilisation(Usage(10, 5.0, 2, None), Usage(20, 5.5, 2, None)) == 0.025
    assert idle.utilisation(Usage(10, 5.0, 2, None), Usage(10, 6.0, 2, None)) is None  # no time passed
    assert idle.utilisation(Usage(10, 5.0, 2, None), Usage(20, 1.0, 2, None)) is None  # restarted processes
    assert idle.utilisation(Usage(10, 5.0, 2, None), Usage(20, 5.0, 0, None)) is None  # nothing running
    assert idle.utilisation(Usage(10, 5.0, 2, None), Usage(20, 5.0, 2, (0, 50))) == 0.25  # GPUs win
    # With each process's CPU time: the busiest process that lived through both answers.
    before = Usage(10, 6.0, 3, None, ((1, 1.0), (2, 2.0), (3, 3.0)))
    assert idle.utilisation(before, Usage(20, 14.0, 3, None, ((1, 1.5), (2, 9.0), (4, 3.5)))) == 0.7
    assert idle.utilisation(before, Usage(20, 4.0, 1, None, ((9, 4.0),))) is None  # all restarted
    assert idle.utilisation(before, Usage(20, 6.0, 0, None, ())) is None  # nothing running


def actions_over(series: list[tuple[float, float | None]], policy: IdlePolicy) -> list[tuple[float, str]]:
    """What a series of (time, utilisation) samples of one host triggers, in order (the rule's step)."""
    state, found = idle.IdleState(), []
    for at, util in series:
        found += [(at, action) for action in idle.step(state, policy, at, util)]
    return found


def test_the_rule_warns_once_per_spell_and_stops_once() -> None:
    policy = IdlePolicy(threshold=0.1, warn_s=30, stop_s=60)
    series = [(0, 0.9), (10, 0.05), (20, 0.0), (40, 0.02), (45, 0.5), (50, 0.0), (79, 0.0), (80, 0.0),
              (100, None), (110, 0.01), (130, 0.0)]
    assert actions_over(series, policy) == [(40, "warn"), (80, "warn"), (110, "stop")]
    assert actions_over(series, IdlePolicy(0.1, 30, None)) == [(40, "warn"), (80, "warn")]
    assert actions_over([(0, 0.0), (5, 0.0)], IdlePolicy(0.1, 30, 5)) == [(5, "stop")]
    assert actions_over([(0, 0.0), (30, 0.0)], IdlePolicy(0.1, 30, 30)) == [(30, "warn"), (30, "stop")]
    assert actions_over([(t, 0.1) for t in range(0, 100, 10)], policy) == []  # at the threshold: busy


def test_flags_and_sampling() -> None:
    assert idle.policy_from_flags("", "") == IdlePolicy(0.1, 600.0, None)
    assert idle.policy_from_flags("0.5", "30") == IdlePolicy(0.1, 30.0, 1800.0)
    for bad in ("0", "-1", "1e3", "²", "1.", ".5", "x", "99999999"):
        with pytest.raises(InputError, match="--idle-stop"):
            idle.policy_from_flags("", bad)
    assert idle.policy_from_flags("", "", "25") == IdlePolicy(0.25, 600.0, None)
    assert idle.policy_from_flags("1", "", "2.5") == IdlePolicy(0.025, 60.0, None)
    for bad in ("0", "101", "-5", "5%", "1e1", ".5", "x"):
        with pytest.raises(InputError, match="--idle-below"):
            idle.policy_from_flags("", "", bad)
    assert IdlePolicy(0.1, 600, None).sample_s == 10.0
    assert IdlePolicy(0.1, 3, 9).sample_s == 1.0
    assert IdlePolicy(0.1, 600, 30).sample_s == 5.0


def test_usage_answers_are_shape_checked() -> None:
    assert idle.read_usage("h1", 'noise\n{"time": 5.5, "cpu_s": 2, "procs": 3, "gpu_util": [10, 20]}') == \
        Usage(5.5, 2.0, 3, (10, 20))
    assert idle.read_usage("h1", '{"time": 5, "cpu_s": 2, "procs": 3, "gpu_util": null}') == Usage(5.0, 2.0, 3, None)
    assert idle.read_usage("h1", '{"time": 5, "cpu_s": 2, "procs": 2, "per_pid": {"12": 1.5, "7": 0.5}}') == \
        Usage(5.0, 2.0, 2, None, ((7, 0.5), (12, 1.5)))
    for bad, why in [('{"time": 5, "cpu_s": -1, "procs": 3}', "cpu_s is -1"),
                     ('{"time": 5, "cpu_s": 1, "procs": "3"}', "procs is '3'"),
                     ('{"time": 5, "cpu_s": 1, "procs": 3, "gpu_util": [101]}', "gpu_util is [101]"),
                     ('{"cpu_s": 1, "procs": 3}', "time is None"), ("[1]", "the answer is [1]"),
                     ('{"time": 5, "cpu_s": 1, "procs": 1, "per_pid": {"x": 1}}', "per_pid is {'x': 1}"),
                     ('{"time": 5, "cpu_s": 1, "procs": 1, "per_pid": {"1": -1}}', "per_pid is {'1': -1}")]:
        with pytest.raises(MeshrunError) as err:
            idle.read_usage("h1", bad)
        assert str(err.value).startswith(f"host 'h1': the usage probe gave an unexpected answer: {why}"), err.value


def test_the_usage_probe_counts_the_tagged_processes_cpu() -> None:
    """The host probe on real processes: a busy and a sleeping one carrying the run's tags."""
    env = {**os.environ, "MESHRUN_RUN_ID": "r-usage", "MESHRUN_HOST": "h1"}
    started = "print('started', flush=True)\nimport time\n"
    busy = subprocess.Popen([sys.executable, "-c", started + "end=time.time()+30\nwhile time.time()<end: pass"],
                            env=env, stdout=subprocess.PIPE)
    sleeper = subprocess.Popen([sys.executable, "-c", started + "time.sleep(30)"], env=env, stdout=subprocess.PIPE)
    try:
        # Until a child has exec'd, /proc/PID/environ is still this process's (no tags): on a
        # loaded machine the first sample once counted 1 of the 2 (CI, 2026-12-03).
        assert busy.stdout.readline() == sleeper.stdout.readline() == b"started\n"
        first = usage.usage("r-usage", "h1")
        time.sleep(1.0)
        second = usage.usage("r-usage", "h1")
        busy_s, sleeper_s = usage.cpu_seconds(busy.pid), usage.cpu_seconds(sleeper.pid)
    finally:
        for proc in (busy, sleeper):
            proc.kill()
            proc.wait()
            proc.stdout.close()
    assert first["procs"] == second["procs"] == 2 and first["gpu_util"] is None  # no nvidia-smi here
    util = idle.utilisation(idle.read_usage("h1", json.dumps(first)), idle.read_usage("h1", json.dumps(second)))
    assert util is not None and 0 < util  # the busy one: about 1, less on a loaded machine
    assert sorted(pid for pid, _ in idle.read_usage("h1", json.dumps(second)).per_pid) == sorted([busy.pid, sleeper.pid])
    assert busy_s is not None and sleeper_s is not None and busy_s > sleeper_s
    assert usage.cpu_seconds(busy.pid) is None  # gone


def test_watch_rows_say_when_a_host_stops_answering() -> None:
    """`fab status --watch`'s rows (deploy/run/watchview.py): a host silent for 10 s is not answering,
    whatever it said last; the busy cell comes from two usage answers."""
    from meshrun.deploy.run.hoststate import HostState
    from meshrun.deploy.run.watchview import HostSeen, WatchRow, parse_frames, rows

    state = HostState("r1", "h1", "running", epoch=3, step=120, generation=1)
    seen = {"h1": HostSeen(state, Usage(20, 0, 2, None, ((5, 9.0),)), Usage(18, 0, 2, None, ((5, 8.0),)), 100.0),
            "h2": HostSeen(HostState("r1", "h2", "running", epoch=3, step=120), None, None, 89.0, "timed out"),
            "h3": HostSeen(state, Usage(20, 0, 1, (80, 90)), None, 99.0)}
    assert rows(["h1", "h2", "h3", "h4"], seen, 100.0) == [
        WatchRow("h1", "running", "-", "1", "3", "120", "-", "-", "-", "CPU 50%", "-", "-", "0 s ago", ""),
        WatchRow("h2", "not answering", "-", "-", "3", "120", "-", "-", "-", "-", "-", "-", "11 s ago", "timed out"),
        WatchRow("h3", "running", "-", "1", "3", "120", "-", "-", "-", "GPU 85%", "-", "-", "1 s ago", ""),
        WatchRow("h4", "asking", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "never", "")]
    assert parse_frames("") == 0 and parse_frames("3") == 3
    for bad in ("0", "x", "-1", "²", "10001"):
        with pytest.raises(InputError, match="--frames"):
            parse_frames(bad)


def test_checkpoint_steps_in_usage_answers(tmp_path, monkeypatch) -> None:
    """--every-checkpoint's source: the newest step the host's own manifest lists, in the trainer's
    exact names only; shape-checked on the controller."""
    from meshrun import events

    monkeypatch.chdir(tmp_path)
    assert usage.newest_checkpoint("r1") is None
    folder = tmp_path / "runs" / "r1" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "MANIFEST.sha256").write_text(f"{'a' * 64}  ckpt-step000000010.pt\n{'b' * 64}  best.pt\n"
                                            f"{'c' * 64}  ckpt-step000000005.pt\n{'d' * 64}  ckpt-step99.pt\n")
    assert usage.newest_checkpoint("r1") == 10
    assert idle.read_usage("h1", '{"time": 1, "cpu_s": 0, "procs": 0, "checkpoint": 10}').checkpoint == 10
    with pytest.raises(MeshrunError, match="checkpoint is 'x'"):
        idle.read_usage("h1", '{"time": 1, "cpu_s": 0, "procs": 0, "checkpoint": "x"}')
    assert events.checkpoint("r1", 5.0, 10, "h2") == {
        "text": "meshrun run r1: checkpoint at step 10 (on h2)", "event": "checkpoint", "run_id": "r1", "time": 5.0,
        "step": 10, "host": "h2"}


def test_idle_below_is_long_only_and_older_short_flags_stay() -> None:
    """invoke hands short flags out in name order: `--idle-below` would have taken `-b` from
    --debug (or `-`, read as the `--` before a script's arguments)."""
    from meshrun.deploy.tasks import train

    names = {arg.attr_name or arg.name: tuple(arg.names) for arg in train.get_arguments()}
    assert names["idle_below"] == ("idle-below",)
    assert (names["debug"], names["idle_stop"], names["idle_warn"]) == (("debug", "b"), ("idle-stop", "e"),
                                                                       ("idle-warn", "l"))


def test_the_watcher_judges_what_each_agent_sends_and_skips_the_rest() -> None:
    """deploy/edges/idle.py fed the way the launcher does (host, the JSON after the prefix): a line
    out of shape, or from a host not in the run, is skipped; a busy host is not warned about; an
    idle one is, once; a newer checkpoint step is passed on once."""
    said, told, steps, clock = [], [], [], [0.0]
    watcher = IdleWatcher(IdlePolicy(0.1, 20.0, None), (SimpleNamespace(name="h1"), SimpleNamespace(name="h2")),  # type: ignore[arg-type]
                          said.append, lambda *a: told.append(a), lambda *a: steps.append(a),
                          clock=lambda: clock[0])  # the lines arrive as the hosts send them (tests/test_idle_clock.py)

    def line(t: float, cpu: float, checkpoint: int | None = None) -> str:
        return json.dumps({"time": t, "cpu_s": cpu, "procs": 1, "per_pid": {"7": cpu}, "gpu_util": None,
                           "checkpoint": checkpoint})

    for t in range(0, 50, 10):
        clock[0] = t
        watcher.feed("h1", line(t, 0.01 * t, 3 if t >= 20 else None))  # 1 % of a core: idle
        watcher.feed("h2", line(t, 0.9 * t))  # busy
        watcher.feed("h3", line(t, 0.0))  # not a host of the run
        watcher.feed("h2", "{not json")
        watcher.feed("h2", json.dumps({"time": "soon", "cpu_s": 0, "procs": 0}))
    assert [w["host"] for w in watcher.warnings] == ["h1"] and len(said) == 1 and said[0].startswith("host 'h1' idle")
    assert [(host, stopping) for host, _, _, stopping in told] == [("h1", False)]
    assert steps == [("h1", 20, 3)] and watcher.stop_reason is None


def test_an_agents_usage_line_is_one_shape_checked_sample_of_its_own_run(tmp_path, monkeypatch) -> None:
    """UsageFeed's line: the prefix, then what the watcher reads as this host's sample (its run's
    tagged processes only: a process of the run started here counts, this test's own does not)."""
    monkeypatch.chdir(tmp_path)
    env = {**os.environ, ENV_RUN_ID: "20261202-000000-feed", ENV_HOST: "h1"}
    tagged = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        lines: list[bytes] = []
        feed = UsageFeed(0.05, "20261202-000000-feed", "h1", lines.append)
        deadline = time.monotonic() + 30
        while not lines and time.monotonic() < deadline:
            time.sleep(0.05)
        feed.stop()
    finally:
        tagged.kill()
        tagged.wait()
    text = lines[0].decode()
    assert text.startswith(AGENT_USAGE_PREFIX) and text.endswith("\n")
    sample = idle.read_usage("h1", text[len(AGENT_USAGE_PREFIX):])
    assert [pid for pid, _ in sample.per_pid] == [tagged.pid] and sample.procs == 1 and sample.checkpoint is None
