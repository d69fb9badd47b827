"""Reusing a passed pre-flight (deploy/run/preflightkey.py) and a no-op code sync.

The key and age rule are pure and tested by exact equality. On the simulated cluster: real
sessions, the real host stamp (deploy/host/stamp.py) and the real pre-flight; and real rsync
runs of a small git project, where a second sync with nothing changed rewrites no file on any
host and a changed file is the only one rewritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from meshrun.layout import PREFLIGHT_REUSE_S, SHIPPED_LIST, WORKDIR_OWNER
from meshrun.deploy.commands.check import preflight
from meshrun.deploy.commands.sync import sync_code
from meshrun.deploy.edges.check_probes import open_sessions
from meshrun.deploy.edges.preflightcache import NOTHING, StoredPass, host_stamps, load_pass, save_pass
from meshrun.deploy.edges.sessions import close_all
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.selection import select_hosts
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.preflightkey import may_reuse, preflight_key

REPO = Path(__file__).resolve().parents[1]


def test_key_is_sha256_of_selection_then_stamps_in_name_order() -> None:
    expected = hashlib.sha256(b"SEL" + b"\0a\0" + b"s1" + b"\0b\0" + b"s2").hexdigest()
    assert preflight_key("SEL", {"b": "s2", "a": "s1"}) == expected
    assert preflight_key("SEL", {"a": "s1", "b": "s2"}) == expected


def test_key_changes_with_any_part() -> None:
    base = preflight_key("SEL", {"a": "s1", "b": "s2"})
    assert preflight_key("SEL2", {"a": "s1", "b": "s2"}) != base
    assert preflight_key("SEL", {"a": "s1", "b": "s3"}) != base
    assert preflight_key("SEL", {"a": "s1"}) != base
    # a name cannot slide into a stamp: "a"+"bs" vs "ab"+"s"
    assert preflight_key("S", {"a": "bs"}) != preflight_key("S", {"ab": "s"})


@pytest.mark.parametrize(("stored_key", "stored_at", "now", "expected"), [
    ("k", 1000.0, 1000.0, True),
    ("k", 1000.0, 1000.0 + PREFLIGHT_REUSE_S, True),
    ("k", 1000.0, 1000.0 + PREFLIGHT_REUSE_S + 0.001, False),  # too old
    ("k", 1000.0, 999.0, False),  # stored in the future: a clock step, check again
    ("other", 1000.0, 1000.0, False),
    (None, None, 1000.0, False),
])
def test_may_reuse(stored_key: str | None, stored_at: float | None, now: float, expected: bool) -> None:
    assert may_reuse(stored_key, stored_at, "k", now) is expected


def test_stored_pass_round_trip_and_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "preflight.json"
    assert load_pass(path) == NOTHING
    save_pass(path, StoredPass("abc", 12.5, ("pre-flight: h1: warn",)))
    assert load_pass(path) == StoredPass("abc", 12.5, ("pre-flight: h1: warn",))
    path.write_text("{not json")
    assert load_pass(path) == NOTHING


@pytest.mark.cluster
def test_preflight_is_reused_until_a_host_stamp_changes(testbed, inventory: Path, tmp_path: Path) -> None:
    cache = tmp_path / "preflight.json"
    inv = load_inventory(inventory)
    selection = select_hosts(inv, None)
    sessions, unreachable = open_sessions(selection.hosts, inv, REPO, 10)
    assert not unreachable
    try:
        assert preflight(selection, sessions, Renderer(), cache) is False  # nothing stored yet: checked
        assert load_pass(cache).key is not None
        assert preflight(selection, sessions, Renderer(), cache) is True  # same key, seconds old: reused
        before = host_stamps(selection.hosts, sessions, sys.executable)
        # What an install into the hosts' interpreter does to its site-packages folder.
        site = next(path for path, mtime in json.loads(before["h2"])["site"] if mtime is not None)  # type: ignore[index]
        testbed.exec(2, ["python3", "-c", f"import os; os.utime({site!r})"])
        assert host_stamps(selection.hosts, sessions, sys.executable) != before
        assert preflight(selection, sessions, Renderer(), cache) is False  # checked again
        assert preflight(selection, sessions, Renderer(), cache) is True
        fewer = select_hosts(inv, "h1,h2")
        assert preflight(fewer, sessions, Renderer(), cache) is False  # other hosts: another key
    finally:
        close_all(sessions)


def _inodes(testbed, i: int, workdir: str) -> dict[str, list[int]]:
    """{relative path: [inode, mtime_ns]} of every file under the host's workdir."""
    script = ("import json, os, sys; r = os.path.expanduser(sys.argv[1]); print(json.dumps({os.path.relpath("
              "os.path.join(d, f), r): [os.stat(os.path.join(d, f)).st_ino, os.stat(os.path.join(d, f)).st_mtime_ns]"
              " for d, _, fs in os.walk(r) for f in fs}))")
    return json.loads(testbed.exec(i, ["python3", "-c", script, workdir]).stdout)


@pytest.mark.cluster
def test_second_sync_rewrites_nothing_and_a_changed_file_only_it(testbed, make_inventory, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    for name, size in (("a.py", 50_000), ("b.txt", 10), ("sub/c.bin", 300_000)):
        (project / name).write_bytes(os.urandom(size))
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    workdir = f"~/h12-sync-{secrets.token_hex(3)}"
    inv = load_inventory(make_inventory(defaults_overrides={"workdir": workdir}))
    hosts = select_hosts(inv, None).hosts
    try:
        sync_code(hosts, inv, Project(project, project / "runs"), Renderer())
        first = {i: _inodes(testbed, i, workdir) for i in (1, 2, 3)}
        # the marker: whose code it is; the list: what this sync sent (rewritten by each: meshrun's, no code)
        assert sorted(first[2]) == [SHIPPED_LIST, WORKDIR_OWNER, "a.py", "b.txt", "sub/c.bin"]
        first = {i: {k: v for k, v in got.items() if k != SHIPPED_LIST} for i, got in first.items()}
        sync_code(hosts, inv, Project(project, project / "runs"), Renderer())
        assert {i: {k: v for k, v in _inodes(testbed, i, workdir).items() if k != SHIPPED_LIST}
                for i in (1, 2, 3)} == first  # nothing of the code rewritten
        (project / "b.txt").write_bytes(b"changed, and longer than before")
        sync_code(hosts, inv, Project(project, project / "runs"), Renderer())
        for i in (1, 2, 3):
            after = _inodes(testbed, i, workdir)
            assert {k: v for k, v in after.items() if k not in ("b.txt", SHIPPED_LIST)} == \
                {k: v for k, v in first[i].items() if k != "b.txt"}
            assert after["b.txt"] != first[i]["b.txt"]
            remote = testbed.exec(i, ["cat", workdir.replace("~", "/root") + "/b.txt"]).stdout
            assert remote == "changed, and longer than before"
    finally:
        for i in (1, 2, 3):
            testbed.exec(i, ["rm", "-rf", workdir.replace("~", "/root")])
