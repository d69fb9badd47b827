"""Config parsing: typed values from YAML and overrides, and exact one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from meshrun.train.config import (DEFAULT_CONFIG, Backend, DatasetKind, OptimizerKind, TrainConfig,
                          load_config, to_dict)
from meshrun.train.config_rules import shown
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


def test_the_resolved_config_written_as_yaml_loads_back_as_itself(tmp_path) -> None:
    """``to_dict`` is what the trainer records (metrics.jsonl's config line, checkpoints): saved as a
    YAML file, it is a config that trains the same run."""
    cfg = load_config(None, ("model.hidden=[3]", "amp=bf16"))
    (tmp_path / "resolved.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    assert load_config(tmp_path / "resolved.yaml") == cfg


def test_unknown_override_key_suggests_the_right_one() -> None:
    assert error_of("optim.lrr=0.1") == (
        "override 'optim.lrr=0.1': unknown key 'optim.lrr' (did you mean 'optim.lr'?); "
        "allowed under 'optim': accum_steps, grad_clip, lr, momentum, name, weight_decay")


def test_unqualified_key_suggests_its_section() -> None:
    assert error_of("lr=0.1").startswith(
        "override 'lr=0.1': unknown key 'lr' (did you mean 'optim.lr'?); allowed at top level: amp,")


@pytest.mark.parametrize("override, message", [
    ("optim.lr=abc", "override 'optim.lr=abc': 'optim.lr' must be a finite number; got 'abc'"),
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
        f"{DEFAULT_CONFIG} with overrides: 'dist.timeout' must be in (0, 86400] seconds; got 0.0")
    assert error_of("debug.step_sleep_seconds=-0.1") == (
        f"{DEFAULT_CONFIG} with overrides: 'debug.step_sleep_seconds' must be in [0, 60]; got -0.1")


@pytest.mark.parametrize("override", [
    "dist.timeout=.inf", "dist.timeout=-.inf", "dist.timeout=.nan", "dist.timeout=nan", "dist.timeout=inf",
    "optim.lr=1e400", "optim.lr=1" + "0" * 400, "optim.lr=٣", "optim.lr=1_0.5", "comm.bucket_cap_mb=.inf",
    "model.dropout=.nan", "optim.momentum=Infinity", "schedule.gamma=1:20.5",
])
def test_a_float_is_a_finite_decimal_number(override: str) -> None:
    key, text = override.split("=")
    assert error_of(override) == f"override {shown(override)}: {key!r} must be a finite number; got {shown(text)}"


@pytest.mark.parametrize("override", ["epochs=0x10", "epochs=010", "epochs=0o10", "epochs=0b11",
                                      "epochs=1_000", "epochs=1:20", "data.batch_size=1e2"])
def test_an_integer_is_plain_decimal(override: str) -> None:
    key, text = override.split("=")
    assert error_of(override) == f"override {override!r}: {key!r} must be an integer; got {text!r}"


def test_decimal_forms_still_read() -> None:
    cfg = load_config(None, ("epochs=+5", "optim.lr=1e-4", "optim.weight_decay=1.5E3", "model.dropout=.5",
                             "schedule.min_lr=0", "model.sa_radius=[1, 2.5e-1]", "data.root=0x10"))
    assert (cfg.epochs, cfg.optim.lr, cfg.optim.weight_decay, cfg.model.dropout) == (5, 1e-4, 1500.0, 0.5)
    assert cfg.schedule.min_lr == 0.0 and cfg.model.sa_radius == (1.0, 0.25) and cfg.data.root == "0x10"


@pytest.mark.parametrize("overrides, key, allowed, shown", [
    (("dist.timeout=1e300",), "dist.timeout", "in (0, 86400] seconds", "1e+300"),
    (("dist.timeout=86401",), "dist.timeout", "in (0, 86400] seconds", "86401.0"),
    (("schedule.name=step", "schedule.step_epochs=0"), "schedule.step_epochs", ">= 1", "0"),
    (("optim.momentum=-1",), "optim.momentum", "in [0, 1)", "-1.0"),
    (("optim.momentum=1",), "optim.momentum", "in [0, 1)", "1.0"),
    (("optim.weight_decay=-1",), "optim.weight_decay", ">= 0", "-1.0"),
    (("optim.grad_clip=-1",), "optim.grad_clip", ">= 0 (0: no clipping)", "-1.0"),
    (("model.dropout=1.5",), "model.dropout", "in [0, 1)", "1.5"),
    (("model.dropout=1",), "model.dropout", "in [0, 1)", "1.0"),
    (("model.hidden=[64, 0]",), "model.hidden", "a list of widths in [1, 1048576]", "(64, 0)"),
    (("model.hidden=[100000000000]",), "model.hidden", "a list of widths in [1, 1048576]", "(100000000000,)"),
    (("model.hidden=[1048577]",), "model.hidden", "a list of widths in [1, 1048576]", "(1048577,)"),
    (("model.sa_points=[0]",), "model.sa_points", "a list of centroid counts >= 1", "(0,)"),
    (("model.sa_radius=[0.2, -0.4]",), "model.sa_radius", "a list of radii > 0", "(0.2, -0.4)"),
    (("model.sa_samples=0",), "model.sa_samples", ">= 1", "0"),
    (("model.width=0",), "model.width", "in [1, 1048576]", "0"),
    (("model.width=1048577",), "model.width", "in [1, 1048576]", "1048577"),
    (("data.batch_size=16777217",), "data.batch_size", "in [1, 16777216]", "16777217"),
    (("data.eval_batch_size=9223372036854775808",), "data.eval_batch_size", "in [1, 16777216]",
     "9223372036854775808"),
    (("data.eval_batch_size=0",), "data.eval_batch_size", "in [1, 16777216]", "0"),
    (("data.num_workers=100000",), "data.num_workers", "in [0, 1024] (0: load in the main process)", "100000"),
    (("data.num_workers=99999999999999999999",), "data.num_workers", "in [0, 1024] (0: load in the main process)",
     "99999999999999999999"),
    (("model.hidden=[" + "1" * 200 + "]",), "model.hidden", "a list of widths in [1, 1048576]",
     "(" + "1" * 28 + "..." + "1" * 29 + ",)"),  # a value is clipped to 80 characters
    (("seed=99999999999999999999999",), "seed", "in [0, 4294967295]", "99999999999999999999999"),
    (("seed=-1",), "seed", "in [0, 4294967295]", "-1"),
    (("data.split_seed=4294967296",), "data.split_seed", "in [0, 4294967295]", "4294967296"),
    (("data.image_size=0",), "data.image_size", ">= 1", "0"),
    (("data.num_classes=0",), "data.num_classes", ">= 2", "0"),
    (("data.train_size=0",), "data.train_size", ">= 1", "0"),
    (("data.test_size=0",), "data.test_size", ">= 1", "0"),
    (("data.num_points=0",), "data.num_points", ">= 1", "0"),
    (("schedule.warmup_epochs=-1",), "schedule.warmup_epochs", ">= 0", "-1.0"),
    (("schedule.gamma=0",), "schedule.gamma", "> 0", "0.0"),
    (("schedule.min_lr=-0.1",), "schedule.min_lr", ">= 0", "-0.1"),
    (("checkpoint.every_steps=-1",), "checkpoint.every_steps", ">= 0 (0: only at epoch ends)", "-1"),
    (("log.progress_seconds=-1",), "log.progress_seconds", ">= 0", "-1.0"),
    (("perf.comm_probe_steps=-1",), "perf.comm_probe_steps", ">= 0 (0: no probe)", "-1"),
    (("comm.bucket_cap_mb=1e300",), "comm.bucket_cap_mb", "in (0, 1048576] MiB", "1e+300"),
    (("debug.stop_after_epoch=-1",), "debug.stop_after_epoch", ">= 0 (0: never)", "-1"),
    (("debug.stop_after_step=-1",), "debug.stop_after_step", ">= 0 (0: never)", "-1"),
])
def test_values_every_host_would_fail_on_are_refused(overrides: tuple[str, ...], key: str, allowed: str,
                                                     shown: str) -> None:
    assert error_of(*overrides) == f"{DEFAULT_CONFIG} with overrides: {key!r} must be {allowed}; got {shown}"


def test_a_file_reads_numbers_as_overrides_do(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("epochs: 0x10\n")
    assert error_of(path=path) == f"{path}: 'epochs' must be an integer; got '0x10'"
    path.write_text("optim:\n  lr: .inf\n")
    assert error_of(path=path) == f"{path}: 'optim.lr' must be a finite number; got '.inf'"
    path.write_text("optim:\n  lr: '0.05'\n  weight_decay: 5e-4\n")
    assert (load_config(path).optim.lr, load_config(path).optim.weight_decay) == (0.05, 5e-4)


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


@pytest.mark.parametrize("override, line", [
    ("dist.timeout=.inf", "override 'dist.timeout=.inf': 'dist.timeout' must be a finite number; got '.inf'"),
    ("epochs=0x10", "override 'epochs=0x10': 'epochs' must be an integer; got '0x10'"),
    ("schedule.step_epochs=0", f"{DEFAULT_CONFIG} with overrides: 'schedule.step_epochs' must be >= 1; got 0"),
])
def test_check_refuses_in_one_line_with_status_2(override: str, line: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "meshrun.train", "--check", override], cwd=REPO,
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr.splitlines()) == (2, "", [f"train: error: {line}"])


def test_off_is_an_enum_value_not_yaml_false(tmp_path) -> None:
    """YAML 1.1 reads `off` as false; `amp=off` and `amp: off` still mean Precision.OFF."""
    from meshrun.train.config import Precision
    assert load_config(None, ("amp=off",)).amp is Precision.OFF
    path = tmp_path / "c.yaml"
    path.write_text("amp: off\n")
    assert load_config(path).amp is Precision.OFF
