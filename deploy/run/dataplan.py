"""`fab sync --data`'s decisions, pure: which links rsync sends as their content, which names a
previous sync left at DEST that the new SRC no longer has, and what a failed transfer's line says.

Hosts are untrusted. The names that come back from DEST's old manifest (`.meshrun-manifest.sha256`)
are the host's words: only well-formed relative names that SRC does not hold are ever used, and
only to remove files at DEST (deploy/edges/datastale.py), never to choose what the controller sends.
How much of it is read is the controller's to say (`old_bound`): a host cannot make it hold or sift
more than a small multiple of what this SRC's own listing costs.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping

from meshrun.deploy.inventory.shown import shown_path
from meshrun.deploy.run.answers import network_hint  # here too: datasync and datastale import it from here

DATA_MANIFEST = ".meshrun-manifest.sha256"  # meshrun's listing, at DEST on each host
LEGACY_CACHE = ".meshrun-hash-cache.json"  # an older meshrun's hash cache inside SRC: never data
# Relative, so it sits beside each cut file at DEST and rsync adds its own exclude for it (never sent,
# never deleted); named for meshrun, so a host's owner can tell whose it is.
PARTIAL_DIR = ".meshrun-partial"
NAME_BYTES_MAX = 4096  # PATH_MAX: no file meshrun sent has a longer name
PART_BYTES_MAX = 255  # NAME_MAX, per component
MANIFEST_LINE_RE = re.compile(rb"[0-9a-f]{64}  (.+)")
LINE_BYTES_MAX = 64 + 2 + NAME_BYTES_MAX  # the longest manifest line meshrun writes, without its newline
# The old manifest read at DEST: OLD_SLACK times the larger of the new listing and the listing of what
# SRC held at its last build on this controller (a dataset cut to a subset still loses the rest), never
# under OLD_FLOOR (about 100 000 names: a small dataset that replaced a larger one), never over OLD_MAX.
OLD_SLACK = 2
OLD_FLOOR = 8 << 20
OLD_MAX = 256 << 20
NO_SPACE = "No space left on device"
DISK_FULL_EXITS = (11, 12, 23)  # rsync: file I/O, protocol stream (its receiver died), partial transfer


def unsafe_link(target: str, rel: str) -> bool:
    """rsync's `unsafe_symlink` (util1.c), which `--copy-unsafe-links` asks: does the link at `rel`
    (its path inside the transfer) with this `target` leave the transfer, counting components the
    way rsync does (textually, never looking at the disk)? Absolute and empty targets always do, and
    since rsync 3.4 so does a `..` after another component (`a/../x`, `a/..`). An older rsync keeps
    those few as links, whose files verification then reads through the link."""
    if not target or target.startswith("/"):
        return True
    rest = target
    while rest.startswith("../"):
        rest = rest[3:].lstrip("/")
    if "/../" in rest or (len(target) > 3 and target.endswith("/..")):
        return True
    depth = 0
    for part in rel.split("/")[:-1]:  # the folders above the link: its safety margin
        if part == "..":
            depth = 0
        elif part not in ("", "."):
            depth += 1
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def removable(name: str) -> bool:
    """A name a host's old manifest may give for removal at DEST: relative, no `..`, `.` or empty
    component, no NUL or line break, within the system's name limits, and not meshrun's own file."""
    if not name or name.startswith("/") or any(c in name for c in "\0\n\r"):
        return False
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 name meshrun sent
        return False
    parts = name.split("/")
    return (size <= NAME_BYTES_MAX and name != DATA_MANIFEST
            and all(p not in ("", ".", "..", PARTIAL_DIR, LEGACY_CACHE) and len(p.encode()) <= PART_BYTES_MAX
                    for p in parts))


def manifest_names(lines: Iterable[bytes]) -> Iterator[str]:
    """The names of a manifest's `<sha256>  <name>` lines (each without its newline) whose names could
    be removed, as they are read: other lines (anything a host wrote) are skipped."""
    for line in lines:
        found = MANIFEST_LINE_RE.fullmatch(line)
        if found is None:
            continue
        try:
            name = found[1].decode("utf-8")
        except UnicodeDecodeError:
            continue
        if removable(name):
            yield name


def listing_size(names: Iterable[str]) -> int:
    """The bytes of a manifest listing `names`: `<sha256>  <name>\n` each."""
    return sum(67 + len(name.encode("utf-8", "replace")) for name in names)


def old_bound(listing: int) -> int:
    """The largest old manifest at DEST this sync reads, whole MiB, for a SRC whose listing (the new
    one, or the one of its last build if larger) is `listing` bytes; a larger one removes nothing."""
    wanted = min(OLD_MAX, max(OLD_FLOOR, OLD_SLACK * listing))
    return -(-wanted >> 20) << 20


def stale_names(old: Iterable[str], manifest: Mapping[str, str], in_src: Callable[[str], bool]) -> tuple[str, ...]:
    """Of the names the previous sync recorded at DEST, those to remove: well-formed, not in the new
    manifest, and nothing of that name in SRC (`in_src`: lexists), so that a link, a FIFO or a file
    under a linked folder that rsync still sends is never removed after it. `old` may be read as this
    goes: only the names picked are held."""
    picked = (n for n in old if removable(n) and n not in manifest and not in_src(n))
    return tuple(sorted(dict.fromkeys(picked)))


def batches(names: Iterable[str], budget: int) -> list[tuple[str, ...]]:
    """`names` in groups whose quoted size stays under `budget` bytes: one remote command line
    (one argument of `sh -c`) holds at most 128 KiB on Linux."""
    groups: list[tuple[str, ...]] = []
    group: list[str] = []
    size = 0
    for name in names:
        cost = len(shlex.quote(name).encode("utf-8", "surrogateescape")) + 1
        if group and size + cost > budget:
            groups.append(tuple(group))
            group, size = [], 0
        group.append(name)
        size += cost
    return groups + ([tuple(group)] if group else [])


def again(source: str, dest: str) -> str:
    """The command that resumes this data sync, as the user can paste it."""
    return f"`fab sync --data {shown_path(shlex.quote(f'{source}:{dest}'))}`"


def rehinted(message: str, host: str, source: str, dest: str) -> str:
    """A failed data rsync's line (deploy/edges/rsyncrun.py, which ends it with `network_hint`) with
    the hint that fits: cut at its deadline, what arrived is kept and the same command resumes it;
    the host's disk full, it says so. Any other failure keeps the network hint."""
    generic = "; " + network_hint(host)
    if not message.endswith(generic):
        return message
    body = message[:-len(generic)]
    prefix = f"host '{host}': data sync "
    if body.startswith(prefix + "did not finish within "):
        return (f"{body}; what arrived is kept at {shown_path(dest)}: run the same {again(source, dest)} again to "
                f"resume it, with --timeout SECONDS for longer (if it stays slow: `fab check-network --hosts {host}`)")
    failed = re.match(re.escape(prefix) + r"failed \(rsync exit (\d+)\): ", body)
    if failed and int(failed[1]) in DISK_FULL_EXITS and NO_SPACE in body[failed.end():]:
        return (f"{body}; the disk holding {shown_path(dest)} on {host} is full: free space there, then run the "
                f"same {again(source, dest)} again (what arrived is kept)")
    return message
