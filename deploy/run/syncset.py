"""Which of the project's files `fab sync` may copy to hosts, pure.

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
"""

from __future__ import annotations

import posixpath

import re
from pathlib import PurePosixPath

from meshrun.layout import RUNS_DIR

EXAMPLE_SUFFIX = ".example.yaml"
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
    if _KEY_NAME.fullmatch(parts[-1]) or parts[0] == RUNS_DIR:
        return True
    in_inventory = len(parts) > 1 and parts[0] == "inventory"
    return in_inventory and bool(_YAML.fullmatch(parts[-1])) and not parts[-1].endswith(EXAMPLE_SUFFIX)


def shippable(names: list[str], named: frozenset[str], folders: frozenset[str] = frozenset()) -> list[str]:
    """`names` minus private files; `named`: the in-use files (relative names) to keep home too, with
    their backups and whatever their case; `folders`: relative folders (the runs folder in use)
    whose every file stays home, whatever their case and with the folder's backups."""
    home = {_original(n) for n in named if n}
    trees = [_original(f) for f in folders if f]

    def ships(name: str) -> bool:
        parts = _original(name)
        return not is_private(name) and parts not in home and not any(parts[:len(t)] == t for t in trees)
    return [n for n in names if ships(n)]


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
