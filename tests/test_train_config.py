"""Config parsing: typed values from YAML and overrides, and exact one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from meshrun.train.config import (DEFAULT_CONFIG, Backend, DatasetKind, OptimizerKind, TrainConfig,
                          from_dict, load_config, to_dict)
from meshrun.train.errors import UsageError
from tests.trainer.harness import REPO, clean_env


def error_of(*overrides: str, path: Path | None = None) -> str:
    with pytest.raises(UsageError) as info:
        load_config(path, overrides)
    return str(info.value)


def test_default_config_is_digits_and_overrides_are_typed() -> None:
    cfg = load_config(None, ("optim.lr=0.05", "data.batch_size=16", "dist.timeout=60",
                             "epochs=3", "optim.weight_decay=1e-4", "model.hidden=[8, 4]",
                             "data.root=2024", "dist.backend=gloo", "optim.name=adamw"))
    assert cfg.data.name is DatasetKind.DIGITS
    assert (cfg.optim.lr, cfg.data.batch_size, cfg.epochs) == (0.05, 16, 3)
    assert cfg.dist.timeout == 60.0 and isinstance(cfg.dist.timeout, float)
    assert cfg.optim.weight_decay == 1e-4 and cfg.model.hidden == (8, 4)
    assert cfg.data.root == "2024"
    assert cfg.dist.backend is Backend.GLOO and cfg.optim.name is OptimizerKind.ADAMW


def test_round_trip_through_plain_dict() -> None:
    cfg = load_config(None, ("model.hidden=[3]", "amp=bf16"))
    assert from_dict(to_dict(cfg)) == cfg


def test_unknown_override_key_suggests_the_right_one() -> None:
    assert error_of("optim.lrr=0.1") == (
        "override 'optim.lrr=0.1': unknown key 'optim.lrr' (did you mean 'optim.lr'?); "
        "allowed under 'optim': accum_steps, grad_clip, lr, momentum, name, weight_decay")


def test_unqualified_key_suggests_its_section() -> None:
    assert error_of("lr=0.1").startswith(
        "override 'lr=0.1': unknown key 'lr' (did you mean 'optim.lr'?); allowed at top level: amp,")


@pytest.mark.parametrize("override, message", [
    ("optim.lr=abc", "override 'optim.lr=abc': 'optim.lr' must be a number; got 'abc'"),
    ("epochs=3.5", "override 'epochs=3.5': 'epochs' must be an integer; got '3.5'"),
    ("debug.stop_after_epoch=true",
     "override 'debug.stop_after_epoch=true': 'debug.stop_after_epoch' must be an integer; got 'true'"),
    ("optim.name=adam",
     "override 'optim.name=adam': 'optim.name' must be one of sgd, adamw; got 'adam' (did you mean 'adamw'?)"),
    ("model.hidden=[a]",
     "override 'model.hidden=[a]': 'model.hidden' must be a list of ints like [1, 2]; got ['a']"),
    ("optim=3", "override 'optim=3': 'optim' is a section; set one of its keys, e.g. optim.name=..."),
    ("epochs", "override 'epochs' must look like key=value, e.g. optim.lr=0.05"),
])
def test_ill_typed_overrides(override: str, message: str) -> None:
    assert error_of(override) == message


def test_out_of_range_value_names_key_and_range() -> None:
    assert error_of("dist.timeout=0") == (
        f"{DEFAULT_CONFIG} with overrides: 'dist.timeout' must be > 0 seconds; got 0.0")
    assert error_of("debug.step_sleep_seconds=-0.1") == (
        f"{DEFAULT_CONFIG} with overrides: 'debug.step_sleep_seconds' must be in [0, 60]; got -0.1")


def test_yaml_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("epochs: 2\noptim:\n  momentun: 0.5\n")
    assert error_of(path=path) == (
        f"{path}: unknown key 'optim.momentun' (did you mean 'optim.momentum'?); "
        "allowed under 'optim': accum_steps, grad_clip, lr, momentum, name, weight_decay")
    path.write_text("data:\n  batch_size: many\n")
    assert error_of(path=path) == f"{path}: 'data.batch_size' must be an integer; got 'many'"


def test_missing_config_file_lists_shipped_ones(tmp_path: Path) -> None:
    assert error_of(path=tmp_path / "nope.yaml").startswith(
        f"config file {tmp_path / 'nope.yaml'} not found; ship-in configs: ")


def test_defaults_are_valid() -> None:
    assert isinstance(TrainConfig(), TrainConfig)


def test_cli_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "meshrun.train", "--run-dir", str(tmp_path / "r"),
                           "optim.lrr=0.1"], cwd=REPO, env=clean_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "train: error: override 'optim.lrr=0.1': unknown key 'optim.lrr' (did you mean "
        "'optim.lr'?); allowed under 'optim': accum_steps, grad_clip, lr, momentum, name, "
        "weight_decay"]
    assert not (tmp_path / "r").exists()


def test_off_is_an_enum_value_not_yaml_false(tmp_path) -> None:
    """YAML 1.1 reads `off` as false; `amp=off` and `amp: off` still mean Precision.OFF."""
    from meshrun.train.config import Precision
    assert load_config(None, ("amp=off",)).amp is Precision.OFF
    path = tmp_path / "c.yaml"
    path.write_text("amp: off\n")
    assert load_config(path).amp is Precision.OFF
