"""`fab firewall` (issue 12, hole 6): the unauthenticated store and gloo ports are reachable only by
the member hosts on the training interface. Exact rule plans (pure), and on the simulated cluster a
fourth namespace that is not a member plays the attacker on the bridge, against a live run."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from meshrun.deploy.errors import InputError
from meshrun.deploy.run.firewall import (Action, FirewallSpec, Step, down_steps, host_request, member_addresses,
                                         parse_action, plans_for, ssh_ports, status_steps, up_steps)
from tests.fabrun import FabProcess, fab
from tests.testbed import network
from tests.testbed.layout import Host
from tests.testbed.inventory import RENDEZVOUS_PORT

W = ("-w", "10")
OUTSIDER = Host(9)  # mrt9, 10.77.0.19: on the bridge, in no inventory
HOST_SCRIPT = Path(__file__).resolve().parents[1] / "deploy" / "host" / "firewall.py"


def test_up_plan_is_exact_for_both_families() -> None:
    spec = FirewallSpec((2222, 22), "wg0", ("10.78.0.11", "fd00::2"))
    v4, v6 = (tuple(s for s in up_steps(spec) if s.argv[0] == tool) for tool in ("iptables", "ip6tables"))
    chain = ("iptables", *W, "-A", "MESHRUN")
    assert v4 == (
        Step(("iptables", *W, "-N", "MESHRUN"), unless=("iptables", *W, "-S", "MESHRUN")),
        Step(("iptables", *W, "-F", "MESHRUN")),
        Step((*chain, "-i", "lo", "-j", "RETURN")),
        Step((*chain, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN")),
        Step((*chain, "-p", "tcp", "--dport", "2222", "-j", "RETURN")),
        Step((*chain, "-p", "tcp", "--dport", "22", "-j", "RETURN")),
        Step((*chain, "-i", "wg0", "-s", "10.78.0.11", "-j", "RETURN")),
        Step((*chain, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset")),
        Step(("iptables", *W, "-I", "INPUT", "1", "-j", "MESHRUN"), unless=("iptables", *W, "-C", "INPUT", "-j", "MESHRUN")),
    )
    assert ("ip6tables", *W, "-A", "MESHRUN", "-i", "wg0", "-s", "fd00::2", "-j", "RETURN") in [s.argv for s in v6]
    assert not any("10.78.0.11" in s.argv for s in v6)


@pytest.mark.parametrize("dialled,ssh_connection,ports", [
    (40022, "203.0.113.9 51234 10.0.0.5 22", (40022, 22)),  # a provider's port forward: sshd saw 22
    (22, "203.0.113.9 51234 10.0.0.5 22\n", (22,)),
    (2222, "fd00::9 51234 fd00::5 2222", (2222,)),
    (22, "", (22,)),  # no variable (sshd always sets it, but the host says what it says)
    (22, "a b c 99999", (22,)),
    (22, "a b c ²", (22,)),
    (22, "a b c 0", (22,)),
    (22, "a b c 2200 extra", (22,)),
])
def test_ssh_is_let_in_on_the_port_dialled_and_the_port_sshd_answered_on(dialled: int, ssh_connection: str,
                                                                        ports: tuple[int, ...]) -> None:
    assert ssh_ports(dialled, ssh_connection) == ports


def test_down_and_status_plans_are_exact() -> None:
    check = ("iptables", *W, "-C", "INPUT", "-j", "MESHRUN")
    exists = ("iptables", *W, "-S", "MESHRUN")
    assert down_steps()[:3] == (Step(("iptables", *W, "-D", "INPUT", "-j", "MESHRUN"), only_if=check),
                                Step(("iptables", *W, "-F", "MESHRUN"), only_if=exists),
                                Step(("iptables", *W, "-X", "MESHRUN"), only_if=exists))
    assert status_steps()[:2] == (Step(exists, only_if=exists), Step(check, only_if=check))


def test_bad_action_and_host_names_are_input_errors() -> None:
    assert parse_action("up") is Action.UP
    with pytest.raises(InputError, match="unknown action 'sideways'; use up, down or status"):
        parse_action("sideways")
    with pytest.raises(InputError, match="'gpu1.example' is not an IP address"):
        member_addresses(("10.0.0.1", "gpu1.example"))
    assert member_addresses(("10.0.0.1", "10.0.0.1", "::1")) == ("10.0.0.1", "::1")


def test_a_detached_run_cannot_be_bracketed(inventory: Path) -> None:
    done = fab("train", "--firewall", "--detach", "--inventory", str(inventory))
    assert done.returncode == 2 and done.stderr.startswith("error: --firewall brackets an attached run;"), done.stderr


def test_unknown_action_is_one_line_and_exit_2(inventory: Path) -> None:
    done = fab("firewall", "sideways", "--inventory", str(inventory))
    assert done.returncode == 2, done.stdout + done.stderr
    assert [ln for ln in done.stderr.splitlines() if ln.strip()] == [
        "error: fab firewall: unknown action 'sideways'; use up, down or status"]


@pytest.mark.cluster
def test_without_root_or_sudo_the_host_script_says_so_in_one_line(testbed) -> None:
    """The host script as `nobody` (the test bed has no sudo): nothing runs, one line, exit 3."""
    done = testbed.exec(1, ["env", "-C", "/", "setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups",
                            "/usr/bin/python3", "-c", HOST_SCRIPT.read_text(), host_request(Action.STATUS, None)],
                           check=False)
    assert done.returncode == 3, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    assert answer["results"] == [] and answer["error"] == (
        "the firewall needs root or passwordless sudo; running as uid 65534 with neither")


@contextmanager
def outsider(testbed) -> Iterator[None]:
    """mrt9 on the bridge, routing each member's overlay address through its bridge address (what an
    attacker on the same LAN can do: Linux accepts a packet for any of its addresses on any link)."""
    network.create_host_link(OUTSIDER)
    try:
        for i in (1, 2):
            h = testbed.host(i)
            subprocess.run(["ip", "-n", OUTSIDER.netns, "route", "add", f"{h.overlay_address}/32", "via", h.address],
                           check=True)
        yield
    finally:
        network.delete_netns(OUTSIDER.netns)


CONNECT = """
import json, socket, sys
out = []
for address, port in json.loads(sys.argv[1]):
    try:
        socket.create_connection((address, port), timeout=3).close(); out.append("open")
    except ConnectionRefusedError: out.append("refused")
    except OSError as err: out.append(type(err).__name__)
print(json.dumps(out))
"""


def outsider_connects(targets: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
    done = subprocess.run(["ip", "netns", "exec", OUTSIDER.netns, "/usr/bin/python3", "-c", CONNECT,
                           json.dumps(targets)], capture_output=True, text=True, timeout=120, check=True)
    return dict(zip(targets, json.loads(done.stdout)))


def tcp_ports(testbed, i: int) -> set[int]:
    """Every listening TCP port in host i but SSH's."""
    lines = testbed.exec(i, ["ss", "-tlnH"]).stdout.splitlines()
    return {int(line.split()[3].rsplit(":", 1)[1]) for line in lines if line.strip()} - {22}


def wait_listening(testbed, i: int, port: int, timeout: float = 60) -> None:
    """Until host i listens on `port` (a python3 started beside a loaded suite takes seconds)."""
    deadline = time.monotonic() + timeout
    while port not in tcp_ports(testbed, i):
        assert time.monotonic() < deadline, f"nothing listens on h{i}:{port} after {timeout:.0f} s"
        time.sleep(0.2)


def chain(testbed, i: int) -> str:
    return testbed.exec(i, ["iptables", "-S", "MESHRUN"], check=False).stdout


CONTROL_PORT = 29611
LISTEN_ANY = "import socket, time; s = socket.create_server(('0.0.0.0', %d)); time.sleep(600)" % CONTROL_PORT


@pytest.mark.cluster
def test_a_non_member_reaches_no_store_or_gloo_port_while_members_train(testbed_wg, wg_inventory: Path) -> None:
    inv, hosts = str(wg_inventory), ("--hosts", "h1,h2")
    both = [(h.address, p) for h in (testbed_wg.host(1),) for p in (CONTROL_PORT,)]
    both += [(testbed_wg.host(1).overlay_address, CONTROL_PORT)]
    control = testbed_wg.popen(1, ["/usr/bin/python3", "-c", LISTEN_ANY])
    train = None
    try:
        wait_listening(testbed_wg, 1, CONTROL_PORT)
        with outsider(testbed_wg):
            # Without the firewall a listener on every address (as torch's store) is the outsider's.
            assert outsider_connects(both) == {t: "open" for t in both}
            first = fab("firewall", "up", "--inventory", inv, *hosts)
            assert first.returncode == 0, first.stdout + first.stderr
            rules = chain(testbed_wg, 1)
            again = fab("firewall", "up", "--inventory", inv, *hosts)
            assert again.returncode == 0 and chain(testbed_wg, 1) == rules, again.stdout + again.stderr
            assert "-A MESHRUN -s 10.78.0.12/32 -i wg0 -j RETURN" in rules.splitlines()
            jumps = testbed_wg.exec(1, ["iptables", "-S", "INPUT"]).stdout.splitlines()
            assert jumps.count("-A INPUT -j MESHRUN") == 1
            status = fab("firewall", "status", "--inventory", inv, *hosts)
            assert status.returncode == 0 and "-A MESHRUN -p tcp -j REJECT --reject-with tcp-reset" in status.stdout
            assert outsider_connects(both) == {t: "refused" for t in both}

            # --firewall: up again (idempotent) before the launch, down after the run, by itself.
            train = FabProcess("train", "--firewall", "--inventory", inv, *hosts, "--script",
                               "tests/scripts/gloo_hold.py", "--", "25")
            train.wait_for(r"GLOO_READY rank 1 sum 2", timeout=240)
            ports = {i: tcp_ports(testbed_wg, i) - {CONTROL_PORT} for i in (1, 2)}
            assert RENDEZVOUS_PORT in ports[1] and len(ports[2]) >= 1, ports  # the store; gloo's pairs
            targets = [(a, p) for i in (1, 2) for p in sorted(ports[i])
                       for a in (testbed_wg.host(i).address, testbed_wg.host(i).overlay_address)]
            assert outsider_connects(targets) == {t: "refused" for t in targets}
            assert train.finish(timeout=240) == 0, train.output[-3000:]
            assert (chain(testbed_wg, 1), chain(testbed_wg, 2)) == ("", "")
    finally:
        if train is not None:
            train.close()
        control.kill()
        control.wait()
        down = fab("firewall", "down", "--inventory", inv, *hosts)
    assert down.returncode == 0, down.stdout + down.stderr
    for i in (1, 2):
        assert chain(testbed_wg, i) == ""
        assert "MESHRUN" not in testbed_wg.exec(i, ["iptables", "-S"]).stdout


@pytest.mark.cluster
def test_behind_a_port_forward_new_ssh_connections_still_get_in(testbed, make_inventory) -> None:
    """The controller dials h1:40022, which h1's own nat table forwards to sshd's 22 (a rented box
    behind its provider's port forward). The filter sees port 22: the chain must let in both the
    port dialled and the one sshd answered on, or every later `fab` locks itself out."""
    inventory = make_inventory(hosts=["h1"], host_overrides={"h1": {"port": 40022}})
    forward = ["-t", "nat", "PREROUTING", "-p", "tcp", "--dport", "40022", "-j", "REDIRECT", "--to-ports", "22"]
    testbed.exec(1, ["iptables", forward[0], forward[1], "-A", *forward[2:]])
    inv = ("--inventory", str(inventory), "--hosts", "h1")
    try:
        up = fab("firewall", "up", *inv)
        assert up.returncode == 0, up.stdout + up.stderr
        rules = chain(testbed, 1)
        assert "--dport 40022 -j RETURN" in rules and "--dport 22 -j RETURN" in rules, rules
        status = fab("firewall", "status", *inv)  # a new SSH connection, through the forward and the chain
        assert status.returncode == 0, status.stdout + status.stderr
    finally:
        down = fab("firewall", "down", *inv)
        testbed.exec(1, ["iptables", forward[0], forward[1], "-D", *forward[2:]], check=False)
    assert down.returncode == 0, down.stdout + down.stderr
    assert chain(testbed, 1) == ""


def test_the_nft_plan_is_the_same_policy_in_meshruns_own_table() -> None:
    spec = FirewallSpec((22,), "wg0", ("10.78.0.11", "fd00::2"))
    rule = ("nft", "add", "rule", "inet", "meshrun", "input")
    assert plans_for(Action.UP, spec)["nft"] == (
        Step(("nft", "add", "table", "inet", "meshrun")),
        Step(("nft", "delete", "table", "inet", "meshrun")),
        Step(("nft", "add", "table", "inet", "meshrun")),
        Step(("nft", "add", "chain", "inet", "meshrun", "input", "{", "type", "filter", "hook", "input", "priority", "0",
              ";", "policy", "accept", ";", "}")),
        Step((*rule, "iifname", '"lo"', "accept")),
        Step((*rule, "ct", "state", "established,related", "accept")),
        Step((*rule, "tcp", "dport", "22", "accept")),
        Step((*rule, "iifname", '"wg0"', "ip", "saddr", "10.78.0.11", "accept")),
        Step((*rule, "iifname", '"wg0"', "ip6", "saddr", "fd00::2", "accept")),
        Step((*rule, "meta", "l4proto", "tcp", "reject", "with", "tcp", "reset")),
    )
    listed = ("nft", "list", "table", "inet", "meshrun")
    assert plans_for(Action.DOWN, None)["nft"] == (Step(("nft", "delete", "table", "inet", "meshrun"), only_if=listed),)
    assert plans_for(Action.STATUS, None)["nft"] == (Step(listed, only_if=listed),)
    assert plans_for(Action.UP, spec)["iptables"] == up_steps(spec)


CONNECT_ONE = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()"


def tools_only(directory: Path, *tools: str, failing: str | None = None) -> Path:
    """A PATH entry with just these commands (symlinks to the real ones), and `failing`, a command of
    that name that fails as ip6tables does on a kernel without IPv6 filtering."""
    directory.mkdir()
    for tool in tools:
        (directory / tool).symlink_to(shutil.which(tool))
    if failing:
        (directory / failing).write_text(f"#!/bin/sh\necho \"{failing}: can't initialize table 'filter'\" >&2\nexit 3\n")
        (directory / failing).chmod(0o755)
    return directory


def host_script(testbed, path: Path, action: Action, spec: FirewallSpec | None) -> tuple[int, dict]:
    """deploy/host/firewall.py in h1 with only `path` on its PATH, as `fab firewall` runs it."""
    done = testbed.exec(1, ["env", f"PATH={path}", "/usr/bin/python3", "-c", HOST_SCRIPT.read_text(),
                            host_request(action, spec)], check=False)
    return done.returncode, json.loads(done.stdout)


def test_the_host_request_carries_the_action_both_plans_and_how_to_take_up_back() -> None:
    spec = FirewallSpec((22,), "wg0", ("10.78.0.11",))
    listed = lambda steps: [{"argv": list(s.argv), "only_if": s.only_if and list(s.only_if),
                             "unless": s.unless and list(s.unless)} for s in steps]
    down = plans_for(Action.DOWN, None)
    assert json.loads(host_request(Action.UP, spec)) == {
        "action": "up", "plans": {b: listed(steps) for b, steps in plans_for(Action.UP, spec).items()},
        "undo": {"iptables": listed(down["iptables"]), "nft": listed(down["nft"])}}
    assert json.loads(host_request(Action.DOWN, None)) == {
        "action": "down", "plans": {b: listed(steps) for b, steps in down.items()}, "undo": {}}


@pytest.mark.cluster
def test_a_host_with_nft_and_no_iptables_command_gets_the_same_policy(testbed, tmp_path: Path) -> None:
    """Debian 12 ships nft, not iptables: the host script runs the nft plan when `iptables` is not on
    its PATH. A member (h2) gets in; this controller, a non-member, is reset; SSH stays open."""
    h1, h2 = testbed.host(1).address, testbed.host(2).address
    only_nft = tools_only(tmp_path / "bin", "nft")

    def run(action: Action, spec: FirewallSpec | None) -> dict:
        rc, answer = host_script(testbed, only_nft, action, spec)
        assert rc == 0, answer
        return answer

    listener = testbed.popen(1, ["/usr/bin/python3", "-c", LISTEN_ANY])
    spec = FirewallSpec((22,), "eth0", (h1, h2))
    try:
        wait_listening(testbed, 1, CONTROL_PORT)
        socket.create_connection((h1, CONTROL_PORT), timeout=3).close()  # open before: this controller gets in
        first = run(Action.UP, spec)
        assert [r["argv"][0] for r in first["results"]] == ["nft"] * 10, first
        listing = run(Action.STATUS, None)["results"][0]["stdout"]
        assert run(Action.UP, spec) and run(Action.STATUS, None)["results"][0]["stdout"] == listing
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((h1, CONTROL_PORT), timeout=3)
        assert testbed.exec(2, ["/usr/bin/python3", "-c", CONNECT_ONE, h1, str(CONTROL_PORT)], check=False).returncode == 0
        assert subprocess.run(testbed.ssh_argv(1, "true"), capture_output=True, timeout=30).returncode == 0
    finally:
        down = run(Action.DOWN, None)
        listener.kill()
        listener.wait()
    assert [r["argv"][:3] for r in down["results"]] == [["nft", "delete", "table"]]
    assert testbed.exec(1, ["nft", "list", "table", "inet", "meshrun"], check=False).returncode != 0


LISTEN_DUAL = ("import socket, time; s = socket.create_server(('::', %d), family=socket.AF_INET6, dualstack_ipv6=True); "
               "time.sleep(600)" % CONTROL_PORT)
V6 = {1: "fd77::11", 2: "fd77::12"}  # ULAs added to eth0 for these tests: the bridge carries IPv6 too


@contextmanager
def ipv6_on_the_lan(testbed) -> Iterator[None]:
    for i, address in V6.items():
        testbed.exec(i, ["ip", "addr", "add", f"{address}/64", "dev", "eth0", "nodad"])
    try:
        yield
    finally:
        for i, address in V6.items():
            testbed.exec(i, ["ip", "addr", "del", f"{address}/64", "dev", "eth0"], check=False)


def from_h2(testbed, targets: list[tuple[str, int]]) -> list[str]:
    done = testbed.exec(2, ["/usr/bin/python3", "-c", CONNECT, json.dumps(targets)])
    return json.loads(done.stdout)


def meshrun_rules(testbed) -> tuple[str, str, str]:
    """What meshrun left in h1: the iptables and ip6tables chains and the nft table (all with the full PATH)."""
    return tuple(testbed.exec(1, argv, check=False).stdout for argv in (  # type: ignore[return-value]
        ["iptables", "-S", "MESHRUN"], ["ip6tables", "-S", "MESHRUN"], ["nft", "list", "table", "inet", "meshrun"]))


@pytest.mark.cluster
def test_iptables_without_ip6tables_filters_ipv6_through_nft(testbed, tmp_path: Path) -> None:
    """Issue 20: a host with iptables and no ip6tables used to get the IPv4 chain only, and a warning,
    while the store listens on `::`. With nft there, both families go through nft's `inet` table: h2
    (a member by its IPv4 address) gets in over IPv4, its IPv6 address is reset; SSH stays open."""
    path = tools_only(tmp_path / "bin", "iptables", "nft")
    h1, h2 = testbed.host(1).address, testbed.host(2).address
    targets = [(h1, CONTROL_PORT), (V6[1], CONTROL_PORT)]
    with ipv6_on_the_lan(testbed):
        listener = testbed.popen(1, ["/usr/bin/python3", "-c", LISTEN_DUAL])
        try:
            deadline = time.monotonic() + 30
            while from_h2(testbed, targets) != ["open", "open"]:  # both families reach it before
                assert time.monotonic() < deadline, "the dual-stack listener on h1 never came up"
                time.sleep(0.2)
            rc, up = host_script(testbed, path, Action.UP, FirewallSpec((22,), "eth0", (h1, h2)))
            assert (rc, up["error"], up["notes"]) == (0, None, [
                "ip6tables not found: both families are filtered in nft's table inet meshrun"]), up
            assert from_h2(testbed, targets) == ["open", "refused"]
            assert subprocess.run(testbed.ssh_argv(1, "true"), capture_output=True, timeout=30).returncode == 0
            v4, v6, table = meshrun_rules(testbed)
            assert (v4, v6) == ("", "") and "ip6 saddr" not in table and f"ip saddr {h2}" in table, table
        finally:
            rc, down = host_script(testbed, path, Action.DOWN, None)
            listener.kill()
            listener.wait()
    assert (rc, [r["argv"][:3] for r in down["results"]]) == (0, [["nft", "delete", "table"]])
    assert meshrun_rules(testbed) == ("", "", "")


@pytest.mark.cluster
@pytest.mark.parametrize("tools,failing,error", [
    (("iptables",), None, "ip6tables not found, and no nft: IPv6 would stay open to the store, so nothing was "
                          "changed; install nftables (Debian: apt-get install nftables) or ip6tables"),
    (("iptables",), "ip6tables", "`ip6tables -w 10 -N MESHRUN` failed: ip6tables: can't initialize table 'filter'; "
                                 "the rules added before it were taken back"),
])
def test_up_that_cannot_filter_ipv6_fails_and_leaves_no_ipv4_chain_behind(testbed, tmp_path: Path, tools, failing,
                                                                           error) -> None:
    """Fail closed: iptables alone (no ip6tables, no nft) is refused before any rule is added; an
    ip6tables that fails midway (a kernel without IPv6 filtering) has its IPv4 chain taken back."""
    path = tools_only(tmp_path / "bin", *tools, failing=failing)
    try:
        rc, up = host_script(testbed, path, Action.UP, FirewallSpec((22,), "eth0", (testbed.host(2).address,)))
        assert (rc, up["error"]) == (1, error), up
        assert meshrun_rules(testbed) == ("", "", "")
        assert "MESHRUN" not in testbed.exec(1, ["iptables", "-S", "INPUT"]).stdout
    finally:
        testbed.exec(1, ["sh", "-c", "iptables -D INPUT -j MESHRUN; iptables -F MESHRUN; iptables -X MESHRUN"],
                     check=False)
