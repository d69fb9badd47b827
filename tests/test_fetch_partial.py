"""`fab fetch-checkpoints` when a host of the run is gone, and when a run is fetched again: on real
files, moved by real rsync from local hosts (no sshd needed; the dead host is 127.0.0.1 port 1,
which refuses at once)."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path

import pytest

from meshrun.deploy.commands.fetch import Fetched, failure_lines, main, replaceable, vouched
from meshrun.deploy.run.resume import newest_listed_step
from meshrun.deploy.edges.fetch import FetchReport
from meshrun.deploy.edges.fetchplace import place
from meshrun.deploy.edges.records import RunRecord, load_record
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.project import Project
from meshrun.deploy.run.manifest import manifest_text, parse_manifest

RUN = "20260101-000000-abcd"
DEAD = "  h1:\n    address: 127.0.0.1\n    port: 1\n    nproc: 1\n    workdir: w1\n"  # the lost rendezvous host
LIVE = "  h2:\n    address: local\n    nproc: 1\n    workdir: w2\n"


def _project(tmp_path: Path, hosts: str, names: tuple[str, ...]) -> Project:
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory/hosts.yaml").write_text("hosts:\n" + hosts)
    project = Project(tmp_path, tmp_path / "runs")
    RunRecord(RUN, str(tmp_path / "inventory/hosts.yaml"), names, time.time(), True, "h1:29500").save(project.runs)
    return project


def _host_run(run: Path, steps: list[int], metrics: str) -> dict[str, str]:
    """What the trainer leaves in a host's run dir: the last saves, its manifest, metrics and a
    log. Older saves are pruned, as keep_last does. Returns the manifest's {name: sha256}."""
    checkpoints = run / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    for old in checkpoints.glob("ckpt-*"):
        old.unlink()
    digests = {}
    for step in steps:
        name = f"ckpt-step{step:09d}.pt"
        (checkpoints / name).write_bytes(f"weights at {step}".encode())
        digests[name] = hashlib.sha256(f"weights at {step}".encode()).hexdigest()
    (checkpoints / "MANIFEST.sha256").write_text(manifest_text(digests))
    (run / "metrics.jsonl").write_text(metrics)
    (run / "train.log").write_text(metrics.replace("{", "log "))
    return digests


def _listed(checkpoints: Path) -> dict[str, str]:
    return parse_manifest((checkpoints / "MANIFEST.sha256").read_bytes()).digests()


def test_a_dead_rendezvous_host_does_not_keep_the_survivors_checkpoints_away(tmp_path: Path, capsys) -> None:
    """h1 (the rendezvous host) is powered off; h2 trained on to step 500. The fetch brings h2's
    checkpoints home and assembles them, prints the table, names h1, and exits 1. Before the
    fix it raised at h1's rsync and `runs/<id>/checkpoints/` was never made."""
    project = _project(tmp_path, DEAD + LIVE, ("h1", "h2"))
    digests = _host_run(tmp_path / "w2/runs" / RUN, [300, 400, 500], '{"step": 500}\n')
    assert main(RUN, None, False, project) == 1
    home = project.runs / RUN / "checkpoints"
    assert _listed(home) == digests
    assert newest_listed_step((home / "MANIFEST.sha256").read_bytes()) == 500
    out, err = capsys.readouterr()
    assert "fetched run" in out and "h2" in out
    lines = err.replace("\n", " ")  # the console wraps long lines
    assert "host 'h1': fetch failed" in lines
    assert "not fetched: h1; the other hosts' files are home and" in lines
    assert "lists verified checkpoints up to step 500; fetch again when h1 is back" in lines
    assert not (project.runs / RUN / "hosts/h1").exists()


def test_a_dead_host_of_an_earlier_attempt_is_a_warning(tmp_path: Path, capsys) -> None:
    """h1 died and `--resume --hosts h2` left it out: it is still tried (its files may matter),
    and named, but the fetch of the latest attempt's hosts succeeds."""
    project = _project(tmp_path, DEAD + LIVE, ("h2", "h1"))
    record = load_record(project.runs, RUN)
    dataclasses.replace(record, earlier=("h1",)).save(project.runs)
    digests = _host_run(tmp_path / "w2/runs" / RUN, [300], "")
    assert main(RUN, None, False, project) == 0
    assert _listed(project.runs / RUN / "checkpoints") == digests
    err = capsys.readouterr().err.replace("\n", " ")
    assert "warning: host 'h1': fetch failed" in err and "h1 is a host of an earlier attempt of this run" in err
    assert "not fetched" not in err


def test_failure_lines_say_what_is_home_and_name_every_host_not_fetched() -> None:
    failed = {"h1": MeshrunError("host 'h1': fetch failed (rsync exit 255): gone"),
              "h3": MeshrunError("host 'h3': no answer within 4200 s")}
    assert failure_lines(Fetched([], failed, -1), "runs/r/checkpoints") == [
        "host 'h1': fetch failed (rsync exit 255): gone", "host 'h3': no answer within 4200 s",
        "no host answered: nothing was fetched; fetch again when h1, h3 are back to bring their files home"]
    assert failure_lines(Fetched([], {}, 700), "runs/r/checkpoints") == []


def test_fetching_again_lists_the_newest_step_and_brings_grown_metrics(tmp_path: Path) -> None:
    """A live run fetched at step 500 as a backup, then again at 700: the assembled manifest is
    the controller's own and lists 700 (resume would otherwise redo 500 -> 700), and metrics and
    logs that only grew are replaced. Before the fix both stayed as the first fetch left them."""
    project = _project(tmp_path, LIVE, ("h2",))
    run = tmp_path / "w2/runs" / RUN
    first = _host_run(run, [300, 400, 500], '{"step": 500}\n')
    assert main(RUN, None, False, project) == 0
    home = project.runs / RUN
    assert newest_listed_step((home / "checkpoints/MANIFEST.sha256").read_bytes()) == 500
    second = _host_run(run, [500, 600, 700], '{"step": 500}\n{"step": 700}\n')
    assert main(RUN, None, False, project) == 0
    assert newest_listed_step((home / "checkpoints/MANIFEST.sha256").read_bytes()) == 700
    assert _listed(home / "checkpoints") == first | second  # 300 and 400 were verified by the first fetch
    assert (home / "hosts/h2/metrics.jsonl").read_text() == '{"step": 500}\n{"step": 700}\n'
    assert (home / "hosts/h2/train.log").read_text() == 'log "step": 500}\nlog "step": 700}\n'


def test_an_edited_checkpoint_at_home_is_kept_and_no_longer_listed(tmp_path: Path) -> None:
    """Checkpoints the controller's manifest listed are its own only while unchanged: one edited
    here stays (a conflict, as before) and the rewritten manifest does not vouch for it."""
    project = _project(tmp_path, LIVE, ("h2",))
    run = tmp_path / "w2/runs" / RUN
    _host_run(run, [300, 400, 500], "")
    assert main(RUN, None, False, project) == 0
    home = project.runs / RUN / "checkpoints"
    (home / "ckpt-step000000400.pt").write_bytes(b"yours")
    (home / "ckpt-step000000500.pt").write_bytes(b"yours too")
    second = _host_run(run, [500, 600], "")
    assert main(RUN, None, False, project) == 0
    assert (home / "ckpt-step000000500.pt").read_bytes() == b"yours too"
    assert sorted(_listed(home)) == ["ckpt-step000000300.pt", "ckpt-step000000600.pt"]
    assert _listed(home)["ckpt-step000000600.pt"] == second["ckpt-step000000600.pt"]


def test_a_host_tree_fetched_again_takes_the_hosts_changes_but_keeps_yours(tmp_path: Path) -> None:
    """`hosts/<host>/` as the host has it now: its manifest (rewritten when it pruned) and a log it
    rewrote are replaced, because they are still what the last fetch placed (`.placed/<host>.json`,
    apart from the host's tree); a file you edited here stays, as before. Before, the host's
    manifest copy stayed at the first fetch's, a conflict on every later fetch."""
    project = _project(tmp_path, LIVE, ("h2",))
    run = tmp_path / "w2/runs" / RUN
    _host_run(run, [300, 400, 500], '{"step": 500}\n')
    assert main(RUN, None, False, project) == 0
    tree = project.runs / RUN / "hosts/h2"
    (tree / "metrics.jsonl").write_text("yours\n")
    second = _host_run(run, [600, 700], '{"step": 700}\n')  # rewritten, not grown: only "ours" lets it in
    assert main(RUN, None, False, project) == 0
    assert _listed(tree / "checkpoints") == second
    assert (tree / "train.log").read_text() == 'log "step": 700}\n'
    assert (tree / "metrics.jsonl").read_text() == "yours\n"
    (run / "placed-by-host.txt").write_text("x")  # a host naming a file after the record: just a file
    (run / ".placed").mkdir()
    (run / ".placed/h2.json").write_text('{"metrics.jsonl": "' + "0" * 64 + '"}')
    assert main(RUN, None, False, project) == 0
    assert (tree / "metrics.jsonl").read_text() == "yours\n"


@pytest.mark.parametrize("local, ours, replaced", [
    (b"line 1\n", {}, True),  # grew: every local byte is in the new copy
    (b"line 1\nline 2\n", {}, False),  # the same bytes: unchanged, not a conflict
    (b"line X\n", {}, False),  # edited here: a conflict
    (b"line 1\nline 2\nline 3\n", {}, False),  # longer here than on the host: a conflict
    (b"older", {"f.pt": hashlib.sha256(b"older").hexdigest()}, True),  # what meshrun listed, unchanged
    (b"older", {"f.pt": hashlib.sha256(b"other").hexdigest()}, False),  # changed since meshrun listed it
])
def test_place_replaces_only_files_that_grew_or_are_still_ours(tmp_path: Path, local: bytes, ours: dict,
                                                                replaced: bool) -> None:
    source, target = tmp_path / "staged", tmp_path / "landed"
    source.mkdir()
    target.mkdir()
    (source / "f.pt").write_bytes(b"line 1\nline 2\n")
    (target / "f.pt").write_bytes(local)
    report = FetchReport("h1", target)
    place(source, target, report, False, ours=ours)
    assert (report.updated, report.conflicts) == ((["f.pt"], []) if replaced else
                                                   ([], ["f.pt"] if local != b"line 1\nline 2\n" else []))
    assert (target / "f.pt").read_bytes() == (b"line 1\nline 2\n" if replaced else local)


def test_vouched_lists_files_verified_now_or_listed_before_and_unchanged() -> None:
    present = {"ckpt-step000000300.pt": "a", "ckpt-step000000500.pt": "b", "ckpt-step000000700.pt": "c",
               "best.pt": "d", "ckpt-step000000900.pt": "e"}
    verified = [{"ckpt-step000000700.pt": "c", "best.pt": "x"}, {"ckpt-step000000900.pt": "e"}]
    previous = {"ckpt-step000000300.pt": "a", "ckpt-step000000500.pt": "old", "best.pt": "d"}
    assert vouched(present, verified, previous) == {"ckpt-step000000300.pt": "a", "ckpt-step000000700.pt": "c",
                                                    "best.pt": "d", "ckpt-step000000900.pt": "e"}



def _saves(run: Path, files: dict[str, bytes]) -> dict[str, str]:
    """A host's checkpoints folder as its trainer leaves it: these files (the others pruned) and
    their manifest. Returns the manifest's {name: sha256}."""
    checkpoints = run / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    for old in [*checkpoints.glob("ckpt-*"), *checkpoints.glob("best.pt")]:
        old.unlink()
    for name, data in files.items():
        (checkpoints / name).write_bytes(data)
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    (checkpoints / "MANIFEST.sha256").write_text(manifest_text(digests))
    return digests


def _inventory(tmp_path: Path, up: str) -> None:
    """h2 and h3, one of them up (a local host) and the other down: only one local host per inventory."""
    h2 = LIVE if up == "h2" else DEAD.replace("h1", "h2")
    h3 = "  h3:\n    address: local\n    nproc: 1\n    workdir: w3\n" if up == "h3" else DEAD.replace("h1", "h3")
    (tmp_path / "inventory/hosts.yaml").write_text("hosts:\n" + h2 + h3)


def test_an_older_host_answering_alone_does_not_replace_the_best_model_at_home(tmp_path: Path) -> None:
    """h2 trained to step 500 (best.pt: the best, at step 450) and is fetched; then h2 dies, and
    the next fetch gets only h3's answer, which left the run at step 300. Home keeps the best at
    450 (the only copy left), still listed; h3's older best is not overwriting (kept, a conflict)
    and its step 300 joins. Before the fix home best.pt became h3's, and was listed."""
    project = _project(tmp_path, LIVE, ("h2", "h3"))
    first = _saves(tmp_path / "w2/runs" / RUN, {"ckpt-step000000400.pt": b"s400", "ckpt-step000000500.pt": b"s500",
                                                   "best.pt": b"best at 450"})
    older = _saves(tmp_path / "w3/runs" / RUN, {"ckpt-step000000300.pt": b"s300", "best.pt": b"best at 200"})
    _inventory(tmp_path, up="h2")
    assert main(RUN, None, False, project) == 1
    home = project.runs / RUN / "checkpoints"
    assert (home / "best.pt").read_bytes() == b"best at 450"
    _inventory(tmp_path, up="h3")
    assert main(RUN, None, False, project) == 1
    assert (home / "best.pt").read_bytes() == b"best at 450"
    assert _listed(home) == first | {"ckpt-step000000300.pt": older["ckpt-step000000300.pt"]}
    assert newest_listed_step((home / "MANIFEST.sha256").read_bytes()) == 500


def test_a_host_claiming_a_newer_step_cannot_replace_a_verified_step_at_home(tmp_path: Path, capsys) -> None:
    """h3 is compromised: it claims step 600 and sends its own bytes, with a matching manifest,
    under step 500's name. The honest step 500 that h2's fetch brought home stays, named as not
    overwritten, and stays listed; h2's tree and its record are not touched by h3's fetch. Before
    the fix h3's step 500 replaced home's (listed in the previous manifest, unchanged: "ours")."""
    project = _project(tmp_path, LIVE, ("h2", "h3"))
    honest = _saves(tmp_path / "w2/runs" / RUN, {"ckpt-step000000400.pt": b"s400", "ckpt-step000000500.pt": b"s500"})
    evil = _saves(tmp_path / "w3/runs" / RUN, {"ckpt-step000000500.pt": b"tampered", "ckpt-step000000600.pt": b"s600"})
    _inventory(tmp_path, up="h2")
    assert main(RUN, None, False, project) == 1
    placed = (project.runs / RUN / ".placed/h2.json").read_bytes()
    _inventory(tmp_path, up="h3")
    capsys.readouterr()
    assert main(RUN, None, False, project) == 1
    home = project.runs / RUN / "checkpoints"
    assert (home / "ckpt-step000000500.pt").read_bytes() == b"s500"
    assert _listed(home) == honest | {"ckpt-step000000600.pt": evil["ckpt-step000000600.pt"]}
    shown = capsys.readouterr().out.replace("\n", "")  # the kept file where it is: runs/<id>/checkpoints/
    assert f"not overwritten: {project.runs / RUN}/checkpoints/ckpt-step000000500.pt differs from h3's copy" in shown
    assert (project.runs / RUN / "hosts/h2/checkpoints/ckpt-step000000500.pt").read_bytes() == b"s500"
    assert _listed(project.runs / RUN / "hosts/h2/checkpoints") == honest
    assert (project.runs / RUN / ".placed/h2.json").read_bytes() == placed
    assert (project.runs / RUN / "hosts/h3/checkpoints/ckpt-step000000500.pt").read_bytes() == b"tampered"


@pytest.mark.parametrize("evil", [
    {"ckpt-step000000300.pt": b"s300", "ckpt-step000000500.pt": b"s500EVIL"},  # a step's file, never replaced
    {"ckpt-step000000300.pt": b"s300", "best.pt": b"best at 450EVIL"},  # best.pt, from an older host
])
def test_a_host_appending_to_verified_checkpoints_cannot_replace_them_at_home(tmp_path: Path, capsys,
                                                                              evil: dict) -> None:
    """A security review: the assembly's placement let any file through whose old bytes are a
    prefix of the new ones (right for a log that grew), so a compromised h3 holding the honest
    copies served them with bytes appended, and a matching manifest: step 500 (or best.pt, though
    h3 lists no step as new as home's 500) at home became its own, listed. Home keeps its bytes
    and their lines, and names h3's copy as not overwritten."""
    project = _project(tmp_path, LIVE, ("h2", "h3"))
    honest = _saves(tmp_path / "w2/runs" / RUN, {"ckpt-step000000400.pt": b"s400", "ckpt-step000000500.pt": b"s500",
                                                 "best.pt": b"best at 450"})
    _saves(tmp_path / "w3/runs" / RUN, evil)
    _inventory(tmp_path, up="h2")
    assert main(RUN, None, False, project) == 1
    _inventory(tmp_path, up="h3")
    capsys.readouterr()
    assert main(RUN, None, False, project) == 1
    home = project.runs / RUN / "checkpoints"
    assert (home / "ckpt-step000000500.pt").read_bytes() == b"s500"
    assert (home / "best.pt").read_bytes() == b"best at 450"
    listed = _listed(home)
    assert {name: listed[name] for name in honest} == honest
    attacked = next(name for name in evil if name != "ckpt-step000000300.pt")
    shown = capsys.readouterr().out.replace("\n", "")
    assert f"not overwritten: {project.runs / RUN}/checkpoints/{attacked} differs from h3's copy" in shown


def test_a_log_that_grew_still_replaces_its_older_copy_but_a_checkpoint_does_not(tmp_path: Path) -> None:
    """place()'s `grow`: on by default (logs and metrics only grow), off for the assembly."""
    for grow, expected in ((True, b"old and new"), (False, b"old")):
        source, target = tmp_path / f"in-{grow}", tmp_path / f"out-{grow}"
        source.mkdir()
        target.mkdir()
        (source / "f").write_bytes(b"old and new")
        (target / "f").write_bytes(b"old")
        report = FetchReport("h3", target)
        place(source, target, report, False, grow=grow)
        assert (target / "f").read_bytes() == expected
        assert (report.updated, report.conflicts) == ((["f"], []) if grow else ([], ["f"]))


@pytest.mark.parametrize("previous, newest_step, expected", [
    ({"ckpt-step000000500.pt": "a", "best.pt": "b"}, 700, {"best.pt": "b"}),  # newer: its best may be newer
    ({"ckpt-step000000500.pt": "a", "best.pt": "b"}, 500, {"best.pt": "b"}),  # as new
    ({"ckpt-step000000500.pt": "a", "best.pt": "b"}, 300, {}),  # older: keep the best here
    ({"ckpt-step000000500.pt": "a"}, 700, {}),  # a step's file: never
    ({"best.pt": "b"}, 0, {"best.pt": "b"}),  # no step listed: any host is as new
    ({}, 700, {}),
])
def test_replaceable_is_best_pt_only_and_only_from_a_host_as_new(previous: dict, newest_step: int,
                                                                  expected: dict) -> None:
    assert replaceable(previous, newest_step) == expected
