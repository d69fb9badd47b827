"""Hosts set up with other requirements than the project declares now, pure.

`fab setup` installs the project's requirements in each host's venv and records their digest there
(deploy/host/setup.py). A package added to requirements.txt afterwards reaches the hosts with the
code sync, but nothing installs it: every rank would die with ModuleNotFoundError after the launch,
with no word about setup. So each host's stamp, read on every launch whether the pre-flight is
reused or not (deploy/host/stamp.py), carries that record, and a host whose record differs from
the controller's digest (deploy/run/requirements.py::declared) gets one WARN naming the fix:

    gpu1, gpu2: requirements.txt changed since `fab setup` ran there; run `fab setup --hosts gpu1,gpu2`

Where setup installs the project itself (`pip install --no-deps -e .`), the stamp also carries the
digest of the build files it installed it from (`project`), and a host installed from other build
files than the project's now gets its own WARN (`project_finding`): an editable install maps the
packages and entry points it found then, so one added since is missing there.

A WARN, not a FAIL: what was added may already be on the host (the system's packages, a reused
site), and a run that needs none of it should still start. Said nothing of: a host with no record
(never set up by meshrun, or its inventory `python:` runs another environment: the stamp then
says null), a local host (setup leaves it alone: it runs this controller's Python), and a project
that declares no requirements now (what a host has beyond them does no harm).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

from meshrun.deploy.check.findings import Finding, warn
from meshrun.deploy.check.ports import STAMP_MAX
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.run.answers import MISSING, Answer, from_json
from meshrun.deploy.run.requirements import BUILD_FILES, Declared

DIGEST_RE = re.compile(r"[0-9a-f]{64}")  # hashlib's sha256 hexdigest, as setup writes it
NONE_DECLARED = ""  # setup's record when the project declared no requirements then


def recorded(host: str, stamp: str, field: str = "requirements") -> str | None:
    """A digest setup recorded on `host` (its `field`: the requirements, or the `project`'s build files),
    read from its stamp line (untrusted): 64 hex digits, or NONE_DECLARED (setup ran when the project
    declared no requirements: whatever it declares now is missing there). None, "no record", for
    anything else: null, another shape, a stamp that is not exactly one JSON object (login noise, an
    older probe)."""
    reader = Answer(host, "the host stamp")
    try:
        stamp_object = reader.mapping(from_json(stamp) if len(stamp) <= STAMP_MAX else MISSING)
        found = reader.text(stamp_object.get(field, MISSING), field, optional=True, limit=None)
    except MeshrunError:
        return None
    return found if found == NONE_DECLARED or found is not None and DIGEST_RE.fullmatch(found) else None


def behind(hosts: Sequence[Host], stamps: Mapping[str, str], now: Declared | None) -> tuple[str, ...]:
    """The remote hosts, in `hosts`' order, whose recorded requirements are not the project's `now`
    (None: the controller could not tell its own; no host then)."""
    if now is None or now.digest == NONE_DECLARED:
        return ()
    records = {h.name: recorded(h.name, stamps[h.name]) if h.name in stamps else None for h in hosts}
    return tuple(h.name for h in hosts if not h.is_local and records[h.name] not in (None, now.digest))


def requirements_finding(hosts: Sequence[Host], stamps: Mapping[str, str], now: Declared | None) -> Finding | None:
    """One WARN naming every host set up with other requirements, and the setup that installs them."""
    names = behind(hosts, stamps, now)
    if not names or now is None:
        return None
    return warn(", ".join(names), f"{now.source} changed since `fab setup` ran there; run "
                                  f"`fab setup --hosts {shlex.quote(','.join(names))}`")


def project_behind(hosts: Sequence[Host], stamps: Mapping[str, str], now: Declared | None) -> tuple[str, ...]:
    """The remote hosts, in `hosts`' order, where setup installed the project itself from other build
    files than the project's now (`now.build`; None: setup does not install it, or the controller
    could not read its own). A host with no such record (never installed it) is not named."""
    if now is None or now.build is None:
        return ()
    records = {h.name: recorded(h.name, stamps[h.name], "project") if h.name in stamps else None for h in hosts}
    return tuple(h.name for h in hosts if not h.is_local and DIGEST_RE.fullmatch(records[h.name] or "")
                 and records[h.name] != now.build)


def project_finding(hosts: Sequence[Host], stamps: Mapping[str, str], now: Declared | None) -> Finding | None:
    """One WARN naming every host whose installed project was built from other build files: a package
    or entry point added to them since is not there (an editable install maps what it found then)."""
    names = project_behind(hosts, stamps, now)
    if not names:
        return None
    return warn(", ".join(names), f"the project's build files ({', '.join(BUILD_FILES)}) changed since `fab setup` "
                                  f"installed the project there; run `fab setup --hosts {shlex.quote(','.join(names))}`")


def since_setup(hosts: Sequence[Host], stamps: Mapping[str, str], now: Declared | None) -> list[Finding]:
    """What changed in the project since setup ran on its hosts: its requirements, its build files."""
    found = (requirements_finding(hosts, stamps, now), project_finding(hosts, stamps, now))
    return [finding for finding in found if finding is not None]
