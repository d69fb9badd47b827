"""Fabric executor for meshrun: `meshrun` is built with it, and `fab` adopts it when it loads the tasks.

Stock Fabric turns anything after `--` into an anonymous shell command to run on `-H` hosts
and refuses when there are none. meshrun's `fab train --script FILE -- ARGS` passes those
arguments to the user's script instead, so they are taken out of Fabric's hands here and
read back, unsplit and unjoined, by `deploy.cli.remainder()`.

Fabric's own options before the task (`-H`, `-i`, `-S`, ...) configure the Connections and commands
Fabric makes itself; meshrun makes its own from the inventory, so they are refused (`guard_parsing`).
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass
from typing import Any

from fabric.executor import Executor
from invoke.exceptions import Exit, ParseError

# invoke's words for a flag given without its value: "Flag <Argument: lines (l)> needed value and was not given one!"
_NEEDED_VALUE = re.compile(r"Flag <Argument: ([A-Za-z0-9_]+)[^>]*> needed value")
_NO_IDEA = re.compile(r"No idea what (.*) is!?", re.DOTALL)  # invoke's words for a token no task or flag matches
_TASKS_MODULE = "meshrun.deploy.tasks"  # where meshrun's task bodies live (not imported: it imports this module)

# Fabric's and invoke's options, before the task, that only act on what Fabric connects or runs itself.
# They are listed in `--help`, so they get used; unrefused, each did nothing, and -H worse: Fabric ran
# the task once per name it lists, each run on every host of the inventory (its `--hosts` unset).
FABRIC_ONLY = {"hosts": "-H/--hosts", "identity": "-i/--identity", "ssh-config": "-S/--ssh-config",
               "connect-timeout": "-t/--connect-timeout", "prompt-for-passphrase": "--prompt-for-passphrase",
               "prompt-for-login-password": "--prompt-for-login-password", "dry": "-R/--dry",
               "command-timeout": "-T/--command-timeout", "prompt-for-sudo-password": "--prompt-for-sudo-password",
               "echo": "-e/--echo", "pty": "-p/--pty", "warn-only": "-w/--warn-only", "hide": "--hide"}


class MeshrunExecutor(Executor):
    def expand_calls(self, calls, apply_hosts=True):  # type: ignore[no-untyped-def]
        saved, self.core.remainder = self.core.remainder, ""
        try:
            return super().expand_calls(calls, apply_hosts)
        finally:
            self.core.remainder = saved


def fabric_option_problem(given: dict[str, object], program: str, task: str, takes_hosts: bool) -> str | None:
    """The line refusing the first of FABRIC_ONLY's options in `given` (name → its value), with
    what meshrun reads instead; None when none was given."""
    name = next((name for name in FABRIC_ONLY if given.get(name)), None)
    if name is None:
        return None
    value = shlex.quote(str(given[name])).replace("\n", "\\n")  # one line, whatever was typed
    if name == "hosts":
        fix = (f"put it after the task: {program} {task} --hosts {value}" if takes_hosts
               else f"{program} {task} takes no --hosts")
    elif name == "identity":
        fix = ("name the SSH key as `identity:` in the inventory (or IdentityFile in $MESHRUN_SSH_CONFIG, "
               "else ~/.ssh/config)")
    elif name == "ssh-config":
        fix = f"set MESHRUN_SSH_CONFIG={value} instead (default ~/.ssh/config)"
    elif name == "connect-timeout":
        fix = f"{program} check-network and {program} trust take --timeout SECONDS after the task"
    elif name == "prompt-for-passphrase":
        fix = "add the key to ssh-agent (ssh-add KEY): meshrun offers the agent's keys"
    elif name == "prompt-for-login-password":
        fix = "meshrun logs in with SSH keys only: `identity:` in the inventory, or ssh-agent"
    elif name == "dry":
        fix = f"it would not keep {program} {task} from acting; drop it"
    else:
        fix = "meshrun runs no commands through Fabric; drop it"
    return f"{FABRIC_ONLY[name]} before the task is Fabric's own option, which meshrun does not use; {fix}"


def refuse_fabric_options(program: Any) -> None:
    """Exit 2 with `fabric_option_problem`'s line when one of meshrun's tasks is to run. A project's
    own Fabric tasks, in the same fabfile, keep Fabric's options."""
    ours = [ctx for ctx in program.tasks if _is_meshrun_task(program.collection, ctx.name)]
    if not ours:
        return
    given = {name: program.args[name].value for name in FABRIC_ONLY if name in program.args}
    problem = fabric_option_problem(given, _shown_as(program), ours[0].name, "hosts" in ours[0].args)
    if problem:
        raise Exit(f"error: {problem}", code=2)


def _shown_as(program: Any) -> str:
    return "meshrun" if program.binary == "meshrun" else "fab"  # `fab`'s binary is how it was called


@dataclass(frozen=True)
class Typed:
    """The command line around the words to move (`misplaced_argument_hint`), each word as the shell split it."""

    before: tuple[str, ...]  # after the program's name: options before the task, the task, its flags so far
    after: tuple[str, ...] = ()  # meshrun's flags after the moved words, up to any `--`
    given: tuple[str, ...] = ()  # what was already after `--`: it stays after the moved words


def misplaced_argument_hint(token: str, task: str, script: str, rest: list[str], program: str,
                            typed: Typed | None = None) -> str | None:
    """The line for an unknown `token` that belongs after `--`: a script's own flag (`--epochs`) given
    to `train --script`, or a trainer override (`epochs=2`) given to `train`; `rest` is the words to move,
    from that token on. The fixed command is the one `typed` (every other flag kept in its place: pasted,
    it runs on the same inventory and hosts), with only `rest` moved after `--`; without `typed`, the task
    alone. None for anything else (a misspelt meshrun flag), which keeps invoke's words."""
    if task != "train":  # the one task that passes arguments on (join and leave take a run's hosts)
        return None
    typed = typed or Typed(("train", "--script", script) if script else ("train",))
    fixed = shlex.join([program, *typed.before, *typed.after, "--", *(rest or [token]), *typed.given])
    if script:
        line = f"'{token}' is not a meshrun flag; put the script's own arguments after --: {fixed}"
    elif "=" in token and not token.startswith("-"):
        line = f"'{token}' is not a meshrun flag; the trainer's key=value overrides go after --: {fixed}"
    else:
        return None
    return line.replace("\n", "\\n")  # one line, whatever was typed


def _unknown_token_line(err: ParseError, argv: list[str], unparsed: list[str], program: str) -> str | None:
    """`misplaced_argument_hint` for invoke's "No idea what X is" in a task's flags; else None. `argv`: the
    whole command line; `unparsed`: its task words (invoke's), which end where `--` starts the rest."""
    found, context = _NO_IDEA.fullmatch(str(err)), getattr(err, "context", None)
    if found is None or context is None or not getattr(context, "name", None):
        return None
    try:
        token = ast.literal_eval(found.group(1))  # invoke shows the token as its repr
    except (ValueError, SyntaxError):
        return None
    script = context.args["script"].value if "script" in context.args else ""
    # `--epochs=3` reaches invoke's error as `--epochs`: move the whole word the user typed, and what
    # follows it up to the next of meshrun's own flags (`--hosts gpu1` after it stays meshrun's)
    start = next((i for i, word in enumerate(unparsed) if word == token or word.startswith(f"{token}=")), None)
    if start is None:
        return misplaced_argument_hint(str(token), context.name, script or "", [], program)
    rest = unparsed[start:]
    end = start + next((i for i, word in enumerate(rest) if i and word.split("=", 1)[0] in context.flags), len(rest))
    body = argv[1:argv.index("--")] if "--" in argv else argv[1:]
    core = body[:len(body) - len(unparsed)] if body[len(body) - len(unparsed):] == unparsed else []
    typed = Typed((*core, *unparsed[:start]), tuple(unparsed[end:]), tuple(argv[len(body) + 2:]))
    return misplaced_argument_hint(str(token), context.name, script or "", unparsed[start:end], program, typed)


def _is_meshrun_task(collection: Any, name: str) -> bool:
    try:
        body = getattr(collection[name], "body", None)
    except (KeyError, ValueError):
        return False
    return getattr(body, "__module__", None) == _TASKS_MODULE


def guard_parsing(program: Any) -> None:
    """Bad input on the command line is one line and exit status 2, as every other bad input: a task
    flag invoke cannot parse (unknown, or given without its value; invoke prints it and exits 1), and
    Fabric's own options before a meshrun task (`refuse_fabric_options`)."""
    parse_tasks, parse_cleanup = program.parse_tasks, program.parse_cleanup

    def parse_tasks_or_exit_2() -> None:
        try:
            parse_tasks()
        except ParseError as err:
            hint = _unknown_token_line(err, list(program.argv), list(program.core.unparsed), _shown_as(program))
            if hint is not None:
                raise Exit(f"error: {hint}", code=2) from None
            needed = _NEEDED_VALUE.match(str(err))
            text = f"--{needed.group(1).replace('_', '-')} needs a value" if needed else str(err).rstrip("!")
            raise Exit(f"error: {text}; see --help", code=2) from None

    def parse_cleanup_then_refuse() -> None:
        parse_cleanup()  # --help, --list and --version answer first; they run no task
        refuse_fabric_options(program)  # before update_config, which would read -S's file and prompt

    program.parse_tasks = parse_tasks_or_exit_2
    program.parse_cleanup = parse_cleanup_then_refuse


def adopt_running_fab() -> None:
    """Make the running `fab` use MeshrunExecutor, so a project's fabfile needs only its one
    import line and no fabric.yaml. The `fab` command is `fabric.main.program.run()`; it imports
    the fabfile (and so this module) before it creates its executor, from `executor_class`
    (a `tasks.executor_class` in a project's own Fabric config still wins, as Fabric documents)."""
    import sys

    program = getattr(sys.modules.get("fabric.main"), "program", None)
    if program is not None and getattr(program, "executor_class", None) is Executor:
        program.executor_class = MeshrunExecutor
        guard_parsing(program)
