"""A disk that fills during a long run costs only the files it cannot hold (findings: "a run that
lasts days or weeks", 2). On the controller, a host's reader that died on a full disk never set its
`done`: the host looked alive for ever and an attached `fab train` never concluded. On a host, the
agent's tee died on a full train.log: torchrun's pipe was never read again, and once it filled
torchrun's `--tee` tails blocked (torchrun's end waits for them), so the run never ended there.

Real files and processes: /dev/full is the kernel's own full disk (every write: ENOSPC), and a
process's file-size limit (RLIMIT_FSIZE, EFBIG) is a disk that fills at a byte we choose and has
room again when the limit is raised. Only the console that ends rich's broken-pipe path is a stand-in
(rich then redirects this very process's stdout to /dev/null)."""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import threading
import io
import time
from pathlib import Path

import pytest

from meshrun.deploy.edges.hostlines import read_host
from meshrun.deploy.edges.livehost import LiveHost
from meshrun.deploy.edges.transport import LocalSession
from meshrun.deploy.inventory.model import Host, Network, Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.render.neutral import NeutralConsole
from meshrun.deploy.run.plan import LaunchOptions, plan_launch
from meshrun.layout import AGENT_PIDFILE, AGENT_USAGE_PREFIX, EXIT_RECORD, TRAIN_LOG, host_dir

REPO = Path(__file__).resolve().parents[1]
LINES = 3000  # of an agent's output; each ~70 bytes: past a pipe's 64 KiB


def host(name: str) -> Host:
    return Host(name, "127.0.0.1", ssh_address=None, user="root", port=22, identity=None, python=sys.executable,
                workdir=".", network=Network.LAN, gpus=None, nproc=None, batch_size=None, env=())


def live_host(tmp_path: Path, log: Path, script: str) -> LiveHost:
    """Host h1 of a one-host plan whose stream is a real local process running `script`."""
    h1 = host("h1")
    plan = plan_launch(Selection((h1,), Rendezvous("h1", 29400)), LaunchOptions("r1"), {}, "/p")
    session = LocalSession(h1, tmp_path)
    live = LiveHost(plan.hosts[0], session, log)
    live.stream = session.start([sys.executable, "-c", script])
    return live


CHATTY_AGENT = f"for i in range({LINES}):\n    print(f'line {{i}} ' + 'x' * 60, flush=i % 500 == 0)\n"


def read_to_end(live: LiveHost, sink) -> None:  # type: ignore[no-untyped-def]
    reader = threading.Thread(target=read_host, args=(live, sink, None), daemon=True)
    reader.start()
    assert live.done.wait(60), "the host's reader died: the launcher would see it running for ever"
    reader.join(5)


def test_a_log_the_disk_refuses_is_said_once_and_every_line_still_reaches_the_console(tmp_path: Path) -> None:
    shown: list[str] = []
    live = live_host(tmp_path, Path("/dev/full"), CHATTY_AGENT)
    read_to_end(live, lambda _host, text: shown.append(text))
    assert (live.rc, live.lost) == (0, False)
    assert shown[0] == ("[h1] meshrun: cannot write /dev/full (No space left on device): free space there; this "
                        "host's lines go on to the console meanwhile, and to that file once it can be written")
    assert shown[1:] == [f"[h1] line {i} " + "x" * 60 for i in range(LINES)]
    assert list(live.tail) == shown[-20:]


def test_a_console_the_disk_refuses_leaves_every_line_in_the_hosts_log(tmp_path: Path) -> None:
    """stdout redirected to a file on a full disk: the real Renderer's rich console raises ENOSPC."""
    full = open("/dev/full", "w")
    try:
        renderer = Renderer(NeutralConsole(file=full, highlight=False, soft_wrap=True))
        live = live_host(tmp_path, tmp_path / "h1.log", CHATTY_AGENT)
        read_to_end(live, renderer.log_line)
    finally:
        with contextlib.suppress(OSError):  # what it still buffers has no room either
            full.close()
    assert (live.rc, live.lost) == (0, False)
    assert (tmp_path / "h1.log").read_text().splitlines() == [
        "[h1] line 0 " + "x" * 60,
        "[h1] meshrun: the console cannot be written (No space left on device); this host's lines go on to this "
        "file only",
        *(f"[h1] line {i} " + "x" * 60 for i in range(1, LINES))]


def test_a_console_whose_pipe_closed_does_not_end_the_reading(tmp_path: Path) -> None:
    """rich answers a closed pipe with SystemExit (Console.on_broken_pipe), after pointing this
    process's stdout at /dev/null: raised here as it does, without that redirection."""
    def closed_pipe(_host: str, _text: str) -> None:
        raise SystemExit(1)

    live = live_host(tmp_path, tmp_path / "h1.log", CHATTY_AGENT)
    read_to_end(live, closed_pipe)
    lines = (tmp_path / "h1.log").read_text().splitlines()
    assert (live.rc, live.lost, len(lines)) == (0, False, LINES + 1)
    assert lines[1] == ("[h1] meshrun: the console cannot be written (its pipe is closed); this host's lines go on to "
                        "this file only")


def test_a_console_that_cannot_encode_a_hosts_line_and_a_failing_usage_line_end_nothing(tmp_path: Path) -> None:
    """A review: a latin-1 console (the controller's locale) given a tqdm bar raised UnicodeEncodeError,
    a ValueError, out of the reader, and the healthy host was counted lost; a usage line whose idle
    warning could not be printed did the same. The real Renderer over a latin-1 stream, here."""
    stream = io.TextIOWrapper(io.BytesIO(), encoding="latin-1")
    renderer = Renderer(NeutralConsole(file=stream, force_terminal=False))

    def usage(_host: str, _text: str) -> None:
        raise OSError(28, "No space left on device")

    live = live_host(tmp_path, tmp_path / "h1.log", f"print('\u2588\u2588 50%'); print({AGENT_USAGE_PREFIX!r} + '{{}}'); "
                                                    "print('next')")
    reader = threading.Thread(target=read_host, args=(live, renderer.log_line, usage), daemon=True)
    reader.start()
    assert live.done.wait(60)
    lines = (tmp_path / "h1.log").read_text().splitlines()
    assert (live.rc, live.lost) == (0, False)
    assert lines[0] == "[h1] \u2588\u2588 50%" and lines[-1] == "[h1] next"
    assert lines[1].startswith("[h1] meshrun: the console cannot be written (UnicodeEncodeError: ")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the bug's traceback, as wanted
def test_a_reading_that_ends_in_error_still_ends_the_host_as_lost(tmp_path: Path) -> None:
    """A bug in the reading (here: the console's) is raised as ever, and the host ends, counted lost:
    its stream is read no more."""
    def broken_sink(_host: str, _text: str) -> None:
        raise RuntimeError("a bug")

    live = live_host(tmp_path, tmp_path / "h1.log", CHATTY_AGENT)
    reader = threading.Thread(target=read_host, args=(live, broken_sink, None), daemon=True)
    reader.start()
    assert live.done.wait(30)
    reader.join(30)  # its exception is raised here, under this test's filter, not during the next test
    assert live.lost and live.rc is None
    agent = live.stream.proc  # type: ignore[union-attr]  # unread now: it would wait on its full pipe
    agent.kill()
    agent.wait(30)


# A disk of 25 bytes: "[h1] line N\n" is 12, so two lines fit, the third is cut after one byte,
# the fourth finds no room; then the disk has room again.
FILLING_DISK = """
import resource, signal, sys
from pathlib import Path
from meshrun.deploy.edges.hostlines import HostLog
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a limit passed is then EFBIG, as a full disk's ENOSPC
log = HostLog(Path(sys.argv[1]), "h1")
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (25, hard))
said = [log.write(f"[h1] line {i}") for i in range(4)]
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
said.append(log.write("[h1] line 4"))
log.close()
print([None if err is None else err.strerror for err in said])
"""


def test_the_hosts_log_goes_on_once_the_disk_has_room_and_says_what_it_missed(tmp_path: Path) -> None:
    log = tmp_path / "h1.log"
    done = subprocess.run([sys.executable, "-c", FILLING_DISK, str(log)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.strip() == "[None, None, 'File too large', 'File too large', None]", done.stderr
    assert log.read_text() == ("[h1] line 0\n[h1] line 1\n[\n"
                               "[h1] meshrun: 2 line(s) of this host are missing here: this file could not be written\n"
                               "[h1] line 4\n")


# The run's command: waits until the test has filled the disk, then prints past a pipe's size.
COMMAND = f"""import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
for i in range({LINES}):
    print(f"line {{i}} " + "x" * 60)
sys.exit(3)
"""
# The agent, with SIGXFSZ ignored (kept across exec): a file-size limit then fails its writes with
# EFBIG instead of killing it.
AGENT = """import os, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
os.execv(sys.executable, [sys.executable, "-m", "meshrun.deploy.host.agent", *sys.argv[1:]])
"""


def test_an_agent_whose_disk_is_full_goes_on_teeing_and_ends_with_its_commands_status(tmp_path: Path) -> None:
    """train.log is /dev/full (ENOSPC on every write); once torchrun (here the command) runs, the
    agent can write no file at all (a file-size limit of 0), its exit record included."""
    run_id = "full-" + os.urandom(3).hex()
    run_dir = tmp_path / host_dir(run_id, "local")
    run_dir.mkdir(parents=True)
    (run_dir / TRAIN_LOG).symlink_to("/dev/full")
    go = tmp_path / "go"
    (tmp_path / "command.py").write_text(COMMAND)
    agent = subprocess.Popen([sys.executable, "-c", AGENT, "run", "--run-id", run_id, "--host", "local",
                              "--heartbeat-timeout", "0", "--grace", "2", "--", sys.executable, "command.py", str(go)],
                             cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / AGENT_PIDFILE).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        resource.prlimit(agent.pid, resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
        go.touch()
        out, _ = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.communicate(timeout=30)
    lines = out.decode().splitlines()
    assert agent.returncode == 3, lines[-5:]
    log_line = (f"meshrun-agent: cannot write runs/{run_id}/hosts/local/{TRAIN_LOG} (No space left on device): free "
                "space there; the run goes on, its lines sent to the controller only")
    exit_line = (f"meshrun-agent: cannot write runs/{run_id}/hosts/local/{EXIT_RECORD} (File too large); fab status "
                 "will not know how the run ended")
    assert lines == [log_line, *(f"line {i} " + "x" * 60 for i in range(LINES)), exit_line]
    assert not (run_dir / EXIT_RECORD).exists()
