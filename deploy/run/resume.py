"""What `fab train --resume` decides, pure: the hosts its run record lists, which of the fetched
checkpoints it pushes to the rendezvous host, and the checkpoint manifest it gives that host after
the push."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from meshrun.layout import BEST_CHECKPOINT, checkpoint_name, checkpoint_step
from meshrun.deploy.run.manifest import Manifest, parse_manifest


@dataclass(frozen=True)
class ResumedHosts:
    hosts: tuple[str, ...]  # the record's: this attempt's, then the earlier ones'
    earlier: tuple[str, ...]  # hosts of earlier attempts that this one leaves out
    dropped: tuple[str, ...]  # hosts of earlier attempts that the resume's inventory lacks


def resumed_hosts(before: tuple[str, ...], launched: tuple[str, ...], known: Collection[str]) -> ResumedHosts:
    """The hosts a resumed run's record lists: this attempt's first, in launch order (the order a
    joiner walks the succession in, membership.join_order: a member's agent and a joiner's must look
    for the next rendezvous at the same host), then every host an earlier attempt listed that this
    one leaves out, in their recorded order, so status, stop and fetch still reach what they hold.
    A host the resume's inventory (`known`) lacks cannot be: the record names one inventory."""
    left_out = [h for h in before if h not in launched]
    earlier = tuple(h for h in left_out if h in known)
    return ResumedHosts((*launched, *earlier), earlier, tuple(h for h in left_out if h not in known))


def to_push(ours: Manifest) -> Manifest:
    """What a resume pushes of the controller's verified checkpoints (its manifest's lines for
    them): the newest listed step and `best.pt`. The home folder keeps every step each fetch
    verified (weeks of them: tens of GB), while the trainer loads the newest step any rank offers
    (train/checkpoint.restore_agreed), and an older one only when that copy fails to load; these
    bytes passed the fetch's sha256 against the trainer's own manifest, so an older step would
    most likely fail the same way, the hosts' own older saves are still offered, and the first
    save after the resume prunes to keep_last anyway. `best.pt` (the best model so far, which a
    later fetch brings home from the host) goes so that a host holding none gets the run's."""
    newest = newest_listed_step(ours)
    wanted = {BEST_CHECKPOINT, *((checkpoint_name(newest),) if newest >= 0 else ())}
    return Manifest(tuple(e for e in ours.entries if e.name in wanted), ())


def to_hash(ours: Manifest, theirs: Manifest) -> tuple[str, ...]:
    """The files whose sha256 the rendezvous host is asked for after the push: those the
    controller's manifest lists and the host's does not, or lists with other bytes. Any of them
    may be ours now: brought by this push, or by an earlier one cut before its manifest was
    written (rsync --ignore-existing skips it from then on, so what rsync sent cannot tell)."""
    listed = theirs.digests()
    return tuple(e.name for e in ours.entries if listed.get(e.name) != e.sha256)


def same_as_ours(ours: Manifest, answer: Manifest, asked: Collection[str]) -> frozenset[str]:
    """Of the files asked for, those the host's answer (sha256 lines, parsed as a manifest: a host
    is untrusted, a line in any other form is no answer) gives our bytes for."""
    mine = ours.digests()
    return frozenset(e.name for e in answer.entries if e.name in asked and mine.get(e.name) == e.sha256)


def pushed_manifest(ours: Manifest, theirs: Manifest, same: Collection[str]) -> str:
    """The manifest the rendezvous host gets once the push is through. The push never replaces a
    file the host holds (rsync --ignore-existing), and `best.pt` is rewritten under one name at
    every new best, so the host's may be older than ours: a file the host holds with our bytes
    (`same`, by the sha256 it answered) gets our line; any other keeps the host's own line, or
    none when the host listed none (a save cut short: its bytes are unknown). Listing ours for a
    file the host kept would fail its checksum at the next fetch."""
    lines = {e.name: e.sha256 for e in theirs.entries}
    lines.update((e.name, e.sha256) for e in ours.entries if e.name in same)
    return "".join(f"{digest}  {name}\n" for name, digest in lines.items())


def newest_listed_step(manifest: bytes | Manifest) -> int:
    """The newest periodic checkpoint a manifest lists in the trainer's exact form (-1: none)."""
    entries = (manifest if isinstance(manifest, Manifest) else parse_manifest(manifest)).entries
    steps = [checkpoint_step(e.name) for e in entries]
    return max((s for s in steps if s is not None), default=-1)
