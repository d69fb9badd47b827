"""Inventory loading: valid files become exact objects; each malformed file gets one exact line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.load import inventory_path, load_inventory
from meshrun.deploy.inventory.model import ElasticBounds, Host, Network, Rendezvous
from meshrun.deploy.inventory.selection import parse_hosts_flag, select_hosts, HostSpec

FULL = """\
defaults:
  user: root
  port: 22
  identity: ~/.ssh/id_ed25519
  python: python3
  workdir: ~/meshrun
  network: zerotier
hosts:
  gpu1:
    address: 10.147.17.11
    ssh_address: 203.0.113.7
    gpus: [0, 1]
  gpu2:
    address: 10.147.17.12
    gpus: [1]
    batch_size: 32
  cpu1:
    address: 10.147.17.13
    nproc: 2
    env: {OMP_NUM_THREADS: "1"}
groups:
  lab: [gpu1, gpu2]
rendezvous: {host: gpu1, port: 29400}
known_hosts: inventory/known_hosts
elastic: {min: 2, max: 3}
"""


@pytest.fixture(autouse=True)
def keys_at_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home whose ~/.ssh holds the key files the inventories here and in inventory/ name: `identity`
    must name a file that exists (deploy.inventory.fields.identity)."""
    home = tmp_path_factory.mktemp("home")
    (home / ".ssh").mkdir()
    for name in ("id_ed25519", "rented_boxes"):
        (home / ".ssh" / name).write_text("a private key\n")
    monkeypatch.setenv("HOME", str(home))
    return home


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_full_example_loads_into_exact_objects(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, FULL))
    common = dict(user="root", port=22, identity="~/.ssh/id_ed25519", python="python3", workdir="~/meshrun",
                  network=Network.ZEROTIER)
    assert inv.hosts == (
        Host("gpu1", "10.147.17.11", "203.0.113.7", gpus=(0, 1), nproc=None, batch_size=None, env=(), **common),
        Host("gpu2", "10.147.17.12", None, gpus=(1,), nproc=None, batch_size=32, env=(), **common),
        Host("cpu1", "10.147.17.13", None, gpus=None, nproc=2, batch_size=None, env=(("OMP_NUM_THREADS", "1"),),
             **common),
    )
    assert dict(inv.groups) == {"lab": ("gpu1", "gpu2")}
    assert inv.rendezvous == Rendezvous("gpu1", 29400)
    assert inv.known_hosts == tmp_path / "inventory" / "known_hosts"  # beside the inventory, not in the cwd
    assert inv.elastic == ElasticBounds(2, 3)
    assert [h.nproc_per_node for h in inv.hosts] == [2, 1, 2]
    assert inv.host("gpu1").ssh_host == "203.0.113.7" and inv.host("gpu2").ssh_host == "10.147.17.12"


def test_host_overrides_defaults_and_gpus_beat_default_nproc(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, """\
        defaults: {nproc: 4, user: alice, port: 2222}
        hosts:
          a: {address: 10.0.0.1, gpus: [3], user: bob}
          b: {address: 10.0.0.2}
    """))
    a, b = inv.hosts
    assert (a.user, a.port, a.gpus, a.nproc, a.nproc_per_node) == ("bob", 2222, (3,), None, 1)
    assert (b.user, b.nproc, b.nproc_per_node, b.network) == ("alice", 4, 4, Network.LAN)
    assert inv.rendezvous == Rendezvous(None, 29400)


def test_bundled_inventories_load() -> None:
    root = Path(__file__).resolve().parents[1]
    for path in sorted((root / "inventory").glob("*.yaml")):
        assert load_inventory(path).hosts, path
    local = load_inventory(root / "inventory/local.yaml")
    assert [(h.name, h.is_local, h.nproc_per_node) for h in local.hosts] == [("local", True, 2)]


def test_inventory_lookup_order(tmp_path: Path) -> None:
    """--inventory, $MESHRUN_INVENTORY, the project's inventory/hosts.yaml then local.yaml, then
    the per-user file under $XDG_CONFIG_HOME (else ~/.config); each step only when the ones
    before it found nothing."""
    project, home = tmp_path / "project", tmp_path / "home"
    user = home / ".config/meshrun/inventory.yaml"
    for path in (project / "inventory/hosts.yaml", project / "inventory/local.yaml", user):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("hosts: {}\n")
    env = {"MESHRUN_INVENTORY": "lab.yaml"}
    assert inventory_path("x.yaml", project, env, home) == Path("x.yaml")
    assert inventory_path(None, project, env, home) == Path("lab.yaml")
    assert inventory_path(None, project, {}, home) == project / "inventory/hosts.yaml"
    (project / "inventory/hosts.yaml").unlink()
    assert inventory_path(None, project, {}, home) == project / "inventory/local.yaml"
    (project / "inventory/local.yaml").unlink()
    assert inventory_path(None, project, {}, home) == user
    xdg = tmp_path / "xdg"
    (xdg / "meshrun").mkdir(parents=True)
    (xdg / "meshrun/inventory.yaml").write_text("hosts: {}\n")
    assert inventory_path(None, project, {"XDG_CONFIG_HOME": str(xdg)}, home) == xdg / "meshrun/inventory.yaml"
    user.unlink()
    with pytest.raises(InputError, match=r"^no inventory found \(looked for --inventory, \$MESHRUN_INVENTORY, "):
        inventory_path(None, project, {}, home)


# (inventory text, exact message after "<path>:")
MALFORMED = [
    ("hosts:\n  a: {address: 10.0.0.1\n",
     "3: YAML syntax error: expected ',' or '}', but got '<stream end>'; fix the YAML at that line"),
    ("hosts:\n  a:\n    address: [1\n", "4: YAML syntax error: expected ',' or ']', but got '<stream end>'; fix the YAML at that line"),
    ("", '1: the inventory is empty; add a `hosts:` section (README, "Many machines")'),
    ("- a\n- b\n", "1: the inventory must be a mapping (key: value lines); write the inventory as `key: value` pairs"),
    ("defaults: {}\n", "1: no `hosts:` section; list at least one host under `hosts:`"),
    ("hosts: {}\n", "1: `hosts:` is empty; list at least one host"),
    ("hosts:\n  a: {address: 10.0.0.1}\nhost: {}\n", "3: unknown key 'host' in the inventory; did you mean 'hosts'?"),
    ("hosts:\n  a: {address: 10.0.0.1}\nrendezvouz: {port: 1}\n",
     "3: unknown key 'rendezvouz' in the inventory; did you mean 'rendezvous'?"),
    ("hosts:\n  a: {address: 10.0.0.1, gpu: [0]}\n", "2: host 'a': unknown key 'gpu'; did you mean 'gpus'?"),
    ("hosts:\n  a:\n    address: 10.0.0.1\n    adress: 10.0.0.2\n",
     "4: host 'a': unknown key 'adress'; did you mean 'address'?"),
    ("defaults: {usr: root}\nhosts:\n  a: {address: 10.0.0.1}\n",
     "1: unknown key 'usr' in defaults; did you mean 'user'?"),
    ("defaults: {address: 10.0.0.9}\nhosts:\n  a: {address: 10.0.0.1}\n",
     "1: unknown key 'address' in defaults; allowed: user, port, identity, python, workdir, network, gpus, nproc, batch_size, env, site"),
    ("hosts:\n  a: {address: 10.0.0.1, xyzzy: 1}\n",
     "2: host 'a': unknown key 'xyzzy'; allowed: address, ssh_address, user, port, identity, python, workdir, network, gpus, nproc, batch_size, env, site"),
    ("hosts:\n  a: {address: 10.0.0.1, port: ssh}\n",
     "2: host 'a', field 'port': expected a port number, got text 'ssh'; write a number from 1 to 65535"),
    ("hosts:\n  a: {address: 10.0.0.1, port: 70000}\n",
     "2: host 'a', field 'port': port 70000 is out of range; write a number from 1 to 65535"),
    ("hosts:\n  a: {address: 10.0.0.1, port: true}\n",
     "2: host 'a', field 'port': expected a port number, got text 'true'; write a number from 1 to 65535"),
    ("hosts:\n  a: {address: 10.0.0.1, nproc: 0}\n", "2: host 'a', field 'nproc': 0 is not >= 1; write a number from 1 to 1024"),
    ("hosts:\n  a: {address: 10.0.0.1, nproc: two}\n",
     "2: host 'a', field 'nproc': expected a whole number, got text 'two'; write a number from 1 to 1024"),
    ("hosts:\n  a: {address: 10.0.0.1, nproc: 99999999999999999999}\n",
     "2: host 'a', field 'nproc': 99999999999999999999 is too large; write a number from 1 to 1024"),
    ("hosts:\n  a: {address: 10.0.0.1, batch_size: 99999999999999999999}\n",
     "2: host 'a', field 'batch_size': batch size 99999999999999999999 is too large; write a number from 1 to 16777216, "
     "or `auto`"),
    ("hosts:\n  a: {address: 10.0.0.1}\nelastic: {min: 1, max: 10001}\n",
     "3: field 'elastic.max': 10001 is too large; write a number from 1 to 10000"),
    ("hosts:\n  a: {address: 10.0.0.1}\ngroups:\n  e: []\n",
     "4: field 'groups': group 'e' is empty; list at least one host, or remove the group"),
    ("hosts:\n  a: {address: 10.0.0.1, gpus: 0}\n",
     "2: host 'a', field 'gpus': expected a list of GPU indices, got 0; write e.g. `gpus: [0, 1]`"),
    ("hosts:\n  a: {address: 10.0.0.1, gpus: [0, -1]}\n",
     "2: host 'a', field 'gpus': GPU index -1 is negative; write indices as nvidia-smi shows them: 0, 1, ..."),
    ("hosts:\n  a: {address: 10.0.0.1, gpus: [1, 1]}\n",
     "2: host 'a', field 'gpus': GPU index 1 is repeated; list each GPU once"),
    ("hosts:\n  a: {address: 10.0.0.1, gpus: [0, x]}\n",
     "2: host 'a', field 'gpus': GPU index 'x' is not a whole number; write indices as nvidia-smi shows them: 0, 1, ..."),
    ("hosts:\n  a: {address: 10.0.0.1, gpus: []}\n",
     "2: host 'a', field 'gpus': the GPU list is empty; list at least one index, or use `nproc` on a CPU host"),
    ("hosts:\n  a:\n    address: 10.0.0.1\n    gpus: [0]\n    nproc: 2\n",
     "2: host 'a': both `gpus` and `nproc` are set; use `gpus` on a GPU host (one process per GPU) or `nproc` on a CPU host, not both"),
    ("hosts:\n  a: {address: 10.0.0.1}\n  a: {address: 10.0.0.2}\n",
     "3: duplicate key 'a' in hosts (first on line 2); keep only one of them"),
    ("hosts:\n  a: {address: 10.0.0.1}\n  b: {address: 10.0.0.1}\n",
     "3: host 'b': address 10.0.0.1 is also host 'a's; give each host its own address, or remove the duplicate"),
    ("hosts:\n  a: {user: root}\n",
     "2: host 'a': no `address`; add `address: <overlay, LAN or public IP>` (or `address: local`)"),
    ("hosts:\n  a:\n", "2: host 'a': no `address`; add `address: <overlay, LAN or public IP>` (or `address: local`)"),
    ("hosts:\n  'bad name': {address: 10.0.0.1}\n",
     "2: host 'bad name': host name 'bad name' has characters other than letters, digits, '.', '_' and '-'; rename the host"),
    ("hosts:\n  a: {address: 10.0.0.1, network: tailscale}\n",
     "2: host 'a', field 'network': unknown network 'tailscale'; use one of: zerotier, wireguard, lan, public"),
    ("hosts:\n  a: {address: 10.0.0.1, batch_size: big}\n",
     "2: host 'a', field 'batch_size': expected a number >= 1 or `auto`, got 'big'; write e.g. `batch_size: 32` or `batch_size: auto`"),
    ("hosts:\n  a: {address: 10.0.0.1, env: [A]}\n",
     "2: host 'a', field 'env': env must be a mapping (key: value lines); write env as `key: value` pairs"),
    ("hosts:\n  a:\n    address: 10.0.0.1\n    env: {1BAD: x}\n",
     "4: host 'a', field 'env.1BAD': '1BAD' is not a valid environment variable name; use letters, digits and _"),
    ("hosts:\n  a: {address: '10.0.0.1 ; rm -rf /'}\n",
     "2: host 'a', field 'address': '10.0.0.1 ; rm -rf /' is not an address; write an IP address, a host name or `local`"),
    ("hosts:\n  a: {address: 10.0.0.1, user: '-oProxyCommand=x'}\n",
     "2: host 'a', field 'user': '-oProxyCommand=x' is not a login name; use letters, digits, '.', '_' and '-'"),
    ("hosts:\n  a: {address: 10.0.0.1, workdir: ~bob/x}\n",
     "2: host 'a', field 'workdir': '~bob/x': only `~` or `~/...` (the login user's home) is supported; write an absolute path or one starting with ~/"),
    ("hosts:\n  a: {address: 10.0.0.1, workdir: -rf}\n",
     "2: host 'a', field 'workdir': '-rf' starts with '-', which commands read as an option; write it as ./-rf"),
    ("hosts:\n  a: {address: 10.0.0.1, python: -c}\n",
     "2: host 'a', field 'python': '-c' starts with '-', which commands read as an option; write it as ./-c"),
    ("hosts:\n  a: {address: 10.0.0.1, python: ''}\n",
     "2: host 'a', field 'python': expected non-empty text, got text ''; write a non-empty string"),
    ("hosts:\n  a: {address: 10.0.0.1}\ngroups:\n  lab: [a, ghost]\n",
     "4: field 'groups': group 'lab' names unknown host 'ghost'; known hosts: a"),
    ("hosts:\n  a: {address: 10.0.0.1}\ngroups:\n  lab: a\n",
     "4: field 'groups': expected a list of host names; write e.g. `lab: [gpu1, gpu2]`"),
    ("hosts:\n  a: {address: 10.0.0.1}\ngroups:\n  a: [a]\n",
     "4: field 'groups': group 'a' has the same name as a host; rename the group"),
    ("hosts:\n  a: {address: 10.0.0.1}\nrendezvous: {host: ghost}\n",
     "3: field 'rendezvous.host': rendezvous host 'ghost' is not in `hosts`; use one of: a"),
    ("hosts:\n  a: {address: 10.0.0.1}\nrendezvous: {host: a, port: 0}\n",
     "3: field 'rendezvous.port': port 0 is out of range; write a number from 1 to 65535"),
    ("hosts:\n  a: {address: 10.0.0.1}\nrendezvous: {hots: a}\n",
     "3: unknown key 'hots' in rendezvous; did you mean 'host'?"),
    ("hosts:\n  a: {address: 10.0.0.1}\nelastic: {min: 3, max: 2}\n",
     "3: field 'elastic': min 3 is greater than max 2; make min <= max"),
    ("hosts:\n  a: {address: 10.0.0.1}\nelastic: {min: 2}\n",
     "3: field 'elastic': needs both `min` and `max`; write `elastic: {min: 2, max: 3}`"),
    ("hosts:\n  a: {address: 10.0.0.1}\nknown_hosts: [x]\n",
     "3: field 'known_hosts': expected text, got a list; write text"),
]


@pytest.mark.parametrize("text,expected", MALFORMED, ids=[f"case{i}" for i in range(len(MALFORMED))])
def test_malformed_inventory_gets_one_exact_line(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_inventory(path)
    assert str(info.value) == f"{path}:{expected}"
    assert info.value.exit_code == 2
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(InputError) as info:
        load_inventory(path)
    assert str(info.value) == (f"{path}: inventory file not found; create it (examples in inventory/) "
                               "or pass --inventory PATH / set MESHRUN_INVENTORY")


def test_hosts_flag_parsing() -> None:
    assert parse_hosts_flag("gpu1:0,1,lab,gpu2") == (HostSpec("gpu1", (0, 1)), HostSpec("lab"), HostSpec("gpu2"))
    assert parse_hosts_flag(" a , b:3 ") == (HostSpec("a"), HostSpec("b", (3,)))


@pytest.mark.parametrize("flag,expected", [
    ("ghost", "--hosts: unknown host 'ghost' in {path}; known hosts: gpu1, gpu2, cpu1; groups: lab"),
    ("gpu1:0,0", "--hosts: host 'gpu1': GPU index 0 is repeated; list each GPU once"),
    ("gpu1:", "--hosts: host 'gpu1': the GPU list is empty; list at least one index, or use `nproc` on a CPU host"),
    ("gpu1:x", "--hosts: host 'gpu1': GPU index 'x' is not a whole number; write indices as nvidia-smi shows them: 0, 1, ..."),
    (",", "--hosts ',': no host named; pass e.g. --hosts gpu1,gpu2"),
])
def test_bad_hosts_flag(tmp_path: Path, flag: str, expected: str) -> None:
    path = write(tmp_path, FULL)
    with pytest.raises(InputError) as info:
        select_hosts(load_inventory(path), flag)
    assert str(info.value) == expected.format(path=path)


def test_select_hosts_groups_overrides_and_order(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, FULL))
    chosen = select_hosts(inv, "cpu1:2,3,lab").hosts
    assert [(h.name, h.gpus, h.nproc) for h in chosen] == [("cpu1", (2, 3), None), ("gpu1", (0, 1), None),
                                                          ("gpu2", (1,), None)]
    assert select_hosts(inv, None).hosts == inv.hosts


def test_selection_decides_the_rendezvous_host(tmp_path: Path) -> None:
    """The head is the inventory's rendezvous host (gpu1) when selected, wherever it is named; a
    named rendezvous host left out of --hosts is one clear error; without one, the first host."""
    inv = load_inventory(write(tmp_path, FULL))
    assert select_hosts(inv, None).head.name == "gpu1"
    assert select_hosts(inv, "gpu2,gpu1").head.name == "gpu1"
    with pytest.raises(InputError) as err:
        select_hosts(inv, "gpu2,cpu1").head
    assert str(err.value) == ("rendezvous host 'gpu1' is not among the selected hosts (gpu2, cpu1); "
                              "add it to --hosts or change `rendezvous.host`")
    no_rdzv = load_inventory(write(tmp_path, "hosts:\n  a: {address: 10.0.0.1}\n  b: {address: 10.0.0.2}\n"))
    assert select_hosts(no_rdzv, "b,a").head.name == "b"


def test_a_resume_without_the_named_rendezvous_host_moves_it_to_the_first_selected_host(tmp_path: Path) -> None:
    """The docs' way to resume after the rendezvous host died, `fab train --resume ID --hosts` leaving
    it out, was refused by `head` (the inventory still names it). A resume now moves the rendezvous
    to the first selected host, as succession would have, on the port the inventory gives, and says so."""
    inv = load_inventory(write(tmp_path, FULL))
    moved, line = select_hosts(inv, "gpu2,cpu1").resumable()
    assert (moved.head.name, moved.rendezvous, [h.name for h in moved.hosts]) == (
        "gpu2", Rendezvous(None, 29400), ["gpu2", "cpu1"])
    assert line == ("rendezvous host 'gpu1' (rendezvous.host) is not among the hosts of this resume; "
                    "'gpu2' hosts its rendezvous instead")
    kept = select_hosts(inv, "cpu1,gpu1")
    assert kept.resumable() == (kept, None) and kept.head.name == "gpu1"
