"""`fab setup` under a running run (the stop50 review, findings 4 and 5).

4. The host side refused under a running run only after the controller had synced the project over
   that run's workdir and pushed the wheel: the run's next worker restart would import other code
   than its peers, while the user read that setup was refused. Now every host is asked first, with
   the host script's `--check-only`, and a refusal comes before any sync or push to any host.
5. The test looked at the 10,000 oldest agent locks only (sorted by run id, the start time), so a
   workdir with more missed the running runs, the newest. Now the most recently written are kept.

The host script runs as a real process, as the controller ships it, in a local workdir; a real
child process holds the agent's lock; the sync and the wheel push are recorded, not run."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from meshrun.layout import AGENT_LOCKS
from meshrun.deploy.commands import setup
from meshrun.deploy.host import setup as host_setup
from tests.fakesession import FakeSession, failure, host
from tests.test_setup_busy import agent_lock, busy, hold, release
from tests.test_setup_lock import REQUEST, LocalSession, pip_calls, workdir_with_venv

H1, GPU2 = host(), dataclasses.replace(host(), name="gpu2")


@pytest.fixture
def effects(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """What setup_hosts changed on the hosts, in order: each sync (all its hosts) and wheel push."""
    done: list[tuple[str, str]] = []
    monkeypatch.setattr(setup, "sync_code", lambda hosts, *_a, **_k: done.append(
        ("sync", " ".join(h.name for h in hosts))))
    monkeypatch.setattr(setup, "push_dir_argv", lambda *_a: ["rsync", "the wheel"])
    monkeypatch.setattr(setup, "run_rsync", lambda _argv, **kw: done.append(("push", kw["host"])))
    # The stand-in venv imports no meshrun: say it imports the controller's build, as a real one would.
    monkeypatch.setattr(setup, "installed_identity", lambda *_a: REQUEST.identity)
    return done


def setup_hosts(workdirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> dict[str, setup.SetupResult]:
    """setup_hosts over H1 and GPU2, each host's session running commands in its workdir here."""
    @contextlib.contextmanager
    def sessions(*_args: Any) -> Iterator[dict[str, LocalSession]]:
        yield {name: LocalSession(workdir) for name, workdir in workdirs.items()}

    monkeypatch.setattr(setup, "sessions_to", sessions)
    project = SimpleNamespace(root=Path("/nonexistent"))
    return setup.setup_hosts((H1, GPU2), SimpleNamespace(known_hosts=None), project, None, REQUEST)  # type: ignore[arg-type]


def test_a_running_run_on_one_host_refuses_before_any_host_is_synced_or_pushed_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, effects: list[tuple[str, str]]) -> None:
    free, running = workdir_with_venv(tmp_path / "h1"), workdir_with_venv(tmp_path / "gpu2")
    holder = hold(agent_lock(running))
    try:
        message = failure(lambda: setup_hosts({"h1": free, "gpu2": running}, monkeypatch))
        assert message == f"host 'gpu2': setup failed: {busy(holder.pid)}"  # today's line, unchanged
    finally:
        release(holder)
    assert effects == []  # no host's files changed, the free one's neither
    assert pip_calls(free) == pip_calls(running) == []


def test_nothing_running_checks_every_host_then_syncs_then_sets_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, effects: list[tuple[str, str]]) -> None:
    workdirs = {"h1": workdir_with_venv(tmp_path / "h1"), "gpu2": workdir_with_venv(tmp_path / "gpu2")}
    agent_lock(workdirs["gpu2"]).write_text("123\n")  # an ended run's lock: nobody holds it
    results = setup_hosts(workdirs, monkeypatch)
    assert effects[0] == ("sync", "h1 gpu2") and sorted(effects[1:]) == [("push", "gpu2"), ("push", "h1")]
    assert sorted(results) == ["gpu2", "h1"]
    assert all(sum(" -m pip install " in call for call in pip_calls(w)) == 2 for w in workdirs.values())


def check_only(workdir: Path, cache: Path) -> tuple[int, dict]:
    done = subprocess.run(setup.check_argv(REQUEST), cwd=workdir, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "XDG_CACHE_HOME": str(cache)})
    return done.returncode, json.loads(done.stdout)


def test_the_check_only_answers_and_makes_nothing(tmp_path: Path) -> None:
    """No venv, no setup lock: a setup running there is still that setup's to refuse, after the sync."""
    workdir, cache = tmp_path / "w", tmp_path / "cache"
    workdir.mkdir()
    assert check_only(workdir, cache) == (0, {"busy": False})
    lock = agent_lock(workdir)
    holder = hold(lock)
    try:
        assert check_only(workdir, cache) == (1, {"error": busy(holder.pid), "busy": True})
    finally:
        release(holder)
    assert sorted(p.name for p in workdir.iterdir()) == ["runs"] and not cache.exists()
    assert lock.read_text() == f"{holder.pid}\n"  # the agent's lock, unwritten


@pytest.mark.parametrize("session,message", [
    (FakeSession("", rc=127), "host 'h1': setup failed: exit status 127; is `"
     f"{REQUEST.base}` a Python >= 3.10 with venv? (--base PYTHON)"),  # a --base that is no such Python
    (FakeSession('{"busy": "no"}'), "host 'h1': the setup script gave an unexpected answer: busy is 'no'; "
     "expected false"),
    (FakeSession("{}"), "host 'h1': the setup script gave an unexpected answer: busy is missing; expected false"),
])
def test_a_check_that_is_no_clear_no_refuses_too(session: FakeSession, message: str) -> None:
    assert failure(lambda: setup.refuse_if_running(H1, session, REQUEST)) == message


def test_over_the_bound_the_most_recently_written_locks_are_kept(tmp_path: Path) -> None:
    paths = [str(tmp_path / name) for name in ("a", "b", "c", "d", "e")]
    for when, path in zip((5, 1, 4, 2, 3), paths):
        Path(path).write_text("")
        os.utime(path, (1_000_000_000 + when, 1_000_000_000 + when))
    assert host_setup.newest_locks(paths, 2) == [paths[0], paths[2]]
    assert host_setup.newest_locks(paths[::-1], 5) == paths


def test_the_newest_run_and_a_resumed_old_one_are_found_among_more_locks_than_the_bound(tmp_path: Path) -> None:
    """3,400 runs of 3 hosts: more locks than are tested. Their names sort by start time; a resumed
    run keeps its first (oldest) id, and its agent writes its lock as it takes it."""
    runs = [f"20260101-{i:06d}-aaaa" for i in range(3400)]
    locks = [agent_lock(tmp_path, run, name) for run in runs for name in ("gpu1", "gpu2", "gpu3")]
    assert len(locks) > host_setup.LOCKS_CHECKED
    for when, lock in enumerate(locks):
        lock.write_text("1\n")
        os.utime(lock, (1_000_000_000 + when, 1_000_000_000 + when))
    newest, resumed = hold(locks[-1]), hold(locks[0])
    try:
        assert host_setup.running_agents(str(tmp_path / AGENT_LOCKS)) == [
            (runs[0], "gpu1", str(resumed.pid)), (runs[-1], "gpu3", str(newest.pid))]
    finally:
        release(newest)
        release(resumed)
