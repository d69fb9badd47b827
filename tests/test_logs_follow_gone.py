"""`fab logs -f` over a link that dies without a reset (a laptop asleep overnight, a VPN or Wi-Fi
switched) froze for ever, saying nothing: each host's `tail -F` was read with no deadline and no
host was ever pinged (review longrun56, finding 2). Now a host whose stream has been quiet a while
is pinged over its session; one that stops answering is named in one line and no longer followed
while the others go on, a stream that ends is said in one line, and once no host is left the
command fails with one line (exit 1).

The decisions (whom to ping when, what a ping's answer makes of a host) by exact equality. Then
`_follow` itself, as `fab logs -f` runs it, over two stand-in hosts: paramiko's server side in this
process, each reached by the real SshSession (only its connect stubbed: the connection is handed in)
over socket pairs joined by a pump. h2's pump is then cut: from then on every byte is dropped and
nobody is told, which stands for a cut link (no RST, no FIN). h1 goes on printing, then its `tail`
ends. The pace is shortened (PACE); the outer bound proves the follow ends, it asserts no speed."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterator

import paramiko
import pytest

from meshrun.deploy.commands import logs, logsfollow
from meshrun.deploy.commands.logsfollow import (End, Followed, Pace, answered, asking, end_line, heard_line,
                                                newly_over, none_left, stream_ended, to_ping)
from meshrun.deploy.edges import launcher, sshexec
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.edges.transport import SshSession
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Host, Network
from meshrun.deploy.render.console import Renderer, repeat_in_hints
from meshrun.deploy.render.neutral import NeutralConsole
from tests.standin_sshd import Keys
from tests.cutlink import Link, joined

PACE = Pace(quiet_s=10.0, ping_timeout_s=6.0, pings_before_lost=2)
RUN = "20261207-020000-ab12"
OUTER_S = 60  # the follow must end well within this once h1's tail ends; it used to never end


def test_the_pace_is_the_projects_own() -> None:
    """Quiet as long as a quiet command before a ping; then the launcher's timeout and misses, as a
    followed host is usually training (its links' queues full)."""
    assert logsfollow.PACE == Pace(sshexec.QUIET_BEFORE_PING_S, launcher.PING_TIMEOUT_S, launcher.PINGS_BEFORE_LOST)


def test_only_hosts_quiet_long_enough_with_no_ping_in_flight_are_pinged() -> None:
    hosts = {"h1": Followed(heard=95.0), "h2": Followed(heard=90.0), "h3": Followed(heard=80.0, asking=True),
             "h4": Followed(heard=50.0, end=End.ENDED), "h5": Followed(heard=50.0, end=End.GONE),
             "h6": Followed(heard=89.0, missed=1)}
    assert to_ping(hosts, 100.0, PACE) == ["h2", "h6"]
    assert to_ping(hosts, 105.0, PACE) == ["h1", "h2", "h6"]
    assert to_ping({}, 100.0, PACE) == []


def test_a_line_or_an_answer_is_word_from_the_host_and_misses_in_a_row_make_it_gone() -> None:
    start = Followed(heard=0.0)
    assert heard_line(start, 3.0) == Followed(heard=3.0)
    once = answered(asking(start), False, 16.0, PACE)
    assert once == Followed(heard=0.0, missed=1)
    assert answered(asking(once), True, 22.0, PACE) == Followed(heard=22.0)
    assert heard_line(once, 17.0) == Followed(heard=17.0)  # a line after a miss: the link works
    assert answered(asking(once), False, 28.0, PACE) == Followed(heard=0.0, missed=2, end=End.GONE)
    assert answered(once, False, 28.0, Pace(10.0, 6.0, 3)) == Followed(heard=0.0, missed=2)


def test_an_end_is_final() -> None:
    gone = Followed(heard=0.0, missed=2, end=End.GONE)
    assert stream_ended(gone) == gone  # its stream ends when it is abandoned: it stays gone
    assert heard_line(gone, 5.0) == gone
    assert answered(Followed(heard=0.0, asking=True, end=End.ENDED), True, 9.0, PACE) == \
        Followed(heard=0.0, end=End.ENDED)
    assert stream_ended(Followed(heard=4.0)) == Followed(heard=4.0, end=End.ENDED)


def test_each_end_is_said_once_in_host_order() -> None:
    hosts = {"h1": Followed(heard=0.0, end=End.ENDED), "h2": Followed(heard=0.0),
             "h3": Followed(heard=0.0, end=End.GONE)}
    assert newly_over(hosts, set()) == [("h1", End.ENDED), ("h3", End.GONE)]
    assert newly_over(hosts, {"h1"}) == [("h3", End.GONE)]
    assert newly_over(hosts, {"h1", "h3"}) == []


def test_the_lines_that_say_it() -> None:
    assert end_line("h2", End.GONE) == ("host 'h2' stopped answering SSH; no more of its log will come: "
                                        "fab logs -f again once it is back")
    assert end_line("h1", End.ENDED) == ("host 'h1': its log stream ended (its `tail -F` exited or the connection "
                                         "closed); no more of its log will come: fab logs -f again once it is back")
    assert none_left(RUN) == (f"no host of run {RUN} is followed any more (see the lines above): "
                              "fab logs -f again once they are back")


class TailingHost(paramiko.ServerInterface):
    """A host whose `tail -F` prints a line every 0.05 s until `end` is set, then exits 0."""

    def __init__(self, name: str) -> None:
        self.name, self.end, self.commands = name, threading.Event(), []

    def check_auth_none(self, username: str) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def get_allowed_auths(self, username: str) -> str:
        return "none"

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.commands.append(command.decode())
        threading.Thread(target=self._tail, args=(channel,), daemon=True).start()
        return True

    def _tail(self, channel: paramiko.Channel) -> None:
        step = 0
        try:
            while not self.end.wait(0.05):
                channel.sendall(f"[{self.name}:0] step {step}\n".encode())
                step += 1
            channel.send_exit_status(0)
            channel.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass


def host(name: str) -> Host:
    return Host(name, "10.0.0.2", ssh_address=None, user="root", port=22, identity=None, python=None,
                workdir="~/meshrun", network=Network.LAN, gpus=None, nproc=None, batch_size=None, env=())


class PairedSsh(SshSession):
    """The real SshSession over `transport`: its connect is the one part stubbed."""

    def __init__(self, name: str, transport: paramiko.Transport) -> None:  # noqa: super() would connect
        self.host, self.timeout, self.transport = host(name), 10.0, transport
        self.conn = SimpleNamespace(is_connected=True,  # type: ignore[assignment]
                                    client=SimpleNamespace(get_transport=lambda: transport))

    def close(self) -> None:
        self.transport.close()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys.make(tmp_path_factory.mktemp("follow-keys"))


@pytest.fixture
def wired(keys: Keys) -> Iterator[dict[str, tuple[PairedSsh, Link, TailingHost]]]:
    made: dict[str, tuple[PairedSsh, Link, TailingHost]] = {}
    ends: list[paramiko.Transport] = []
    for name in ("h1", "h2"):
        link, server = Link(), TailingHost(name)
        client, served = joined(link, server, str(keys.host_key))
        made[name] = (PairedSsh(name, client), link, server)
        ends += [client, served]
    yield made
    for server in (made["h1"][2], made["h2"][2]):
        server.end.set()
    for end in ends:
        end.close()


def returned(call: Callable[[], object]) -> object:
    """call()'s value or the exception it raised."""
    try:
        return call()
    except BaseException as err:  # noqa: BLE001 - handed to the test
        return err


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + OUTER_S
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {OUTER_S} s"
        time.sleep(0.05)


def test_a_host_whose_link_is_cut_is_said_and_left_and_the_others_go_on(
        wired: dict[str, tuple[PairedSsh, Link, TailingHost]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """h2's link is cut (its pump drops every byte: a laptop asleep, a VPN switched): h2 is said once
    and left while h1's lines go on, none lost; h1's tail then ends, is said, and with no host left
    the follow fails with one line. It used to wait on h2's read for ever, saying nothing."""
    # Short, so h2's loss is said within seconds; h1's pings get 2 s each, so a loaded machine's pause
    # in its stand-in server is not a loss.
    monkeypatch.setattr(logsfollow, "PACE", Pace(quiet_s=0.5, ping_timeout_s=2.0, pings_before_lost=2))
    monkeypatch.setattr(logs, "connect", lambda h, _known, _root: wired[h.name][0])
    repeat_in_hints({})  # the hints as written (an earlier test may have set flags to repeat)
    out, err = io.StringIO(), io.StringIO()
    renderer = Renderer(*(NeutralConsole(file=f, width=10_000, soft_wrap=True, highlight=False, color_system=None)
                          for f in (out, err)))
    record = RunRecord(RUN, "inventory/hosts.yaml", ("h1", "h2"), time.time(), True, "10.0.0.2:29400")

    def follow() -> None:  # as `fab logs -f --run RUN` does, past the inventory's loading
        logs._follow((host("h1"), host("h2")), SimpleNamespace(known_hosts=None),  # type: ignore[arg-type]
                     tmp_path, tmp_path / "runs", record, renderer, 10, {})

    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(returned(follow)), daemon=True)
    thread.start()
    wait_for(lambda: "[h1:0] step 3\n" in out.getvalue() and "[h2:0] step 3\n" in out.getvalue(), "lines of both")
    wired["h2"][1].cut.set()
    gone = f"warning: {end_line('h2', End.GONE)}\n"
    wait_for(lambda: gone in err.getvalue(), "word of h2")
    h1_then = out.getvalue().count("[h1:0]")
    wait_for(lambda: out.getvalue().count("[h1:0]") >= h1_then + 5, "more lines of h1 after h2 went")
    wired["h1"][2].end.set()  # h1's tail exits: nothing is left to follow
    thread.join(OUTER_S)
    assert not thread.is_alive() and outcome, "still following with no host left"
    assert isinstance(outcome[0], MeshrunError) and str(outcome[0]) == none_left(RUN), outcome
    assert err.getvalue() == gone + f"warning: {end_line('h1', End.ENDED)}\n"
    h1_lines = [line for line in out.getvalue().splitlines() if line.startswith("[h1:0]")]
    assert h1_lines == [f"[h1:0] step {i}" for i in range(len(h1_lines))]  # every line of h1, in order
    assert [server.commands for _, _, server in wired.values()] == [
        [f"cd \"$HOME\"/meshrun && exec tail -n 10 -F runs/{RUN}/hosts/{name}/train.log"] for name in ("h1", "h2")]
