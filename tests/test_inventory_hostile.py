"""Hostile inventories and flags (issue 12, hole 10): each gets one exact line, exit status 2, no traceback.

The inventory is input written by hand, or by someone who means harm. Every case here failed on the code
before the fix: with a traceback (ValueError, ConstructorError, RecursionError), a message of many lines or
many megabytes, or no error at all for a value that breaks something later (a NUL in an env value, a
login name inside `address`). Cases load real files; the `fab` cases run the real command.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.model import ElasticBounds, Inventory
from meshrun.deploy.inventory.selection import HostSpec, parse_hosts_flag, parse_nnodes, select_hosts
from meshrun.deploy.inventory.yamlnodes import MAX_BYTES
from tests.fabrun import FAB, ROOT

MAX_MESSAGE = 300  # characters: the bound for one line
A = "hosts:\n  a: {address: 10.0.0.1}\n"  # a valid inventory, to append to
BOMB = ('lol: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
        + "".join(f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefg", "bcdefgh")))
# The same bomb where today's fields read it: the GPU list's message used to repr() the nested nodes (57 MB).
GPU_BOMB = ("hosts:\n  a:\n    address: 10.0.0.1\n    gpus: [[&a [0,0,0,0,0,0,0,0,0], "
            + ", ".join(f"&{n} [{', '.join([f'*{p}'] * 9)}]" for p, n in zip("abcde", "bcdef")) + "]]\n")
TAGS_FIX = "remove the tag: inventories hold plain text, numbers, lists and mappings"
DEEP_FIX = "an inventory needs 5 (hosts → host → env → value); check the brackets and indentation"
MANY = ("more than 100000 values, counting each alias as the values it repeats; an inventory of hosts needs far "
        "fewer: check the file (an alias bomb?)")
UNPRINTABLE_FIX = "write it on one line, in printable characters"
PRINTABLE = "remove it (an inventory is plain text)"
NAME_CHARS = "has characters other than letters, digits, '.', '_' and '-'"


def host(fields: str) -> str:
    return "hosts:\n  a: {address: 10.0.0.1, " + fields + "}\n"


# (inventory text, exact message after "<path>:")
HOSTILE = [
    # YAML tags that construct nothing valid, or code: refused by name, never constructed
    (host("port: !!int abc"), f"2: YAML tag '!!int' is not supported; {TAGS_FIX}"),
    (host("port: !!timestamp 2020-99-99"), f"2: YAML tag '!!timestamp' is not supported; {TAGS_FIX}"),
    ("hosts:\n  a: {address: !!python/name:os.system x}\n",
     f"2: YAML tag '!!python/name:os.system' is not supported; {TAGS_FIX}"),
    ("hosts:\n  a: !!python/object/apply:os.system [echo hi]\n",
     f"2: YAML tag '!!python/object/apply:os.system' is not supported; {TAGS_FIX}"),
    ("hosts:\n  a: {address: !vault 10.0.0.1}\n", f"2: YAML tag '!vault' is not supported; {TAGS_FIX}"),
    ("hosts:\n  !host a: {address: 10.0.0.1}\n", f"2: YAML tag '!host' is not supported; {TAGS_FIX}"),
    (host("python: !!str python3"), f"2: YAML tag '!!str' is not supported; {TAGS_FIX}"),
    ("hosts:\n  a: !!map {address: 10.0.0.1}\n", f"2: YAML tag '!!map' is not supported; {TAGS_FIX}"),
    (host("gpus: !!set {0: null}"), f"2: YAML tag '!!set' is not supported; {TAGS_FIX}"),
    (host("python: ! python3"), f"2: YAML tag '!' is not supported; {TAGS_FIX}"),
    ("%TAG !e! tag:evil.example,2026:\n---\nhosts: !e!x {}\n",
     f"3: YAML tag 'tag:evil.example,2026:x' is not supported; {TAGS_FIX}"),
    ("!" + "x" * 5000 + " a: 1\n", f"1: YAML tag '!{'x' * 39}'… is not supported; {TAGS_FIX}"),
    # untagged scalars YAML would make dates, `=` or numbers past 4300 digits: they stay text
    (host("port: 2020-99-99"),
     "2: host 'a', field 'port': expected a port number, got text '2020-99-99'; write a number from 1 to 65535"),
    (host("nproc: 2020-01-01"),
     "2: host 'a', field 'nproc': expected a whole number, got text '2020-01-01'; write a number from 1 to 1024"),
    (host("port: " + "1" * 5000),
     f"2: host 'a', field 'port': expected a port number, got text '{'1' * 40}'…; write a number from 1 to 65535"),
    (host("port: " + "9" * 30),
     f"2: host 'a', field 'port': port {'9' * 30} is out of range; write a number from 1 to 65535"),
    (host("port: " + "9" * 100),
     f"2: host 'a', field 'port': port {'9' * 40}… is out of range; write a number from 1 to 65535"),
    (host("batch_size: ="), "2: host 'a', field 'batch_size': expected a number >= 1 or `auto`, got '='; "
                            "write e.g. `batch_size: 32` or `batch_size: auto`"),
    (host("network: 2020-01-01"),
     "2: host 'a', field 'network': unknown network '2020-01-01'; use one of: zerotier, wireguard, lan, public"),
    # nesting: refused at 20 levels, before Python's recursion limit
    ("hosts: " + "[" * 3000 + "]" * 3000 + "\n", f"1: values nested more than 20 levels deep; {DEEP_FIX}"),
    ("hosts:\n  a: {address: 10.0.0.1, env: " + "{a: " * 3000 + "1" + "}" * 3000 + "}\n",
     f"2: values nested more than 20 levels deep; {DEEP_FIX}"),
    ("".join("  " * i + "-\n" for i in range(100)), f"21: values nested more than 20 levels deep; {DEEP_FIX}"),
    ("[" * (MAX_BYTES - 1), f"1: values nested more than 20 levels deep; {DEEP_FIX}"),
    # aliases: a bomb stops at its first big alias; no message ever shows a node
    (BOMB + A, f"6: {MANY}"),
    (GPU_BOMB, f"4: {MANY}"),
    ("x: &x [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\ny: [" + ", ".join(["*x"] * 10_000) + "]\n" + A, f"2: {MANY}"),
    ("hosts:\n  a:\n    address: 10.0.0.1\n    gpus: &g [0, [1, *g]]\n",
     "4: alias *g is used inside its own anchor; an alias may only repeat a value that is complete"),
    ("hosts:\n  a: {address: 10.0.0.1, gpus: [0, &l [1, 2], *l]}\n",
     "2: host 'a', field 'gpus': GPU index a list is not a whole number; write e.g. `gpus: [0, 1]`"),
    ("hosts:\n  a: &x {address: 10.0.0.1, env: {A: b}}\n  b: {address: 10.0.0.2, gpus: [*x, *x]}\n",
     "3: host 'b', field 'gpus': GPU index a mapping is not a whole number; write e.g. `gpus: [0, 1]`"),
    ("hosts:\n  a: {address: 10.0.0.1, gpus: &x [1, 2], port: *x}\n",
     "2: host 'a', field 'port': expected a port number, got a list; write a port number"),
    ("hosts:\n  a: {address: 10.0.0.1, gpus: &x [1]}\n  *x : {address: 10.0.0.2}\n",
     "2: keys in hosts must be names, got a list; use plain text keys"),  # an alias's line is its anchor's
    ("hosts:\n  a: {address: *nowhere}\n",
     "2: YAML syntax error: found undefined alias 'nowhere'; fix the YAML at that line"),
    ("x: &a 1\ny: &a 2\n" + A, "2: anchor &a is defined twice (first on line 1); give each anchor its own name"),
    # control characters in the file, named with their line; escaped ones refused in any value
    (A + "# \x00\n", f"3: control character U+0000 in the file; {PRINTABLE}"),
    ("hosts:\n  a: {address: 10.0\x07.0.1}\n", f"2: control character U+0007 in the file; {PRINTABLE}"),
    (A + "\x1b[2J\n", f"3: control character U+001B in the file; {PRINTABLE}"),
    (A + "# \x7f\n", f"3: control character U+007F in the file; {PRINTABLE}"),
    (A + "# \x9b\n", f"3: control character U+009B in the file; {PRINTABLE}"),
    ('hosts:\n  a: {address: "10.0.0.1\\a"}\n', "2: host 'a', field 'address': '10.0.0.1\\x07' contains the "
                                                f"unprintable character U+0007; {UNPRINTABLE_FIX}"),
    (host('python: "py\\ethon"'),
     f"2: host 'a', field 'python': 'py\\x1bthon' contains the unprintable character U+001B; {UNPRINTABLE_FIX}"),
    (host('workdir: "~/run\\u202Egnp.exe"'), "2: host 'a', field 'workdir': '~/run\\u202egnp.exe' contains the "
                                             f"unprintable character U+202E; {UNPRINTABLE_FIX}"),
    (host('user: "root\\n"'),
     f"2: host 'a', field 'user': 'root\\n' contains the unprintable character U+000A; {UNPRINTABLE_FIX}"),
    (host('env: {NCCL_DEBUG: "INFO\\0"}'),
     "2: host 'a', field 'env.NCCL_DEBUG': 'INFO\\x00' contains the unprintable character U+0000; an environment "
     "value cannot hold a NUL byte; remove it"),
    # names: the whole name must match (a trailing newline is not a name)
    ('hosts:\n  "gpu1\\n": {address: 10.0.0.1}\n', f"2: host 'gpu1\\n': host name 'gpu1\\n' {NAME_CHARS}; rename the host"),
    ('hosts:\n  "gpu1\\e[31m": {address: 10.0.0.1}\n',
     f"2: host 'gpu1\\x1b[31m': host name 'gpu1\\x1b[31m' {NAME_CHARS}; rename the host"),
    ("hosts:\n  " + "g" * 65 + ": {address: 10.0.0.1}\n",
     f"2: host '{'g' * 40}'…: host name '{'g' * 40}'… is longer than 64 characters; rename the host"),
    (host('env: {"A\\n": x}'),
     "2: host 'a', field 'env.A\\n': 'A\\n' is not a valid environment variable name; use letters, digits and _"),
    (host('env: {"PATH=/tmp:": x}'), "2: host 'a', field 'env.PATH=/tmp:': 'PATH=/tmp:' is not a valid environment "
                                      "variable name; use letters, digits and _"),
    (A + 'groups:\n  "lab\\n": [a]\n', f"4: field 'groups': group name 'lab\\n' {NAME_CHARS}; rename the group"),
    (A + 'rendezvous: {host: "a\\n"}\n',
     f"3: field 'rendezvous.host': 'a\\n' contains the unprintable character U+000A; {UNPRINTABLE_FIX}"),
    (A + "rendezvous: {host: " + "h" * 500 + "}\n",
     f"3: field 'rendezvous.host': rendezvous host '{'h' * 40}'… is not in `hosts`; use one of: a"),
    ("hosts:\n  a: {address: 10.0.0.1}\n  {b: 1}: {address: 10.0.0.2}\n",
     "3: keys in hosts must be names, got a mapping; use plain text keys"),
    ("hosts:\n  a: {address: 10.0.0.1, " + "x" * 1000 + ": 1}\n",
     f"2: host 'a': unknown key '{'x' * 40}'…; allowed: address, ssh_address, user, port, identity, python, "
     "workdir, network, gpus, nproc, batch_size, env, site"),
    # address: the login name and the port have their own fields
    ("hosts:\n  a: {address: bob@10.0.0.1}\n", "2: host 'a', field 'address': 'bob@10.0.0.1' holds a login name; "
                                              "put the login name in `user:` and only the host in `address:`"),
    ("hosts:\n  a: {address: 10.0.0.1, ssh_address: root@203.0.113.7}\n",
     "2: host 'a', field 'ssh_address': 'root@203.0.113.7' holds a login name; "
     "put the login name in `user:` and only the host in `ssh_address:`"),
    ("hosts:\n  a: {address: 'host:2222'}\n", "2: host 'a', field 'address': 'host:2222' holds a port; "
                                              "put the port in `port:` and only the host in `address:`"),
    ("hosts:\n  a: {address: '[fe80::1]:2222'}\n", "2: host 'a', field 'address': '[fe80::1]:2222' holds a port; "
                                                   "put the port in `port:` and only the host in `address:`"),
    ("hosts:\n  a: {address: 'host:'}\n", "2: host 'a', field 'address': 'host:' holds a port; "
                                          "put the port in `port:` and only the host in `address:`"),
    ("hosts:\n  a: {address: 10.0.0.0/24}\n", "2: host 'a', field 'address': '10.0.0.0/24' is not an address; "
                                              "write an IP address, a host name or `local`"),
    ("hosts:\n  a: {address: '$(reboot)'}\n", "2: host 'a', field 'address': '$(reboot)' is not an address; "
                                              "write an IP address, a host name or `local`"),
    ("hosts:\n  a: {address: '-oProxyCommand=x'}\n", "2: host 'a', field 'address': '-oProxyCommand=x' is not an "
                                                     "address; write an IP address, a host name or `local`"),
    # identity: a key file that is not there
    (host("identity: ~/.ssh/no_such_key"), "2: host 'a', field 'identity': key file '~/.ssh/no_such_key' does not "
                                           "exist; create the key (ssh-keygen) or correct the path"),
    ("defaults: {identity: ~/.ssh}\n" + A, "1: field 'identity': key file '~/.ssh' is not a file; "
                                          "create the key (ssh-keygen) or correct the path"),
    # merge keys: only mappings merge
    ("hosts:\n  a: {<<: 1, address: 10.0.0.1}\n", "2: host 'a': a merge key (`<<`) in host 'a' takes mappings, got 1; "
                                                  "write `<<: *name` (an anchored mapping) or `<<: [*a, *b]`"),
    ("hosts:\n  a: {<<: [&x [1]], address: 10.0.0.1}\n",
     "2: host 'a': a merge key (`<<`) in host 'a' takes mappings, got a list; "
     "write `<<: *name` (an anchored mapping) or `<<: [*a, *b]`"),
    ("hosts:\n  a: {<<: {<<: {<<: {<<: {<<: {<<: {<<: {<<: {<<: {port: 1}}}}}}}}}, address: 10.0.0.1}\n",
     "2: host 'a': merge keys (`<<`) nested more than 8 deep; merge fewer levels"),
    # the file itself
    ("---\n" + A + "---\n" + A, "4: YAML syntax error: expected a single document in the stream, but found another document; "
                                "fix the YAML at that line"),
]


@pytest.fixture(autouse=True)
def empty_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home with an empty ~/.ssh, so `identity: ~/.ssh/...` cases do not depend on this machine."""
    home = tmp_path_factory.mktemp("home")
    (home / ".ssh").mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def load_error(path: Path) -> InputError:
    with pytest.raises(InputError) as info:
        load_inventory(path)
    return info.value


@pytest.mark.parametrize("text,expected", HOSTILE, ids=[f"case{i}" for i in range(len(HOSTILE))])
def test_hostile_inventory_gets_one_exact_line(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(text, encoding="utf-8")
    err = load_error(path)
    assert str(err) == f"{path}:{expected}"
    assert err.exit_code == 2 and "\n" not in str(err) and len(str(err)) <= MAX_MESSAGE


def test_size_cap(tmp_path: Path) -> None:
    """Past MAX_BYTES the file is refused unread (a wrong --inventory could name a disk image); at the cap it loads."""
    path = tmp_path / "inv.yaml"
    path.write_text(A + "#" * (MAX_BYTES - len(A) - 1) + "\n")
    assert load_inventory(path).host_names == ("a",)
    path.write_text(A + "#" * (MAX_BYTES - len(A)) + "\n")
    assert str(load_error(path)) == (f"{path}: larger than 1 MiB, too large for an inventory; "
                                     "check that --inventory names the inventory")
    assert str(load_error(Path("/dev/zero"))) == ("/dev/zero: is a character device, not a regular file; "
                                                  "pass the inventory's YAML file")


@pytest.mark.parametrize("data,expected", [
    (b"hosts:\n  a: {address: 10.0.0.1}\n# \xff\n",
     ": cannot read the inventory (UnicodeDecodeError); pass a readable UTF-8 YAML file"),
    (b"\x00" * 100, ":1: control character U+0000 in the file; remove it (an inventory is plain text)"),
])
def test_bytes_that_are_not_yaml(tmp_path: Path, data: bytes, expected: str) -> None:
    path = tmp_path / "inv.yaml"
    path.write_bytes(data)
    assert str(load_error(path)) == f"{path}{expected}"


def test_path_with_a_newline_stays_one_line(tmp_path: Path) -> None:
    path = tmp_path / "inv\nfake: line.yaml"
    assert str(load_error(path)) == (f"{str(path)!r}"[1:-1] + ": inventory file not found; create it (examples in "
                                     "inventory/) or pass --inventory PATH / set MESHRUN_INVENTORY")


def test_identity_that_exists_loads(tmp_path: Path, empty_home: Path) -> None:
    (empty_home / ".ssh" / "id_ed25519").write_text("a private key\n")
    path = tmp_path / "inv.yaml"
    path.write_text(host("identity: ~/.ssh/id_ed25519"))
    assert load_inventory(path).hosts[0].identity == "~/.ssh/id_ed25519"


def test_merge_keys_are_ordinary_yaml(tmp_path: Path) -> None:
    """`<<: *anchor` and `<<: [*a, *b]`: own keys win over merged ones, the earlier of two merged mappings
    wins, merges nest, and the result is what the same inventory written out gives."""
    merged = tmp_path / "merged.yaml"
    merged.write_text(
        "defaults: &base {user: alice, port: 2222, network: zerotier}\n"
        "hosts:\n"
        "  gpu1: &gpu {<<: *base, address: 10.0.0.1, gpus: [0, 1], env: &env {OMP_NUM_THREADS: '1'}}\n"
        "  gpu2: {<<: [{port: 2200, network: public}, *gpu], address: 10.0.0.2, user: bob}\n"
        "  cpu1:\n"
        "    <<: {env: *env}\n"
        "    address: 10.0.0.3\n"
        "    env: {<<: *env, A: b}\n"
    )
    written = tmp_path / "written.yaml"
    written.write_text(
        "defaults: {user: alice, port: 2222, network: zerotier}\n"
        "hosts:\n"
        "  gpu1: {user: alice, port: 2222, network: zerotier, address: 10.0.0.1, gpus: [0, 1],\n"
        "         env: {OMP_NUM_THREADS: '1'}}\n"
        "  gpu2: {port: 2200, network: public, gpus: [0, 1], env: {OMP_NUM_THREADS: '1'}, address: 10.0.0.2,\n"
        "         user: bob}\n"
        "  cpu1: {address: 10.0.0.3, env: {OMP_NUM_THREADS: '1', A: b}}\n"
    )
    got, want = load_inventory(merged), load_inventory(written)
    assert got.hosts == want.hosts
    assert [(h.name, h.user, h.port, h.gpus, h.nproc, h.env) for h in got.hosts] == [
        ("gpu1", "alice", 2222, (0, 1), None, (("OMP_NUM_THREADS", "1"),)),
        ("gpu2", "bob", 2200, (0, 1), None, (("OMP_NUM_THREADS", "1"),)),
        ("cpu1", "alice", 2222, None, None, (("OMP_NUM_THREADS", "1"), ("A", "b"))),
    ]


def test_merge_does_not_hide_a_duplicate_key(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  a:\n    <<: {port: 1}\n    address: 10.0.0.1\n    address: 10.0.0.2\n")
    assert str(load_error(path)) == (f"{path}:5: host 'a': duplicate key 'address' in host 'a' (first on line 4); "
                                     "keep only one of them")


def test_ipv6_addresses_still_load(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  a: {address: 'fe80::1%eth0'}\n  b: {address: '2001:db8::2'}\n  c: {address: local}\n")
    assert [h.address for h in load_inventory(path).hosts] == ["fe80::1%eth0", "2001:db8::2", "local"]


INVENTORY = "hosts:\n" + "".join(f"  gpu{i}: {{address: 10.0.0.{i}, gpus: [0]}}\n" for i in (1, 2))
GPU_FIX = "write indices as nvidia-smi shows them: 0, 1, ..."


@pytest.mark.parametrize("flag,expected", [
    ("gpu1:--1", f"--hosts: host 'gpu1': GPU index '--1' is not a whole number; {GPU_FIX}"),
    ("gpu1:²", f"--hosts: host 'gpu1': GPU index '²' is not a whole number; {GPU_FIX}"),
    ("gpu1:0,²", "--hosts: unknown host '²' in {path}; known hosts: gpu1, gpu2"),
    ("gpu1:٣", f"--hosts: host 'gpu1': GPU index '٣' is not a whole number; {GPU_FIX}"),
    ("gpu1:99999999999999999999",
     "--hosts: host 'gpu1': GPU index 99999999999999999999 is too large; write indices as nvidia-smi shows them: "
     "0 to 1023"),
    ("gpu1:" + "9" * 5000, f"--hosts: host 'gpu1': GPU index '{'9' * 40}'… is not a whole number; {GPU_FIX}"),
    ("gpu1:1024", "--hosts: host 'gpu1': GPU index 1024 is too large; write indices as nvidia-smi shows them: 0 to 1023"),
    ("gpu1:0,-0", "--hosts: host 'gpu1': GPU index 0 is repeated; list each GPU once"),
    ("gpu1:-1", f"--hosts: host 'gpu1': GPU index -1 is negative; {GPU_FIX}"),
    ("gpu1:0x1", f"--hosts: host 'gpu1': GPU index '0x1' is not a whole number; {GPU_FIX}"),
    ("gpu1\x1b[2J", "--hosts: unknown host 'gpu1\\x1b[2J' in {path}; known hosts: gpu1, gpu2"),
    ("g" * 10_000, f"--hosts: unknown host '{'g' * 40}'… in {{path}}; known hosts: gpu1, gpu2"),
    ("gpu1\n:0", "--hosts: unknown host 'gpu1\\n' in {path}; known hosts: gpu1, gpu2"),
    ("gpu1\n", "--hosts: unknown host 'gpu1\\n' in {path}; known hosts: gpu1, gpu2"),  # not read as gpu1
    (",\n,", "--hosts ',\\n,': no host named; pass e.g. --hosts gpu1,gpu2"),
])
def test_hostile_hosts_flag(tmp_path: Path, flag: str, expected: str) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(INVENTORY)
    with pytest.raises(InputError) as info:
        select_hosts(load_inventory(path), flag)
    assert str(info.value) == expected.format(path=path)
    assert info.value.exit_code == 2 and "\n" not in str(info.value) and len(str(info.value)) <= MAX_MESSAGE


def test_hosts_flag_numbers_are_ascii_digits() -> None:
    assert parse_hosts_flag("gpu1:007,2,gpu2") == (HostSpec("gpu1", (7, 2)), HostSpec("gpu2"))


NO_ELASTIC = Inventory(Path("inv.yaml"), (), {}, None, None, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("flag,expected", [
    ("²:3", "--nnodes '²:3': expected MIN:MAX, e.g. --nnodes 2:3"),
    ("2:³", "--nnodes '2:³': expected MIN:MAX, e.g. --nnodes 2:3"),
    ("²", "--nnodes '²': expected MIN:MAX, e.g. --nnodes 2:3"),
    ("-1:3", "--nnodes '-1:3': expected MIN:MAX, e.g. --nnodes 2:3"),
    ("2:3:4", "--nnodes '2:3:4': expected MIN:MAX, e.g. --nnodes 2:3"),
    ("2:3\n", "--nnodes '2:3\\n': expected MIN:MAX, e.g. --nnodes 2:3"),
    ("0:2", "--nnodes '0:2': need 1 <= MIN <= MAX"),
    ("99999999999999999999:3", "--nnodes '99999999999999999999:3': need 1 <= MIN <= MAX"),
    ("3:99999999999999999999", "--nnodes '3:99999999999999999999': MIN 3 is more than the 2 selected host(s)"),
    ("1:10001", "--nnodes '1:10001': MAX 10001 is too large; write at most 10000"),
    ("9" * 5000, f"--nnodes '{'9' * 40}'…: expected MIN:MAX, e.g. --nnodes 2:3"),
    ("9" * 100 + ":" + "9" * 100, f"--nnodes '{'9' * 40}'…: MIN {'9' * 40}… is more than the 2 selected host(s)"),
])
def test_hostile_nnodes_flag(flag: str, expected: str) -> None:
    with pytest.raises(InputError) as info:
        parse_nnodes(flag, NO_ELASTIC, 2)
    assert str(info.value) == expected
    assert info.value.exit_code == 2 and len(str(info.value)) <= MAX_MESSAGE


def test_nnodes_flag_still_reads_numbers() -> None:
    assert parse_nnodes("1:3", NO_ELASTIC, 2) == ElasticBounds(1, 3)
    assert parse_nnodes("2", NO_ELASTIC, 2) is None
    assert parse_nnodes(None, NO_ELASTIC, 2) is None


# Runs a command as its child and writes the child's peak memory (KB, from wait4) to the file argv[1].
PEAK = ("import os, subprocess, sys; child = subprocess.Popen(sys.argv[2:]); _, status, usage = os.wait4(child.pid, 0); "
        "open(sys.argv[1], 'w').write(str(usage.ru_maxrss)); sys.exit(os.waitstatus_to_exitcode(status))")


def run_fab(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """`fab ARGS` in the test project, and its peak memory in MB."""
    peak = tmp_path / "peak_kb"
    done = subprocess.run([sys.executable, "-c", PEAK, str(peak), *FAB, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # a guard against a hang, not a speed check
    return done, int(peak.read_text()) // 1024


@pytest.mark.parametrize("task,text,flags,expected", [
    ("train", GPU_BOMB, (), f":4: {MANY}"),
    ("train", "hosts: " + "[" * 100_000 + "\n", (), f":1: values nested more than 20 levels deep; {DEEP_FIX}"),
    ("train", INVENTORY, ("--nnodes", "²:3"), "--nnodes '²:3': expected MIN:MAX, e.g. --nnodes 2:3"),
    ("check-network", INVENTORY, ("--hosts", "gpu1:²"),
     f"--hosts: host 'gpu1': GPU index '²' is not a whole number; {GPU_FIX}"),
])
def test_fab_prints_one_line_and_exits_2(tmp_path: Path, task: str, text: str, flags: tuple[str, ...],
                                         expected: str) -> None:
    """The real `fab`: one line on stderr, exit status 2, no traceback, small memory, for the bomb and the
    deep nesting (which took minutes, gigabytes or a RecursionError before) and the two flags."""
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    done, peak_mb = run_fab(tmp_path, task, "--inventory", str(path), *flags)
    message = f"{path}{expected}" if expected.startswith(":") else expected
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: {message}\n")
    assert peak_mb < 400, peak_mb


def test_env_values_may_span_lines(tmp_path: Path) -> None:
    """An environment value is never printed nor put on an argv: a newline or a tab is legitimate
    (a PEM key, a list); only NUL, which no environment can hold, is refused (above)."""
    path = tmp_path / "inv.yaml"
    path.write_text('hosts:\n  a: {address: 10.0.0.1, env: {PEM: "line1\\nline2", SEP: "\\t"}}\n')
    assert load_inventory(path).hosts[0].env == (("PEM", "line1\nline2"), ("SEP", "\t"))
