"""A WireGuard handshake's age is taken with the host's own clock (findings "stalls", 10): the check
subtracted the host's handshake times from the controller's clock, so a host whose clock ran an hour
behind showed "handshakes 3605 s" for a handshake 5 s old. The host prints its time with the answer."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

from meshrun.deploy.check import wireguard
from meshrun.deploy.check.wireguard import WgPeer, WireGuardState

CONTROLLER_NOW = 1767225600
HOST_NOW = CONTROLLER_NOW - 3600  # the host's clock, an hour behind


def test_the_age_is_the_hosts_own() -> None:
    answer = f"wg0\tAbC=\t{HOST_NOW - 5}\nwg0\tDeF=\t0\n{HOST_NOW}\n"
    state = wireguard.host_state(0, answer, "")
    assert state == WireGuardState((WgPeer("wg0", "AbC=", 5), WgPeer("wg0", "DeF=", None)))
    assert wireguard.summary(state) == "wg0: 2 peer(s), handshakes 5 s, never"


def test_an_answer_without_the_hosts_time_is_unreadable_and_a_failure_keeps_its_reason() -> None:
    assert wireguard.host_state(0, "wg0\tAbC=\t5\n", "") == WireGuardState(
        error="the host's clock (`date +%s`) gave no time: 'wg0\\tAbC=\\t5'")
    assert wireguard.host_state(127, f"{HOST_NOW}\n", "sh: 1: wg: not found\n") == WireGuardState(
        error="`wg` not found (apt-get install wireguard-tools)")
    denied = wireguard.host_state(1, f"{HOST_NOW}\n", "Unable to access interface: Operation not permitted\n")
    assert denied.error is not None and denied.error.startswith("Unable to access interface: Operation not permitted")


def test_the_command_prints_the_hosts_time_after_wgs_lines_and_keeps_wgs_status(tmp_path: Path) -> None:
    """ARGV under a real sh, with a stand-in `wg` first on PATH (the real one needs root and a tunnel)."""
    fake = tmp_path / "wg"
    fake.write_text("#!/bin/sh\nprintf 'wg0\\tAbC=\\t%s\\n' \"$(( $(date +%s) - 5 ))\"\nexit ${WG_RC:-0}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(list(wireguard.ARGV), capture_output=True, text=True, env=env, timeout=30)
    state = wireguard.host_state(done.returncode, done.stdout, done.stderr)
    assert len(state.peers) == 1 and state.peers[0].handshake_age_s in (5, 6)  # a second may turn between the two
    failed = subprocess.run(list(wireguard.ARGV), capture_output=True, text=True, env={**env, "WG_RC": "3"}, timeout=30)
    assert failed.returncode == 3
    bare = tmp_path / "bare"  # a PATH with sh and date only: no wg
    bare.mkdir()
    for tool in ("sh", "date"):
        (bare / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
    missing = subprocess.run(list(wireguard.ARGV), capture_output=True, text=True, env={**env, "PATH": str(bare)},
                             timeout=30)
    assert missing.returncode == 127
    assert wireguard.host_state(missing.returncode, missing.stdout, missing.stderr).error == (
        "`wg` not found (apt-get install wireguard-tools)")
