"""Hints in messages (`fab TASK ...`) as the user can run them from here.

Messages say `fab TASK`, the README's first form. Two things make such a hint fail as written:
- run as `meshrun`, in a project with no fabfile, `fab` cannot find the tasks;
- run with `--inventory lab.yaml` (or `--project`, `--runs-dir`), the hint `fab setup --hosts gpu2`
  would act on the default inventory, or another runs dir, and not find the host or the run.

So each hint names the program that runs and repeats the flags this command was given, for the
tasks that take them. Only meshrun's own lines are rewritten, never a host's.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

TASKS = ("check-network", "trust", "setup", "sync", "train", "status", "logs", "stop", "join", "leave",
         "fetch-checkpoints", "report", "firewall")
# The tasks that read an inventory; every task takes --project and --runs-dir (deploy/tasks.py).
INVENTORY_TASKS = frozenset({"check-network", "trust", "setup", "sync", "train", "firewall"})
REPEATED = ("inventory", "project", "runs_dir")  # the flags a hint repeats, in this order
FIREWALL_ACTIONS = ("up", "down", "status")

_TASK = "(?:" + "|".join(map(re.escape, TASKS)) + r")\b"
# `fab` alone before a task (not `./fab`, `fabulous`); `fab join|leave` names two tasks at once; a
# firewall hint may name its action. Flags go in only where a command goes on (a flag, the end, a
# closing quote or bracket, a separator, a firewall action): never into prose such as "fab trust: 2 new keys".
HINT_RE = re.compile(r"(?<![\w/.-])fab (?P<tasks>" + _TASK + r"(?:\|" + _TASK + r")*)"
                     r"(?:(?P<action> (?:" + "|".join(FIREWALL_ACTIONS) + r")\b)|(?= --| \[|[`),;]|$))", re.MULTILINE)
# Any `fab TASK` (the program's name is rewritten in prose too: it names what to type).
PROGRAM_RE = re.compile(r"(?<![\w/.-])fab (?=" + _TASK + ")")


def repeated_flags(given: Mapping[str, object]) -> dict[str, str]:
    """The flags of `REPEATED` this command was given a value for, as the user wrote them."""
    return {name: str(given[name]) for name in REPEATED if isinstance(given.get(name), str) and given[name]}


def with_flags(message: str, flags: Mapping[str, str]) -> str:
    """`message` with `flags` repeated in each `fab TASK` hint whose tasks all take them."""
    if not flags:
        return message

    def extend(match: re.Match[str]) -> str:
        tasks = match["tasks"].split("|")
        action = match["action"] or ""
        if action and tasks != ["firewall"]:
            return match[0]
        return match[0] + "".join(f" --{name.replace('_', '-')} {shlex.quote(value)}" for name, value in flags.items()
                                  if name != "inventory" or all(task in INVENTORY_TASKS for task in tasks))

    return HINT_RE.sub(extend, message)


def as_run(message: str, program: str, flags: Mapping[str, str] | None = None) -> str:
    """`message` with its hints in the words of `program`, repeating `flags` (see the module doc)."""
    message = with_flags(message, flags or {})
    return PROGRAM_RE.sub("meshrun ", message) if program == "meshrun" else message
