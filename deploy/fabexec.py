"""Fabric executor for meshrun: `meshrun` is built with it, and `fab` adopts it when it loads the tasks.

Stock Fabric turns anything after `--` into an anonymous shell command to run on `-H` hosts
and refuses when there are none. meshrun's `fab train --script FILE -- ARGS` passes those
arguments to the user's script instead, so they are taken out of Fabric's hands here and
read back, unsplit and unjoined, by `deploy.cli.remainder()`.

Fabric's own options before the task (`-H`, `-i`, `-S`, ...) configure the Connections and commands
Fabric makes itself; meshrun makes its own from the inventory, so they are refused (`guard_parsing`).
A task flag invoke cannot place is one line naming the flag and the fix (`_flag_line`), not invoke's words.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabric.executor import Executor
from invoke.exceptions import Exit, ParseError

from meshrun.layout import TRAINER_MODULE
from meshrun.deploy.flagwords import FlagSpec, as_overrides, find_stray, stray_line, trainer_keys, unknown_flag_line
from meshrun.deploy.inventory.shown import shown

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
class ReadAs:
    """One of meshrun's one-letter flags near a script's misplaced words: a script's own `-b` or `-p`
    (seed 004's) clashes with meshrun's `-b` (--debug) and `-p` (--project), so the line says how
    meshrun reads each. Moved ones go after `--` with the script's words; kept ones stay meshrun's."""

    short: str  # as typed: -b
    long: str  # what meshrun takes it for: --debug
    kept: bool = False  # left before `--` in the fixed command: it may be meshrun's (`-h gpu1`)


@dataclass(frozen=True)
class Typed:
    """The command line around the words to move (`misplaced_argument_hint`), each word as the shell split it."""

    before: tuple[str, ...]  # after the program's name: options before the task, the task, its flags so far
    after: tuple[str, ...] = ()  # meshrun's flags after the moved words, up to any `--`
    given: tuple[str, ...] = ()  # what was already after `--`: it stays after the moved words
    read: tuple[ReadAs, ...] = ()  # meshrun's one-letter flags around the moved words, in the order typed


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
        kept = " (a kept flag too, if it is the script's)" if any(r.kept for r in typed.read) else ""
        line = f"'{token}' is not a meshrun flag; {_read_as_words(typed.read)}put the script's own arguments after --"
        line += f"{kept}: {fixed}"
    elif "=" in token and not token.startswith("-"):
        line = f"'{token}' is not a meshrun flag; the trainer's key=value overrides go after --: {fixed}"
    else:
        return None
    return line.replace("\n", "\\n")  # one line, whatever was typed


def _unknown_token_line(err: ParseError, argv: list[str], unparsed: list[str], program: str) -> str | None:
    """`misplaced_argument_hint` for invoke's "No idea what X is" in a task's flags; else None. `argv`: the
    whole command line; `unparsed`: its task words (invoke's), which end where `--` starts the rest."""
    token, context = _unknown_token(err)
    if token is None:
        return None
    script = context.args["script"].value if "script" in context.args else ""
    # `--epochs=3` reaches invoke's error as `--epochs`: move the whole word the user typed, and what
    # follows it (`_moved_span` says how far)
    start = next((i for i, word in enumerate(unparsed) if word == token or word.startswith(f"{token}=")), None)
    if start is None:
        return misplaced_argument_hint(token, context.name, script or "", [], program)
    end, start, read = _moved_span(unparsed, start, context, bool(script), token.startswith("-"))
    typed = _typed(argv, unparsed, start, end, read)
    return misplaced_argument_hint(token, context.name, script or "", unparsed[start:end], program, typed)


def _unknown_token(err: ParseError) -> tuple[str | None, Any]:
    """The word invoke's "No idea what X is" names, and the task's parser context; else (None, None)."""
    found, context = _NO_IDEA.fullmatch(str(err)), getattr(err, "context", None)
    if found is None or context is None or not getattr(context, "name", None):
        return None, None
    try:
        token = ast.literal_eval(found.group(1))  # invoke shows the token as its repr
    except (ValueError, SyntaxError):
        return None, None
    return (str(token), context) if isinstance(token, str) else (None, None)


def _typed(argv: list[str], unparsed: list[str], start: int, end: int, read: tuple[ReadAs, ...] = ()) -> Typed:
    """The command line as typed around the task's words `unparsed[start:end]`, which move after `--`."""
    body = argv[1:argv.index("--")] if "--" in argv else argv[1:]
    core = body[:len(body) - len(unparsed)] if body[len(body) - len(unparsed):] == unparsed else []
    return Typed((*core, *unparsed[:start]), tuple(unparsed[end:]), tuple(argv[len(body) + 2:]), read)


def _moved_span(words: list[str], start: int, context: Any, script: bool,
                dashed: bool) -> tuple[int, int, tuple[ReadAs, ...]]:
    """Where the words to move after `--` end and start in `words` (the task's words, the unknown one at
    `start`), and meshrun's one-letter flags the line names. A trainer's overrides (`epochs=2`) end at any
    flag of meshrun's. A script's words end only at a long one (`--hosts gpu1` stays meshrun's): its own
    short flags clash with meshrun's (`-b 128 -p 20`: meshrun's --debug and --project). A one-letter switch
    just before an unknown value (`-b 128`) was the script's (a switch takes no value), so it moves too;
    one-letter flags before that are kept, named: `-h gpu1` there is as likely meshrun's as the script's."""
    def ends(word: str) -> bool:
        return word.split("=", 1)[0] in context.flags and (word.startswith("--") or not script)

    end = start + next((i for i, word in enumerate(words[start:]) if i and ends(word)), len(words) - start)
    if not script:
        return end, start, ()
    switch = _short_flag(words[start - 1], context) if start > 1 else None
    if switch is not None and not switch.takes_value and not dashed:
        start -= 1
    kept, i = [], start
    while i > 1:  # words[0] is the task's name
        flag, valued = _short_flag(words[i - 1], context), _short_flag(words[i - 2], context) if i > 2 else None
        if flag is not None and not flag.takes_value:
            kept, i = [i - 1, *kept], i - 1
        elif valued is not None and valued.takes_value and valued.name != "script":  # the hint names the script
            kept, i = [i - 2, *kept], i - 2
        else:
            break
    named = [(at, True) for at in kept] + [(at, False) for at in range(start, end) if _short_flag(words[at], context)]
    return end, start, tuple(ReadAs(words[at], "--" + _short_flag(words[at], context).name.replace("_", "-"), keep)
                             for at, keep in named)


def _short_flag(word: str, context: Any) -> Any:
    """The task's argument that `word` names as a one-letter flag (`-b`), else None."""
    one_letter = len(word) == 2 and word[0] == "-" and word[1] != "-"
    return context.flags[word] if one_letter and word in context.flags else None


def _read_as_words(read: tuple[ReadAs, ...]) -> str:
    """The line's `meshrun read -b as --debug and -p as --project; `, or nothing when none was typed."""
    if not read:
        return ""
    said = [f"{r.short} as {r.long}{' (kept)' if r.kept else ''}" for r in read]
    return "meshrun read " + (f"{', '.join(said[:-1])} and {said[-1]}" if len(said) > 1 else said[0]) + "; "


def _trainer_source() -> str:
    """train/config.py of this meshrun as text ("" if it cannot be read): finding the package imports none of it."""
    try:
        folders = importlib.util.find_spec(TRAINER_MODULE).submodule_search_locations  # type: ignore[union-attr]
        return (Path(list(folders or [])[0]) / "config.py").read_text()
    except (ImportError, AttributeError, IndexError, OSError, UnicodeDecodeError):
        return ""


def _flag_line(err: ParseError, argv: list[str], unparsed: list[str], program: Any) -> str | None:
    """The one line for a flag given twice, a value given to a switch, a misspelt flag, or the trainer's key
    typed as a flag (`--epochs 3`), ahead of `_unknown_token_line`'s where it knows better; else None."""
    token, context = _unknown_token(err)
    spelt = {s: context.flags[s] for s in [*context.flags.keys(), *context.flags.aliases]} if token else {}  # -h too
    flags = {s: FlagSpec("--" + a.name.replace("_", "-"), a.takes_value, a.kind is list) for s, a in spelt.items()}
    stray = find_stray(unparsed[1:], flags, len(context.positional_args)) if flags else None
    if stray is None or stray.word != token:  # read otherwise than invoke did (`-kd`): keep invoke's words
        return None
    twice = stray.after is not None and stray.after.startswith("--") and flags[stray.after].takes_value
    hint = None if twice or stray.glued else _unknown_token_line(err, argv, unparsed, _shown_as(program))
    if hint is not None or not token.startswith("-"):  # a long flag's second value, `--detach=yes`: meshrun's
        return hint or stray_line(stray, flags, f"{_shown_as(program)} {context.name}")
    start, given = stray.at + 1, {flags[w.split("=", 1)[0]].long for w in unparsed if w.split("=", 1)[0] in flags}
    trainer = context.name == "train" and "--script" not in given and _is_meshrun_task(program.collection, "train")
    overrides, count = as_overrides(unparsed[start:], trainer_keys(_trainer_source()), flags) if trainer else ((), 0)
    if not overrides:
        return unknown_flag_line(token, flags, context.name)
    typed = _typed(argv, unparsed, start, start + count)
    fixed = shlex.join([_shown_as(program), *typed.before, *typed.after, "--", *overrides, *typed.given])
    return f"{shown(token)} is not a meshrun flag but a key of the trainer's config; set it after --: {fixed}"


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
            _help_not_positional(program)
        except ParseError as err:
            argv, unparsed = list(program.argv), list(program.core.unparsed)
            hint = _flag_line(err, argv, unparsed, program) or _unknown_token_line(err, argv, unparsed,
                                                                                   _shown_as(program))
            if hint is not None:
                raise Exit(f"error: {hint}".replace("\n", "\\n"), code=2) from None  # one line, whatever was typed
            needed = _NEEDED_VALUE.match(str(err))
            text = f"--{needed.group(1).replace('_', '-')} needs a value" if needed else str(err).rstrip("!")
            raise Exit(f"error: {text}; see --help", code=2) from None

    def parse_cleanup_then_refuse() -> None:
        parse_cleanup()  # --help, --list and --version answer first; they run no task
        refuse_fabric_options(program)  # before update_config, which would read -S's file and prompt

    program.parse_tasks = parse_tasks_or_exit_2
    program.parse_cleanup = parse_cleanup_then_refuse


def _help_not_positional(program: Any) -> None:
    """`meshrun firewall --help`: invoke gives `--help` to the task's positional argument while that has
    no value yet, and the task ran with the action '--help'. As it is for every other task, it asks for help."""
    for context in program.tasks:
        for arg in context.positional_args:
            if arg.value == "--help":
                arg.value = None
                program.args["help"].value = context.name


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
