"""Which of the project's files `fab sync` may copy to hosts, pure.

A host may be compromised, and a synced file is readable by it. So whatever the controller
uses to reach hosts stays home, tracked by git or not (docs/security.md, "Secrets"):

- inventories: every `*.yaml`/`*.yml` under `inventory/` except meshrun's own examples, which
  end in `.example.yaml`; plus the inventory file in use, wherever it lies;
- SSH files: any file named `known_hosts*`, `id_*` with no dot or ending in `.pub` (OpenSSH's
  key names: `id_ed25519`, `id_rsa_work`, `id_ed25519.pub`), `*.pem` or `*.key`, in any folder;
  plus the inventory's `known_hosts` and `identity` files, wherever they lie.

`inventory/local.yaml` is therefore not synced either: no host needs an inventory.

Nor is the project's `runs/`: the controller's run records (launch records name the inventory,
fetched checkpoints are large) stay home even in a project whose .gitignore forgets them.
"""

from __future__ import annotations

import posixpath

import re
from pathlib import PurePosixPath

from meshrun.layout import RUNS_DIR

EXAMPLE_SUFFIX = ".example.yaml"
_KEY_NAME = re.compile(r"known_hosts.*|id_[^.]*(\.pub)?|.*\.pem|.*\.key", re.DOTALL)


def is_private(name: str) -> bool:
    """`name`: a path relative to the project root, as git lists it (`/`-separated)."""
    path = PurePosixPath(name)
    if _KEY_NAME.fullmatch(path.name) or path.parts[0] == RUNS_DIR:
        return True
    in_inventory = len(path.parts) > 1 and path.parts[0] == "inventory"
    return in_inventory and path.suffix in (".yaml", ".yml") and not path.name.endswith(EXAMPLE_SUFFIX)


def shippable(names: list[str], named: frozenset[str]) -> list[str]:
    """`names` minus private files; `named`: the in-use files (relative names) to keep home too."""
    return [n for n in names if not is_private(n) and n not in named]


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
