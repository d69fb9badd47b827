"""What a host sends is held within bounds (issue 20, item 3): a streamed line is cut at
LINE_MAX_BYTES and marked `[… N bytes cut]`, a command's answer keeps its head and tail within
ANSWER_MAX_BYTES and marks the size of the cut. Exact equality on the pure pieces; then 64 MiB
with no newline from a real SSH channel (tests/standin_sshd.py running the command) through
`SshSession.start` (what `fab train` and `fab logs -f` read) and `SshSession.run` (every other
command), with Python's allocations traced: they stay well below what went through."""

from __future__ import annotations

import io
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Iterator

import pytest

from meshrun.deploy.edges.capped import (ANSWER_HEAD_BYTES, ANSWER_MAX_BYTES, LINE_MAX_BYTES, Capped, LineSplitter,
                                         TailLines, cut_mark, read_line, utf8_whole)
from meshrun.deploy.edges.localproc import run_bounded
from meshrun.deploy.host.procs import alive
from meshrun.deploy.edges.transport import LocalSession, SshSession
from meshrun.deploy.inventory.load import load_inventory
from tests.standin_sshd import Keys, Mode, StandinSshd

BIG = 64 << 20  # bytes of one line with no newline
MEMORY_BOUND = 32 << 20  # what reading it may allocate at its peak: half of it (the 4 MiB kept of an answer
# becomes text of 2 bytes a character once the mark's `…` is in it; the old code held all 64 MiB, twice)


def reader(data: bytes) -> io.BufferedReader:
    return io.BufferedReader(io.BytesIO(data))


def test_a_long_line_keeps_its_start_and_says_how_much_was_cut() -> None:
    stream = reader(b"short\n" + b"a" * 10 + b"\n" + b"b" * 25 + b"\nlast")
    assert [read_line(stream.readline, 10) for _ in range(5)] == [
        b"short\n", b"a" * 10 + b"\n", b"b" * 10 + b" " + cut_mark(15) + b"\n", b"last", b""]
    assert cut_mark(15) == "[… 15 bytes cut]".encode()
    assert read_line(reader(b"c" * 30).readline, 10) == b"c" * 10 + b" [\xe2\x80\xa6 20 bytes cut]"
    # A cut never splits a character: the partial one is counted as cut.
    assert read_line(reader("ab€€".encode() + b"\n").readline, 4) == b"ab " + cut_mark(6) + b"\n"
    assert [utf8_whole(b) for b in (b"", b"ab", "a€".encode(), "a€".encode()[:-1], "a€".encode()[:-2], b"\xff")] == \
        [0, 2, 4, 1, 1, 1]


def test_line_splitter_and_tail_lines() -> None:
    splitter = LineSplitter(b"\r\n", limit=8)
    assert splitter.feed(b"one\r 10%\rtwo\nthree-is-") == [b"one", b" 10%", b"two"]
    assert splitter.feed(b"long\nfour") == [b"three-is " + cut_mark(5)]
    assert splitter.flush() == [b"four"] and splitter.flush() == []
    tail = TailLines(2, limit=6)
    for chunk in (b"first\nsecond line\n", b"\n\nthird", b"\xff\n"):
        tail.feed(chunk)
    assert tail.text() == ["second " + "[… 5 bytes cut]", "third\ufffd"]


def test_an_answer_keeps_its_head_and_its_tail() -> None:
    capped = Capped(limit=12, head=4)
    for chunk in (b"HEAD", b"-middle-", b"xx", b"-TAIL1"):
        capped.feed(chunk)
    assert capped.value() == b"HEAD\n" + cut_mark(8) + b"\n" + b"xx-TAIL1" and capped.total == 20
    small = Capped()
    small.feed(b"{}\n")
    assert small.text() == "{}\n"
    assert (ANSWER_HEAD_BYTES, LINE_MAX_BYTES) < (ANSWER_MAX_BYTES, ANSWER_MAX_BYTES)


def test_a_local_command_reads_both_pipes_at_once_and_keeps_its_answer_bounded(tmp_path: Path) -> None:
    """`address: local`: 8 MiB on stdout and 8 MiB on stderr, interleaved (each over a pipe's
    size while the other is full), held capped; the last line of stdout survives."""
    script = ("import sys\nfor _ in range(128):\n    sys.stdout.write('o' * 65536); sys.stderr.write('e' * 65536)\n"
              "print(); print('{\"done\": true}')\n")
    session = LocalSession(load_inventory_local(tmp_path), tmp_path)
    result = session.run([sys.executable, "-c", script], timeout=120)
    cut = (128 << 16) + 1 - ANSWER_MAX_BYTES + len('{"done": true}\n')
    assert result.rc == 0 and result.last_json() == {"done": True}
    assert result.stdout.startswith("o" * ANSWER_HEAD_BYTES + "\n" + f"[… {cut} bytes cut]\n")
    assert len(result.stderr.encode()) < ANSWER_MAX_BYTES + 100
    assert run_bounded(["sleep", "30"], timeout=0.5, on_stdout=print, on_stderr=print) is None


CHILD_OF_A_KILLED_CONTROLLER = '''
import sys
from concurrent.futures import ThreadPoolExecutor
from meshrun.deploy.edges.localproc import run_bounded
from meshrun.deploy.host.procs import alive

def out(data):
    sys.stdout.buffer.write(data); sys.stdout.flush()

with ThreadPoolExecutor(2) as pool:  # started from a worker thread, as the fan-out starts rsync
    pool.submit(run_bounded, ["sh", "-c", "echo $$; exec sleep 60"], timeout=120, on_stdout=out, on_stderr=out)
'''


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_controller_killed_outright_takes_its_local_commands_with_it() -> None:
    """SIGKILL runs no exit handler: the child (in a group of its own, so a signal to the
    controller's group misses it) still goes with its parent. Before, it ran on: a fetch's rsync
    went on writing into the staging tree under the next fetch (CI, test_fetch_hostile)."""
    controller = subprocess.Popen([sys.executable, "-c", CHILD_OF_A_KILLED_CONTROLLER], stdout=subprocess.PIPE)
    try:
        assert controller.stdout is not None
        child = int(controller.stdout.readline())
        assert alive(child)
        controller.kill()
        controller.wait()
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), f"pid {child} outlived its controller"
    finally:
        controller.kill()


def test_ctrl_c_during_a_local_command_ends_its_group() -> None:
    """KeyboardInterrupt while the main thread waits on rsync (a resume's checkpoint push, a local
    host's command): the exit handler no longer knew the group once `run_bounded` returned, and
    rsync with its ssh kept writing until the controller's own end (on macOS, beyond)."""
    started: list[int] = []

    def interrupt(_sig: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        with pytest.raises(KeyboardInterrupt):
            run_bounded(["sh", "-c", "echo $$; exec sleep 60"], timeout=120,
                        on_stdout=lambda data: started.append(int(data)), on_stderr=print)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert started and not alive(started[0]), f"pid {started} outlived the Ctrl-C"


def load_inventory_local(tmp_path: Path):  # type: ignore[no-untyped-def]
    inventory = tmp_path / "local.yaml"
    inventory.write_text("hosts:\n  me:\n    address: local\n    workdir: .\n")
    return load_inventory(inventory).host("me")


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshSession]:
    keys = Keys.make(tmp_path_factory.mktemp("keys"))
    home = Path(tempfile.mkdtemp(prefix="meshrun-standin-home-"))
    (home / "meshrun").mkdir()  # the host's workdir, where commands run
    with StandinSshd(keys, Mode.REAL, home=home) as sshd:
        folder = tmp_path_factory.mktemp("inv")
        (folder / "known_hosts").write_text(sshd.known_hosts_line())
        (folder / "hosts.yaml").write_text(f"hosts:\n  h1:\n    address: 127.0.0.1\n    port: {sshd.port}\n"
                                           f"    identity: {keys.client_key}\nknown_hosts: {folder / 'known_hosts'}\n")
        inventory = load_inventory(folder / "hosts.yaml")
        opened = SshSession(inventory.host("h1"), inventory.known_hosts).open()
        try:
            yield opened
        finally:
            opened.close()
            shutil.rmtree(home)


FLOOD = ["sh", "-c", f"yes x | tr -d '\\n' | head -c {BIG}; echo; echo after"]


def test_a_streamed_line_of_64_mib_is_cut_and_never_held(session: SshSession) -> None:
    """What the launcher and `fab logs -f` read: SshStream.readline."""
    tracemalloc.start()
    try:
        stream = session.start(FLOOD)
        lines = [line for line in iter(stream.readline, b"")]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert lines == [b"x" * LINE_MAX_BYTES + b" " + cut_mark(BIG - LINE_MAX_BYTES) + b"\n", b"after\n"]
    assert stream.wait(30) == 0
    assert peak < MEMORY_BOUND, f"{peak} bytes allocated at the peak"


def test_an_answer_of_64_mib_keeps_its_head_and_tail_and_never_holds_the_rest(session: SshSession) -> None:
    tracemalloc.start()
    try:
        result = session.run(FLOOD, timeout=300)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    kept_tail = ANSWER_MAX_BYTES - ANSWER_HEAD_BYTES
    assert result.rc == 0 and result.stdout.endswith("x\nafter\n")
    assert result.stdout == ("x" * ANSWER_HEAD_BYTES + f"\n[… {BIG + 7 - ANSWER_MAX_BYTES} bytes cut]\n"
                             + "x" * (kept_tail - 7) + "\nafter\n")
    assert peak < MEMORY_BOUND, f"{peak} bytes allocated at the peak"
