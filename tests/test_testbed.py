"""The simulated cluster is real: SSH, names, homes, overlay, shaping, faults."""

from __future__ import annotations

import base64
import hashlib
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paramiko
import pytest
import yaml

from tests.testbed import SimCluster
from tests.testbed.homes import passthrough_dirs
from tests.testbed.inventory import check_workdir
from tests.testbed.network import own_netns, own_root_links
from tests.testbed import wireguard as testbed_wireguard
from tests.testbed.layout import WG_PORT
from tests.testbed.proc import alive, read_pidfile, run
from tests.testbed.sshd import HOST_THREADS

pytestmark = pytest.mark.cluster


def ssh(cluster: SimCluster, i: int, *remote: str, known_hosts: Path | None = None,
        timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cluster.ssh_argv(i, *remote, known_hosts=known_hosts),
                          capture_output=True, text=True, timeout=timeout)


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Bounded wait: True as soon as predicate() holds, False after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def known_hosts_of(inventory: Path) -> Path:
    return Path(yaml.safe_load(inventory.read_text())["known_hosts"])


def test_passthrough_covers_checkout_venv_and_interpreter(tmp_path: Path) -> None:
    """CI may clone to an unknown folder under /root, with pyenv's python."""
    home = tmp_path / "root"
    base_bin = home / ".pyenv" / "versions" / "3.11.7" / "bin"
    base_bin.mkdir(parents=True)
    (base_bin / "python3.11").write_text("")
    (home / ".cargo").mkdir()
    (home / "unrelated").mkdir()
    checkout = home / "ci" / "meshrun"
    venv_bin = home / "envs" / "mr" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(base_bin / "python3.11")
    (venv_bin.parent / "pyvenv.cfg").write_text(f"home = {base_bin}\n")
    (home / "link").symlink_to(checkout.parent, target_is_directory=True)
    checkout.mkdir(parents=True)
    dirs = passthrough_dirs(str(venv_bin / "python"), repo_root=home / "link" / "meshrun",
                            real_home=home)
    assert [d.name for d in dirs] == [".pyenv", ".cargo", "envs", "link", "ci"]


def test_workdir_inside_a_shared_dir_is_refused() -> None:
    doc = {"defaults": {"workdir": "~/meshrun"}, "hosts": {"h1": {"address": "10.77.0.11"}}}
    check_workdir(doc, [Path("/root/.pyenv")])
    with pytest.raises(ValueError, match="shared into every"):
        check_workdir(doc, [Path("/root/.pyenv"), Path("/root/meshrun")])


def test_ssh_to_each_host_returns_its_own_hostname(testbed: SimCluster, inventory: Path) -> None:
    for h in testbed.hosts:
        result = ssh(testbed, h.index, "hostname", known_hosts=known_hosts_of(inventory))
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == h.name


def test_paramiko_verifies_host_keys_and_fingerprints(testbed: SimCluster, inventory: Path) -> None:
    doc = yaml.safe_load(inventory.read_text())
    for h in testbed.hosts:
        client = paramiko.SSHClient()
        client.load_host_keys(doc["known_hosts"])
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(doc["hosts"][h.name]["address"], username="root",
                       key_filename=doc["defaults"]["identity"], timeout=10,
                       look_for_keys=False, allow_agent=False)
        try:
            transport = client.get_transport()
            assert transport is not None
            key = transport.get_remote_server_key()
            digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode()
            assert f"SHA256:{digest.rstrip('=')}" == testbed.host_key_fingerprint(h.index)
            _, stdout, _ = client.exec_command("hostname")
            assert stdout.read().decode().strip() == h.name
        finally:
            client.close()


def test_unknown_host_key_is_refused(testbed: SimCluster,
                                     make_inventory: Callable[..., Path]) -> None:
    inventory = make_inventory(known_hosts=False)
    known_hosts = known_hosts_of(inventory)
    assert not known_hosts.exists()
    known_hosts.write_text("")
    result = ssh(testbed, 1, "hostname", known_hosts=known_hosts)
    assert result.returncode == 255
    assert "Host key verification failed" in result.stderr


def test_inventory_fields_and_overrides(testbed: SimCluster,
                                        make_inventory: Callable[..., Path]) -> None:
    plain = yaml.safe_load(make_inventory().read_text())
    assert plain["defaults"] == {
        "user": "root", "port": 22, "identity": str(testbed.client_key),
        "python": sys.executable, "workdir": "~/meshrun", "network": "lan",
    }
    assert plain["hosts"] == {h.name: {"address": h.address} for h in testbed.hosts}
    assert plain["rendezvous"] == {"host": "h1", "port": 29400}
    lines = Path(plain["known_hosts"]).read_text().split("\n")
    assert lines[0].startswith("10.77.0.11 ssh-ed25519 ")

    custom_path = make_inventory(
        hosts=["h2", "h3"], python="/opt/py/bin/python",
        host_overrides={"h3": {"gpus": [0, 1], "nproc": 2, "env": {"X": "1"}}},
        defaults_overrides={"port": 2222}, extra={"rendezvous": {"host": "h3", "port": 29500}},
    )
    custom = yaml.safe_load(custom_path.read_text())
    assert list(custom["hosts"]) == ["h2", "h3"]
    assert custom["hosts"]["h3"] == {"address": "10.77.0.13", "gpus": [0, 1], "nproc": 2,
                                     "env": {"X": "1"}}
    assert custom["defaults"]["python"] == "/opt/py/bin/python"
    assert custom["rendezvous"] == {"host": "h3", "port": 29500}
    entries = [line.split()[0] for line in Path(custom["known_hosts"]).read_text().splitlines()]
    assert entries == ["[10.77.0.12]:2222", "[10.77.0.13]:2222"]
    with pytest.raises(ValueError):
        make_inventory(hosts=["h1", "h9"])


def test_home_directories_are_private(testbed: SimCluster, tmp_path: Path) -> None:
    marker = f"marker-{time.monotonic_ns()}"
    assert ssh(testbed, 1, "touch", f"~/{marker}").returncode == 0
    assert ssh(testbed, 1, "test", "-e", f"~/{marker}").returncode == 0
    assert ssh(testbed, 2, "test", "-e", f"~/{marker}").returncode == 1
    assert not (Path("/root") / marker).exists()
    # rsync to ~/meshrun on each host lands in a different place.
    ssh_cmd = shlex.join(testbed.ssh_command())
    for h in testbed.hosts:
        src = tmp_path / h.name
        src.mkdir()
        (src / "who").write_text(h.name)
        result = subprocess.run(["rsync", "-a", "-e", ssh_cmd, f"{src}/",
                                 f"root@{h.address}:meshrun/"],
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
    for h in testbed.hosts:
        assert ssh(testbed, h.index, "cat", "~/meshrun/who").stdout == h.name


def test_hosts_reach_each_other_by_name(testbed: SimCluster) -> None:
    names = [h.name for h in testbed.hosts]
    result = ssh(testbed, 1, "getent", "hosts", *names)
    resolved = {line.split()[1]: line.split()[0] for line in result.stdout.splitlines()}
    assert resolved == {h.name: h.address for h in testbed.hosts}
    # torchrun's rank 0 advertises its hostname: it must resolve to a real address.
    own = ssh(testbed, 2, "sh", "-c", shlex.quote('getent hosts "$(hostname)"'))
    assert own.stdout.split()[0] == "10.77.0.12"
    for h in testbed.hosts[1:]:
        result = ssh(testbed, 1, "ping", "-c", "1", "-W", "2", h.name)
        assert result.returncode == 0, result.stdout + result.stderr


def test_venv_python_imports_torch_over_ssh(testbed: SimCluster) -> None:
    code = "import socket, torch; print(torch.__version__, socket.gethostname(), torch.get_num_threads())"
    result = ssh(testbed, 2, shlex.join([sys.executable, "-c", code]), timeout=120)
    assert result.returncode == 0, result.stderr
    version, host, threads = result.stdout.split()
    assert host == "h2"
    assert version.startswith("2.")
    assert int(threads) == HOST_THREADS  # a simulated host is a one-core machine (sshd's SetEnv)


def test_exec_enters_the_host_without_ssh(testbed: SimCluster) -> None:
    assert testbed.exec(3, ["hostname"]).stdout.strip() == "h3"
    assert testbed.exec(3, ["cat", "/etc/hostname"]).returncode == 0
    addrs = testbed.exec(3, ["ip", "-4", "-o", "addr", "show", "eth0"]).stdout
    assert "10.77.0.13/24" in addrs
    home = testbed.exec(3, ["pwd"]).stdout.strip()
    assert home == "/root"
    assert testbed.processes(3, sessions=False) == []


def test_wireguard_overlay(testbed_wg: SimCluster, wg_inventory: Path) -> None:
    h2 = testbed_wg.host(2)
    assert wait_for(lambda: testbed_wg.exec(
        1, ["ping", "-c", "1", "-W", "1", h2.overlay_address], check=False).returncode == 0, 10)
    route = testbed_wg.exec(1, ["ip", "route", "get", h2.overlay_address]).stdout
    assert " dev wg0 " in route
    link = json.loads(testbed_wg.exec(1, ["ip", "-j", "link", "show", "wg0"]).stdout)
    assert link[0]["mtu"] == 1420
    assert testbed_wg.processes(1, sessions=False) == []  # wireguard-go is infrastructure
    doc = yaml.safe_load(wg_inventory.read_text())
    assert doc["defaults"]["network"] == "wireguard"
    assert doc["hosts"]["h2"] == {"address": h2.overlay_address, "ssh_address": h2.address}
    result = ssh(testbed_wg, 2, "ip", "-4", "-o", "addr", "show", "wg0",
                 known_hosts=known_hosts_of(wg_inventory))
    assert f"{h2.overlay_address}/24" in result.stdout
    # Another test bed going down meanwhile (the other pytest worker's) leaves these daemons' control
    # sockets where `wg` finds them: its teardown once removed the shared mount point, which
    # detached every tmpfs on it (CI, 2026-12-03).
    testbed_wireguard.down([], testbed_wg.paths, owned=set())
    for h in testbed_wg.hosts:
        pid = testbed_wireguard.pid_of(h, testbed_wg.paths)
        assert pid is not None
        shown = run(testbed_wireguard.wg_argv(pid, ["wg", "show", "wg0", "listen-port"]), check=False)
        assert (shown.returncode, shown.stdout.strip()) == (0, str(WG_PORT)), shown.stderr


def _iperf_bits_per_second(testbed: SimCluster) -> float:
    """One 1 s iperf3 run h1 -> h2; retried while the server is still starting
    (iperf3 3.12 with -J may exit 0 on "Connection refused": check "error")."""
    def attempt() -> dict[str, Any]:
        result = testbed.exec(1, ["iperf3", "-c", "10.77.0.12", "-t", "1", "-J"],
                              check=False, timeout=30)
        try:
            report: dict[str, Any] = json.loads(result.stdout)
        except json.JSONDecodeError:
            return {"error": f"rc={result.returncode} {result.stderr.strip()}"}
        return report

    report = attempt()
    deadline = time.monotonic() + 10
    while "error" in report and time.monotonic() < deadline:
        time.sleep(0.2)
        report = attempt()
    assert "error" not in report, report["error"]
    return float(report["end"]["sum_received"]["bits_per_second"])


def test_shaping_limits_a_transfer(testbed: SimCluster) -> None:
    server = testbed.popen(2, ["iperf3", "-s", "-B", "10.77.0.12"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        unshaped = _iperf_bits_per_second(testbed)
        with testbed.shaped("20mbit"):
            shaped = _iperf_bits_per_second(testbed)
    finally:
        server.kill()
        server.wait(10)
    assert shaped < 60e6, f"shaped to 20mbit but measured {shaped / 1e6:.1f} Mbit/s"
    assert shaped < unshaped / 5, (shaped, unshaped)


def test_cut_makes_host_unreachable_and_heal_restores(testbed: SimCluster) -> None:
    with testbed.link_cut(2):
        result = subprocess.run(testbed.ssh_argv(2, "true", connect_timeout=2),
                                capture_output=True, text=True, timeout=20)
        assert result.returncode == 255
        assert testbed.exec(1, ["ping", "-c", "1", "-W", "1", "h2"], check=False).returncode != 0
    assert wait_for(lambda: ssh(testbed, 2, "true", timeout=15).returncode == 0, 15)


def test_kill_processes_kills_a_sleeper_started_over_ssh(testbed: SimCluster) -> None:
    client = subprocess.Popen(testbed.ssh_argv(3, "sleep", "300"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def sleeper() -> list[int]:
            return [p.pid for p in testbed.processes(3) if p.argv[:2] == ["sleep", "300"]]

        assert wait_for(lambda: bool(sleeper()), 10)
        pid = sleeper()[0]
        killed = testbed.kill_processes(3)
        assert pid in killed
        assert not alive(pid)
        assert testbed.processes(3) == []
        client.wait(timeout=10)  # its session died with the host's processes
        assert read_pidfile(testbed.paths.sshd_pid(testbed.host(3))) not in killed
        assert ssh(testbed, 3, "hostname").stdout.strip() == "h3"  # sshd survived
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()


def test_up_cleans_leftovers_of_a_crashed_run(testbed: SimCluster) -> None:
    old_sshd = [read_pidfile(testbed.paths.sshd_pid(h)) for h in testbed.hosts]
    stray = testbed.popen(1, ["sleep", "300"])
    try:
        # A new instance knows nothing of the running one, like after a crash.
        SimCluster(testbed.paths.root).up(3)
        assert wait_for(lambda: stray.poll() is not None, 5)
        assert not any(alive(pid) for pid in old_sshd if pid is not None)
        assert ssh(testbed, 1, "hostname").stdout.strip() == "h1"
    finally:
        if stray.poll() is None:
            stray.kill()
        stray.wait()


def test_down_removes_everything(testbed: SimCluster) -> None:
    testbed.wireguard_up()
    infra = [read_pidfile(p) for h in testbed.hosts
             for p in (testbed.paths.sshd_pid(h), testbed.paths.wg_pid(h))]
    stray = testbed.popen(2, ["sleep", "300"])
    try:
        assert wait_for(lambda: any(p.pid == stray.pid for p in testbed.processes(2)), 5)
        report = testbed.down()
        assert [(ns, p.pid) for ns, p in report.leftovers] == [("mrt2", stray.pid)]
        assert own_netns() == []
        assert own_root_links() == []
        assert not list(Path("/etc/netns").glob("mrt*"))
        assert not any(alive(pid) for pid in infra if pid is not None)
        assert not testbed.is_up
    finally:
        stray.wait()
        testbed.up(3)  # the cluster is shared: later tests (other files) need it
