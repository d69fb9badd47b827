"""The don't-fragment probe of `fab check-network` (network55 finding 5). It was sized MTU - 28 for
every address, 20 bytes too big for IPv6 (ZeroTier's fd…/6plane and WireGuard's ULAs): every IPv6
link read as "the path MTU is below the interface MTU; lower the interface MTU", which the probe
then tracked. And any lost ping read so: ICMP filtered, a ping without CAP_NET_RAW, busybox's
without -M. Now each target's payload follows its address's family, a lost probe counts only once
a small ping passes, and a host without `ping` is told once that the path MTU was not tested.

The ping cases run deploy/host/links.py for real: a stand-in `ping` script first on PATH (or none
at all), real processes, and the real listener on loopback for the whole probe."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest

from meshrun.deploy.check.answers import link_results
from meshrun.deploy.check.findings import Finding, Level
from meshrun.deploy.check.linkverdicts import LinkResult, PortState, df_payload, df_targets, link_findings
from meshrun.deploy.check.verdicts import Fingerprint, HostFacts
from meshrun.deploy.edges import check_probes
from meshrun.deploy.host import links
from tests.fakesession import FakeSession, host
from tests.test_probe_listener import LINKS, TRAINING, listener

V6_MTU = 2800  # ZeroTier's
UNTESTED = "`fab check-network --bandwidth` tests the path with a bulk transfer instead"
SMALL = f"a {links.SMALL_PING}-byte ping got no answer either"


def test_the_payload_fills_the_mtu_by_the_address_family() -> None:
    assert df_payload(V6_MTU, "10.147.17.1") == 2772  # 20 bytes of IPv4, 8 of ICMP
    assert df_payload(V6_MTU, "fd80:56c2:e21c::2") == 2752  # IPv6's header is 40 bytes
    assert df_payload(1420, "fd00::2") == 1372  # WireGuard's MTU
    assert df_payload(None, "fd80::2") is None


def test_each_ephemeral_target_carries_its_own_size() -> None:
    store = {"name": "h1", "address": "fd80::1", "port": 29400, "rendezvous": True}
    v6, v4 = {"name": "h2", "address": "fd80::2", "port": 41000}, {"name": "h3", "address": "10.0.0.3", "port": 41000}
    assert df_targets([store, v6, v4], V6_MTU) == [store, {**v6, "df_size": 2752}, {**v4, "df_size": 2772}]
    assert df_targets([store, v6], None) == [store, v6]  # no MTU known: no probe


def test_the_check_probes_an_ipv6_peer_48_bytes_under_the_interface_mtu() -> None:
    """probe_network over fake sessions on an IPv6 overlay: what each host is asked, and what it reports."""
    hosts = tuple(dataclasses.replace(host(), name=f"h{i}", address=f"fd80:56c2:e21c::{i}") for i in (1, 2))
    specs: list[dict] = []

    def answer(argv: Sequence[str]) -> str:
        if argv[3] == "listen":
            return json.dumps({"port": 41000, "rendezvous": "listening", "lifetime": 60}) + "\n"
        specs.append(spec := json.loads(argv[4]))
        return json.dumps([{"state": "open", "connect_ms": 1.0, "detail": "", **({"df_ok": True} if "df_size" in t
                                                                                   else {})} for t in spec["targets"]])
    sessions = {h.name: FakeSession(answer, the_host=h) for h in hosts}
    facts = tuple(HostFacts(h.name, h.address, "zerotier", True, fingerprint=Fingerprint("3.11.9", "2.5.0"),
                            mtu=V6_MTU) for h in hosts)
    probed = check_probes.probe_network(hosts, hosts[0], 29400, sessions, facts, 0.0, sys.executable)
    asked = sorted((t["name"], bool(t.get("rendezvous")), t.get("df_size", 0))
                   for spec in specs for t in spec["targets"])
    assert asked == [("h1", False, 2752), ("h1", True, 0), ("h1", True, 0), ("h2", False, 2752)]  # 0: none asked
    assert sorted((k.source, k.target, k.df_size) for k in probed.links if not k.rendezvous) == [
        ("h1", "h2", 2752), ("h2", "h1", 2752)]


# --- the ping on the host: a stand-in `ping` on PATH ---

LOG = "$(dirname \"$0\")/calls"
STANDINS = {
    "sound": "exit 0",
    # small packets pass, full-size ones are lost: the one case a lost probe is the MTU's
    "black hole": 'size=0; prev=; for a in "$@"; do [ "$prev" = "-s" ] && size=$a; prev=$a; done\n'
                  '[ "$size" -le 1400 ] && exit 0; exit 1',
    "no raw socket": 'echo "ping: socket: Operation not permitted" >&2; exit 2',
    "busybox": 'case " $* " in *" -M "*) echo "ping: unrecognized option: M" >&2; '
               'echo "BusyBox v1.36.1 (2024-06-10) multi-call binary." >&2; exit 1;; esac; exit 0',
    "filtered": 'echo "1 packets transmitted, 0 received, 100% packet loss, time 0ms"; exit 1',
}


def standin(tmp_path: Path, kind: str) -> Path:
    """A folder holding a `ping` that acts as `kind` and logs each call's arguments to `calls`."""
    folder = tmp_path / "bin"
    folder.mkdir()
    ping = folder / "ping"
    ping.write_text(f'#!/bin/sh\necho "$*" >> {LOG}\n{STANDINS[kind]}\n')
    ping.chmod(0o755)
    return folder


def calls(folder: Path) -> list[str]:
    log = folder / "calls"
    return log.read_text().splitlines() if log.exists() else []


def df_argv(size: int, wait: int, address: str = "10.147.17.1") -> str:
    return f"-n -q -M do -s {size} -c 1 -W {wait} {address}"


@pytest.mark.parametrize("kind,expected", [
    ("sound", (True, "")),
    ("black hole", (False, "")),
    ("no raw socket", (None, f"{SMALL} (ping: socket: Operation not permitted): ICMP is filtered or ping cannot run")),
    ("busybox", (None, f"{SMALL} (ping: unrecognized option: M): ICMP is filtered or ping cannot run")),
    ("filtered", (None, f"{SMALL} (no reply): ICMP is filtered or ping cannot run")),
])
def test_a_lost_probe_is_the_mtus_only_when_a_small_ping_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 kind: str, expected: tuple) -> None:
    folder = standin(tmp_path, kind)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    assert links._df_ping("10.147.17.1", 2772) == expected
    # One ping on a sound path; after a loss one more, small, with a shorter deadline.
    assert calls(folder) == [df_argv(2772, 2)] + ([] if kind == "sound" else [df_argv(links.SMALL_PING, 1)])


def test_a_host_without_ping_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    assert links._df_ping("10.147.17.1", 2772) == (None, links.PING_MISSING)


def connect_phase(folder: Path, port: int, address: str, names: Sequence[str]) -> tuple[LinkResult, ...]:
    """The real probe process, `ping` looked up in `folder` alone, to the real listener; read as the controller does."""
    targets = df_targets([{"name": n, "address": address, "port": port} for n in names], 1500)
    spec = {"targets": targets, "timeout": 3, "df_size": None, "bandwidth_s": 0.0}
    out = subprocess.run([sys.executable, str(LINKS), "connect", json.dumps(spec)], capture_output=True, text=True,
                         timeout=60, check=True, env={**os.environ, "PATH": str(folder)}).stdout
    return link_results("h1", targets, json.loads(out), None)


@pytest.mark.parametrize("kind", ["no raw socket", "busybox", "filtered"])
def test_a_ping_that_cannot_tell_gives_no_mtu_advice(tmp_path: Path, kind: str) -> None:
    """The finding's case: every ping lost. The links were "path MTU below the interface MTU; lower the
    interface MTU"; now one WARN says the path MTU was not tested, and why."""
    folder = standin(tmp_path, kind)
    with listener(None, 60) as answer:
        found = link_findings(connect_phase(folder, answer["port"], TRAINING, ["h2", "h3"]), {"h1": 1500})
    assert [(f.level, f.where) for f in found] == [(Level.WARN, "h1")]
    assert found[0].message.startswith(f"the path MTU to h2, h3 was not tested: {SMALL} (")
    assert found[0].message.endswith(UNTESTED) and "lower the interface MTU" not in found[0].message


def test_a_path_that_drops_full_size_packets_still_warns_to_lower_the_mtu(tmp_path: Path) -> None:
    folder = standin(tmp_path, "black hole")
    with listener(None, 60) as answer:
        probed = connect_phase(folder, answer["port"], TRAINING, ["h2"])
    assert [(k.df_size, k.df_ok, k.df_detail) for k in probed] == [(1472, False, "")]
    assert link_findings(probed, {"h1": 1500}) == [Finding(Level.WARN, "h1 -> h2", (
        f"a 1472-byte don't-fragment ping to {TRAINING} was lost: the path MTU is below h1's interface MTU 1500; "
        "large transfers may stall; lower the interface MTU (docs/zerotier.md#mtu)"))]


def test_a_missing_ping_is_said_once_per_host(tmp_path: Path) -> None:
    """No `ping` on the host (slim images): its DF probe was null and nothing said the MTU went untested."""
    empty = tmp_path / "empty"
    empty.mkdir()
    with listener(None, 60) as answer:
        probed = connect_phase(empty, answer["port"], TRAINING, ["h2", "h3"])
    assert link_findings(probed, {"h1": 1500}) == [
        Finding(Level.WARN, "h1", f"the path MTU to h2, h3 was not tested: {links.PING_MISSING}; {UNTESTED}")]


def test_links_whose_tcp_failed_say_nothing_of_their_mtu() -> None:
    """A closed link already FAILs; the rendezvous port's host is probed as an ephemeral target."""
    why = links.PING_MISSING
    closed = LinkResult("h1", "h2", "10.0.0.2", 41000, PortState.REFUSED, detail="connection refused", df_detail=why)
    store = LinkResult("h1", "h2", "10.0.0.2", 29400, PortState.OPEN, rendezvous=True, df_detail=why)
    assert [f.level for f in link_findings([closed, store], {})] == [Level.FAIL]


def loopback_mtu() -> int:
    return int(Path("/sys/class/net/lo/mtu").read_text())


def pings(address: str) -> bool:
    try:
        return subprocess.run(["ping", "-n", "-q", "-c", "1", "-W", "1", address], capture_output=True,
                              timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not (Path("/sys/class/net/lo/mtu").exists() and pings("::1")),
                    reason="needs a ping that runs, and IPv6 on loopback")
def test_the_real_ping_on_ipv6_loopback() -> None:
    """The finding's evidence with the system's own ping: MTU - 48 passes over ::1, MTU - 28 (the old
    size) is lost while a small ping passes, which is what read as a path below the MTU."""
    mtu = loopback_mtu()
    assert links._df_ping("::1", df_payload(mtu, "::1") or 0) == (True, "")
    assert links._df_ping("::1", mtu - 28) == (False, "")
