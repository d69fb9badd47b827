"""`fab check-network --bandwidth` on a link that connects but cannot carry bulk data (network55
finding 7), ZeroTier's "ping works, training hangs": the handshake is OPEN, the transfer's
full-size segments are lost. It was "bandwidth not measured (the far end did not answer the
transfer in time) … run again", a WARN, exit 0, and training then hung on its first gradient
bucket. Now a transfer the far end acknowledged none of is STALLED, a FAIL saying it is a path-MTU
black hole and what to lower; one that moved and then stopped stays the WARN it was.

deploy/host/links.py runs for real on loopback sockets. Loopback acknowledges every segment, so a
black hole's one mark, a far end whose kernel acknowledges nothing past the first byte, is stood in
for by the reading of the unacknowledged bytes (`_unacked`); the stall itself (writes blocked on a
far end that never reads) is real. The stall's wait is shortened for the test's speed."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from meshrun.deploy.check import linkplan, linkverdicts
from meshrun.deploy.check.findings import Finding, Level
from meshrun.deploy.check.verdicts import AllReduceResult, LinkResult, PortState, ProbeStatus, build_report
from meshrun.deploy.edges import check_probes
from meshrun.deploy.edges.fanout import on_each
from meshrun.deploy.host import links
from tests.fakesession import FakeSession, host
from tests.localsockets import listening

BLACK_HOLE = ("TCP connects to h2 but a bulk transfer stalls: nothing sent was acknowledged, the mark of a path-MTU "
              "black hole (small packets pass, full-size ones are lost), and training would hang on its first large "
              "collective; lower the MTU of the training interface on the hosts (docs/zerotier.md#mtu)")
AGAIN = "places and the plan's floors leave those links out: run `fab check-network --bandwidth` again"


@contextmanager
def never_reads() -> Iterator[int]:
    """A far end that accepts and never reads: the sender's writes block once the buffers are full."""
    held: list[socket.socket] = []
    with listening(held.append) as port:
        try:
            yield port
        finally:
            for conn in held:
                conn.close()


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(links, "STALL_S", 0.3)
    monkeypatch.setattr(links, "WRITE_TIMEOUT_S", 0.5)


def acknowledged_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The far end's kernel acknowledges none of the writes: all of them stay unacknowledged."""
    monkeypatch.setattr(links, "_unacked", lambda sock: 1 << 40)


def test_the_host_and_the_controller_name_a_stall_alike() -> None:
    assert links.STALLED == linkverdicts.STALLED  # links.py runs alone on the host: it keeps its own copy


def test_a_transfer_nothing_of_which_is_acknowledged_has_stalled(quick: None, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    acknowledged_nothing(monkeypatch)
    with never_reads() as port:
        assert links._bulk("127.0.0.1", port, 5.0) == (None, links.STALLED)
        links.connect({"targets": [{"name": "h2", "address": "127.0.0.1", "port": port}], "timeout": 3,
                       "df_size": None, "bandwidth_s": 5.0, "bulk_only": True})
    assert json.loads(capsys.readouterr().out) == [{"state": "error", "mbit_s": None, "detail": links.STALLED}]


def test_a_transfer_that_moved_and_then_stopped_is_no_stall(quick: None) -> None:
    """The far end stops reading: its kernel acknowledged its buffer's worth, so the path carries full-size
    segments. Its figure is not measured, as before, and nothing blames the MTU."""
    with never_reads() as port:
        assert links._bulk("127.0.0.1", port, 5.0) == (None, "the far end did not answer the transfer in time")


def test_a_sound_transfer_is_timed_as_before(quick: None) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        threading.Thread(target=lambda: links._serve_one(server.accept()[0]), daemon=True).start()
        mbit_s, why = links._bulk("127.0.0.1", server.getsockname()[1], 0.3)
    assert why == "" and mbit_s is not None and mbit_s > 0


def test_a_stalled_open_link_fails_with_the_mtu_fix_and_other_reasons_still_warn() -> None:
    links_found = [
        LinkResult("h1", "h2", "10.0.0.2", 41000, PortState.OPEN, connect_ms=0.2,
                   bandwidth_detail=linkverdicts.STALLED),
        LinkResult("h1", "h3", "10.0.0.3", 41000, PortState.OPEN, connect_ms=0.2,
                   bandwidth_detail="the far end did not answer the transfer in time"),
        LinkResult("h1", "h4", "10.0.0.4", 41000, PortState.OPEN, connect_ms=0.2, mbit_s=940.0)]
    assert linkverdicts.bandwidth_findings(links_found) == [
        Finding(Level.FAIL, "h1", BLACK_HOLE),
        Finding(Level.WARN, "h1", f"bandwidth to h3 not measured (the far end did not answer the transfer in time); "
                                  f"{AGAIN}")]


def test_a_stall_the_host_reports_fails_the_check() -> None:
    """From the host's answer through the controller's reading to the report: a FAIL, so a non-zero exit."""
    h1 = host()
    found = {"h1": (LinkResult("h1", "h2", "10.0.0.2", 41234, PortState.OPEN, connect_ms=0.5),)}
    answer = json.dumps([{"state": "error", "mbit_s": None, "detail": links.STALLED}])
    measured = check_probes.measure_bandwidth((h1,), found, {"h1": FakeSession(answer, the_host=h1)}, 1.0,
                                              "/venv/bin/python")
    assert measured == {("h1", "h2"): (None, linkverdicts.STALLED)}
    timed = tuple(dataclasses.replace(k, bandwidth_detail=measured[(k.source, k.target)][1]) for k in found["h1"])
    report = build_report((), None, timed, AllReduceResult(ProbeStatus.OK), "zerotier", 1.0)
    assert (report.level, report.findings) == (Level.FAIL, (Finding(Level.FAIL, "h1", BLACK_HOLE),))


def test_the_fan_outs_limit_covers_the_longest_hosts_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each host's probe may take links_limit for its targets (a stalled one waits STALL_S); the fan-out
    over the hosts waited a fixed 60 + 10·bandwidth_s, so 31 stalled targets read as "the transfers
    from h1 failed" instead of 31 stalls."""
    assert linkplan.links_limit(31, 1.0) == 3.0 + 10 + 62 and linkplan.links_limit(2, 0.25) == 3.0 + 10 + 4
    given: list[float] = []

    def fan_out(hosts, fn, timeout):  # type: ignore[no-untyped-def]
        given.append(timeout)
        return on_each((), fn, timeout=timeout)  # nothing is probed: the limit given is what is tested

    monkeypatch.setattr(check_probes, "on_each", fan_out)
    links = tuple(LinkResult("h1", f"t{n}", f"10.0.0.{n}", 40000, PortState.OPEN) for n in range(31))
    check_probes.measure_bandwidth((host(),), {"h1": links}, {}, 1.0, "/venv/bin/python")
    assert given == [check_probes.FACTS_TIMEOUT_S + linkplan.links_limit(31, 1.0)]
