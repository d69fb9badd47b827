"""Why invoke could place a task's word nowhere, pure: a flag given twice, a value given to a switch, a
misspelt flag (did-you-mean), or the built-in trainer's config key typed as a flag (`--epochs 3` is
`-- epochs=3`). deploy/fabexec.py reads invoke's parse and prints the line these build.
"""

from __future__ import annotations

import ast
import difflib
import shlex
from dataclasses import dataclass
from typing import Mapping, Sequence

from meshrun.deploy.inventory.shown import shown


@dataclass(frozen=True)
class FlagSpec:  # one of a task's flags, as invoke reads it
    long: str  # its long spelling, whichever was typed: --hosts for -h
    takes_value: bool
    repeatable: bool = False  # a list flag (--notify): each mention adds a value


@dataclass(frozen=True)
class Stray:  # the first of a task's words that invoke places nowhere
    word: str  # as invoke names it: `yes` of `--detach=yes`
    at: int  # the index of the word it is in, among the task's words
    after: str | None = None  # the flag typed right before it (`--hosts`), if it came right after one
    glued: bool = False  # typed as `--flag=word`
    earlier: str | None = None  # `after` given twice: the value its first mention took


def find_stray(words: Sequence[str], flags: Mapping[str, FlagSpec], positional: int = 0) -> Stray | None:
    """The first of a task's `words` (after its name; the first `positional` words without a flag are its own:
    firewall's `up`) that invoke places nowhere, read as invoke does: `--flag=value` split, a flag's value the
    next word unless that is a flag, and a flag given again taking none (invoke keeps the first and stops at the
    next word: "No idea what 'gpu2' is"). None when every word has its place."""
    tokens = [(at, part, glued and i == 1) for at, word in enumerate(words)
              for glued in [word.startswith("-") and "=" in word]
              for i, part in enumerate(word.split("=", 1) if glued else [word])]
    values: dict[str, str] = {}
    waiting, after = None, None
    for at, part, glued in tokens:
        if part in flags:
            spec = flags[part]
            fresh = spec.repeatable or spec.long not in values
            waiting, after = (spec if spec.takes_value and fresh else None), part
        elif waiting is not None:
            values.setdefault(waiting.long, part)
            waiting, after = None, None
        elif positional > 0:  # a word the task takes without a flag
            positional, after = positional - 1, None
        else:
            return Stray(part, at, after, glued, values.get(flags[after].long) if after is not None else None)
    return None


def stray_line(stray: Stray, flags: Mapping[str, FlagSpec], task: str) -> str | None:
    """The line for a flag given twice, or a value given to a switch (`--detach=yes`); None for another stray."""
    spec, word = flags[stray.after] if stray.after is not None else None, shown(stray.word)
    if spec is None or (spec.takes_value and stray.earlier is None):
        return None
    if spec.takes_value:  # it took its value at its first mention: this is a second one
        hosts = list(dict.fromkeys([*str(stray.earlier).split(","), *stray.word.split(",")]))
        fix = f": --hosts {shlex.quote(','.join(hosts))}" if spec.long == "--hosts" else ""
        fix = f", several hosts comma-separated{fix}" if fix and len(hosts) > 1 else fix
        return f"{spec.long} is given twice ({shown(stray.earlier)}, then {word}); give it once{fix}"
    if stray.glued:
        return f"{spec.long} is a switch and takes no value ({word}); give {spec.long} alone"
    return (f"{spec.long} takes no value, so {word} after it is no flag's; give {spec.long} alone, and {word} "
            f"after the flag it is for (`{task} --help` lists them)")


def unknown_flag_line(token: str, flags: Mapping[str, FlagSpec], task: str) -> str | None:
    """`did you mean --hosts?` for a misspelt flag (`--host`), from the task's long flags; None if none is near."""
    near = difflib.get_close_matches(token, sorted({spec.long for spec in flags.values()}), n=1, cutoff=0.75)
    return f"{shown(token)} is not a flag of {task}; did you mean {near[0]}?" if near else None


def trainer_keys(source: str) -> dict[str, str]:
    """The built-in trainer's config keys (`optim.lr`), each with its type as written (`float`), read from
    the source of train/config.py: the controller never imports the trainer (docs/architecture.md)."""
    classes = {node.name: node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)}

    def fields(name: str, prefix: str) -> dict[str, str]:
        found: dict[str, str] = {}
        for item in classes[name].body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                kind, key = ast.unparse(item.annotation), prefix + item.target.id
                nested = kind in classes and key.count(".") < 4  # a section, as the trainer's `_all_keys` reads it
                found |= fields(kind, key + ".") if nested else {key: kind}
        return found

    return fields("TrainConfig", "") if "TrainConfig" in classes else {}


def as_overrides(words: Sequence[str], keys: Mapping[str, str],
                 flags: Mapping[str, FlagSpec]) -> tuple[tuple[str, ...], int]:
    """`--epochs 3 --lr=0.1` (the trainer's keys as flags, from the start of `words`: a key, or a last part only it
    has) as `epochs=3 optim.lr=0.1`, and how many words they were. No value: `true` for a yes/no key, else `VALUE`."""
    overrides, at = [], 0
    while at < len(words) and words[at].startswith("--") and words[at].split("=", 1)[0] not in flags:
        name = words[at][2:].split("=", 1)[0].replace("-", "_")
        ending = [k for k in keys if k.rsplit(".", 1)[-1] == name]
        key = name if name in keys else ending[0] if len(ending) == 1 else None
        if key is None:
            break
        if "=" in words[at]:
            value, at = words[at].split("=", 1)[1], at + 1
        elif at + 1 < len(words) and not words[at + 1].startswith("-"):
            value, at = words[at + 1], at + 2
        else:
            value, at = ("true" if keys[key] == "bool" else "VALUE"), at + 1
        overrides.append(f"{key}={value}")
    return tuple(overrides), at
