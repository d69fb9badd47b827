"""Where SSH goes for an inventory host (deploy.edges.sshtarget) and the ssh command rsync runs
(deploy.edges.sshargv): inventory first, then ssh_config, then root/22; exact equality throughout.
The cluster tests that connect for real are in tests/test_ssh_hops.py."""

from __future__ import annotations

import shlex
import textwrap
from pathlib import Path

import paramiko
import pytest

from meshrun.deploy.edges import sshargv, sshtarget
from meshrun.deploy.edges.sshtarget import Hop, SshTarget
from meshrun.deploy.edges.transport import login_refused
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.inventory.model import Host, Network

CONFIG = """\
Host gpu1
  HostName 203.0.113.7
  User ubuntu
  Port 2200
  IdentityFile ~/.ssh/rented
  ProxyJump bastion
Host bastion
  HostName 198.51.100.1
  User jump
  Port 2022
Host gpu2
  User alice
Host 10.0.0.3
  Port 2203
Host *
  ServerAliveInterval 9
"""


def host(name: str, address: str, **fields: object) -> Host:
    values: dict[str, object] = dict(ssh_address=None, user=None, port=None, identity=None, python=None,
                                     workdir="~/meshrun", network=Network.LAN, gpus=None, nproc=None,
                                     batch_size=None, env=())
    values.update(fields)
    return Host(name, address, **values)  # type: ignore[arg-type]


def resolve(h: Host, text: str = CONFIG) -> SshTarget:
    return sshtarget.resolve(h, paramiko.SSHConfig.from_text(textwrap.dedent(text)), Path("/cfg"))


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return tmp_path


def test_a_host_named_like_a_block_gets_all_of_it_and_its_jump_host(home: Path) -> None:
    got = resolve(host("gpu1", "10.147.17.11"))
    key = str(home / ".ssh/rented")
    assert got == SshTarget(
        "gpu1",
        (Hop("bastion", "198.51.100.1", "jump", 2022, (key,), "IdentityFile for Host gpu1 in /cfg"),),
        Hop("gpu1", "203.0.113.7", "ubuntu", 2200, (key,), "IdentityFile for Host gpu1 in /cfg"),
        Path("/cfg"))


def test_the_inventory_wins_where_it_speaks(home: Path) -> None:
    (home / "id").write_text("k")
    got = resolve(host("gpu1", "10.147.17.11", user="root", port=22, identity=str(home / "id")))
    assert got.target == Hop("gpu1", "203.0.113.7", "root", 22, (str(home / "id"),), "`identity` in the inventory")
    assert got.jumps[0].identities == (str(home / "id"),)  # the jump host has no key of its own


def test_a_block_without_hostname_keeps_the_address_and_no_block_means_the_address() -> None:
    assert resolve(host("gpu2", "10.0.0.2")).target == Hop("gpu2", "10.0.0.2", "alice", 22, (), "")
    # `Host *` alone says nothing about the name: the address's block applies, as `ssh 10.0.0.3` would.
    assert resolve(host("cpu3", "10.0.0.3")).target == Hop("10.0.0.3", "10.0.0.3", "root", 2203, (), "",
                                                           user_defaulted=True)


def test_ssh_address_picks_its_block_as_before() -> None:
    got = resolve(host("x", "10.147.17.9", ssh_address="gpu1"))
    assert (got.target.hostname, got.target.port, [j.label for j in got.jumps]) == ("203.0.113.7", 2200, ["bastion"])


def test_jump_specs_and_refusals() -> None:
    got = resolve(host("a", "10.0.0.9"), "Host a\n  ProxyJump u@j1:2001,[fd00::5]:23,j3\n")
    assert [(j.label, j.hostname, j.user, j.port, j.user_defaulted) for j in got.jumps] == [
        ("j1", "j1", "u", 2001, False), ("fd00::5", "fd00::5", "root", 23, True), ("j3", "j3", "root", 22, True)]
    with pytest.raises(InputError) as err:
        resolve(host("a", "10.0.0.9"), "Host a\n  ProxyCommand nc %h %p\n")
    assert str(err.value) == ("host 'a': /cfg sets a ProxyCommand for a; meshrun cannot pin the keys behind it: "
                              "use ProxyJump instead")
    with pytest.raises(InputError) as err:  # a jump host's ProxyCommand would be dialled around otherwise
        resolve(host("a", "10.0.0.9"), "Host a\n  ProxyJump j1\nHost j1\n  ProxyCommand nc evil %p\n")
    assert str(err.value) == ("host 'a': /cfg sets a ProxyCommand for j1; meshrun cannot pin the keys behind it: "
                              "use ProxyJump instead")


def test_rsync_ssh_gets_every_setting_on_its_command_line_and_reads_no_config(home: Path) -> None:
    target = resolve(host("gpu1", "10.147.17.11"))
    options = sshargv.common_options(home / "my keys" / "known%hosts")
    assert options[:7] == ["-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o"]
    assert options[7] == f'UserKnownHostsFile="{home}/my keys/known%%hosts" {home}/.ssh/known_hosts'
    assert options[8:10] == ["-o", "GlobalKnownHostsFile=/dev/null"]  # paramiko never reads /etc/ssh's file
    key = str(home / ".ssh/rented")
    jump = ["ssh", *options, "-p", "2022", "-o", "HostName=198.51.100.1", "-i", key, "-o", "IdentitiesOnly=yes",
            "-l", "jump", "-W", "203.0.113.7:2200", "198.51.100.1"]
    assert sshargv.hop_argv(target.target, target.jumps, options) == [
        "ssh", *options, "-p", "2200", "-o", "HostName=203.0.113.7", "-i", key, "-o", "IdentitiesOnly=yes",
        "-o", "ProxyCommand=" + shlex.join(jump).replace("%", "%%"), "-l", "ubuntu"]


def test_missing_keys_are_named_with_where_they_were_set(home: Path) -> None:
    target = resolve(host("gpu1", "10.147.17.11"))
    with pytest.raises(Exception) as err:
        sshtarget.check_keys(target)
    assert str(err.value) == (f"host 'gpu1': SSH key {home}/.ssh/rented for bastion does not exist; it is set by "
                              "IdentityFile for Host gpu1 in /cfg: point it at your private key")
    with pytest.raises(Exception) as err:
        sshtarget.check_keys(resolve(host("gpu2", "10.0.0.2")))
    assert str(err.value) == ("host 'gpu2': no SSH key to offer gpu2 (no `identity` in the inventory, no "
                              "IdentityFile for Host gpu2 in /cfg, no ssh-agent, no ~/.ssh/id_*); set "
                              "`identity: ~/.ssh/<key>` in the inventory")
    (home / ".ssh").mkdir()
    (home / ".ssh/id_ed25519").write_text("k")
    sshtarget.check_keys(resolve(host("gpu2", "10.0.0.2")))  # paramiko finds ~/.ssh/id_ed25519 itself


def test_a_refused_login_names_a_defaulted_user_and_only_a_real_key_source(home: Path) -> None:
    """The target's user fell back to root and no key was set anywhere: say so, and name no IdentityFile."""
    refused = paramiko.AuthenticationException("Authentication failed.")
    bare = resolve(host("cpu3", "10.0.0.3"))
    assert str(login_refused("host 'cpu3'", "root@10.0.0.3:2203", bare.target, None, bare.config, refused)) == (
        "host 'cpu3': SSH login to root@10.0.0.3:2203 refused (Authentication failed.); check user root (the "
        "default; set `user:` in the inventory) and the key (ssh-agent or ~/.ssh/id_*: none is set in the "
        "inventory or ssh_config), and that the key is in the host's authorized_keys")
    named = resolve(host("gpu1", "10.147.17.11"))
    assert str(login_refused("host 'gpu1'", "ubuntu@203.0.113.7:2200", named.target, None, named.config,
                             refused)) == (
        "host 'gpu1': SSH login to ubuntu@203.0.113.7:2200 refused (Authentication failed.); check the user and "
        "the key (IdentityFile for Host gpu1 in /cfg), and that the key is in the host's authorized_keys")
    jumped = resolve(host("a", "10.0.0.9", user="me", identity="~/k"), "Host a\n  ProxyJump j3\n")
    assert str(login_refused("host 'a': jump host j3", "root@j3:22", jumped.jumps[0], "j3", jumped.config,
                             refused)) == (
        "host 'a': jump host j3: SSH login to root@j3:22 refused (Authentication failed.); check user root (the "
        "default; set User for Host j3 in /cfg) and the key (`identity` in the inventory), and that the key is "
        "in the host's authorized_keys")


def test_a_key_path_with_a_percent_reaches_ssh_literally(home: Path) -> None:
    """OpenSSH expands %-tokens in -i paths: `%h` in a key's path would name another file."""
    hop = Hop("a", "10.0.0.9", "root", 22, (str(home / "keys%h" / "id"),), "`identity` in the inventory")
    assert sshargv.hop_argv(hop, (), ["-F", "/dev/null"]) == [
        "ssh", "-F", "/dev/null", "-p", "22", "-o", "HostName=10.0.0.9", "-i", f"{home}/keys%%h/id",
        "-o", "IdentitiesOnly=yes", "-l", "root"]


def test_an_inventory_silent_on_user_and_port_leaves_them_to_ssh_config(tmp_path: Path) -> None:
    """The loader's defaults are not root/22: a `Host gpu2` block's User and Port win unless the
    inventory (a host or `defaults`) names its own."""
    from meshrun.deploy.inventory.load import load_inventory

    inventory = tmp_path / "inv.yaml"
    inventory.write_text("hosts:\n  gpu2: {address: 10.0.0.2}\n  cpu3: {address: 10.0.0.3, user: bob, port: 2022}\n")
    hosts = {h.name: h for h in load_inventory(inventory).hosts}
    assert (hosts["gpu2"].user, hosts["gpu2"].port) == (None, None)
    config = "Host gpu2 10.0.0.3\n  User alice\n  Port 2202\n"
    assert (resolve(hosts["gpu2"], config).target.user, resolve(hosts["gpu2"], config).target.port) == ("alice", 2202)
    assert (resolve(hosts["cpu3"], config).target.user, resolve(hosts["cpu3"], config).target.port) == ("bob", 2022)
    assert (resolve(hosts["gpu2"], "").target.user, resolve(hosts["gpu2"], "").target.port) == ("root", 22)


FIX = "fix ssh_config or set it in the inventory"


@pytest.mark.parametrize("block,expected", [
    ("Port abc", "Port 'abc' for Host 'gpu1' is not a port number (1-65535)"),  # was int(): an internal error
    ("Port 0", "Port '0' for Host 'gpu1' is not a port number (1-65535)"),
    ("Port 70000", "Port '70000' for Host 'gpu1' is not a port number (1-65535)"),
    ("Port ٣", "Port '٣' for Host 'gpu1' is not a port number (1-65535)"),  # int('٣') is 3
    ("HostName -oProxyCommand=touch/tmp/x", "HostName '-oProxyCommand=touch/tmp/x' for Host 'gpu1' is not a host name or IP address"),
    ("User -oProxyCommand=x", "User '-oProxyCommand=x' for Host 'gpu1' is not a login name"),
    ("User a;b", "User 'a;b' for Host 'gpu1' is not a login name"),
    ("ProxyJump -oProxyCommand=x", "ProxyJump '-oProxyCommand=x' for Host 'gpu1' is not [user@]host[:port] with a login "
                                   "name and a host name or address"),
    ("ProxyJump bastion:²", "ProxyJump 'bastion:²' for Host 'gpu1' is not [user@]host[:port] with a port 1-65535"),
    ("ProxyJump -l@bastion", "ProxyJump '-l@bastion' for Host 'gpu1' is not [user@]host[:port] with a login name and a "
                             "host name or address"),
    ("ProxyJump j\nHost j\n  Port x", "Port 'x' for Host 'j' is not a port number (1-65535)"),  # a jump host's own
    ("ProxyJump j\nHost j\n  HostName -x", "HostName '-x' for Host 'j' is not a host name or IP address"),
])
def test_an_ssh_config_value_meshrun_uses_is_checked(block: str, expected: str) -> None:
    """Each value is one line naming the file, the Host block and the field (exit status 2); a HostName or a
    jump host that ssh would read as an option (`-o…`: rsync's ssh gets it as an argument) never gets there."""
    with pytest.raises(InputError) as info:
        resolve(host("gpu1", "10.0.0.1"), f"Host gpu1\n  {block}\n")
    assert (str(info.value), info.value.exit_code) == (f"host 'gpu1': /cfg: {expected}; {FIX}", 2)


def test_check_all_refuses_before_any_host_and_skips_local_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config"
    config.write_text("Host 10.0.0.2\n  Port abc\n")
    monkeypatch.setenv("MESHRUN_SSH_CONFIG", str(config))
    with pytest.raises(InputError) as info:
        sshtarget.check_all([host("gpu1", "10.0.0.1"), host("gpu2", "10.0.0.2")])
    assert str(info.value) == f"host 'gpu2': {config}: Port 'abc' for Host '10.0.0.2' is not a port number (1-65535); {FIX}"
    sshtarget.check_all([host("gpu1", "10.0.0.1"), host("me", "local")])


def test_a_key_file_that_is_no_regular_file_is_named_as_such(home: Path) -> None:
    """paramiko reads every IdentityFile itself: a FIFO would block it, /dev/zero fill memory. Named, not
    called missing."""
    import os

    os.mkfifo(home / "fifo")
    for key, what in ((home / "fifo", "is a FIFO, not a regular file"),
                      (Path("/dev/zero"), "is a character device, not a regular file")):
        with pytest.raises(MeshrunError) as err:
            sshtarget.check_keys(resolve(host("gpu1", "10.0.0.1", identity=str(key)), ""))
        assert str(err.value) == (f"host 'gpu1': SSH key {key} for 10.0.0.1 {what}; it is set by `identity` in the "
                                  "inventory: point it at your private key")
