"""network55 finding 6: a stale line in ~/.ssh/known_hosts (an overlay address reused by another
machine) is the key a connection checks against, since the user's file is read before the inventory's.
The CHANGED error used to tell the user to delete the line from the inventory's file, which held the
correct key; it now names the file and line that hold the key compared, and the line that already pins
the offered key. The order stays (hostkeys' docstring): the project's file may not overrule the user's.
Pure: two temp files, HOME patched, the key scan of `fab trust` replaced."""

from __future__ import annotations

import struct
from pathlib import Path

import paramiko
import pytest

from meshrun.deploy.commands import trust
from meshrun.deploy.edges import hostkeys
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.render.console import Renderer
from meshrun.layout import ENV_SSH_CONFIG

ADDRESS = "10.147.17.5"


def ed25519(fill: int) -> paramiko.Ed25519Key:
    """A fixed ed25519 public key (32 bytes of `fill`): no key generation, same fingerprint every run."""
    kind = b"ssh-ed25519"
    return paramiko.Ed25519Key(data=struct.pack(">I", len(kind)) + kind + struct.pack(">I", 32) + bytes([fill]) * 32)


OLD, NEW, OTHER = ed25519(1), ed25519(2), ed25519(3)


def line(name: str, key: paramiko.PKey) -> str:
    return f"{name} {key.get_name()} {key.get_base64()}\n"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv(ENV_SSH_CONFIG, "/dev/null")
    return home


@pytest.fixture
def stale(tmp_path: Path, home: Path) -> Path:
    """The old machine's key on line 2 of ~/.ssh/known_hosts; the current one on line 1 of the inventory's."""
    (home / ".ssh" / "known_hosts").write_text("# work laptop\n" + line(ADDRESS, OLD) + line("10.147.17.6", OTHER))
    pinned = tmp_path / "inv_known_hosts"
    pinned.write_text(line(ADDRESS, NEW))
    return pinned


def changed(pinned: Path, offered: paramiko.PKey, expected: paramiko.PKey) -> str:
    return str(hostkeys.changed_key_error("gpu2", paramiko.BadHostKeyException(ADDRESS, offered, expected), pinned))


def test_the_stale_user_line_still_wins_and_the_error_names_it_not_the_inventory(stale: Path) -> None:
    assert hostkeys.known_keys(stale, ADDRESS)["ssh-ed25519"].asbytes() == OLD.asbytes()  # order kept
    assert changed(stale, NEW, OLD) == (
        f"host 'gpu2': SSH host key CHANGED for {ADDRESS}: known {hostkeys.fingerprint(OLD)}, offered "
        f"{hostkeys.fingerprint(NEW)}. This may be an attack; if the host was reinstalled or its address reused, "
        f"delete line 2 of ~/.ssh/known_hosts ({stale}:1 already pins the offered key) and run: "
        "fab trust --hosts gpu2")
    assert hostkeys.pins_for(stale, ADDRESS) == (hostkeys.Pin("~/.ssh/known_hosts", 2, OLD),
                                                 hostkeys.Pin(str(stale), 1, NEW))


def test_a_reinstalled_host_pinned_in_both_files_names_both_lines(tmp_path: Path, home: Path) -> None:
    (home / ".ssh" / "known_hosts").write_text(line(ADDRESS, OLD))
    pinned = tmp_path / "inv_known_hosts"
    pinned.write_text(line("10.147.17.6", OTHER) + line(ADDRESS, OTHER))
    assert changed(pinned, NEW, OLD).endswith(
        f"delete line 1 of ~/.ssh/known_hosts and line 2 of {pinned} and run: fab trust --hosts gpu2")


def test_only_the_inventory_pins_the_host_names_the_inventory_line(tmp_path: Path, home: Path) -> None:
    pinned = tmp_path / "inv_known_hosts"
    pinned.write_text(line("10.147.17.6", OTHER) + line(ADDRESS, OLD))
    assert changed(pinned, NEW, OLD).endswith(f"delete line 2 of {pinned} and run: fab trust --hosts gpu2")


def test_a_hashed_stale_line_is_found_and_named_by_its_number(tmp_path: Path, home: Path) -> None:
    """Debian and Ubuntu hash ~/.ssh/known_hosts: the address cannot be grepped for, so the line number is the fix."""
    hashed = paramiko.HostKeys.hash_host(ADDRESS)
    (home / ".ssh" / "known_hosts").write_text(line("10.147.17.6", OTHER) + line(hashed, OLD))
    pinned = tmp_path / "inv_known_hosts"
    pinned.write_text(line(ADDRESS, NEW))
    pins = hostkeys.pins_for(pinned, ADDRESS)
    assert [(p.file, p.line) for p in pins] == [("~/.ssh/known_hosts", 2), (str(pinned), 1)]
    first = {kind: pin.key.asbytes() for kind, pin in hostkeys.first_pins(pins).items()}
    assert first == {kind: key.asbytes() for kind, key in hostkeys.known_keys(pinned, ADDRESS).items()}
    assert "delete line 2 of ~/.ssh/known_hosts (" in changed(pinned, NEW, OLD)


def test_a_hashed_name_with_a_broken_salt_is_skipped_not_an_internal_error(tmp_path: Path, home: Path) -> None:
    """paramiko's lookup asserts on a salt that is not 20 bytes of base64 (an AssertionError, a traceback)."""
    (home / ".ssh" / "known_hosts").write_text(line("|1|YWJj|abc", OTHER) + line(ADDRESS, OLD))
    assert hostkeys.known_keys(None, ADDRESS)["ssh-ed25519"].asbytes() == OLD.asbytes()
    assert hostkeys.pins_for(None, ADDRESS) == (hostkeys.Pin("~/.ssh/known_hosts", 2, OLD),)


def test_an_unknown_key_names_every_file_looked_in(tmp_path: Path, home: Path) -> None:
    pinned = tmp_path / "inv_known_hosts"
    err = hostkeys.UnknownHostKey(ADDRESS, NEW)
    tail = "; if you trust it, run: fab trust --hosts gpu2"
    assert str(hostkeys.unknown_key_error("gpu2", err, pinned)).endswith(
        f"for {ADDRESS}, not in ~/.ssh/known_hosts or {pinned}{tail}")
    assert str(hostkeys.unknown_key_error("gpu2", err, None)).endswith(f"not in ~/.ssh/known_hosts{tail}")


def test_fab_trust_shows_and_names_the_stale_user_line(stale: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts:\n  gpu2: {{address: {ADDRESS}}}\nknown_hosts: {stale}\n")
    monkeypatch.setattr(trust, "scan_host_key", lambda *_args, **_kw: NEW)
    before = stale.read_text()
    with pytest.raises(MeshrunError) as info:
        trust.trust(trust.TrustRequest(str(inventory), "gpu2", yes=True), Renderer(), False, lambda _q: True, tmp_path)
    assert str(info.value).endswith(f"delete line 2 of ~/.ssh/known_hosts ({stale}:1 already pins the offered key) "
                                    "and run: fab trust --hosts gpu2")
    assert stale.read_text() == before  # a changed key is never written, --yes or not

    offer = trust.classify("gpu2", ADDRESS, NEW, hostkeys.pins_for(stale, ADDRESS))
    assert (offer.status, offer.known, offer.shown_status) == (
        trust.KeyStatus.CHANGED, hostkeys.Pin("~/.ssh/known_hosts", 2, OLD), "CHANGED (~/.ssh/known_hosts:2)")


def test_a_new_key_type_on_a_pinned_host_is_still_changed_and_names_the_pinned_line(stale: Path) -> None:
    ecdsa = paramiko.ECDSAKey.generate()  # a type nothing pins for the host: a downgrade looks like this
    offer = trust.classify("gpu2", ADDRESS, ecdsa, hostkeys.pins_for(stale, ADDRESS))
    assert (offer.status, offer.shown_status) == (trust.KeyStatus.CHANGED, "CHANGED (~/.ssh/known_hosts:2)")
    assert trust.changed_error(offer, stale).args[0].endswith(
        f"delete line 2 of ~/.ssh/known_hosts and line 1 of {stale} and run: fab trust --hosts gpu2")
