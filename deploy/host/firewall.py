"""Host side of `fab firewall`; stdlib only, run as `python -c <this file> REQUEST_JSON`.

The rules are planned on the controller (deploy/run/firewall.host_request), one plan per backend:
`{"action": "up", "plans": {"iptables": [steps], "nft": [steps]}, "undo": {...}}`. Each step runs
only when its `only_if` probe succeeds or its `unless` probe fails, as root, or through `sudo -n`
when not root. Prints one JSON object: {"results": [...], "error": str|null, "notes": [...]}. With
neither root nor passwordless sudo it runs nothing and says so (exit status 3).

`up` fails closed: it uses iptables only where ip6tables is there too (nft-backed or legacy), else
nft (its `inet` table filters both families); a host with iptables alone is refused before any rule
is added, since the store listens on IPv6 as well. A step that fails takes back what `up` added
(its backend's `undo` steps): no host is left with one family filtered. `down` and `status` run
every backend the host has, so rules added through either are found.
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


def _have(tool: str) -> bool:
    return shutil.which(tool) is not None


def up_backend(plans: dict) -> tuple[str | None, list[str]]:
    """The backend `up` uses, one that filters both address families, and a note; or None and why."""
    if "iptables" in plans and _have("iptables") and _have("ip6tables"):
        return "iptables", []
    if "nft" in plans and _have("nft"):
        return "nft", ["ip6tables not found: both families are filtered in nft's table inet meshrun"] \
            if _have("iptables") else []
    if _have("iptables"):
        return None, ["ip6tables not found, and no nft: IPv6 would stay open to the store, so nothing was changed; "
                      "install nftables (Debian: apt-get install nftables) or ip6tables"]
    return None, ["neither iptables nor nft found: install one (Debian: apt-get install nftables)"]


def run_steps(steps: list[dict], prefix: list[str]) -> tuple[list[dict], str | None]:
    """Run the steps in order, skipping those of a tool the host lacks (down and status: nothing of
    it to see); stops at the first that fails, with why."""
    results: list[dict] = []
    for step in steps:
        if not _have(step["argv"][0]):
            continue
        if step.get("only_if") and _run(prefix, step["only_if"])["rc"] != 0:
            continue
        if step.get("unless") and _run(prefix, step["unless"])["rc"] == 0:
            continue
        result = {"argv": step["argv"], **_run(prefix, step["argv"])}
        results.append(result)
        if result["rc"] != 0:
            why = (result["stderr"].strip().splitlines() or [f"exit status {result['rc']}"])[-1]
            return results, f"`{' '.join(step['argv'])}` failed: {why}"
    return results, None


def down_or_status(plans: dict, prefix: list[str]) -> dict:
    """Every backend the host has a tool of: what `up` added through either is found."""
    results: list[dict] = []
    for name in (b for b in plans if any(_have(step["argv"][0]) for step in plans[b])):
        done, error = run_steps(plans[name], prefix)
        results += done
        if error:
            return {"results": results, "error": error, "notes": []}
    return {"results": results, "error": None, "notes": []}


def up(request: dict, chosen: str, notes: list[str], prefix: list[str]) -> dict:
    # The other backend's rules, from an `up` before this host gained or lost a tool, would keep an
    # old member list: they go first.
    results: list[dict] = []
    for other in (b for b in request["undo"] if b != chosen):
        done, error = run_steps(request["undo"][other], prefix)
        if error:
            return {"results": done, "error": error, "notes": notes}
        results += done
    applied, error = run_steps(request["plans"][chosen], prefix)
    results += applied
    if error:  # take back what was added: one family filtered and the other open is what `up` must not leave
        undone, undo_error = run_steps(request["undo"][chosen], prefix)
        results += undone
        error += (f"; taking back the rules added before failed as well: {undo_error}" if undo_error else
                  "; the rules added before it were taken back")
    return {"results": results, "error": error, "notes": notes}


def main(argv: list[str]) -> int:
    request = json.loads(argv[0])
    chosen, notes = up_backend(request["plans"]) if request["action"] == "up" else (None, [])
    if request["action"] == "up" and chosen is None:
        print(json.dumps({"results": [], "notes": [], "error": notes[0]}))
        return 1
    prefix = privilege_prefix()
    if prefix is None:
        print(json.dumps({"results": [], "notes": [], "error":
                          f"the firewall needs root or passwordless sudo; running as uid {os.geteuid()} "
                          "with neither"}))
        return NO_PRIVILEGE_EXIT
    result = up(request, chosen, notes, prefix) if chosen else down_or_status(request["plans"], prefix)
    print(json.dumps(result))
    return 0 if result["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
