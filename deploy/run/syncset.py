"""Which of the project's files `fab sync` may copy to hosts, and the rest of the code sync's
planning, pure: the list rsync reads (`sent_list`), the removal on a host of what left the project
(`PRUNE_SH`), rsync's host paths, and the workdir owner mark's messages (deploy/edges/sync.py runs them).

A host may be compromised, and a synced file is readable by it. So whatever the controller
uses to reach hosts stays home, tracked by git or not (docs/security.md, "Secrets"):

- inventories: every file under `inventory/` whose name holds `.yaml` or `.yml` except meshrun's
  own examples, which end in `.example.yaml`; plus the inventory file in use, wherever it lies;
- SSH files: any file named `known_hosts*`, `id_*` with no dot or ending in `.pub` (OpenSSH's
  key names: `id_ed25519`, `id_rsa_work`, `id_ed25519.pub`), `*.pem` or `*.key`, in any folder;
  plus the inventory's `known_hosts` and `identity` files, wherever they lie.

Names are compared case-insensitively (`HOSTS.YAML`, `ID_RSA`: a macOS or Windows disk does not
tell them apart), and an editor's or a merge's copy stays home with its file: `hosts.yaml~`,
`#hosts.yaml#`, `.hosts.yaml.swp`, `hosts.yaml.bak`, `hosts.yaml.orig`, `id_ed25519.BAK`
(`original_name`).

`inventory/local.yaml` is therefore not synced either: no host needs an inventory.

Nor is the project's `runs/`, nor the runs folder in use (`--runs-dir`) where it lies inside the
project: the controller's run records (launch records name the inventory; fetched host trees hold
what one host served, which no other host may read) stay home even in a project whose .gitignore
forgets them.

A git repository inside the project (a submodule, an untracked clone) is listed file by file
(deploy/edges/gitlist.py), each file judged by its name from that repository's top as well as from the
project's: a clone's `id_ed25519` or `inventory/hosts.yaml` stays home like the project's own. One in a
folder whose files all stay home (`kept_home`: the run records, a local workdir's copy) is never entered.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from meshrun.layout import RUNS_DIR, SHIPPED_LIST, WORKDIR_OWNER
from meshrun.deploy.errors import InputError

EXAMPLE_SUFFIX = ".example.yaml"
# The record a code sync sends with the code; made the workdir's record (SHIPPED_LIST) once rsync succeeded.
SHIPPED_NEW = SHIPPED_LIST + ".new"
# meshrun's own files at a workdir's top: a project file so named stays home.
WORKDIR_FILES = frozenset({SHIPPED_LIST, SHIPPED_NEW})
# Run by `sh` in a host's workdir once a code sync's rsync succeeded: removes each name the workdir's record
# (`codestat.record_of`) lists and the record just sent does not, then makes the one sent the record (with any
# name that could not be removed, tried again next time). Only names an earlier sync sent are ever removed,
# each a relative path without `.` or `..` parts, whose every folder is a folder (a link put in a folder's
# place leads out of the workdir: nothing under it is touched), never a folder itself (meshrun sends none).
# Folders emptied are left: a folder without `__init__.py` never shadows a module (Python's finder takes
# `net.py` over a bare `net/` beside it, which is a namespace package only when nothing else has the name),
# and the host's user may have made it. Each record line is printable ASCII (`printf %b` reads the escapes).
# Never fails the sync: whatever is left is in the record, so the code check says "sync" until it is gone.
# "Succeeded" is the host's rsync's word: a file this machine's rsync could not read or saw vanish is in
# the record still (it was listed), and the code check's digest, which sees it missing, says "sync".
PRUNE_SH = (
    f"L={SHIPPED_LIST}; N={SHIPPED_NEW}; t=$L.$$; "
    '[ -f "$N" ] && [ ! -L "$N" ] || exit 0; '
    'if [ ! -f "$L" ] || [ -L "$L" ]; then mv -f "$N" "$L"; exit 0; fi; '
    'LC_ALL=C sort -u "$N" > "$t.n" && { LC_ALL=C sort -u "$L" | LC_ALL=C comm -23 - "$t.n" > "$t.s"; } && '
    ': > "$t.k" || { rm -f "$t.n" "$t.s" "$t.k"; exit 0; }; '
    "while IFS= read -r e; do "
    r"""case $e in *\\*) n=$(printf '%bx' "$e"); n=${n%x};; *) n=$e;; esac; """
    "case /$n/ in *//*|*/./*|*/../*) continue;; esac; "
    f"case $n in $L|$L.*|{WORKDIR_OWNER}) continue;; esac; "
    "p=; r=$n; ok=1; while :; do case $r in */*) p=$p${r%%/*}; r=${r#*/}; "
    'if [ -L "$p" ] || [ ! -d "$p" ]; then ok=; break; fi; p=$p/;; *) break;; esac; done; '
    '[ -n "$ok" ] || continue; if [ -d "$n" ] && [ ! -L "$n" ]; then continue; fi; rm -f -- "$n" 2>/dev/null; '
    r"""if [ -e "$n" ] || [ -L "$n" ]; then printf '%s\n' "$e" >> "$t.k"; fi; done < "$t.s"; """
    'LC_ALL=C sort -u "$t.n" "$t.k" > "$t.l" && mv -f "$t.l" "$L" && rm -f "$N"; '
    'rm -f "$t.n" "$t.s" "$t.k" "$t.l"; exit 0')

_KEY_NAME = re.compile(r"known_hosts.*|id_[^.]*(\.pub)?|.*\.pem|.*\.key", re.DOTALL)
_YAML = re.compile(r".*\.ya?ml.*", re.DOTALL)
# What editors, merges, patches and package managers leave beside a file, holding its text: Emacs's
# `#f#`, `.#f`, `f~` and `f.~3~`, vim's swap files `.f.swp` (to `.swa`), and `f.bak`, `f.orig`, ...
_BACKUP = re.compile(r"#(.+)#|\.#(.+)|\.?(.+)\.sw[a-p]|(.+?)(?:~|\.~\d+~|\.(?:bak\d*|backup|orig|old|save|tmp|rej|"
                     r"dpkg-old|dpkg-dist|rpmsave|rpmnew))", re.DOTALL)


def original_name(name: str) -> str:
    """One file or folder name, casefolded, as the file it is a backup of (`HOSTS.yaml.BAK~` →
    `hosts.yaml`); a name that is no backup, casefolded."""
    name = name.casefold()
    while (match := _BACKUP.fullmatch(name)) is not None:
        name = next(group for group in match.groups() if group is not None)
    return name


def _original(name: str) -> tuple[str, ...]:
    return tuple(original_name(part) for part in PurePosixPath(name).parts)


def is_private(name: str) -> bool:
    """`name`: a path relative to the project root, as git lists it (`/`-separated)."""
    parts = _original(name)
    if _KEY_NAME.fullmatch(parts[-1]) or parts[0] == RUNS_DIR:  # runs/: `kept_home` too
        return True
    in_inventory = len(parts) > 1 and parts[0] == "inventory"
    return in_inventory and bool(_YAML.fullmatch(parts[-1])) and not parts[-1].endswith(EXAMPLE_SUFFIX)


def shippable(names: list[str], named: frozenset[str], folders: frozenset[str] = frozenset()) -> list[str]:
    """`names` minus private files; `named`: the in-use files (relative names) to keep home too, with
    their backups and whatever their case; `folders`: relative folders (the runs folder in use)
    whose every file stays home, whatever their case and with the folder's backups."""
    home = {_original(n) for n in named if n}
    trees = _trees(folders)

    def ships(name: str) -> bool:
        parts = _original(name)
        return not is_private(name) and parts not in home and not _under(parts, trees)
    return [n for n in names if ships(n)]


def kept_home(folder: str, tops: tuple[str, ...], folders: frozenset[str]) -> bool:
    """Does every file under `folder` (project-relative) stay home whatever its name, so that nothing in it
    need be listed: under `runs/` from the project's top or from that of a repository inside it holding it
    (`tops`, project-relative: `is_private` judges its files from each), or under one of `folders`
    (`shippable`'s)? A git repository there is never entered (deploy/edges/gitlist.py): a host's fetched
    tree may hold one whose config runs a command."""
    if _under(_original(folder), _trees(folders)):
        return True
    relative = [folder, *(folder[len(top) + 1:] for top in tops if folder.startswith(f"{top}/"))]
    return any(_original(name)[0] == RUNS_DIR for name in relative)


def _trees(folders: frozenset[str]) -> list[tuple[str, ...]]:
    return [_original(f) for f in folders if f]


def _under(parts: tuple[str, ...], trees: list[tuple[str, ...]]) -> bool:
    return any(parts[:len(t)] == t for t in trees)


def data_beside_code(dest: str, files: bytes) -> bool:
    """May the dataset go to `dest` while the code sync runs? Yes when `dest` is inside the workdir
    and no project file is at or under it (or is a file where one of its folders must be): then
    the two rsyncs never write the same path. An absolute `dest` may be anywhere: not decided here."""
    if posixpath.isabs(dest) or dest.startswith("~"):
        return False
    target = posixpath.normpath(dest)
    for name in filter(None, files.split(b"\0")):
        path = posixpath.normpath(name.decode("utf-8", "surrogateescape"))
        if path == target or path.startswith(target + "/") or target.startswith(path + "/"):
            return False
    return target not in (".", "..") and not target.startswith("../")


def relative_name(path: Path, root: Path) -> str:
    """`path` as git names it under `root` ("" when it lies outside: nothing to leave out)."""
    try:
        return Path(os.path.realpath(path)).relative_to(os.path.realpath(root)).as_posix()
    except ValueError:
        return ""


def remote_path(workdir: str) -> str:
    """rsync's remote paths are relative to the login home, so `~/x` becomes `x`."""
    if workdir == "~":
        return "."
    return workdir[2:] if workdir.startswith("~/") else workdir


def remote_spec(address: str, path: str) -> str:
    """rsync's `HOST:PATH`. An IPv6 address goes in brackets: bare, its colons would make rsync
    read `fd00::1:x` as host `fd00` and a `::` daemon module."""
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"{host}:{path}"


def clean_name(name: bytes) -> bool:
    """A path relative to the project, as git lists a file: no leading `/`, no empty, `.` or `..` part."""
    return bool(name) and not name.startswith(b"/") and all(p not in (b"", b".", b"..") for p in name.split(b"/"))


def sent_list(root: bytes, files: bytes, staged: bytes) -> bytes:
    """rsync's --files-from when its source is `/`: each of `files` (NUL-separated, relative to the
    absolute `root`) and the staged record (the file `staged`) as `PATH/./NAME`: rsync keeps only what
    follows `/./`, so all land at the workdir's top, the record with the code in one transfer (rsync
    takes one source with --files-from). A name leaving `root` is refused: this rsync could read anything."""
    names = [n for n in files.split(b"\0") if n]
    odd = [n for n in names if not clean_name(n)]
    if odd:
        raise ValueError(f"not a project file name: {odd[0]!r}")
    base = root.rstrip(b"/").lstrip(b"/") + b"/./"
    folder, _, name = staged.rpartition(b"/")
    return b"".join(base + n + b"\0" for n in names) + folder.lstrip(b"/") + b"/./" + name + b"\0"


# The workdir the code goes to: its owner mark (deploy/edges/sync.py), as messages name it.
OWNER_SAID = "meshrun-workdir-owner:"  # on the claim's stderr, before the first line of the mark it found
NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")  # a project's name in a mark, and the only one a message shows
# What the claim said, as rsync's message or a command's output carries it: a name is shown only in this form.
SAID_RE = re.compile(re.escape(OWNER_SAID) + r" ?(?:[0-9a-f]{32} (" + NAME_RE.pattern + r")(?![A-Za-z0-9._-]))?")


@dataclass(frozen=True)
class Claim:
    """This project as a workdir's owner mark names it, and where the advice says to give it a workdir."""

    project_id: str  # 32 hex digits
    name: str  # the project's directory name, NAME_RE's characters only
    inventory: str
    also: tuple[str, ...] = ()  # this checkout's earlier ids (32 hex digits): a mark naming one is rewritten
    shallow: bool = False  # a shallow clone: its root commits are not here, so its id is its own (`project_ids`)

    @property
    def mark(self) -> str:
        return f"{self.project_id} {self.name}"


class WorkdirTaken(InputError):
    """A host's workdir holds another project's code; `other`: that project's name, None when its mark
    names none in meshrun's form."""

    def __init__(self, host: str, workdir: str, other: str | None, claim: Claim) -> None:
        super().__init__(taken_message((host,), workdir, other, claim))
        self.host, self.workdir, self.other, self.claim = host, workdir, other, claim


def mark_name(line: bytes) -> str | None:
    """The project a mark's first line names, in meshrun's form only (a host's mark is untrusted)."""
    found = SAID_RE.fullmatch(f"{OWNER_SAID} {line.decode('ascii', 'replace')}")
    return found.group(1) if found else None


def taken_message(hosts: tuple[str, ...], workdir: str, other: str | None, claim: Claim) -> str:
    """One line: whose code the workdir holds, and what to do (a clone shares the id: `project_ids`)."""
    who = ("host " if len(hosts) == 1 else "hosts ") + ", ".join(f"'{h}'" for h in hosts)
    mark = posixpath.join(workdir, WORKDIR_OWNER)
    if other is None:
        whose, gone = f"another project's code (its {WORKDIR_OWNER} names no other)", "no other project uses it"
    elif other != claim.name:
        whose, gone = f"the code of another project, {other}", f"{other} no longer uses it"
    else:
        whose = (f"the code of another repository named {other} (or of a checkout of this one synced before its "
                 "first commit, from a shallow clone or by an older meshrun)")
        gone = f"that {other} no longer uses it or is a checkout of this repository"
    own = new_workdir(workdir, other, claim)
    fix = f"set `workdir: {own}` for this project ({claim.name}) in {claim.inventory}, or " if own else ""
    unshallow = ("; this checkout is a shallow clone, which cannot name its repository: `git fetch --unshallow` "
                 "here, then sync again" if claim.shallow and other == claim.name else "")
    return f"{who}: workdir {workdir} holds {whose}; {fix}delete {mark} there if {gone}{unshallow}"


def new_workdir(workdir: str, other: str | None, claim: Claim) -> str | None:
    """`<workdir>-<name>`, never `-<name>` twice (README's `~/meshrun-<project>`), with this repository's id when
    the other has this name (told the same, it would follow); None when it has it, or a shallow clone's (per CI run)."""
    base = "~/meshrun" if workdir.rstrip("/") == "~" else workdir.rstrip("/")
    tag = f"-{claim.project_id[:8]}"
    if base.endswith(tag) or (claim.shallow and other == claim.name):
        return None
    named = base.endswith(f"-{claim.name}")
    if other != claim.name and not named:
        return f"{base}-{claim.name}"
    return f"{base}{tag}" if named else f"{base}-{claim.name}{tag}"
