"""SSH trust on every hop, and ssh_config honoured where the inventory is silent (issue 12, hole 5),
on the simulated cluster: real sshd per host, `fab` run as a user would. The hostile side is a
host whose sshd answers with a key that is not the pinned one (a second sshd in its namespace)
and a jump host nobody pinned. ssh_config lives in a throw-away $HOME (~/.ssh/config, where both
Fabric and meshrun look by default) or in $MESHRUN_SSH_CONFIG; the real ~/.ssh is never touched."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from meshrun.deploy.edges.transport import TRANSPORT_POLL_S, connect
from meshrun.deploy.inventory.load import load_inventory
from tests.fabrun import ROOT, fab
from tests.testbed import SimCluster
from tests.testbed import sshd

pytestmark = pytest.mark.cluster


def known_hosts_of(inventory: Path) -> Path:
    return Path(yaml.safe_load(inventory.read_text())["known_hosts"])


def home_with_config(tmp_path: Path, text: str) -> Path:
    """A $HOME whose ~/.ssh/config is `text` and that holds no keys and no known_hosts."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(text)
    return home


def fab_as(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return fab(*args, timeout=180, env={"HOME": str(home), "SSH_AUTH_SOCK": ""})


def reachability(home: Path, inventory: Path, host: str) -> tuple[bool, str]:
    result = fab_as(home, "check-network", "--inventory", str(inventory), "--hosts", host, "--json")
    assert result.stdout, result.stderr
    facts = json.loads(result.stdout)["hosts"][0]
    return facts["reachable"], facts["error"] or ""


def pin(testbed: SimCluster, known: Path, i: int, as_host: int | None = None) -> None:
    """Add h<i>'s address to `known` with the key of h<as_host> (default: its own)."""
    key = sshd.public_key(testbed.paths.host_key(testbed.host(as_host or i)))
    known.write_text(known.read_text() + f"{testbed.host(i).address} {key}\n")


def accepted_from(testbed: SimCluster, i: int) -> list[str]:
    """The clients h<i>'s sshd logged a login from."""
    log = testbed.paths.sshd_log(testbed.host(i)).read_text(errors="replace")
    return [line.split(" from ")[1].split()[0] for line in log.splitlines() if "Accepted publickey for" in line]


@contextmanager
def second_sshd(testbed: SimCluster, i: int, port: int, host_keys: list[Path], tmp: Path) -> Iterator[None]:
    """Another sshd inside h<i> on `port`, answering with `host_keys`: a reinstalled host, or a man
    in the middle with keys of its own. Same logins as the host's own sshd."""
    h = testbed.host(i)
    lines = [l for l in sshd.sshd_config_text(h, testbed.paths, port).splitlines()
             if not l.startswith(("HostKey ", "PidFile "))]
    config = tmp / f"sshd-{port}.conf"
    config.write_text("\n".join([*lines, *(f"HostKey {k}" for k in host_keys), f"PidFile {tmp}/sshd-{port}.pid"]) + "\n")
    proc = testbed.popen(i, [sshd.SSHD, "-D", "-f", str(config), "-E", str(tmp / f"sshd-{port}.log")])
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with socket.create_connection((h.address, port), timeout=1) as sock:
                    if sock.recv(64).startswith(b"SSH-"):
                        break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"second sshd on h{i}:{port} did not start: {(tmp / f'sshd-{port}.log').read_text()}")
                time.sleep(0.1)
        yield
    finally:
        proc.terminate()
        proc.wait(10)


def new_key(tmp: Path, kind: str) -> Path:
    path = tmp / f"key_{kind}"
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)
    return path


def fingerprint(key: Path) -> str:
    return subprocess.run(["ssh-keygen", "-lf", f"{key}.pub"], capture_output=True, text=True,
                          check=True).stdout.split()[1]


# `Host h2 10.77.0.12`: Fabric alone (which looks up the address) takes the jump too.
def jump_config(testbed: SimCluster) -> str:
    return f"Host h2 10.77.0.12\n  ProxyJump h1\nHost h1\n  HostName 10.77.0.11\n  IdentityFile {testbed.client_key}\n"


def test_a_jump_host_whose_key_is_not_pinned_or_changed_is_refused(
        testbed: SimCluster, make_inventory: Callable[..., Path], tmp_path: Path) -> None:
    """Fabric alone connects h1 with AutoAddPolicy and reaches h2 through it (reachable, no error)."""
    home = home_with_config(tmp_path, jump_config(testbed))
    inventory = make_inventory(hosts=["h2"])
    known = known_hosts_of(inventory)
    ok, error = reachability(home, inventory, "h2")
    assert not ok and error == (f"host 'h2': jump host h1: unknown SSH host key {testbed.host_key_fingerprint(1)} "
                                f"(ssh-ed25519) for 10.77.0.11, not in ~/.ssh/known_hosts or {known}; if you trust it, run: "
                                "fab trust --hosts h2")
    logins = len(accepted_from(testbed, 1))
    sync = fab_as(home, "sync", "--inventory", str(inventory), "--hosts", "h2")
    # fab sync first asks each host whether a run runs from its workdir, over meshrun's own session: the jump
    # host's unpinned key refuses it there, so h2 is synced by no one (rsync's ssh, strict too: sshargv's argv).
    last = sync.stderr.strip().splitlines()[-1]
    assert sync.returncode == 1 and last == (f"error: host 'h2': jump host h1: unknown SSH host key "
                                             f"{testbed.host_key_fingerprint(1)} (ssh-ed25519) for 10.77.0.11, not in "
                                             f"~/.ssh/known_hosts or {known}; if you trust it, run: fab trust --inventory {inventory} "
                                             "--hosts h2"), sync.stderr
    assert len(accepted_from(testbed, 1)) == logins  # nothing logged in to the unpinned jump host

    pin(testbed, known, 1, as_host=3)  # h1 "was" h3: h1 offers a changed key
    line = len(known.read_text().splitlines())  # the line pin() added: the one to delete
    ok, error = reachability(home, inventory, "h2")
    assert not ok and error == (f"host 'h2': jump host h1: SSH host key CHANGED for 10.77.0.11: known "
                                f"{testbed.host_key_fingerprint(3)}, offered {testbed.host_key_fingerprint(1)}. This "
                                f"may be an attack; if the host was reinstalled or its address reused, delete line "
                                f"{line} of {known} and run: fab trust --hosts h2")


def test_trust_pins_the_jump_host_first_then_the_host_behind_it(
        testbed: SimCluster, make_inventory: Callable[..., Path], tmp_path: Path) -> None:
    home = home_with_config(tmp_path, jump_config(testbed))
    inventory = make_inventory(hosts=["h2"], known_hosts=False)
    known = known_hosts_of(inventory)
    first = fab_as(home, "trust", "--inventory", str(inventory), "--hosts", "h2", "--yes")
    assert first.returncode == 0, first.stdout + first.stderr
    assert known.read_text().split("\n")[0].startswith("10.77.0.11 ssh-ed25519 ")
    assert f"run `fab trust --inventory {inventory} --hosts h2` again for the keys behind jump host h1" in first.stdout
    second = fab_as(home, "trust", "--inventory", str(inventory), "--hosts", "h2", "--yes")
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"trusted h2: 10.77.0.12 {testbed.host_key_fingerprint(2)} added to {known}" in second.stdout
    assert len(known.read_text().splitlines()) == 2


def test_proxyjump_through_h1_to_h2_works_when_both_are_pinned_for_commands_and_sync(
        testbed: SimCluster, make_inventory: Callable[..., Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    home = home_with_config(tmp_path, jump_config(testbed))
    inventory = make_inventory(hosts=["h2"])
    pin(testbed, known_hosts_of(inventory), 1)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SSH_AUTH_SOCK", "")
    inv = load_inventory(inventory)
    session = connect(inv.host("h2"), inv.known_hosts, ROOT)
    try:
        # Both hops' paramiko threads wake once a second when idle (h1's TCP socket, h2's channel through h1).
        polls = [conn.client.get_transport().sock.gettimeout() for conn in session.chain]
        result = session.run(["sh", "-c", "echo $SSH_CONNECTION; hostname"], create_workdir=True)
    finally:
        session.close()
    assert result.ok and result.stdout.split()[0] == "10.77.0.11" and result.stdout.split()[-1] == "h2"
    assert polls == [TRANSPORT_POLL_S, TRANSPORT_POLL_S]

    before = len(accepted_from(testbed, 2))
    testbed.exec(2, ["rm", "-rf", "/root/meshrun-jump"])
    inventory.write_text(inventory.read_text().replace("workdir: ~/meshrun", "workdir: ~/meshrun-jump"))
    sync = fab_as(home, "sync", "--inventory", str(inventory), "--hosts", "h2")
    assert sync.returncode == 0, sync.stdout + sync.stderr
    assert testbed.exec(2, ["test", "-f", "/root/meshrun-jump/fabfile.py"], check=False).returncode == 0
    # fab sync's question whether a run runs there, then rsync's ssh: both came through h1
    assert accepted_from(testbed, 2)[before:] == ["10.77.0.11", "10.77.0.11"]


def test_a_pinned_ed25519_host_offering_a_new_rsa_key_is_changed_and_yes_does_not_accept_it(
        testbed: SimCluster, make_inventory: Callable[..., Path], tmp_path: Path) -> None:
    rsa = new_key(tmp_path, "rsa")
    inventory = make_inventory(hosts=["h1"], host_overrides={"h1": {"port": 2222}})
    known = known_hosts_of(inventory)
    assert known.read_text().startswith("[10.77.0.11]:2222 ssh-ed25519 ")
    before = known.read_text()
    expected = (f"host 'h1': SSH host key CHANGED for [10.77.0.11]:2222: known {testbed.host_key_fingerprint(1)} "
                f"(ssh-ed25519), offered {fingerprint(rsa)} (ssh-rsa). This may be an attack; if the host was "
                f"reinstalled or its address reused, delete line 1 of {known} and run: fab trust --hosts h1")
    with second_sshd(testbed, 1, 2222, [rsa], tmp_path):
        result = fab("trust", "--inventory", str(inventory), "--hosts", "h1", "--yes", timeout=180)
        assert result.returncode == 1 and "CHANGED" in result.stdout
        # What the console says repeats the inventory in its hint (deploy/render/hints.py); the JSON does not.
        shown = expected.replace("fab trust --hosts", f"fab trust --inventory {inventory} --hosts")
        assert result.stderr.strip().splitlines()[-1] == f"error: {shown}"
        assert known.read_text() == before
        check = fab("check-network", "--inventory", str(inventory), "--hosts", "h1", "--json", timeout=180)
        assert json.loads(check.stdout)["hosts"][0]["error"] == expected
    # The honest host with both keys: the pinned type is asked for first, so nothing is CHANGED.
    with second_sshd(testbed, 1, 2222, [rsa, testbed.paths.host_key(testbed.host(1))], tmp_path):
        result = fab("trust", "--inventory", str(inventory), "--hosts", "h1", "--yes", timeout=180)
        assert result.returncode == 0 and "already trusted" in result.stdout, result.stdout + result.stderr
        check = fab("check-network", "--inventory", str(inventory), "--hosts", "h1", "--json", timeout=180)
        assert json.loads(check.stdout)["hosts"][0]["reachable"] is True
    assert known.read_text() == before


def test_alias_port_and_user_come_from_ssh_config_when_the_inventory_is_silent(
        testbed: SimCluster, make_inventory: Callable[..., Path], tmp_path: Path) -> None:
    """h1's inventory address leads nowhere (TEST-NET); ssh_config's `Host h1` sends SSH to h1's
    second sshd on port 2222, whose key is its own: the key scan and the login must both go there.
    The inventory has no user, port or identity: ssh_config's are used ($MESHRUN_SSH_CONFIG)."""
    own = new_key(tmp_path, "ed25519")
    config = tmp_path / "ssh config"
    config.write_text(f"Host h1\n  HostName 10.77.0.11\n  Port 2222\n  User root\n  IdentityFile {testbed.client_key}\n")
    inventory = make_inventory(hosts=["h1"], known_hosts=False, host_overrides={"h1": {"address": "192.0.2.11"}},
                               defaults_overrides={"port": None, "user": None, "identity": None})
    known = known_hosts_of(inventory)
    env = {"MESHRUN_SSH_CONFIG": str(config), "SSH_AUTH_SOCK": ""}
    with second_sshd(testbed, 1, 2222, [own], tmp_path):
        trust = fab("trust", "--inventory", str(inventory), "--hosts", "h1", "--yes", timeout=180, env=env)
        assert trust.returncode == 0, trust.stdout + trust.stderr
        assert known.read_text().splitlines() == [f"[10.77.0.11]:2222 {(Path(f'{own}.pub').read_text().split()[0])} "
                                                  f"{Path(f'{own}.pub').read_text().split()[1]}"]
        check = fab("check-network", "--inventory", str(inventory), "--hosts", "h1", "--json", timeout=180, env=env)
        facts = json.loads(check.stdout)["hosts"][0]
        assert (facts["reachable"], facts["error"]) == (True, None)
        # Logged in; what is wrong is the training address, and the check says so at once.
        assert [(f["where"], f["message"].split(": `address`")[0]) for f in json.loads(check.stdout)["findings"]] == [
            ("h1", "the link probe could not start on h1: cannot listen on 192.0.2.11 (Cannot assign requested address)")]


@contextmanager
def ssh_agent_holding(key: Path, socket_path: Path) -> Iterator[None]:
    """A real ssh-agent listening at `socket_path` (not $SSH_AUTH_SOCK's) with `key` added: an agent
    only ssh_config's IdentityAgent names, as 1Password's or Secretive's."""
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(socket_path)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not socket_path.exists():
            assert agent.poll() is None and time.monotonic() < deadline, "ssh-agent did not start"
            time.sleep(0.05)
        subprocess.run(["ssh-add", "-q", str(key)], env={"SSH_AUTH_SOCK": str(socket_path)}, check=True,
                       capture_output=True, timeout=30)
        yield
    finally:
        agent.kill()
        agent.wait()


def test_an_included_host_block_with_an_identity_agent_logs_in_for_commands_and_sync(
        testbed: SimCluster, make_inventory: Callable[..., Path], tmp_path: Path) -> None:
    """h1's `Host` block lives in a file ssh_config Includes (a glob), and its key only in an agent its
    IdentityAgent names, with $SSH_AUTH_SOCK empty: meshrun follows the Include to the address (the
    inventory's leads nowhere) and offers that agent's key, to paramiko (trust, check-network) and to
    rsync's ssh (sync). Before, the Include was skipped (root@192.0.2.11) and no key was offered."""
    agent_socket = tmp_path / "agent.sock"
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "lab").write_text(f"Host h1\n  HostName 10.77.0.11\n  User root\n"
                                             f"  IdentityAgent {agent_socket}\n")
    config = tmp_path / "config"
    config.write_text(f"Include {tmp_path}/conf.d/*\n")
    inventory = make_inventory(hosts=["h1"], known_hosts=False, host_overrides={"h1": {"address": "192.0.2.11"}},
                               defaults_overrides={"user": None, "identity": None})
    env = {"MESHRUN_SSH_CONFIG": str(config), "SSH_AUTH_SOCK": ""}
    with ssh_agent_holding(testbed.client_key, agent_socket):
        trust = fab("trust", "--inventory", str(inventory), "--hosts", "h1", "--yes", timeout=180, env=env)
        assert trust.returncode == 0, trust.stdout + trust.stderr
        check = fab("check-network", "--inventory", str(inventory), "--hosts", "h1", "--json", timeout=180, env=env)
        facts = json.loads(check.stdout)["hosts"][0]
        assert (facts["reachable"], facts["error"]) == (True, None), check.stdout[-2000:] + check.stderr[-2000:]
        sync = fab("sync", "--inventory", str(inventory), "--hosts", "h1", timeout=180, env=env)
        assert sync.returncode == 0, sync.stdout + sync.stderr


def test_a_missing_identity_names_the_key_and_where_to_set_it(
        make_inventory: Callable[..., Path], tmp_path: Path) -> None:
    home = home_with_config(tmp_path, "Host h2\n  IdentityFile ~/.ssh/rented_box\n")
    inventory = make_inventory(hosts=["h2"], defaults_overrides={"identity": None})
    ok, error = reachability(home, inventory, "h2")
    assert not ok and error == (f"host 'h2': SSH key {home}/.ssh/rented_box for h2 does not exist; it is set by "
                                f"IdentityFile for Host h2 in {home}/.ssh/config: point it at your private key")
    ok, error = reachability(home, make_inventory(hosts=["h3"], defaults_overrides={"identity": None}), "h3")
    assert not ok and error == ("host 'h3': no SSH key to offer 10.77.0.13 (no `identity` in the inventory, no "
                                f"IdentityFile for Host 10.77.0.13 in {home}/.ssh/config, no ssh-agent, no "
                                "~/.ssh/id_*); set `identity: ~/.ssh/<key>` in the inventory")


def test_fab_sync_works_with_a_known_hosts_path_holding_a_space(testbed: SimCluster, tmp_path: Path) -> None:
    inventory = testbed.write_inventory(tmp_path / "my cluster" / "inv.yaml", hosts=["h1"])
    assert " " in str(known_hosts_of(inventory)) and known_hosts_of(inventory).exists()
    result = fab("sync", "--inventory", str(inventory), "--hosts", "h1", timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
