"""A link's bandwidth is the sender's own figure (network55 finding 4): `fab check-network --bandwidth`,
the `site:` inference and `--comm auto` read A->B from what A's probe reports, and A's probe used to
relay B's listener's number unchecked. A hostile B could then answer a huge finite rate (A's slowness
vanished from `node_bandwidth`'s minimum) or `inf` (the controller refused A's whole answer, and
the WARN blamed A). Now the sender times its own transfer until the receiver's answer arrives and
reports at most that; the far end's number can only lower it. The controller voids one absurd link,
not the host's answer.

deploy/host/links.py runs for real: listeners in threads on 127.0.0.1, real sockets. The upper bound
asserted on a throttled receiver follows from its sleeps (a sleep is never shorter than asked), so
no assertion depends on how fast this machine is."""

from __future__ import annotations

import dataclasses
import json
import socket
import time
from collections.abc import Callable

import pytest

from meshrun.deploy.check.answers import link_results
from meshrun.deploy.check.findings import Finding, Level
from meshrun.deploy.check.verdicts import LinkResult, PortState, bandwidth_findings
from meshrun.deploy.edges import check_probes
from meshrun.deploy.host import links
from meshrun.deploy.run.commplan import node_bandwidth
from tests.fakesession import FakeSession, host
from tests.localsockets import listening


READ = 65536  # bytes a throttled receiver reads at a time
PAUSE_S = 0.01  # its sleep after each read: it reads at most READ / PAUSE_S bytes/s (52.4 Mbit/s)


def receiver(reply: bytes, pause: float) -> Callable[[socket.socket], None]:
    """A far end that reads the transfer to its end (sleeping `pause` after each read), then answers `reply`."""
    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            conn.recv(1)
            while conn.recv(READ):
                time.sleep(pause)
            conn.sendall(reply)
    return serve


def transfers(capsys: pytest.CaptureFixture[str], ports: dict[str, int], seconds: float) -> list[dict]:
    """links.connect's bulk phase, as the controller asks it, to each named port; its printed answer."""
    targets = [{"name": name, "address": "127.0.0.1", "port": port} for name, port in ports.items()]
    links.connect({"targets": targets, "timeout": 3, "df_size": None, "bandwidth_s": seconds, "bulk_only": True})
    return json.loads(capsys.readouterr().out)


def test_a_far_end_answering_inf_leaves_that_link_unmeasured_and_the_others_timed(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The finding's snippet: A to an honest listener (the real one) and to one answering `inf`."""
    with listening(links._serve_one) as honest, listening(receiver(b"inf\n", 0.0)) as liar:
        answer = transfers(capsys, {"C": honest, "B": liar}, 0.3)
    assert answer[0]["mbit_s"] > 0 and answer[0]["detail"] == ""
    assert answer[1] == {"state": "error", "mbit_s": None, "detail": "the far end answered no usable rate"}


def test_a_far_end_inflating_its_rate_cannot_raise_the_senders_figure() -> None:
    """B reads at most 52.4 Mbit/s and answers 1e12 bytes/s (8e6 Mbit/s): A's figure is what A timed,
    so the slow A stays the slowest node in `--comm auto`'s bandwidth, whatever the fast B says."""
    with listening(receiver(b"1000000000000.0\n", PAUSE_S), rcvbuf=1 << 18) as liar:
        mbit_s, why = links._bulk("127.0.0.1", liar, 1.0)
    assert why == "" and mbit_s is not None
    # Read in (t, end] by B: at most (t_span / PAUSE_S + 1) reads; the sender's window is at least half
    # its transfer (0.5 s), so one read and a few unacknowledged segments add under 5 Mbit/s.
    assert 0 < mbit_s <= 100
    assert node_bandwidth([("A", mbit_s), ("B", 900.0)]) <= 100 * 1e6 / 8  # A, not B's word, sets the pace


@pytest.mark.parametrize("reply,expected", [
    (b"125000.0\n", (1.0, "")),  # the far end counted less: its figure, lower, stands
    (b"nan\n", (None, "the far end answered no usable rate")),
    (b"-5\n", (None, "the far end answered no usable rate")),
    (b"fast\n", (None, "the far end answered no usable rate")),
    (b"", (None, "the far end answered no usable rate")),  # closed without answering
    (b"0.0\n", (None, "the far end counted no steady transfer")),
])
def test_the_far_ends_answer_can_only_lower_or_void_the_figure(reply: bytes, expected: tuple) -> None:
    with listening(receiver(reply, 0.0)) as port:
        assert links._bulk("127.0.0.1", port, 0.2) == expected


def test_the_steady_rate_starts_at_the_last_sample_before_the_middle() -> None:
    """The sender samples only while it writes: a drain longer than its writes leaves no sample past
    the middle but the last, which used to read as no transfer at all."""
    assert links._steady_rate([(0.0, 0), (1.0, 100), (3.0, 300)]) == 100.0
    assert links._steady_rate([(0.0, 0), (1.0, 100), (2.0, 300), (3.0, 600)]) == 250.0


TARGETS = [{"name": "B", "address": "10.0.0.2", "port": 41234}, {"name": "C", "address": "10.0.0.3", "port": 41235}]


@pytest.mark.parametrize("value,shown", [("Infinity", "inf"), ("NaN", "nan"), ("-1.0", "-1.0"), ("1e12", "1000000000000.0"),
                                         ("1" + "0" * 400, "1000000000000000000000000000000000000000…")])
def test_one_absurd_rate_voids_that_link_not_the_hosts_answer(value: str, shown: str) -> None:
    answer = json.loads(f'[{{"state": "open", "mbit_s": {value}, "detail": ""}}, '
                        '{"state": "open", "mbit_s": 940.5, "detail": ""}]')
    assert link_results("A", TARGETS, answer, None) == (
        LinkResult("A", "B", "10.0.0.2", 41234, PortState.OPEN, detail=f"the probe reported {shown} Mbit/s, no usable rate"),
        LinkResult("A", "C", "10.0.0.3", 41235, PortState.OPEN, mbit_s=940.5))


def test_the_bandwidth_phase_keeps_the_hosts_other_links() -> None:
    """measure_bandwidth over A's answer with one `Infinity`: A->C keeps its rate, A->B alone is not
    measured, and the WARN says so for that link instead of "the transfers from A failed"."""
    a = dataclasses.replace(host(), name="A")
    found = {"A": (LinkResult("A", "B", "10.0.0.2", 41234, PortState.OPEN, connect_ms=0.5),
                   LinkResult("A", "C", "10.0.0.3", 41235, PortState.OPEN, connect_ms=0.5))}
    sessions = {"A": FakeSession('[{"state": "open", "mbit_s": Infinity, "detail": ""}, '
                                 '{"state": "open", "mbit_s": 940.5, "detail": ""}]', the_host=a)}
    why = "the probe reported inf Mbit/s, no usable rate"
    measured = check_probes.measure_bandwidth((a,), found, sessions, 1.0, "/venv/bin/python")
    assert measured == {("A", "B"): (None, why), ("A", "C"): (940.5, "")}
    timed = [dataclasses.replace(k, mbit_s=measured[(k.source, k.target)][0],
                                 bandwidth_detail=measured[(k.source, k.target)][1]) for k in found["A"]]
    assert bandwidth_findings(timed) == [Finding(Level.WARN, "A", (
        f"bandwidth to B not measured ({why}); places and the plan's floors leave those links out: run "
        "`fab check-network --bandwidth` again"))]
