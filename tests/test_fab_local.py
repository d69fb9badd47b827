"""`fab train` on the bundled local inventory: real torchrun, real gloo processes, real files."""

from __future__ import annotations

import hashlib
import json
import platform
import re
import signal
import subprocess
import time

import pytest

from meshrun.deploy.host.facts import meshrun_identity
from meshrun.layout import AGENT_USAGE_PREFIX
from tests.cpuhog import cpu_hog
from tests.fabrun import ROOT, FabProcess, fab, run_id_of, run_processes, wait_no_run_processes
from tests.webhook import Receiver

pytestmark = pytest.mark.slow


def _dirty_project() -> dict[str, str]:
    """ROOT as a commit plus edits: a tracked file changed and an untracked one added (both shipped).
    Returns what summary.json's provenance.project must say, computed here by the documented rule."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "add", "-A"], cwd=ROOT, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "base"], cwd=ROOT, check=True)
    with (ROOT / "README.md").open("a") as f:
        f.write("\nlocal edit\n")
    (ROOT / "scratch_note.txt").write_text("not committed\n")
    digests = {p: hashlib.sha256((ROOT / p).read_bytes()).hexdigest() for p in ("README.md", "scratch_note.txt")}
    lines = "".join(f"{digests[p]}  {p}\n" for p in sorted(digests))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {"commit": commit, "diff_sha256": hashlib.sha256(lines.encode()).hexdigest()}


def test_fab_train_local_default_reaches_95_percent_and_writes_summary() -> None:
    expected = _dirty_project()
    done = fab("train", timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_id = run_id_of(done.stdout)
    summary = json.loads((ROOT / "runs" / run_id / "summary.json").read_text())
    assert summary["run_id"] == run_id and summary["status"] == "succeeded"
    assert summary["hosts"] == ["local"] and summary["world_size"] == 2 and summary["restarts"] == 0
    assert summary["epochs_completed"] >= 1 and summary["metrics"]["test_acc"] >= 0.95
    assert summary["duration_s"] > 0
    assert "[local:0] " in done.stdout  # rank-prefixed live logs
    log = (ROOT / "runs" / run_id / "logs" / "local.log").read_text()
    assert "[local:0] " in log and "epoch" in log
    assert not run_processes(run_id)

    # Provenance (issue 23): the dirty tree that shipped, this build, the host's versions, the config, the checkpoints.
    prov = summary["provenance"]
    assert prov["project"] == {"commit": expected["commit"], "dirty": True, "diff_sha256": expected["diff_sha256"],
                               "changed_files": ["README.md", "scratch_note.txt"], "changed_count": 2}
    build = prov["meshrun"]  # this controller's build (not compared with this process's: helpers edit the tree)
    assert build["version"] == meshrun_identity()["version"] and re.fullmatch(r"[0-9a-f]{12}", build["build"])
    import torch  # what the host's torch says of itself, imported (the provenance probe reads files instead)

    assert prov["hosts"] == {"local": {
        "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())), "torch_error": None,
        "meshrun": f"{build['version']} (build {build['build']})", "gpus": []}}  # no GPU on this machine
    ckpt_dir = ROOT / "runs" / run_id / "checkpoints"
    on_disk = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in ckpt_dir.glob("*.pt")}
    assert on_disk and prov["checkpoints"] == {"host": "local", "files": on_disk}
    config_line = next(json.loads(line) for line in (ROOT / "runs" / run_id / "metrics.jsonl").open()
                       if '"kind": "config"' in line)
    assert prov["trainer_config"] == config_line["config"] and prov["links"] is None

    assert_report_shows_the_run(run_id, summary, expected)


@pytest.mark.parametrize("sig,limit", [(signal.SIGINT, 15.0), (signal.SIGKILL, 30.0)])
def test_interrupted_or_killed_controller_leaves_no_process(sig: int, limit: float) -> None:
    """Ctrl-C stops the run everywhere; a SIGKILLed controller's agent notices EOF and stops it."""
    # Paced (20 ms a step asleep): the run only has to be running while it is watched and stopped, and
    # at full speed its 2 ranks took both cores for that whole time.
    fab_run = FabProcess("train", "--", "epochs=500", "debug.step_sleep_seconds=0.02")
    try:
        run_id = run_id_of(fab_run.wait_for(r"\[local:0\] epoch 1 ", timeout=120))
        assert run_processes(run_id)
        if sig == signal.SIGINT:  # issue 23, item 1: the live view of the same run, two frames, read only
            view = fab("status", "--watch", "--frames", "6", "--run", run_id, timeout=90, env={"COLUMNS": "200"})
            assert view.returncode == 0, view.stdout + view.stderr
            frames = view.stdout.split(f"run {run_id} — ")[1:]
            # host, state, ranks, generation, epoch, step, samples/s now / average, last progress, rtt (standalone: -)
            row = r"│ local +│ running +│ 2 +│ 0 +│ \d+ +│ \d+ +│ (\d+|-) / \d+ +│ \d+ s ago +│ - +│"
            # The view never waits for a host: a frame drawn before the first answer says so (a loaded
            # machine's CI drew one), and every frame from the first answer on shows the run.
            asked = r"│ local +│ asking +│ - +│ - +│ - +│ - +│ - +│ - +│ - +│ - +│ - +│ - +│ never +│"
            answered = next((i for i, f in enumerate(frames) if not re.search(asked, f)), len(frames))
            assert len(frames) == 6 and answered <= 2 and all(re.search(row, f) for f in frames[answered:]), view.stdout
            assert any(re.search(r"│ \d+ / \d+ +│", f) for f in frames), view.stdout  # two progress answers
            assert any(re.search(r"│ CPU \d+% +│ RSS \d+\.\d +│ - +│ \d+ s ago", f) for f in frames), view.stdout
            assert re.search(r"world 2 rank\(s\) on 1 host\(s\) · epoch \d+/500 · step \d+ .* · ETA \d+ (h|min|s)",
                             " ".join(frames[-1].split())), frames[-1]
            assert "last events" in frames[-1] and "local started: agent started at generation 0" in frames[-1]
            found = json.loads(fab("status", "--watch", "--json", "--run", run_id, timeout=60).stdout)
            assert [(r["host"], r["state"], r["ranks"], r["generation"]) for r in found["hosts"]] == [
                ("local", "running", "2", "0")]
            assert found["run"].startswith("world 2 rank(s) on 1 host(s) · epoch ") and " · ETA " in found["run"]
            texts = [e["text"] for e in found["events"]]  # the controller's, the agent's, the newest checkpoint
            assert {"local started; world size 2", "local started: agent started at generation 0"} <= set(texts), texts
            assert any(re.fullmatch(r"checkpoint saved at step \d+ \(local\)", t) for t in texts), texts
        with cpu_hog():  # the bound must hold on a loaded machine
            if sig == signal.SIGINT:
                fab_run.signal_group(sig)  # what a terminal's Ctrl-C does
            else:
                fab_run.proc.kill()  # only the controller: its agent must notice
            wait_no_run_processes(run_id, timeout=limit)
        if sig == signal.SIGINT:
            assert fab_run.finish(timeout=60) == 130, fab_run.output[-2000:]  # 128 + SIGINT, as any task
            summary = json.loads((ROOT / "runs" / run_id / "summary.json").read_text())
            assert summary["status"] == "stopped"
            assert "every host is clean" in fab_run.output
    finally:
        fab_run.close()


def assert_report_shows_the_run(run_id: str, summary: dict, expected: dict) -> None:
    """fab report on the same run: a table, JSON, and a real PNG with curves in it."""
    prov, build = summary["provenance"], summary["provenance"]["meshrun"]
    shown = fab("report", "--run", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "local" in shown.stdout and "samples/s" in shown.stdout
    assert f"project: commit {expected['commit']}, dirty: 2 file(s) differ, diff sha256 {expected['diff_sha256']}" \
        in shown.stdout
    assert f"meshrun: {build['version']} (build {build['build']})" in shown.stdout
    data = json.loads(fab("report", "--run", run_id, "--json").stdout)
    assert data["provenance"] == prov
    assert data["final_test_acc"] == pytest.approx(summary["metrics"]["test_acc"])
    assert [r["rank"] for r in data["ranks"]] == [0, 1] and data["total_samples_per_s"] > 0
    png = ROOT / "runs" / run_id / "report.png"
    import matplotlib.image

    pixels = matplotlib.image.imread(png)
    assert pixels.shape[0] >= 300 and pixels.shape[1] >= 900
    assert pixels[..., :3].std() > 0.05  # not a blank canvas


def test_an_idle_run_is_warned_about_then_stopped() -> None:
    """Issue 23, item 3: a script that sleeps after its first seconds of work. The local host's run
    processes use almost no CPU: a WARN after --idle-warn (3 s here), then --idle-stop (9 s) stops
    the run; the summary says why and lists the warning."""
    receiver = Receiver()  # and the run's notifications: the idle warning, the stop
    try:
        done = fab("train", "--skip-checks", "--script", "tests/idle_worker.py", "--idle-warn", "0.05",
                   "--idle-stop", "0.15", "--notify", receiver.url, timeout=240)
    finally:
        receiver.close()
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    run_id = run_id_of(done.stdout)
    out = " ".join((done.stdout + done.stderr).split())  # rich wraps long lines; warnings go to stderr
    assert "now sleeping" in out and "host 'local' idle: its run's processes under 10% utilisation for" in out
    assert "stopping the run: host 'local' idle for" in out
    summary = json.loads((ROOT / "runs" / run_id / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["reason"].startswith("host 'local' idle for ")
    assert [w["host"] for w in summary["idle"]] == ["local"] and summary["idle"][0]["idle_s"] >= 3
    assert not run_processes(run_id)
    assert [(b["event"], b.get("host"), b.get("stopping")) for b in receiver.bodies] == [
        ("started", None, None), ("idle", "local", False), ("idle", "local", True), ("stopped", None, None)]
    assert receiver.bodies[-1]["reason"] == summary["reason"]
    # The samples came from the host's agent (deploy/host/idle.py UsageFeed, the only source of an
    # attached run's): taken out of the stream, they are in no log and not on the console.
    logs = [p.read_text(errors="replace") for p in (ROOT / "runs" / run_id).rglob("*.log")]
    assert logs and not any(AGENT_USAGE_PREFIX in text for text in logs) and AGENT_USAGE_PREFIX not in out


def test_a_detached_idle_run_is_warned_about_and_stopped_by_its_agent() -> None:
    """The same sleeping script, detached: no controller watches it, so the local host's agent
    applies the idle rule (common/idlerule.py) to its own host: it journals, prints and sends the
    warning and the stop (its own host's events), then stops its part of the run."""
    receiver, run_id = Receiver(), ""
    try:
        started = fab("train", "--skip-checks", "--detach", "--script", "tests/idle_worker.py", "--idle-warn", "0.05",
                      "--idle-stop", "0.15", "--notify", receiver.url, timeout=240)
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        run_id = run_id_of(started.stdout)
        host = ROOT / "runs" / run_id / "hosts" / "local"
        deadline = time.monotonic() + 120
        while run_processes(run_id) or not (host / "exit.json").exists():
            assert time.monotonic() < deadline, "the detached idle run was not stopped"
            time.sleep(0.5)
        with receiver.got:
            receiver.got.wait_for(lambda: len(receiver.bodies) >= 4, 10)
    finally:
        receiver.close()
        if run_id and run_processes(run_id):  # a failed run must not outlive its test
            fab("stop", "--run", run_id, timeout=120)
    journal = [json.loads(line) for line in (host / "events.jsonl").read_text().splitlines()]
    idle = [e["text"] for e in journal if e["event"] == "idle"]
    assert len(idle) == 2 and idle[0].startswith("host 'local' idle: its run's processes under 10% utilisation for")
    assert re.fullmatch(r"host 'local' idle for \d+ s \(--idle-stop\)", idle[1]), idle
    exit_record = json.loads((host / "exit.json").read_text())
    assert exit_record["reason"] == idle[1]
    assert [(b["event"], b.get("host"), b.get("stopping")) for b in receiver.bodies] == [
        ("started", None, None), ("idle", "local", False), ("idle", "local", True), ("stopped", None, None)]
    assert receiver.bodies[1]["idle_s"] >= 3 and receiver.bodies[-1]["reason"] == idle[1]
    assert "now sleeping" in (host / "train.log").read_text()
