"""The wheel `fab setup` pushes: the meshrun this controller runs, packed as it is installed here.

Hosts get meshrun from the controller, never from an index, and always the same code: the wheel
holds exactly the files `meshrun_identity` digests (deploy/host/facts.py), so a host that
installed it reports the controller's build. Packed from the imported packages rather than by
`pip wheel`, because a controller that installed meshrun from a wheel has no source tree to build
from; the metadata (dependencies, the `meshrun` command) is the installed distribution's own.

Cached per build under ~/.cache/meshrun/wheels/<build>/ (XDG_CACHE_HOME respected).
"""

from __future__ import annotations

import base64
import csv
import functools
import hashlib
import io
import os
import tempfile
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.host.facts import meshrun_folders, meshrun_identity, package_files

WHEEL_TAG = "py3-none-any"  # pure Python: one wheel for every host
# Metadata files of the installed distribution that belong in a wheel (RECORD is rewritten).
KEPT_METADATA = ("METADATA", "entry_points.txt", "top_level.txt")


@dataclass(frozen=True)
class Identity:
    version: str
    build: str  # digest of the shipped files: same version, different code, different build

    def __str__(self) -> str:
        return f"{self.version} (build {self.build})"


@functools.lru_cache(maxsize=1)
def controller_identity() -> Identity:
    found = meshrun_identity()
    if found is None:  # we are running meshrun, so this is a broken install
        raise MeshrunError("this controller's meshrun cannot find its own packages; reinstall it (pip install meshrun)")
    return Identity(found["version"], found["build"])


def wheel_cache(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "meshrun" / "wheels"


def controller_wheel(cache: Path | None = None) -> Path:
    """The wheel of this controller's meshrun, built once per build and then reused."""
    identity = controller_identity()
    target = (cache or wheel_cache()) / identity.build / f"meshrun-{identity.version}-{WHEEL_TAG}.whl"
    if target.is_file():
        return target
    folders = meshrun_folders()
    assert folders is not None  # controller_identity found them
    target.parent.mkdir(parents=True, exist_ok=True)
    data = wheel_bytes(identity.version, dict(package_files(folders)), _installed_metadata())
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
        tmp.write(data)
    os.replace(tmp.name, target)  # a crash mid-write never leaves a truncated wheel under its name
    return target


def _installed_metadata() -> dict[str, bytes]:
    """The installed distribution's metadata files. Found through sys.path, it may be the
    `meshrun.egg-info` an editable install leaves in the clone (when the clone is the current
    directory): the same fields, in PKG-INFO instead of METADATA."""
    dist = metadata.distribution("meshrun")
    found = {name: dist.read_text(name) for name in KEPT_METADATA}
    found["METADATA"] = found["METADATA"] or dist.read_text("PKG-INFO")
    if not found["METADATA"]:
        raise MeshrunError("this controller's meshrun has no readable metadata (METADATA or PKG-INFO); "
                           "reinstall it (pip install meshrun)")
    return {name: text.encode() for name, text in found.items() if text is not None}


def wheel_bytes(version: str, files: dict[str, str], meta: dict[str, bytes]) -> bytes:
    """A wheel (PEP 427) holding `files` (name in the wheel -> path here) and `meta`."""
    info = f"meshrun-{version}.dist-info"
    entries = {name: Path(path).read_bytes() for name, path in sorted(files.items())}
    entries.update({f"{info}/{name}": text for name, text in meta.items()})
    entries[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: meshrun\nRoot-Is-Purelib: true\n"
                                f"Tag: {WHEEL_TAG}\n").encode()
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([name, f"sha256={digest}", len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    entries[f"{info}/RECORD"] = record.getvalue().encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in entries.items():
            # A fixed date: the same build packs to the same bytes.
            wheel.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data,
                           compress_type=zipfile.ZIP_DEFLATED)
    return out.getvalue()
