"""The trainer config's YAML is read with the inventory's bounds (train/config_rules.YamlLoader): an
alias bomb, deep nesting and duplicate keys are one line naming the file, the line and the key, exit
status 2 — through `python -m meshrun.train --check` and through the controller's check before any host.
Before: a 329-byte file gave a 157 MB error line, 5000 brackets a RecursionError traceback (exit status 1),
and `lr:` twice silently kept the last one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from meshrun.deploy.edges.trainercheck import check_trainer_args
from meshrun.deploy.errors import InputError
from meshrun.deploy.run.plan import Workload
from meshrun.train.config import CONFIG_DIR, DEFAULT_CONFIG, load_config
from meshrun.train.errors import UsageError
from tests.trainer.harness import REPO, clean_env

ROW = "[" + ", ".join(["*{0}"] * 9) + "]"
BOMB = ("model:\n  hidden: [&a [1,2,3,4,5,6,7,8,9], "
        + ", ".join(f"&{b} " + ROW.format(a) for a, b in zip("abcdefg", "bcdefgh")) + "]\n")
DEEP = "model:\n  hidden: " + "[" * 5000 + "]" * 5000 + "\n"
DEPTH_LINE = ("'model.hidden': values nested more than 20 levels deep; a config needs 4 (section, key, list, "
              "value): check the brackets")


def error_of(path: Path | None = None, *overrides: str) -> str:
    with pytest.raises(UsageError) as info:
        load_config(path, overrides)
    return str(info.value)


def written(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    (tmp_path / name).write_text(text)
    return tmp_path / name


def test_an_alias_bomb_is_refused_at_its_line_not_expanded_into_the_message(tmp_path: Path) -> None:
    path = written(tmp_path, BOMB)
    assert len(BOMB) == 329
    message = error_of(path)
    assert message == (f"{path}:2: 'model.hidden': more than 100000 values, counting each alias as the values it "
                       "repeats; a config needs far fewer (an alias bomb?)")


def test_deep_nesting_in_a_file_or_an_override_is_one_line_not_a_recursion_error(tmp_path: Path) -> None:
    path = written(tmp_path, DEEP)
    assert error_of(path) == f"{path}:2: {DEPTH_LINE}"
    override = "model.hidden=" + "[" * 3000 + "]" * 3000
    assert error_of(None, override) == ("override 'model.hidden=" + "[" * 14 + "..." + "]" * 28
                                        + "': values nested more than 20 levels deep; a config needs 4 (section, "
                                        "key, list, value): check the brackets")


def test_twenty_levels_still_load_as_far_as_the_key_allows(tmp_path: Path) -> None:
    """The bound is the nesting, not the type check: 17 brackets under model.hidden (20 levels) reach the key,
    which refuses a list of lists in its own words."""
    path = written(tmp_path, "model:\n  hidden: " + "[" * 17 + "1" + "]" * 17 + "\n")
    assert error_of(path).startswith(f"{path}: 'model.hidden' must be a list of ints like [1, 2]; got [[[[[[")


def test_a_duplicate_key_is_refused_with_both_lines(tmp_path: Path) -> None:
    path = written(tmp_path, "optim:\n  lr: 0.05\n  lr: 0.5\nepochs: 3\nepochs: 30\n")
    assert error_of(path) == f"{path}:3: duplicate key 'optim.lr' (first on line 2); keep only one of them"
    path = written(tmp_path, "optim:\n  lr: 0.05\nepochs: 3\n'epochs': 30\n")
    assert error_of(path) == f"{path}:4: duplicate key 'epochs' (first on line 3); keep only one of them"
    path = written(tmp_path, "model: {hidden: [4], dropout: 0.1, hidden: [8]}\n")
    assert error_of(path) == f"{path}:1: duplicate key 'model.hidden' (first on line 1); keep only one of them"
    assert error_of(None, "model.hidden=[{a: 1, a: 2}]") == (
        "override 'model.hidden=[{a: 1, a: 2}]': duplicate key 'a' (first on line 1); "
        "keep only one of them")


def test_a_merge_key_is_no_duplicate_and_the_mapping_s_own_key_wins(tmp_path: Path) -> None:
    path = written(tmp_path, "optim: {<<: {lr: 0.5, momentum: 0.5}, lr: 0.05}\n")
    cfg = load_config(path)
    assert (cfg.optim.lr, cfg.optim.momentum) == (0.05, 0.5)


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path: Path) -> None:
    path = written(tmp_path, "model:\n  hidden: &a [1, *a]\n")
    assert error_of(path) == (f"{path}:2: 'model.hidden': an alias is used inside its own anchor; an alias may "
                              "only repeat a value that is complete")


def test_values_in_messages_are_escaped_and_clipped(tmp_path: Path) -> None:
    path = written(tmp_path, f"amp: \"{'x' * 10_000}\\n\\u001b[2J\"\n")
    assert error_of(path) == f"{path}: 'amp' must be one of off, bf16, fp16; got '{'x' * 27}...{'x' * 19}\\n\\x1b[2J'"
    path = written(tmp_path, "optim:\n  lr: [" + "1, " * 5_000 + "1]\n")
    assert error_of(path) == f"{path}: 'optim.lr' must be a finite number; got [1, 1, 1, 1, 1, 1, 1, 1, ...]"
    path = written(tmp_path, f"? {'k' * 10_000}\n: 1\n")  # an explicit key: a plain one stops at 1024
    assert error_of(path).startswith(f"{path}: unknown key '{'k' * 27}...{'k' * 28}'; allowed at top level: amp, ")


def test_a_number_past_int_s_digit_limit_is_text_that_an_integer_key_refuses(tmp_path: Path) -> None:
    """int() refuses 4300 digits: the loader raised ValueError, a traceback with exit status 1."""
    path = written(tmp_path, f"seed: {'1' * 5000}\n")
    assert error_of(path) == f"{path}: 'seed' must be an integer; got '{'1' * 27}...{'1' * 28}'"
    assert error_of(None, f"seed={'1' * 5000}") == (f"override 'seed={'1' * 22}...{'1' * 28}': 'seed' must be an "
                                                    f"integer; got '{'1' * 27}...{'1' * 28}'")


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIG_DIR.glob("*.yaml")))
def test_every_shipped_config_still_loads(name: str) -> None:
    load_config(CONFIG_DIR / name)


@pytest.mark.parametrize("text, line", [
    (DEEP, f"c.yaml:2: {DEPTH_LINE}"),
    (BOMB, "c.yaml:2: 'model.hidden': more than 100000 values, counting each alias as the values it repeats; "
           "a config needs far fewer (an alias bomb?)"),
    ("epochs: 3\nepochs: 30\n", "c.yaml:2: duplicate key 'epochs' (first on line 1); keep only one of them"),
])
def test_check_and_the_controller_refuse_in_one_line_with_status_2(tmp_path: Path, text: str, line: str) -> None:
    written(tmp_path, text)
    proc = subprocess.run([sys.executable, "-m", "meshrun.train", "--check", "--config", "c.yaml"], cwd=tmp_path,
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr.splitlines()) == (2, "", [f"train: error: {line}"])
    with pytest.raises(InputError) as info:
        check_trainer_args(Workload(config="c.yaml"), 60, tmp_path)
    assert (str(info.value), info.value.exit_code) == (
        f"the trainer refuses its arguments: {line}; fix --config or the key=value overrides after --", 2)


@pytest.mark.parametrize("override, rule", [
    ("data.num_workers=100000", "'data.num_workers' must be in [0, 1024] (0: load in the main process); got 100000"),
    ("data.eval_batch_size=9223372036854775808", "'data.eval_batch_size' must be in [1, 16777216]; "
                                                 "got 9223372036854775808"),
    ("model.hidden=[100000000000]", "'model.hidden' must be a list of widths in [1, 1048576]; got (100000000000,)"),
])
def test_check_refuses_values_every_host_would_crash_or_hang_on(override: str, rule: str) -> None:
    """These passed --check; each host then trained an epoch and died with a traceback, or hung forking workers."""
    proc = subprocess.run([sys.executable, "-m", "meshrun.train", "--check", override], cwd=REPO,
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr.splitlines()) == (
        2, "", [f"train: error: {DEFAULT_CONFIG} with overrides: {rule}"])
