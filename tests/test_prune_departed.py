"""`fab fetch-checkpoints --prune` over a week-long elastic run: a host that left the run on day 2
(lost past its rejoins, or `fab leave`), answering or down, no longer holds every later checkpoint
home; a member still in the run that does not answer still removes nothing (it may keep older ones,
and an answering host's lie must not be the only word: tests/test_fetch_prune.py). The floor comes from the hosts that answered and are still in the run (deploy/run/fetchplan.py
`prune_rule`, `departed`); a file any answering host lists is never removed, nor the newest one home.

Old code: the floor was the oldest step of every answering host, the one that left included (its
day-2 saves kept all 117 later ones home), and one that left and did not answer removed nothing at all."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from meshrun.deploy.edges.fetch import FetchReport
from meshrun.deploy.edges.prune import Pruned, prune_home
from meshrun.deploy.run.fetchplan import PruneRule, departed, prunable, prune_rule
from meshrun.deploy.run.manifest import manifest_text, parse_manifest
from meshrun.layout import checkpoint_name

A, B = "a" * 64, "b" * 64


def _names(*steps: int) -> list[str]:
    return [checkpoint_name(s) for s in steps]


def _listing(*steps: int) -> dict[str, str]:
    return {**{name: A for name in _names(*steps)}, "best.pt": B}


def _event(event: str, host: str, world_size: object) -> dict:
    return {"time": 1.7e9, "event": event, "host": host, "world_size": world_size, "detail": None}


def test_a_host_left_the_run_when_its_last_event_left_the_others_training() -> None:
    began = [_event("started", h, n) for h, n in (("h1", 1), ("h2", 2), ("h3", 3))]
    assert departed([*began, _event("lost", "h3", 2)]) == {"h3"}
    assert departed([*began, _event("left", "h2", 2)]) == {"h2"}  # fab leave
    assert departed([*began, _event("lost", "h3", 2), _event("joined", "h3", 3)]) == set()  # came back
    # The run ended: the last one lost had nobody after it, so it did not leave the run.
    assert departed([*began, _event("lost", "h1", 2), _event("lost", "h2", 1), _event("lost", "h3", 0)]) == {"h1", "h2"}
    assert departed([*began, _event("finished", "h1", 2)]) == set()
    # A resume's new attempt starts it again.
    assert departed([*began, _event("lost", "h3", 2), _event("started", "h3", 3)]) == set()


def test_a_line_of_another_shape_never_makes_a_host_leave() -> None:
    assert departed([None, [], "x", {"event": "lost", "world_size": 2}, {"host": 3, "event": "lost", "world_size": 2},
                     _event("lost", "h3", None), _event("lost", "h3", True), _event("lost", "h3", "2"),
                     _event("gone", "h3", 2), _event("succession", "h3", 2)]) == set()


DAY_2 = (2000, 2100, 2200)  # what h3 kept when it left
NOW = (11800, 11900, 12000)  # what the hosts still in the run keep


def test_the_floor_is_the_oldest_step_of_the_answering_hosts_still_in_the_run() -> None:
    answered = {"h1": _listing(*NOW), "h2": _listing(*NOW), "h3": _listing(*DAY_2)}
    kept = frozenset([*_names(*NOW, *DAY_2), "best.pt"])
    members = ("h1", "h2", "h3")
    assert prune_rule(answered, members, {"h3"}, 12000) == PruneRule(11800, kept, ("h1", "h2"))
    # Old code: agreed_floor over every answering host, h3 with it: 2000.
    assert prune_rule(answered, members, set(), 12000) == PruneRule(2000, kept, ("h1", "h2", "h3"))
    # h3 left and is down: not waited for (old code removed nothing).
    assert prune_rule({"h1": _listing(*NOW), "h2": _listing(*NOW)}, members, {"h3"}, 12000) == PruneRule(
        11800, frozenset([*_names(*NOW), "best.pt"]), ("h1", "h2"))
    # h3 down but still in the run: nothing goes, as before.
    assert prune_rule({"h1": _listing(*NOW), "h2": _listing(*NOW)}, members, set(), 12000) == PruneRule(
        None, frozenset([*_names(*NOW), "best.pt"]), ("h1", "h2"), ("h3",))
    # A host of an earlier attempt (`--resume` left it out) sets no floor either.
    assert prune_rule(answered, ("h1", "h2"), set(), 12000) == PruneRule(11800, kept, ("h1", "h2"))


def test_when_every_answering_member_left_they_all_count() -> None:
    answered = {"h1": _listing(*NOW), "h3": _listing(*DAY_2)}
    assert prune_rule(answered, ("h1", "h3"), {"h1", "h3"}, 12000) == PruneRule(
        2000, frozenset([*_names(*NOW, *DAY_2), "best.pt"]), ("h1", "h3"))


def test_the_newest_checkpoint_home_is_never_below_the_floor() -> None:
    """The one member that answered lists steps newer than came home (a lie, or its copy failed)."""
    lie = {checkpoint_name(999_999_999): A}
    assert prune_rule({"h1": lie}, ("h1", "h2"), {"h2"}, 12000) == PruneRule(12000, frozenset(lie), ("h1",))
    assert prune_rule({"h1": lie}, ("h1", "h2"), {"h2"}, -1) == PruneRule(None, frozenset(lie), ("h1",))
    assert prune_rule({"h1": {"best.pt": B}}, ("h1",), set(), 12000) == PruneRule(None, frozenset(["best.pt"]), ("h1",))
    assert prune_rule({}, ("h1",), set(), 12000) == PruneRule(None, frozenset(), (), ("h1",))


def test_a_file_an_answering_host_lists_is_never_prunable() -> None:
    placed = {name: A for name in _names(1900, *DAY_2, 5000)}
    assert prunable(placed, placed, 11800, frozenset(_names(*DAY_2))) == _names(1900, 5000)
    assert prunable(placed, placed, 11800) == _names(1900, *DAY_2, 5000)


def _home(tmp_path: Path) -> Path:
    """runs/<id>/ after a week of hourly fetches: 120 saves assembled in checkpoints/, its manifest."""
    home = tmp_path / "runs/20260101-000000-week"
    folder = home / "checkpoints"
    folder.mkdir(parents=True)
    files = {checkpoint_name(s): f"weights at {s}".encode() for s in range(100, 12001, 100)}
    files["best.pt"] = b"best"
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "MANIFEST.sha256").write_text(manifest_text({n: hashlib.sha256(d).hexdigest() for n, d in files.items()}))
    return home


def _reports(home: Path, hosts: dict[str, tuple[int, ...]]) -> list[FetchReport]:
    return [FetchReport(h, home / "hosts" / h, claimed=_listing(*steps)) for h, steps in hosts.items()]


def test_a_week_with_a_host_that_left_on_day_2_prunes_all_but_what_the_hosts_list(tmp_path: Path) -> None:
    home = _home(tmp_path)
    (home / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [
        _event("started", "h1", 1), _event("started", "h2", 2), _event("started", "h3", 3), _event("lost", "h3", 2)]))
    pruned = prune_home(home, _reports(home, {"h1": NOW, "h2": NOW, "h3": DAY_2}), ("h1", "h2", "h3"))
    gone = [f"checkpoints/{n}" for n in _names(*(s for s in range(100, 11800, 100) if s not in DAY_2))]
    assert pruned == Pruned(11800, gone, ["h3 (left the run: what it lists is kept)"])
    assert len(gone) == 114  # old code: the floor at 2000, 19 removed
    left = sorted(p.name for p in (home / "checkpoints").iterdir())
    assert left == sorted(["MANIFEST.sha256", "best.pt", *_names(*DAY_2, *NOW)])
    listed = parse_manifest((home / "checkpoints/MANIFEST.sha256").read_bytes()).digests()
    assert sorted(listed) == sorted(["best.pt", *_names(*DAY_2, *NOW)])
    assert pruned.line() == (
        "prune: removed 114 checkpoint file(s) older than step 11800, which the hosts no longer keep: "
        "checkpoints/ckpt-step000000100.pt, checkpoints/ckpt-step000000200.pt, checkpoints/ckpt-step000000300.pt, "
        "checkpoints/ckpt-step000000400.pt, checkpoints/ckpt-step000000500.pt, checkpoints/ckpt-step000000600.pt "
        "and 108 more; not counted: h3 (left the run: what it lists is kept)")


def test_a_host_that_left_and_does_not_answer_is_named_and_waited_for_no_longer(tmp_path: Path) -> None:
    home = _home(tmp_path)
    (home / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [
        _event("started", "h1", 1), _event("started", "h2", 2), _event("started", "h3", 3), _event("left", "h3", 2)]))
    pruned = prune_home(home, _reports(home, {"h1": NOW, "h2": NOW}), ("h1", "h2", "h3"))
    assert pruned.floor == 11800 and len(pruned.removed) == 117
    assert pruned.aside == ["h3 (left the run, did not answer)"] and pruned.silent == []
    assert pruned.line().endswith(" and 111 more; not counted: h3 (left the run, did not answer)")
    (home / "events.jsonl").unlink()  # h3 never left: it may keep older checkpoints, nothing goes
    kept = prune_home(home, _reports(home, {"h1": NOW, "h2": NOW}), ("h1", "h2", "h3"))
    assert (kept.floor, kept.removed, kept.silent) == (None, [], ["h3"])
    assert kept.line() == "prune: nothing removed: h3 did not answer, and may keep older checkpoints"
    assert Pruned(None, [], ["h1 (left the run: what it lists is kept)"]).line() == (
        "prune: nothing removed: no answering host still in the run lists a checkpoint, or none is home; "
        "not counted: h1 (left the run: what it lists is kept)")
