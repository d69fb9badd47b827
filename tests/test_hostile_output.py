"""Remote output is data, not code (issue 12, hole 7), against hostile hosts on the simulated
cluster (real sshd, agents, torchrun): a host that prints terminal control sequences, a host
whose agent answers garbage or cut-off JSON, a host that cuts a metrics line short, and an sshd
port that answers a garbage banner. The pure parts are in tests/test_remote_output.py.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from meshrun.deploy.edges.records import RunRecord, new_run_id
from tests.fabrun import ROOT, fab, run_id_of

pytestmark = [pytest.mark.cluster, pytest.mark.either_cluster]

WORKDIR = "/root/meshrun"
UNSAFE = [chr(c) for c in (*range(0x00, 0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0))]


def unsafe_in(text: str) -> list[str]:
    return sorted({repr(c) for c in text if c in UNSAFE})


def test_control_sequences_from_a_host_reach_the_terminal_escaped(testbed, inventory: Path) -> None:
    done = fab("train", "--inventory", str(inventory), "--hosts", "h1,h2", "--script", "tests/scripts/print_escapes.py",
               timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert unsafe_in(done.stdout + done.stderr) == []
    shown = [line for line in done.stdout.splitlines() if "ESCAPES " in line]
    assert len(shown) == 2 and all("\\x1b]0;pwned\\x07 \\x1b[2J \\x1b[31mred\\x1b[0m \\x1bP1$r\\x1b\\ \\x9b31m" in line
                                   for line in shown), shown
    # The controller's copy of the log keeps what the host sent, as it sent it (docs/security.md).
    log = (ROOT / "runs" / run_id_of(done.stdout) / "logs" / "h2.log").read_text()
    assert "\x1b]0;pwned\x07 \x1b[2J" in log


EVIL_AGENT = "#!/bin/sh\ncat /root/evil-answer\n"


@pytest.mark.parametrize("answer", ["garbage \x1b]0;pwned\x07\n", '[{"run_id": "RUN", "state": "runn'],
                         ids=["garbage", "truncated"])
def test_status_shows_a_garbage_answering_host_as_unknown(testbed, make_inventory, answer: str) -> None:
    """The host's `python` is a program that answers whatever it likes to the status query."""
    testbed.exec(2, ["sh", "-c", "cat > /root/evil-agent && chmod +x /root/evil-agent"], input=EVIL_AGENT)
    inventory = make_inventory(host_overrides={"h2": {"python": "/root/evil-agent"}})
    run_id = new_run_id()
    testbed.exec(2, ["sh", "-c", "cat > /root/evil-answer"], input=answer.replace("RUN", run_id))
    RunRecord(run_id, str(inventory), ("h1", "h2"), time.time() - 3600, True,
              f"{testbed.host(1).address}:29400").save(ROOT / "runs")
    as_json = fab("status", "--run", run_id, "--json", timeout=120)
    assert as_json.returncode == 0 and as_json.stderr == "", as_json.stderr
    states = {s["host"]: s for s in json.loads(as_json.stdout)}
    assert states["h2"]["state"] == "unknown" and states["h2"]["detail"].startswith("the agent's answer is not JSON")
    assert "\n" not in states["h2"]["detail"]
    assert states["h1"]["state"] == "unknown" and states["h1"]["detail"] == "the agent does not know this run"
    table = fab("status", "--run", run_id, timeout=120)
    assert table.returncode == 0 and "internal error" not in table.stderr, table.stderr
    assert "unknown" in table.stdout and unsafe_in(table.stdout + table.stderr) == []


def _cut_metrics_lines(testbed, run: dict, stop: threading.Event) -> None:
    """A hostile (or crashing) rank 0 host: as soon as a run's metrics file has its first records,
    append a line cut short (no newline: the trainer's next record lands on the same, broken line).
    Not as soon as it appears: a fresh start opens the file, then sets aside what an earlier run left
    there (train/metrics.py `set_aside_earlier_run`), and a cut line that lands in between goes aside
    with it (it did, in a CI run); nothing is written to the file before that."""
    while not stop.is_set():
        found = testbed.exec(1, ["sh", "-c", f'for f in {WORKDIR}/runs/*/metrics.rank0.jsonl; do '
                                 '[ -s "$f" ] && echo "$f"; done; true'], check=False).stdout.split()
        fresh = [f for f in found if f not in run["before"]]
        if fresh:
            testbed.exec(1, ["sh", "-c", 'printf %s \'{"kind": "comm", "comm_s": 0.0\' >> "$1"', "sh", fresh[0]])
            run["cut"] = fresh[0]
            return
        time.sleep(0.2)


def test_a_cut_metrics_line_still_gives_a_comm_run_its_summary(testbed, make_inventory) -> None:
    inventory = make_inventory()
    before = testbed.exec(1, ["sh", "-c", f"ls {WORKDIR}/runs/*/metrics.rank0.jsonl 2>/dev/null"],
                          check=False).stdout.split()
    run: dict = {"before": set(before)}
    stop = threading.Event()
    cutter = threading.Thread(target=_cut_metrics_lines, args=(testbed, run, stop), daemon=True)
    cutter.start()
    try:
        done = fab("train", "--inventory", str(inventory), "--hosts", "h1,h2", "--comm", "auto", "--",
                   "epochs=3", "log.tensorboard=false", timeout=400)
    finally:
        stop.set()
        cutter.join()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    run_id = run_id_of(done.stdout)
    assert run.get("cut", "").endswith(f"runs/{run_id}/metrics.rank0.jsonl"), run  # rank 0 was on h1
    text = testbed.exec(1, ["cat", run["cut"]]).stdout
    assert '"comm_s": 0.0{' in text or text.endswith('"comm_s": 0.0')  # the broken line is there
    summary = json.loads((ROOT / "runs" / run_id / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["comm"]["hook"] == "none"


GARBAGE_SSHD = r"""
import socket, sys, time
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(sys.argv[1])))
server.listen(8)
server.settimeout(1)
print("ready", flush=True)
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    try:
        conn, _ = server.accept()
    except OSError:
        continue
    conn.sendall(b"garbage\x1b]0;pwned\x07\r\n")
    time.sleep(0.3)
    conn.close()
"""


def test_a_garbage_ssh_banner_is_one_line_naming_the_host(testbed, make_inventory) -> None:
    port = 2299
    server = testbed.popen(3, ["python3", "-c", GARBAGE_SSHD, str(port), "90"], stdout=subprocess.PIPE,
                           text=True)
    try:
        assert server.stdout is not None and server.stdout.readline() == "ready\n"
        inventory = make_inventory(host_overrides={"h3": {"port": port}})
        done = fab("train", "--inventory", str(inventory), "--hosts", "h1,h3", "--script", "tests/scripts/secret_env.py",
                   timeout=120)
    finally:
        server.kill()
        server.wait()
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "host 'h3': " in lines[0] and "banner" in lines[0], done.stderr
    assert unsafe_in(done.stdout + done.stderr) == []
