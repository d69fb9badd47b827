"""Host side of `fab firewall`; stdlib only, run as `python -c <this file> PLANS_JSON`.

The rules are planned on the controller (deploy/run/firewall.py), one plan per backend:
`{"iptables": [steps], "nft": [steps]}`. This picks the backend the host has (the iptables
command, nft-backed or legacy; else nft) and runs its steps in order, each only when its
`only_if` probe succeeds or its `unless` probe fails, as root, or through `sudo -n` when not root.
Prints one JSON object: {"results": [...], "error": str|null, "notes": [...]}. With neither root
nor passwordless sudo it runs nothing and says so (exit status 3).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

STEP_TIMEOUT_S = 30
NO_PRIVILEGE_EXIT = 3


def privilege_prefix() -> list[str] | None:
    """[] as root, ["sudo", "-n"] with passwordless sudo, None with neither."""
    if os.geteuid() == 0:
        return []
    sudo = shutil.which("sudo")
    if sudo is None:
        return None
    try:
        ok = subprocess.run([sudo, "-n", "true"], capture_output=True, timeout=STEP_TIMEOUT_S).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return [sudo, "-n"] if ok else None


def _run(prefix: list[str], argv: list[str]) -> dict:
    try:
        done = subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
        return {"rc": done.returncode, "stdout": done.stdout[-4000:], "stderr": done.stderr[-1000:]}
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"rc": 127, "stdout": "", "stderr": str(err)}


def backend(plans: dict) -> str | None:
    """The iptables command when the host has it (what the rules were first written for), else nft."""
    return next((name for name in ("iptables", "nft") if name in plans and shutil.which(name)), None)


def run_steps(steps: list[dict], prefix: list[str]) -> dict:
    notes: list[str] = []
    missing = sorted({s["argv"][0] for s in steps if shutil.which(s["argv"][0]) is None})
    notes += [f"{tool} not found: that address family is not filtered" for tool in missing]
    results: list[dict] = []
    for step in steps:
        if step["argv"][0] in missing:
            continue
        if step.get("only_if") and _run(prefix, step["only_if"])["rc"] != 0:
            continue
        if step.get("unless") and _run(prefix, step["unless"])["rc"] == 0:
            continue
        result = {"argv": step["argv"], **_run(prefix, step["argv"])}
        results.append(result)
        if result["rc"] != 0:
            why = (result["stderr"].strip().splitlines() or [f"exit status {result['rc']}"])[-1]
            return {"results": results, "error": f"`{' '.join(step['argv'])}` failed: {why}", "notes": notes}
    return {"results": results, "error": None, "notes": notes}


def main(argv: list[str]) -> int:
    plans = json.loads(argv[0])
    chosen = backend(plans)
    if chosen is None:
        print(json.dumps({"results": [], "notes": [], "error": "neither iptables nor nft found: install one "
                                                               "(Debian: apt-get install nftables)"}))
        return 1
    steps = plans[chosen]
    prefix = privilege_prefix()
    if prefix is None:
        print(json.dumps({"results": [], "notes": [], "error":
                          f"the firewall needs root or passwordless sudo; running as uid {os.geteuid()} "
                          "with neither"}))
        return NO_PRIVILEGE_EXIT
    answer = run_steps(steps, prefix)
    print(json.dumps(answer))
    return 0 if answer["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
