"""Every file meshrun reads that a person or a host wrote is a regular file of a bounded size, read once, and
checked; anything else is one line naming the file (issue 20, item 4). Real files, FIFOs and devices: a FIFO
used to hang the controller (the inventory, known_hosts, a join request), `/dev/zero` to fill its memory
(known_hosts), a bad line or field to end in an internal error (known_hosts base64, a run record, a comm
plan, pyproject.toml), and a run record whose `run_id` disagrees with its folder was trusted.

The FIFO cases run their reader in a thread joined with a bound: that bound is a hang guard, not a timing
assertion (a correct reader returns at once, whatever the load).
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import paramiko
import pytest

from meshrun.deploy.commands.membership import RequestPoller
from meshrun import fsutil
from meshrun.deploy.edges import comm, hostkeys, preflightcache, records, sshtarget
from meshrun.deploy.edges.records import RunRecord, all_records, load_record
from meshrun.deploy.errors import InputError
from meshrun.deploy.run.requirements import project_requirements
from meshrun.train.config import load_config
from meshrun.train.errors import UsageError

KNOWN_HOSTS_FIX = "point `known_hosts:` at the file `fab trust` writes, or remove it"
ED25519 = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


def within(fn: Callable[[], Any], bound_s: float = 30) -> Any:
    """fn() in a thread; a hang (a FIFO read without O_NONBLOCK waits for a writer forever) fails the test."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the test's thread
            box["error"] = err

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(bound_s)
    assert not thread.is_alive(), "the reader hung"
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def test_read_regular_refuses_what_is_not_a_regular_file(tmp_path: Path, fifo: Path) -> None:
    for path, why in ((fifo, "is a FIFO, not a regular file"), (Path("/dev/zero"), "is a character device, not a "
                      "regular file"), (tmp_path, "is a directory, not a regular file")):
        with pytest.raises(fsutil.FileRefused) as info:
            within(lambda: fsutil.read_regular(path, 100))
        assert (str(info.value), info.value.too_large) == (why, False)
    (tmp_path / "f").write_bytes(b"x" * 101)
    with pytest.raises(fsutil.FileRefused) as info:
        fsutil.read_regular(tmp_path / "f", 100)
    assert (str(info.value), info.value.too_large) == ("is larger than 100 bytes", True)
    assert fsutil.read_regular(tmp_path / "f", 101) == b"x" * 101


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    return home


def test_known_hosts_lines_that_are_not_keys_are_skipped(tmp_path: Path, home: Path) -> None:
    """paramiko's own reader raised on bad base64 (InvalidHostKey), a short key (nacl's ValueError) or
    bytes that are not UTF-8 in a key: an internal error. Such lines are skipped, as OpenSSH does."""
    pinned = tmp_path / "known_hosts"
    pinned.write_text("h1 ssh-ed25519 AAAA!!!notbase64\nh1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAABWFiY2Rl\n"
                      "h1 ecdsa-sha2-nistp256 //////////////////////////////////////////8=\n# a comment\n"
                      f"h1 ssh-ed25519 {ED25519}\n[h2]:2222 ssh-ed25519 {ED25519}\n")
    assert {name: key.get_base64() for name, key in hostkeys.known_keys(pinned, "h1").items()} == {"ssh-ed25519": ED25519}
    assert list(hostkeys.known_keys(pinned, "[h2]:2222")) == ["ssh-ed25519"]
    (home / ".ssh" / "known_hosts").write_text(f"h3 ssh-ed25519 {ED25519}\n")
    client = paramiko.SSHClient()
    hostkeys.load_known_hosts(client, pinned)
    assert sorted(client.get_host_keys().keys()) == ["[h2]:2222", "h1", "h3"]


@pytest.mark.parametrize("name,why", [("fifo", "is a FIFO, not a regular file"),
                                      ("zero", "is a character device, not a regular file"),
                                      ("dir", "is a directory, not a regular file")])
def test_a_known_hosts_that_is_no_file_is_one_line(tmp_path: Path, home: Path, fifo: Path, name: str, why: str) -> None:
    path = {"fifo": fifo, "zero": Path("/dev/zero"), "dir": tmp_path}[name]
    with pytest.raises(InputError) as info:
        within(lambda: hostkeys.known_keys(path, "h1"))
    assert str(info.value) == f"known_hosts {path} {why}; {KNOWN_HOSTS_FIX}"
    with pytest.raises(InputError) as info:  # and `fab trust` never appends to it
        within(lambda: hostkeys.append_known_host(path, "h1", paramiko.Ed25519Key(data=base64.b64decode(ED25519))))
    assert str(info.value) == f"known_hosts {path} {why}; {KNOWN_HOSTS_FIX}"


def test_a_broken_user_known_hosts_is_skipped_not_fatal(tmp_path: Path, home: Path) -> None:
    os.mkfifo(home / ".ssh" / "known_hosts")
    assert within(lambda: hostkeys.known_keys(None, "h1")) == {}


@pytest.mark.parametrize("name,expected", [
    ("fifo", "ssh_config {path} is a FIFO, not a regular file; fix the file or set MESHRUN_SSH_CONFIG"),
    ("big", "ssh_config {path} is larger than 1 MiB; fix the file or set MESHRUN_SSH_CONFIG"),
])
def test_ssh_config_is_read_bounded(tmp_path: Path, fifo: Path, name: str, expected: str) -> None:
    path = fifo if name == "fifo" else tmp_path / name
    if name == "big":
        path.write_text("# x\n" * (1 << 18) + "\n")
    with pytest.raises(InputError) as info:
        within(lambda: sshtarget.load_config(path))
    assert str(info.value) == expected.format(path=path)
    assert dict(sshtarget.load_config(Path(os.devnull)).lookup("h")) == {"hostname": "h"}  # as `ssh -F /dev/null`


RUN = "20261130-100000-aaaa"


def record_json(**changes: object) -> dict:
    good = {"run_id": RUN, "inventory": "/inv.yaml", "hosts": ["gpu1"], "started": 1.0, "detached": True,
            "rdzv_endpoint": "10.0.0.1:29400", "rdzv_id": "", "elastic": None, "workload": {}, "pg_timeout_s": 60,
            "controller_pid": None, "firewall": False}
    return {**good, **changes}


@pytest.mark.parametrize("changes,expected", [
    ({"run_id": "20261130-100000-bbbb"}, "run_id '20261130-100000-bbbb' is not its folder's name '20261130-100000-aaaa'"),
    ({"run_id": None}, "run_id None is not its folder's name '20261130-100000-aaaa'"),
    ({"hosts": "gpu1"}, "hosts is not a list of host names"),
    ({"hosts": ["gpu1", "-oProxyCommand=x"]}, "hosts is not a list of host names"),
    ({"started": "yesterday"}, "started is not a time"),
    ({"detached": "no"}, "detached is not true or false"),
    ({"inventory": ["x"]}, "inventory is not a path"),
    ({"elastic": [3, 1]}, "elastic is not null or [MIN, MAX]"),
    ({"workload": {"args": "epochs=3"}}, "workload is not the trainer's or a script's workload"),
    ({"pg_timeout_s": 1e400}, "pg_timeout_s is not whole seconds"),
    ({"controller_pid": -1}, "controller_pid is not null or a process id"),
    ({"rdzv_id": "../x"}, "rdzv_id is not a rendezvous id"),
])
def test_a_damaged_run_record_is_refused(tmp_path: Path, changes: dict, expected: str) -> None:
    path = tmp_path / RUN / "launch.json"
    path.parent.mkdir()
    path.write_text(json.dumps(record_json(**changes)).replace("Infinity", "1e400"))
    with pytest.raises(InputError) as info:
        load_record(tmp_path, RUN)
    assert str(info.value) == f"{path}: {expected}; {records.RECORD_FIX}"


def test_a_listing_leaves_a_damaged_record_out_and_says_so(tmp_path: Path, fifo: Path) -> None:
    RunRecord(RUN, "/inv.yaml", ("gpu1",), 1.0, True, "10.0.0.1:29400").save(tmp_path)
    copied = tmp_path / "20261201-100000-cccc" / "launch.json"  # a run's folder copied under another name
    copied.parent.mkdir()
    copied.write_text((tmp_path / RUN / "launch.json").read_text())
    (tmp_path / "20261202-100000-dddd").mkdir()
    os.rename(fifo, tmp_path / "20261202-100000-dddd" / "launch.json")
    warnings: list[str] = []
    assert [r.run_id for r in within(lambda: all_records(tmp_path, warnings.append))] == [RUN]
    assert warnings == [
        f"run record {tmp_path}/20261202-100000-dddd/launch.json is a FIFO, not a regular file; {records.RECORD_FIX}; left out",
        f"{copied}: run_id '{RUN}' is not its folder's name '20261201-100000-cccc'; {records.RECORD_FIX}; left out"]


def test_a_damaged_comm_plan_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / RUN / "commplan.json"
    path.parent.mkdir()
    for text in ('{"hook": "fp16"}', "[]", '{"hook": "fp16", "recommended": "fp16", "reason": "r", "nodes": 2, '
                 '"bandwidth_bytes_s": 1e6, "floors": [{"hook": "none", "floor_s": 1}]}'):
        path.write_text(text)
        with pytest.raises(InputError) as info:
            comm.load_plan(tmp_path, RUN)
        assert str(info.value) == (f"comm plan {path} is not the shape meshrun writes; the file is damaged or was "
                                   "edited; remove it (the report then leaves the floors out)")


class Warnings:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def warn(self, message: str) -> None:
        self.lines.append(message)


def test_join_requests_that_are_not_requests_neither_block_nor_crash_the_controller(tmp_path: Path, fifo: Path) -> None:
    """The attached controller polls runs/<id>/requests/ while it runs a job: a FIFO there used to block it
    for ever, and a file of the wrong shape crashed it. Both are left alone, with a warning."""
    from meshrun.deploy.project import Project

    record = RunRecord(RUN, "/inv.yaml", ("gpu1",), 1.0, False, "10.0.0.1:29400", elastic=(1, 2))
    requests = tmp_path / "runs" / RUN / "requests"
    requests.mkdir(parents=True)
    renderer = Warnings()
    poller = RequestPoller(record, None, Project(tmp_path, tmp_path / "runs"), renderer)  # type: ignore[arg-type]
    os.rename(fifo, requests / "1-fifo.json")
    (requests / "2-list.json").write_text("[" * 100_000)
    (requests / "3-shape.json").write_text('{"action": "reboot", "host": "gpu1"}')
    within(lambda: poller(None))  # type: ignore[arg-type]
    assert renderer.lines == [f"ignored {name} in {requests}: not a join or leave request"
                              for name in ("1-fifo.json", "2-list.json", "3-shape.json")]


def test_a_resumed_run_does_not_replay_the_requests_of_an_earlier_controller(tmp_path: Path) -> None:
    """`fab train --resume` reuses runs/<id>/requests/: a leave answered (or never answered) by the
    controller that ran before is history. Only what arrives while this controller runs is done."""
    from types import SimpleNamespace

    from meshrun.deploy.project import Project

    record = RunRecord(RUN, "/inv.yaml", ("gpu1",), 1.0, False, "10.0.0.1:29400", elastic=(1, 2))
    requests = tmp_path / "runs" / RUN / "requests"
    requests.mkdir(parents=True)
    (requests / "1-old-leave-gpu1.json").write_text('{"action": "leave", "host": "gpu1"}')
    renderer = Warnings()
    renderer.info = renderer.lines.append  # type: ignore[method-assign]
    poller = RequestPoller(record, None, Project(tmp_path, tmp_path / "runs"), renderer)  # type: ignore[arg-type]
    (requests / "2-new-leave-gpu1.json").write_text('{"action": "leave", "host": "gpu1"}')
    poller(SimpleNamespace(hosts=[]))  # type: ignore[arg-type]
    answer = requests / "2-new-leave-gpu1.done.json"
    deadline = time.monotonic() + 10
    while not answer.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert json.loads(answer.read_text()) == {"ok": False, "message": f"host 'gpu1' is not running in run {RUN}"}
    time.sleep(0.5)  # a replayed request would have been answered beside the new one
    assert not (requests / "1-old-leave-gpu1.done.json").exists()


def test_the_preflight_cache_and_pyproject_are_read_bounded(tmp_path: Path, fifo: Path) -> None:
    assert within(lambda: preflightcache.load_pass(fifo)) == preflightcache.NOTHING
    (tmp_path / "deep.json").write_text("[" * 100_000)
    assert preflightcache.load_pass(tmp_path / "deep.json") == preflightcache.NOTHING
    (tmp_path / "pyproject.toml").write_text('project = "meshrun"\n')
    with pytest.raises(InputError) as info:
        project_requirements(tmp_path)
    assert str(info.value) == (f"{tmp_path}/pyproject.toml: [project] is not a table; fix it, or declare the "
                               "project's requirements in requirements.txt")


def test_the_trainer_reads_its_config_bounded(tmp_path: Path, fifo: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("#" * (1 << 20) + "\n")
    for path, why in ((fifo, "is a FIFO, not a regular file"), (big, "is larger than 1 MiB")):
        with pytest.raises(UsageError) as info:
            within(lambda: load_config(path))
        assert str(info.value) == f"config file {path}: cannot be read ({why}); name a YAML file"
