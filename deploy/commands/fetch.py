"""`fab fetch-checkpoints`: checkpoints, manifest, logs and metrics of a run, home and verified."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from stat import S_ISDIR
from pathlib import Path

from meshrun.layout import BEST_CHECKPOINT, CHECKPOINTS, EVENTS, HOSTS, checkpoint_step, run_dir
from meshrun.deploy.edges.agents import run_hosts, with_missing
from meshrun.deploy.edges.checkpointpush import copy_records
from meshrun.deploy.edges.digestmemo import DigestMemo
from meshrun.deploy.edges.fanout import HostResults, on_each
from meshrun.deploy.project import Project
from meshrun.deploy.edges.fetch import BUT_CHECKPOINTS, EVERYTHING, FETCH_ATTEMPTS, FETCH_TIMEOUT_S, \
    ONLY_CHECKPOINTS, RESUMES, FetchReport, fetch_argv, fetch_lock, fetch_verified, prepare_staging, read_host_manifest, \
    remove_staging, skip_lines
from meshrun.deploy.edges.fetchplace import note_unchanged, place, stage_verified
from meshrun.deploy.edges.prune import prune_home
from meshrun.deploy.edges.placed import drop_journal, hashes_of, journal_to, placed_after, read_journal, read_placed, \
    save_placed, write_assembled_manifest
from meshrun.deploy.edges.staging import Staging, fetch_basis, is_regular
from meshrun.deploy.edges.records import RunRecord, resolve_run
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.inputfiles import flag_path_stat
from meshrun.deploy.inventory.shown import with_path
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.render.console import HostProgress, Renderer
from meshrun.deploy.run.fetchplan import Claim, holder_order, newest_listed, worth_trying
from meshrun.deploy.run.shell import local_workdir

INCOMING = ".incoming"  # staging, per host; `.checkpoints` (not a host name) for the assembly
ASSEMBLY = f".{CHECKPOINTS}"  # the journal of the assembled checkpoints/ (not a host name, as in INCOMING)
PLACE_S = 600  # after the transfer: hashing and placing what came, on this machine's disk


@dataclass
class Fetched:
    reports: list[FetchReport]  # the hosts whose files came home, in the run's host order
    failed: dict[str, MeshrunError]  # host -> why it (or the checkpoints only it lists) did not come home this time
    newest_step: int  # the newest step `runs/<id>/checkpoints/`'s manifest lists (-1: none)
    copies_from: list[str] = dataclasses.field(default_factory=list)  # the hosts whose checkpoints came, in order
    # Hosts of the run its inventory no longer names: waiting brings none back (their own line says what does).
    missing: tuple[str, ...] = ()


@dataclass
class _Transfers:
    """One fetch's transfers from its hosts into `home` (`runs/<id>/` here)."""

    record: RunRecord
    root: Path
    home: Path
    known_hosts: Path | None
    force: bool
    renderer: Renderer
    memo: DigestMemo  # the digests of the files here, read once while unchanged

    def each(self, part: tuple[str, ...], chosen: list[Host], what: str) -> HostResults[FetchReport]:
        """`part` of each chosen host's run directory, in parallel, with a progress bar per host."""
        with HostProgress(self.renderer, what, [h.name for h in chosen]) as bars:
            deadline = FETCH_ATTEMPTS * FETCH_TIMEOUT_S + PLACE_S
            return on_each(chosen, lambda h: self.one(h, part, bars), timeout=deadline)

    def one(self, host: Host, part: tuple[str, ...], bars: HostProgress) -> FetchReport:
        home, run_id = self.home, self.record.run_id
        report = FetchReport(host.name, home / HOSTS / host.name)
        if host.is_local and (local_workdir(host.workdir, self.root) / run_dir(run_id)).resolve() == home.resolve():
            report.landed = home  # the local default: the run already lives here
            report.claimed = read_host_manifest(home / CHECKPOINTS).digests()
            bars.update(host.name, 100)
            return report
        staging = Staging(home / INCOMING / host.name)
        prepare_staging(staging)
        # The staging tree is emptied after each fetch: the host's tree here is rsync's basis instead.
        # --force replaces what differs here, even with the host's size and time: no basis then.
        basis = None if self.force else fetch_basis(report.landed)
        argv = fetch_argv(host, run_id, staging, self.root, self.known_hosts, basis, part)
        fetch_verified(argv, staging, report, bars.update)
        ours = read_placed(home, host.name)
        checked = {f"{CHECKPOINTS}/{name}": digest for name, digest in report.verified.items()}
        place(staging.tree, report.landed, report, self.force, ours=ours, on_placed=journal_to(home, host.name),
              known=checked, here=self.memo)
        save_placed(home, host.name, placed_after(ours, report))
        remove_staging(staging)
        return report


def fetch_run(record: RunRecord, root: Path, dest: Path, force: bool, renderer: Renderer,
              every_copy: bool = False) -> Fetched:
    """Fetch every host of the run in parallel: its logs, metrics and checkpoint manifest, and
    with `every_copy` its checkpoints too. Then the checkpoints of the host whose manifest lists
    the newest step, and of another only while it lists a file not home (`deploy.run.fetchplan`:
    the hosts hold the same copy unless an elastic run changed who saved what), and the newest
    verified ones are assembled from the hosts that answered: a host that is gone for
    good (a lost rendezvous host) is named in `failed`, never a reason to leave the others' newest
    work on the hosts. A `--script` run's hosts each send everything: what a script writes in
    its run directory's `checkpoints/` is its own, listed in no manifest."""
    hosts, inventory, missing = run_hosts(record, root)  # a bad ssh_config: one line before any host
    home = dest / record.run_id
    every_copy = every_copy or isinstance(record.workload.get("script"), str)
    transfers = _Transfers(record, root, home, inventory.known_hosts, force, renderer, DigestMemo(home))
    results = transfers.each(EVERYTHING if every_copy else BUT_CHECKPOINTS, hosts, "fetch")
    failed = with_missing(results, missing, record.hosts).failed
    reports = list(results.ok.values())
    copies_from = [r.host for r in reports] if every_copy else []
    if not every_copy:
        by_name = {h.name: h for h in hosts}
        home_pairs, trees = _assembled_pairs(home), {r.host: _tree_pairs(home, r) for r in reports}
        top = max((newest_listed(r.claimed) for r in reports), default=-1)
        passed_over: dict[str, MeshrunError] = {}
        for host, got in _copies(reports, home, _HomeRule(home_pairs, trees, top),
                                 lambda h: transfers.each(ONLY_CHECKPOINTS, [by_name[h]], "checkpoints")):
            if isinstance(got, MeshrunError):
                passed_over[host] = got
            else:
                _merge(reports, got)
                copies_from.append(host)
        for host, err in passed_over.items():
            claim = Claim(host, next(r.claimed for r in reports if r.host == host))
            if not worth_trying(claim, _HomeRule(home_pairs, trees, top).of(claim)):
                renderer.warn(f"{str(err).replace(f'; {RESUMES}', '')}; every checkpoint {host} lists came from "
                              "another host")
                shutil.rmtree(home / INCOMING / host, ignore_errors=True)  # its partial file: never resumed now
            else:
                failed.setdefault(host, MeshrunError(f"{err}; its logs and metrics came home, its checkpoints did not"))
    _assemble_checkpoints(home, reports, force, transfers.memo)
    transfers.memo.save()
    incoming = home / INCOMING
    if incoming.is_dir() and not any(incoming.iterdir()):
        incoming.rmdir()
    steps = (checkpoint_step(name) for name in read_host_manifest(home / CHECKPOINTS).digests())
    return Fetched(reports, failed, max((s for s in steps if s is not None), default=-1), copies_from, tuple(missing))


@dataclass
class _HomeRule:
    """What counts as home for a holder: for one of the newest step, the assembled `checkpoints/`
    (`assembled`, growing with what each holder verified), which is what it is fetched for; for
    another, its own tree here too (`trees`: it is fetched for what only it holds, and a file an
    earlier fetch brought it is home)."""

    assembled: set[tuple[str, str]]
    trees: Mapping[str, set[tuple[str, str]]]
    top: int  # the newest step any host lists

    def of(self, claim: Claim) -> set[tuple[str, str]]:
        return self.assembled if claim.newest == self.top else self.assembled | self.trees.get(claim.host, set())


def _copies(reports: list[FetchReport], home: Path, rule: _HomeRule, fetch: Callable[[str], HostResults[FetchReport]]
            ) -> Iterator[tuple[str, FetchReport | MeshrunError]]:
    """The checkpoints of the holders `holder_order` ranks, one after the other, each only while it
    lists a file not home (`worth_trying`, by `rule`): a host whose copy fails its checksum or that
    stops answering costs only the time to try the next."""
    claims = [Claim(r.host, r.claimed, r.landed == home, _at_home(r)) for r in reports]
    for claim in holder_order(claims):
        if claim.here or not worth_trying(claim, rule.of(claim)):
            continue
        results = fetch(claim.host)
        if claim.host in results.failed:
            yield claim.host, results.failed[claim.host]
            continue
        got = results.ok[claim.host]
        rule.assembled |= set(got.verified.items())
        yield claim.host, got


def _assembled_pairs(home: Path) -> set[tuple[str, str]]:
    """The checkpoints the assembled `checkpoints/` holds, (name, sha256) each: what its manifest
    lists (or the local host's own, where the run lives here), each still there (a file you
    deleted is fetched again; one you edited in place counts as it was: yours, never overwritten)."""
    target = home / CHECKPOINTS
    return {(n, d) for n, d in read_host_manifest(target).digests().items() if is_regular(target / n)}


def _tree_pairs(home: Path, report: FetchReport) -> set[tuple[str, str]]:
    """The checkpoints an earlier fetch placed under this host's tree here and still there."""
    if report.landed == home:
        return set()
    prefix = f"{CHECKPOINTS}/"
    return {(n.removeprefix(prefix), d) for n, d in read_placed(home, report.host).items()
            if n.startswith(prefix) and is_regular(report.landed / n)}


def _at_home(report: FetchReport) -> int:
    """How many of the files a host's manifest lists an earlier fetch left under hosts/<host>/."""
    return sum(is_regular(report.landed / CHECKPOINTS / name) for name in report.claimed)


def _merge(reports: list[FetchReport], extra: FetchReport) -> None:
    """Fold a host's checkpoint transfer into its report of the first part (its manifest, which
    both parts bring, counted once)."""
    report = next(r for r in reports if r.host == extra.host)
    counted = {*report.new, *report.unchanged, *report.conflicts, *report.updated}
    for listed in ("new", "unchanged", "conflicts", "corrupt", "updated"):
        getattr(report, listed).extend(n for n in getattr(extra, listed) if n not in counted)
    report.refused += [line for line in extra.refused if line not in report.refused]  # the manifest's, again
    report.placed.update(extra.placed)
    report.verified, report.newest_step, report.claimed = extra.verified, extra.newest_step, extra.claimed
    for name in extra.skipped.names:
        report.skipped.add(name)
    report.skipped.total += extra.skipped.total - len(extra.skipped.names)


def _assemble_checkpoints(home: Path, reports: list[FetchReport], force: bool, memo: DigestMemo) -> None:
    """`runs/<id>/checkpoints/`: the verified checkpoints of the host holding the newest one, and
    the controller's manifest of the verified ones there (nothing else a host put in its folder).
    That manifest is meshrun's own file, rewritten on every fetch: kept as it was, it would stop
    at an earlier fetch's step while newer files land, and `fab train --resume` would redo the
    steps between. What it listed and is unchanged since stays listed; of those, only `best.pt`
    may be replaced, and only by a host as new (`replaceable`)."""
    holders = [r for r in reports if r.newest_step >= 0 and r.landed != home]
    if not holders:
        return
    best = max(holders, key=lambda r: r.newest_step)
    target = home / CHECKPOINTS
    ours = not any(r.landed == home for r in reports)  # else the folder is a local host's trainer's, manifest too
    # A journal left by an assembly cut off before its manifest: verified files meshrun placed.
    previous = {**read_host_manifest(target).digests(), **read_journal(home, ASSEMBLY)} if ours else {}
    assembly = home / INCOMING / f".{CHECKPOINTS}"
    shutil.rmtree(assembly, ignore_errors=True)
    staged, already = stage_verified(best.landed / CHECKPOINTS, best.verified, assembly, target, memo)
    combined = FetchReport(best.host, target)
    on_placed = journal_to(home, ASSEMBLY) if ours else None
    place(assembly, target, combined, force, prefix=f"{CHECKPOINTS}/", ours=replaceable(previous, best.newest_step),
          on_placed=on_placed, grow=False, known=staged, here=memo)
    note_unchanged(combined, already, f"{CHECKPOINTS}/", on_placed)
    shutil.rmtree(assembly)
    if ours:
        # What this assembly placed or found is as it left it; only the rest is read again (yours?).
        unread = (set(previous) | {n for r in reports for n in r.verified}) - set(combined.placed)
        present = {**hashes_of(target, unread, memo.digest), **combined.placed}
        write_assembled_manifest(target, vouched(present, [r.verified for r in reports], previous), combined)
        drop_journal(home, ASSEMBLY)
    best.kept_home += [c for c in combined.conflicts if c not in best.kept_home]  # relative to runs/<id>/
    best.refused += combined.refused


def replaceable(previous: Mapping[str, str], newest_step: int) -> dict[str, str]:
    """Of what the previous assembled manifest listed, what an assembly from a host whose newest
    step is `newest_step` may replace while unchanged here. A periodic checkpoint never: a step's
    file is written once in a run, so other bytes under its name are another timeline or
    tampering, and the verified copy here may be the only one left (a conflict; --force). `best.pt`
    is rewritten by the trainer, but only a host at or past the newest step listed has a best as
    new: an older host (one that left the run early) would replace the best model with its own."""
    steps = (checkpoint_step(name) for name in previous)
    listed = max((s for s in steps if s is not None), default=-1)
    as_new = BEST_CHECKPOINT in previous and newest_step >= listed
    return {BEST_CHECKPOINT: previous[BEST_CHECKPOINT]} if as_new else {}


def vouched(present: Mapping[str, str], verified: Iterable[Mapping[str, str]],
            previous: Mapping[str, str]) -> dict[str, str]:
    """What the assembled manifest lists: each checkpoint here (name -> its sha256 now) whose
    sha256 a host's manifest verified in this fetch, or the previous assembled manifest listed
    (a file an earlier fetch verified, unchanged since). A file edited here is not listed."""
    now = {(name, digest) for digests in verified for name, digest in digests.items()}
    return {name: digest for name, digest in present.items() if (name, digest) in now or previous.get(name) == digest}


def main(run: str | None, dest: str | None, force: bool, project: Project, every_copy: bool = False,
         prune: bool = False) -> int:
    """`fab fetch-checkpoints`: exit status 1 when a host's checkpoints failed their checksum, its
    manifest had lines meshrun does not accept, a host could not be fetched (down, say), or none
    answered; what did pass, from the hosts that answered, is fetched and assembled all the same."""
    renderer = Renderer()
    record = resolve_run(project.runs, run, warn=renderer.warn)
    destination = Path(dest).expanduser().resolve() if dest else project.runs
    found = flag_path_stat("--dest", destination)
    if found is not None and not S_ISDIR(found.st_mode):
        raise InputError(with_path("--dest ", destination, ": exists and is not a directory; name a directory to "
                                   "fetch runs into"))
    # Another runs folder: without the run's records there, `--runs-dir DEST` could neither report
    # what came home nor resume from it (the push reads DEST's checkpoints only then).
    elsewhere = destination.resolve() != project.runs.resolve()
    with fetch_lock(destination / record.run_id, record.run_id):  # one fetch of the run here at a time
        if elsewhere:
            copy_records(record, project.runs, destination, renderer)
        fetched = fetch_run(record, project.root, destination, force, renderer, every_copy)
        # The run's events are this project's (copy_records may not carry them to --dest).
        pruned = (prune_home(destination / record.run_id, fetched.reports, record.members,
                             project.runs / record.run_id / EVENTS) if prune else None)
    return _said(record, fetched, destination, every_copy, pruned.line() if pruned is not None else None,
                 str(destination) if elsewhere else None, renderer)


def _said(record: RunRecord, fetched: Fetched, destination: Path, every_copy: bool, pruned: str | None,
          runs_dir: str | None, renderer: Renderer) -> int:
    """What the fetch brought, refused and missed, and its exit status. With no host answering,
    no table or resume hint: nothing came, and nothing here is newer than before."""
    reports, script = fetched.reports, record.workload.get("script")
    if fetched.copies_from and not every_copy:
        renderer.info(f"checkpoints: taken from {fetched.copies_from[0]} (the hosts hold the same copy; --every-copy "
                      "brings each host's)" if len(fetched.copies_from) == 1 else
                      f"checkpoints: taken from {', '.join(fetched.copies_from)} (each for what the hosts before it "
                      "did not deliver: a file only it holds, or one whose copy failed)")
    if reports:
        renderer.fetch_reports(record.run_id, str(destination / record.run_id), reports,
                               script if isinstance(script, str) else None, runs_dir=runs_dir)
    if pruned is not None:
        renderer.info(pruned)
    for line in [line for r in reports for line in skip_lines(r.host, r.skipped)]:
        renderer.warn(line)
    for line in [line for r in reports for line in r.refused]:
        renderer.error(line)
    corrupt = [f"{r.host}:{name}" for r in reports for name in r.corrupt]
    if corrupt:
        renderer.error(f"checksum mismatch, not kept: {', '.join(corrupt)}; the host's copy is damaged")
    # A host only an earlier attempt used (left out by --resume, often dead) costs a warning.
    failed = {h: err for h, err in fetched.failed.items() if h not in record.earlier}
    for host in [h for h in fetched.failed if h not in failed]:
        renderer.warn(f"{fetched.failed[host]}; {host} is a host of an earlier attempt of this run: what did not "
                      "come stays there until a fetch reaches it")
    for line in failure_lines(dataclasses.replace(fetched, failed=failed), str(destination / record.run_id / CHECKPOINTS)):
        renderer.error(line)
    return 1 if corrupt or failed or not reports or any(r.refused for r in reports) else 0


def failure_lines(fetched: Fetched, checkpoints: str) -> list[str]:
    """One line per host that sent nothing, or whose checkpoints did not come (its own error), then
    what is home all the same: nothing new when no host answered. A host the run's inventory no
    longer names is not waited for (its own line says to put it back). A host that answered but
    sent damaged files is not here: it is a checksum mismatch."""
    answered = {r.host for r in fetched.reports}
    gone = [h for h in fetched.failed if h not in answered]
    back = _when_back([h for h in gone if h not in fetched.missing])
    listed = f"{checkpoints}/ lists verified checkpoints up to step {fetched.newest_step}"
    errors = [str(err) for err in fetched.failed.values()]
    if not fetched.failed:
        return []
    if not fetched.reports:
        before = f" ({listed}, from an earlier fetch)" if fetched.newest_step >= 0 else ""
        return errors + [f"no host answered: nothing was fetched{before}{back}"]
    if not gone:  # each answered: its logs came, its checkpoints did not
        names = ", ".join(fetched.failed)
        return errors + [f"{listed if fetched.newest_step >= 0 else 'no verified checkpoint of this run is home'}; "
                         f"fetch again to bring {names}'s checkpoints"]
    home = (f"the other hosts' files are home and {listed}" if fetched.newest_step >= 0
            else "no verified checkpoint of this run is home")
    return errors + [f"not fetched: {', '.join(gone)}; {home}{back}"]


def _when_back(hosts: list[str]) -> str:
    one = len(hosts) == 1
    return (f"; fetch again when {', '.join(hosts)} {'is' if one else 'are'} back to bring {'its' if one else 'their'} "
            "files home") if hosts else ""
