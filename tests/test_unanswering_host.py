"""A host that never answers cannot stall the controller (issue 20, item 2).

The hosts are stand-in sshds on loopback (tests/standin_sshd.py): they accept the connection and
the test's key, and then one never answers a request to run a command (MUTE), one accepts every
command and never sends a byte (SILENT), and one is an honest host whose login user is not root
and whose run directory holds 3000 files it cannot read (REAL, as uid 65534). Real `meshrun`
commands and the real edge functions run against them, with real rsync and OpenSSH. Each must
come back, with one line naming the host and what it did not answer, and leave no rsync or ssh
running. The outer timeouts only prove that a call returns at all; they assert no speed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, cast

import pytest

from meshrun.deploy.commands.setup import SetupRequest, setup_host
from meshrun.deploy.edges.checkpointpush import push_checkpoints
from meshrun.deploy.edges import rsyncrun
from meshrun.deploy.edges import sync as sync_edge
from meshrun.deploy.edges.datasync import DataSpec, sync_data
from meshrun.deploy.edges.fetch import Staging, fetch_argv, prepare_staging, transfer
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.edges.sessions import sessions_to
from meshrun.deploy.edges.transport import Session, SshSession
from meshrun.deploy.edges.wheel import Identity
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.inventory.selection import select_hosts
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.requirements import Requirements
from meshrun.layout import CHECKPOINTS
from tests.standin_sshd import Keys, Mode, StandinSshd

pytestmark = pytest.mark.waits  # deadlines and hosts that never answer: little CPU (tests/conftest.py)
MESHRUN = str(Path(sys.executable).parent / "meshrun")
RUN_ID = "20261201-120000-abcd"
OUTER_S = 240  # proves a command returns; far above any bound meshrun sets for these calls
UNREADABLE = 3000


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys.make(tmp_path_factory.mktemp("standin-keys"))


@pytest.fixture(scope="module")
def mute(keys: Keys) -> Iterator[StandinSshd]:
    with StandinSshd(keys, Mode.MUTE) as sshd:
        yield sshd


@pytest.fixture(scope="module")
def silent(keys: Keys) -> Iterator[StandinSshd]:
    with StandinSshd(keys, Mode.SILENT) as sshd:
        yield sshd


def make_project(root: Path, keys: Keys, sshd: StandinSshd) -> Path:
    """A git project whose inventory's one host `h1` is the stand-in, and a detached run on it."""
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True, timeout=30)
    inventory = root / "inventory" / "hosts.yaml"
    inventory.parent.mkdir(exist_ok=True)
    inventory.write_text(f"hosts:\n  h1:\n    address: 127.0.0.1\n    port: {sshd.port}\n    user: root\n"
                         f"    identity: {keys.client_key}\n    python: {sys.executable}\n"
                         f"known_hosts: {root / 'inventory' / 'known_hosts'}\n")
    (root / "inventory" / "known_hosts").write_text(sshd.known_hosts_line())
    RunRecord(RUN_ID, str(inventory), ("h1",), time.time() - 60, True, f"127.0.0.1:{sshd.port}").save(root / "runs")
    return root


def meshrun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`meshrun ARGS` in its own process group; the group is killed if it outlives OUTER_S."""
    env = {k: v for k, v in os.environ.items() if k != "MESHRUN_INVENTORY"}
    proc = subprocess.Popen([MESHRUN, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=OUTER_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"meshrun {' '.join(args)} still running after {OUTER_S} s:\n{out[-2000:]}{err[-2000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def returns(fn: Callable[[], object]) -> object:
    """fn()'s value or the exception it raised, from a thread given OUTER_S to come back."""
    box: list[object] = []

    def call() -> None:
        try:
            box.append(fn())
        except BaseException as err:  # noqa: BLE001 - handed to the test
            box.append(err)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(OUTER_S)
    assert not thread.is_alive(), f"still waiting after {OUTER_S} s"
    return box[0]


def processes_naming(text: str) -> list[str]:
    """Live processes of this machine whose command line holds `text` (a port, a folder)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in argv and state != b"Z" and int(entry) != os.getpid():
            found.append(f"{entry}: {argv}")
    return found


@pytest.fixture(scope="module")
def mute_project(tmp_path_factory: pytest.TempPathFactory, keys: Keys, mute: StandinSshd) -> Path:
    return make_project(tmp_path_factory.mktemp("mute") / "proj", keys, mute)


UNANSWERED = "its sshd accepted the connection but did not answer the request to "


@pytest.mark.parametrize("args", [("logs", "--run", RUN_ID), ("logs", "-f", "--run", RUN_ID),
                                  ("stop", "--run", RUN_ID)])
def test_logs_and_stop_give_up_on_a_host_that_never_runs_the_command(mute_project: Path, args: tuple[str, ...]) -> None:
    done = meshrun(*args, cwd=mute_project)
    assert done.returncode == 1, done
    assert f"host 'h1': {UNANSWERED}" in done.stdout + done.stderr, done
    assert "Traceback" not in done.stdout + done.stderr


def test_status_names_what_the_host_did_not_answer(mute_project: Path) -> None:
    """`fab status` gave up before too, but said only "no answer within 30 s"."""
    done = meshrun("status", "--json", "--run", RUN_ID, cwd=mute_project)
    assert done.returncode == 0, done
    assert '"state": "unreachable"' in done.stdout and UNANSWERED in done.stdout, done


def test_train_preflight_and_launch_give_up_on_a_host_that_never_runs_the_command(mute_project: Path) -> None:
    """The pre-flight's first command, and with --skip-checks --no-sync the agent's start itself:
    the run then ends FAILED with a summary, its message naming the host."""
    preflight = meshrun("train", "--hosts", "h1", cwd=mute_project)
    assert preflight.returncode == 1 and "host 'h1'" in preflight.stdout + preflight.stderr, preflight
    assert UNANSWERED in preflight.stdout + preflight.stderr, preflight
    launch = meshrun("train", "--hosts", "h1", "--skip-checks", "--no-sync", cwd=mute_project)
    text = launch.stdout + launch.stderr
    assert launch.returncode == 1 and f"host 'h1': {UNANSWERED}" in text, launch
    assert "Traceback" not in text


def test_the_link_probe_declares_a_stuck_sshd_down(mute_project: Path) -> None:
    """The launcher's liveness probe (SshSession.ping) asks the host's sshd for a channel and closes
    it unused: no shell is forked on the host every 2 s (docs/scale.md). The mute stand-in grants
    channels until a request to run a command arrives, and from then on answers nothing, as an sshd
    stuck in that request would: the probe says alive before it and False after it, in bounded time
    both, so a stuck host is declared lost."""
    inventory = load_inventory(mute_project / "inventory" / "hosts.yaml")
    session = SshSession(inventory.host("h1"), inventory.known_hosts).open()
    try:
        assert returns(lambda: session.ping(timeout=3.0)) is True
        with pytest.raises(MeshrunError, match=UNANSWERED):
            session.run(["true"], timeout=5)
        assert returns(lambda: session.ping(timeout=3.0)) is False
    finally:
        session.close()


@pytest.fixture(scope="module")
def silent_project(tmp_path_factory: pytest.TempPathFactory, keys: Keys, silent: StandinSshd) -> Path:
    root = make_project(tmp_path_factory.mktemp("silent") / "proj", keys, silent)
    (root / "train.py").write_text("print('hello')\n")
    checkpoints = root / "runs" / RUN_ID / CHECKPOINTS
    checkpoints.mkdir(parents=True)
    (checkpoints / "ckpt-step000000001.pt").write_bytes(b"weights")
    (checkpoints / "MANIFEST.sha256").write_text(f"{'0' * 64}  ckpt-step000000001.pt\n")
    return root


def _code_sync(root: Path, host: Host, known_hosts: Path) -> None:
    sync_edge.sync_host(host, root, known_hosts, b"train.py\0", lambda _h, _p: None, OUTER_S)


def _fetch(root: Path, host: Host, known_hosts: Path) -> None:
    staging = Staging(root / "runs" / RUN_ID / ".incoming" / host.name)
    prepare_staging(staging)
    transfer(fetch_argv(host, RUN_ID, staging, root, known_hosts), host.name, lambda _h, _p: None)


def _data_sync(root: Path, host: Host, known_hosts: Path) -> None:
    spec = DataSpec(root / "runs" / RUN_ID / CHECKPOINTS, "data/x")
    with sessions_to((host,), load_inventory(root / "inventory" / "hosts.yaml"), root) as sessions:
        sync_data(host, sessions[host.name], sys.executable, spec, {}, root, known_hosts, OUTER_S)


def _resume_push(root: Path, host: Host, known_hosts: Path) -> None:
    inventory = load_inventory(root / "inventory" / "hosts.yaml")
    with sessions_to((host,), inventory, root) as sessions:
        push_checkpoints(select_hosts(inventory, host.name), sessions, RUN_ID, inventory, Project(root, root / "runs"),
                         Renderer())


def _wheel_push(root: Path, host: Host, known_hosts: Path) -> None:
    wheel = root / "wheel" / "meshrun-0-py3-none-any.whl"
    wheel.parent.mkdir(exist_ok=True)
    wheel.write_bytes(b"a wheel")
    request = SetupRequest("python3", None, wheel, Identity("0", "b" * 16), Requirements(None, ()))
    inventory = load_inventory(root / "inventory" / "hosts.yaml")
    setup_host(host, cast(Session, None), request, root, inventory)  # the push comes first: no session is used


@pytest.mark.parametrize(("transfer_with", "what"), [
    (_code_sync, "code sync"), (_fetch, "fetch"), (_data_sync, "data sync"),
    (_resume_push, f"pushing the checkpoints of {RUN_ID}"), (_wheel_push, "pushing meshrun's wheel")])
def test_every_rsync_gives_up_on_a_host_that_sends_nothing(silent_project: Path, silent: StandinSshd,
                                                          monkeypatch: pytest.MonkeyPatch, transfer_with: Callable,
                                                          what: str) -> None:
    """The host's sshd starts rsync's command and then sends nothing: rsync's own I/O timeout
    (shortened here; every argv carries it, test_fetch_rules) ends the transfer, the message
    names the host, the transfer and rsync's last words, and neither rsync nor its ssh is left."""
    monkeypatch.setattr(rsyncrun, "RSYNC_IO_TIMEOUT_S", 3)
    inventory = load_inventory(silent_project / "inventory" / "hosts.yaml")
    host = inventory.host("h1")
    failure = returns(lambda: transfer_with(silent_project, host, inventory.known_hosts))
    assert isinstance(failure, MeshrunError), failure
    assert str(failure).startswith(f"host 'h1': {what} failed (rsync exit 30: no data from the host for 3 s): "), failure
    assert "timeout" in str(failure).split("):", 1)[1], failure  # rsync's own line
    assert processes_naming(f"-p {silent.port} ") == []


NOBODY = 65534


@pytest.fixture(scope="module")
def honest_home() -> Iterator[Path]:
    """The host's home, as its login user (uid 65534) sees it: its workdir `meshrun/` is root's
    (nothing can be written there) and the run directory holds UNREADABLE files it cannot read.
    Under /tmp, not pytest's folder, which uid 65534 cannot enter."""
    home = Path(tempfile.mkdtemp(prefix="meshrun-standin-home-"))
    home.chmod(0o755)
    run = home / "meshrun" / "runs" / RUN_ID
    (run / "metrics").mkdir(parents=True)
    (run / "train.log").write_text("hello\n")
    for n in range(UNREADABLE):
        path = run / "metrics" / f"part-{n:05d}.jsonl"
        path.write_text("{}\n")
        path.chmod(0)
    for folder in (home / "meshrun", home / "meshrun" / "runs", run, run / "metrics"):
        folder.chmod(0o755)
    yield home
    shutil.rmtree(home)


@pytest.fixture(scope="module")
def honest(keys: Keys, honest_home: Path) -> Iterator[StandinSshd]:
    with StandinSshd(keys, Mode.REAL, home=honest_home, uid=NOBODY) as sshd:
        yield sshd


@pytest.fixture(scope="module")
def honest_project(tmp_path_factory: pytest.TempPathFactory, keys: Keys, honest: StandinSshd) -> Path:
    """A project of UNREADABLE + a few files, none of which the host's user may write."""
    root = make_project(tmp_path_factory.mktemp("honest") / "proj", keys, honest)
    for n in range(UNREADABLE):
        (root / f"part-{n:05d}.py").write_text("")
    return root


@pytest.mark.parametrize(("args", "what"), [(("sync", "--hosts", "h1"), "code sync"),
                                            (("fetch-checkpoints", "--run", RUN_ID), "fetch")])
def test_thousands_of_rsync_errors_cannot_block_it(honest_project: Path, honest: StandinSshd,
                                                   args: tuple[str, ...], what: str) -> None:
    """An honest host whose user cannot write the workdir (sync) or read 3000 files (fetch):
    rsync says so once per file on stderr, more than a pipe holds, while its stdout is still
    open. Both are read at once: the command ends with rsync's last words, and nothing is left."""
    done = meshrun(*args, cwd=honest_project)
    text = done.stdout + done.stderr
    assert done.returncode == 1, done
    assert f"host 'h1': {what} failed (rsync exit 23): " in text, text[-3000:]
    assert "Permission denied (13)" in text and "some files/attrs were not transferred" in text, text[-3000:]
    assert processes_naming(f"-p {honest.port} ") == []


def test_a_host_that_never_reads_its_stdin_costs_a_send_its_timeout(silent_project: Path) -> None:
    """The silent host runs the command and never reads what it is sent, so its SSH window fills
    (paramiko's 2 MiB). `sendall` waited for room without end: a launch's env block, the heartbeat
    thread (no host got heartbeats any more) and Ctrl-C all hung on it. A send now gives up after
    its timeout, and at once with timeout 0 (the heartbeat's)."""
    inventory = load_inventory(silent_project / "inventory" / "hosts.yaml")
    host = inventory.host("h1")
    with sessions_to((host,), inventory, silent_project) as sessions:
        stream = sessions["h1"].start(["cat"])
        try:
            assert returns(lambda: stream.send(b"x" * (8 << 20), timeout=1.0)) is False
            assert returns(lambda: stream.send(b"\n", timeout=0)) is False
            stream.close_stdin()
            assert returns(lambda: stream.send(b"\n", timeout=5.0)) is False  # closed: no spin, no wait
        finally:
            stream.abandon()


def test_a_failed_connect_leaves_no_reader_on_the_hosts_socket(tmp_path: Path, keys: Keys,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A host whose SSH greeting never ends: the connect fails at its timeout, and Fabric's close()
    does nothing before a connect has returned, so paramiko's reader went on reading (uncapped) on
    an open socket, one more at each retry of an elastic run's rejoin. The socket is now closed:
    the host sees it."""
    import socket

    from meshrun.deploy.edges.transport import connect

    monkeypatch.setenv("MESHRUN_SSH_CONFIG", os.devnull)
    closed = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as server:
        def babble() -> None:
            conn, _ = server.accept()
            with conn:
                try:
                    while True:
                        conn.sendall(b"x" * 64)
                        time.sleep(0.01)
                except OSError:
                    closed.set()

        threading.Thread(target=babble, daemon=True).start()
        host = Host("h1", "127.0.0.1", ssh_address=None, user="root", port=server.getsockname()[1],
                    identity=str(keys.client_key),
                    python=None, workdir="~/meshrun", network=None, gpus=None, nproc=1, batch_size=None, env=())
        failure = returns(lambda: connect(host, None, tmp_path, timeout=2))
        assert isinstance(failure, MeshrunError) and str(failure).startswith("host 'h1': "), failure
        assert closed.wait(10), "the controller still holds the connection open"
