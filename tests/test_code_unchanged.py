"""A host that already holds the project's code is asked, not synced (deploy/run/codehint.py).

The hint rules are pure and tested by exact equality; the digest (deploy/host/codestat.py) on
real files, against a real `rsync --archive` copy. On the simulated cluster: real sessions, the
host program run by each host's own python, real rsync and sshd, whose log tells whether rsync's
ssh logged in. A host that answers wrong, floods its answer or never answers is synced as before.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import threading
import time
from pathlib import Path

import pytest

from meshrun.deploy.commands import sync as sync_cmd
from meshrun.deploy.edges import codehints
from meshrun.deploy.edges.codehints import hint_file, load_hints, save_hints
from meshrun.deploy.edges.sessions import SessionsLater, close_all, connect_all
from meshrun.deploy.host import codestat
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.model import Host, Network
from meshrun.deploy.inventory.selection import select_hosts
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.codehint import hint_key, may_hold, parse_hints, with_synced


def host(name: str = "h1", workdir: str = "~/meshrun", port: int | None = 22) -> Host:
    return Host(name, "10.0.0.1", None, "root", port, None, None, workdir, Network.LAN, None, None, None, ())


def test_the_key_names_the_project_the_host_as_reached_and_its_workdir() -> None:
    key = hint_key("/p", host())
    assert len(key) == 64 and key == hint_key("/p", host())
    others = {hint_key("/q", host()), hint_key("/p", host("h2")), hint_key("/p", host(workdir="~/x")),
              hint_key("/p", host(port=2222))}
    assert key not in others and len(others) == 4


def test_stored_hints_are_read_as_strings_only_and_junk_is_none() -> None:
    assert parse_hints(b'{"a": "d1", "b": 3, "c": ["x"]}') == {"a": "d1"}
    for junk in (b"", b"[1, 2]", b"\xff\xfe", b'"text"', b"[" * 100_000):
        assert parse_hints(junk) == {}


def test_the_newest_hints_are_kept_last_and_the_oldest_dropped() -> None:
    assert with_synced({"a": "1", "b": "2", "c": "3"}, {"a": "9", "d": "4"}, limit=3) == {"c": "3", "a": "9", "d": "4"}
    assert list(with_synced({"a": "1", "b": "2"}, {"a": "9"})) == ["b", "a"]
    assert may_hold({"k": "d"}, "k", "d") and not may_hold({"k": "d"}, "k", "e") and not may_hold({}, "k", "d")


def test_hints_survive_a_round_trip_and_an_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "cache" / "codesync.json"
    assert load_hints(path) == {}
    save_hints(path, {"a": "1"})
    save_hints(path, {"b": "2"})
    assert load_hints(path) == {"a": "1", "b": "2"}
    path.unlink()
    os.mkfifo(path)  # a FIFO where the file was: no hint, and no hang
    assert load_hints(path) == {}


def _tree(root: Path) -> list[bytes]:
    (root / "sub").mkdir(parents=True)
    (root / "a.py").write_text("print(1)\n")
    (root / "sub" / "b.txt").write_bytes(os.urandom(1000))
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "link").symlink_to("sub/b.txt")
    return [b"a.py", b"sub/b.txt", b"run.sh", b"link"]


def test_the_digest_of_an_rsync_archive_copy_is_the_original_s_and_any_change_shows(tmp_path: Path) -> None:
    src, copy = tmp_path / "src", tmp_path / "copy"
    names = _tree(src)
    subprocess.run(["rsync", "--archive", f"{src}/", f"{copy}/"], check=True)
    same = codestat.digest(os.fsencode(src), names)
    assert codestat.digest(os.fsencode(copy), names) == same
    def rewrite() -> None:  # same size, a later second
        (copy / "a.py").write_text("print(2)\n")
        os.utime(copy / "a.py", ns=(0, os.lstat(src / "a.py").st_mtime_ns + 2 * 10**9))

    changes = [rewrite,
               lambda: os.utime(copy / "sub" / "b.txt", ns=(0, os.lstat(copy / "sub" / "b.txt").st_mtime_ns + 10**9)),
               lambda: (copy / "run.sh").chmod(0o644),
               lambda: ((copy / "link").unlink(), (copy / "link").symlink_to("a.py")),
               lambda: (copy / "sub" / "b.txt").unlink()]
    for change in changes:
        subprocess.run(["rsync", "--archive", f"{src}/", f"{copy}/"], check=True)
        assert codestat.digest(os.fsencode(copy), names) == same
        change()
        assert codestat.digest(os.fsencode(copy), names) != same
    assert codestat.digest(os.fsencode(src), names[:-1]) != same  # a file more or less in the list
    subprocess.run(["rsync", "--archive", f"{src}/", f"{copy}/"], check=True)
    os.utime(copy / "a.py", ns=(0, os.lstat(copy / "a.py").st_mtime_ns // 10**9 * 10**9))
    assert codestat.digest(os.fsencode(copy), names) == same  # rsync, too, compares whole seconds


def test_sessions_later_waits_for_the_put_and_an_empty_put_means_none() -> None:
    later = SessionsLater()
    assert later.get("h1", 0.05) is None  # not put yet: none, after the wait
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(later.get("h1", 10)))
    waiter.start()
    time.sleep(0.1)
    later.put({"h1": "session"})  # type: ignore[dict-item]
    waiter.join(10)
    assert got == ["session"]
    later.put({})  # a second put (the way out) changes nothing
    assert later.get("h1", 0) == "session" and later.get("h2", 0) is None
    empty = SessionsLater()
    empty.put({})
    assert empty.get("h1", 10) is None


def _logins(testbed, i: int) -> int:
    log = testbed.paths.sshd_log(testbed.host(i)).read_text(errors="replace")
    return log.count("Accepted publickey for")


def _gone(testbed, i: int, program: str, wait_s: float = 10.0) -> bool:
    deadline = time.monotonic() + wait_s
    while any(p.argv[:1] == [program] for p in testbed.processes(i, sessions=False)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


class Asked(SessionsLater):
    """The sessions, and which hosts the sync asked for one."""

    def __init__(self, sessions) -> None:
        super().__init__()
        self.put(sessions)
        self.names: list[str] = []

    def get(self, name: str, timeout: float):
        self.names.append(name)
        return super().get(name, timeout)


@pytest.mark.cluster
def test_a_host_that_holds_the_code_is_asked_over_its_session_and_only_the_others_synced(
        testbed, make_inventory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # Short, so that h3's flood is given up on soon; long enough for h1 and h2 to start a Python and
    # answer on a loaded machine (the default is 20 s).
    monkeypatch.setattr(codehints, "CODE_CHECK_TIMEOUT_S", 8.0)
    project = tmp_path / "project"
    names = _tree(project)
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    workdir = f"~/code-{secrets.token_hex(3)}"
    remote = workdir.replace("~", "/root")
    # h3's "python" floods its answer forever: it is synced after the check gives up, as before.
    testbed.exec(3, ["sh", "-c", "printf '#!/bin/sh\\nexec yes\\n' > /root/flood && chmod +x /root/flood"])
    inv = load_inventory(make_inventory(defaults_overrides={"workdir": workdir},
                                        host_overrides={"h3": {"python": "/root/flood"}}))
    hosts = select_hosts(inv, None).hosts
    sessions = connect_all(hosts, inv, project)

    def sync(later: SessionsLater | None = None) -> tuple[dict[str, bool], dict[int, int]]:
        before = {i: _logins(testbed, i) for i in (1, 2, 3)}
        done = sync_cmd.sync_code(hosts, inv, Project(project, project / "runs"), Renderer(), later=later)
        return {n: r.unchanged for n, r in done.items()}, {i: _logins(testbed, i) - before[i] for i in (1, 2, 3)}

    try:
        assert sync(Asked(sessions)) == ({"h1": False, "h2": False, "h3": False}, {1: 1, 2: 1, 3: 1})  # no hints yet
        assert len(load_hints(hint_file())) == 3
        asked = Asked(sessions)
        assert sync(asked) == ({"h1": True, "h2": True, "h3": False}, {1: 0, 2: 0, 3: 1})
        assert sorted(asked.names) == ["h1", "h2", "h3"]
        assert _gone(testbed, 3, "yes")  # the flood given up on is not left running

        testbed.exec(2, ["sh", "-c", f"echo tampered > {remote}/a.py"])  # the host's copy changed
        assert sync(Asked(sessions)) == ({"h1": True, "h2": False, "h3": False}, {1: 0, 2: 1, 3: 1})
        assert testbed.exec(2, ["cat", f"{remote}/a.py"]).stdout == "print(1)\n"  # put back by rsync

        (project / "sub" / "b.txt").write_bytes(b"new")  # the project changed: no host is asked
        asked = Asked(sessions)
        assert sync(asked) == ({"h1": False, "h2": False, "h3": False}, {1: 1, 2: 1, 3: 1})
        assert asked.names == []
        assert testbed.exec(1, ["cat", f"{remote}/sub/b.txt"]).stdout == "new"

        assert sync(None)[1] == {1: 1, 2: 1, 3: 1}  # `fab sync` always runs rsync
        listed = [n for n in sync_cmd.code_files(inv, Project(project, project / "runs")).split(b"\0") if n]
        assert sorted(listed) == sorted(names)
        assert set(load_hints(hint_file()).values()) == {codestat.digest(os.fsencode(project), listed)}
    finally:
        close_all(sessions)
        for i in (1, 2, 3):
            testbed.exec(i, ["rm", "-rf", remote, "/root/flood"])
