"""Does each host run the controller's meshrun? Pure. The host's agent, trainer and script runner
come from its own install (`fab setup`), and they speak the controller's file and flag contract:
a host without meshrun, or with another build of it, would fail at launch or misread the run."""

from __future__ import annotations

from typing import Iterable

from meshrun.deploy.check.findings import Finding, fail
from meshrun.deploy.check.verdicts import HostFacts


def meshrun_findings(hosts: Iterable[HostFacts], controller: str) -> list[Finding]:
    """`controller`: this controller's meshrun as `version (build digest)`."""
    found = []
    for host in hosts:
        fp = host.fingerprint
        if fp is None or fp.python is None:
            continue  # the python finding already says the interpreter did not run
        fix = f"run `fab setup --hosts {host.name}` (it installs this controller's meshrun {controller})"
        if fp.meshrun is None:
            found.append(fail(host.name, f"meshrun is not installed for the host's python; {fix}, and point "
                                         "`python:` in the inventory at the venv it reports"))
        elif fp.meshrun != controller:
            found.append(fail(host.name, f"version skew: the host runs meshrun {fp.meshrun}, this controller "
                                         f"{controller}; {fix}"))
    return found
