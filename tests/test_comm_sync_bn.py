"""`fab train --comm` and the trainer's `sync_bn: true`: the trainer refuses SyncBatchNorm with
flat DiLoCo (train/config_rules.check_combinations), and `comm.hook=` is added after the
controller's `--check`. So the controller learns sync_bn from `python -m meshrun.train --describe`
(shape-checked), refuses an explicit `--comm diloco|diloco-overlap` in one line before measuring
any link, and `auto` leaves both out, saying so in its reason (console and commplan.json)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from meshrun.deploy.edges import comm
from meshrun.deploy.edges.comm import Gradients, check_comm, choose, described, save_plan
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.run.commplan import Hook, HookSettings, plan, site_links
from meshrun.deploy.run.plan import Workload
from tests.test_commplan import DIGITS, WIDE
from tests.test_commplan_sites import SITES, matrix
from tests.trainer.harness import REPO, clean_env

DIGITS_SETTINGS = HookSettings(powersgd_rank=4, localsgd_period=4, diloco_inner_steps=8)  # digits.yaml's
DIGITS_SHAPES = tuple(tuple(s) for s in DIGITS)
FAR = HookSettings(powersgd_rank=4, localsgd_period=4, diloco_inner_steps=64)  # `far`: 50 Mbit/s, 150 ms
REFUSED = ("--comm {} and sync_bn true (the trainer's config with its overrides) do not go together: "
           "SyncBatchNorm would communicate at every inner step; pass sync_bn=false after -- (the outer step "
           "averages BatchNorm statistics) or use --comm hier (SyncBatchNorm inside each site)")
LEFT_OUT = "sync_bn true leaves out diloco {0} and diloco-overlap {0} (SyncBatchNorm would communicate at every " \
           "inner step); "


# --- what --describe answers, and what the controller accepts of it

def test_describe_answers_sync_bn_beside_the_shapes_and_the_controller_reads_it() -> None:
    done = subprocess.run([sys.executable, "-m", "meshrun.train", "--describe", "sync_bn=true"], cwd=REPO,
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout.splitlines()[-1])
    assert sorted(info) == ["comm", "gradient_bytes", "parameters", "shapes", "sync_bn"]
    assert (info["sync_bn"], info["shapes"]) == (True, DIGITS)
    assert comm.describe(Workload(args=("sync_bn=true",)), REPO) == \
        Gradients(DIGITS_SHAPES, dataclasses.replace(DIGITS_SETTINGS, sync_bn=True))
    assert comm.describe(Workload(), REPO) == Gradients(DIGITS_SHAPES, DIGITS_SETTINGS)


GOOD = {"parameters": 10, "gradient_bytes": 40, "shapes": [[2, 4], [2]], "sync_bn": False,
        "comm": {"hook": "none", "powersgd_rank": 2, "localsgd_period": 3, "diloco_inner_steps": 5,
                 "diloco_wire_dtype": "bf16"}}


def test_a_sound_describe_answer_gives_every_setting() -> None:
    assert described(GOOD) == Gradients(((2, 4), (2,)), HookSettings(2, 3, 5, diloco_wire_bytes=2))
    assert described({**GOOD, "sync_bn": True}) == \
        Gradients(((2, 4), (2,)), HookSettings(2, 3, 5, diloco_wire_bytes=2, sync_bn=True))


@pytest.mark.parametrize("bad", [
    [], "x", {k: v for k, v in GOOD.items() if k != "sync_bn"},  # an answer without sync_bn: auto could pick diloco
    {**GOOD, "sync_bn": "true"}, {**GOOD, "sync_bn": 1}, {**GOOD, "shapes": [[2, -4]]},
    {**GOOD, "shapes": [[True]]}, {**GOOD, "shapes": [2]}, {**GOOD, "shapes": {}}, {**GOOD, "comm": []},
    {**GOOD, "comm": {**GOOD["comm"], "powersgd_rank": 0}}, {**GOOD, "comm": {**GOOD["comm"], "localsgd_period": 2.5}},
    {**GOOD, "comm": {**GOOD["comm"], "diloco_inner_steps": None}},
    {**GOOD, "comm": {**GOOD["comm"], "diloco_wire_dtype": "fp8"}},
    {**GOOD, "comm": {**GOOD["comm"], "diloco_wire_dtype": ["bf16"]}},
])
def test_a_describe_answer_of_another_shape_is_refused(bad: object) -> None:
    assert described(bad) is None


def test_describe_of_another_shape_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a process from another meshrun answers so; none can be had here, so run's answer is made."""
    answer = subprocess.CompletedProcess([], 0, json.dumps({**GOOD, "sync_bn": None}) + "\n", "")
    monkeypatch.setattr(comm.subprocess, "run", lambda *a, **k: answer)
    with pytest.raises(MeshrunError) as info:
        comm.describe(Workload(), REPO)
    assert str(info.value) == (f"--comm: `python -m meshrun.train --describe` answered no JSON of the shape this "
                               f"controller reads (is its meshrun this one?); try it locally: {sys.executable} "
                               "-m meshrun.train --describe")


# --- an explicit --comm: one line, before any link is measured

@pytest.mark.parametrize("hook", ["diloco", "diloco-overlap"])
def test_explicit_diloco_with_sync_bn_is_one_line_naming_both(hook: str) -> None:
    with pytest.raises(InputError) as info:
        check_comm(hook, Workload(args=("sync_bn=true",)), REPO)
    assert str(info.value) == REFUSED.format(hook)


def test_the_other_hooks_and_the_users_own_override_go_with_sync_bn() -> None:
    with_bn = Gradients(DIGITS_SHAPES, dataclasses.replace(DIGITS_SETTINGS, sync_bn=True))
    assert check_comm("hier", Workload(args=("sync_bn=true",)), REPO) == with_bn
    assert check_comm("auto", Workload(args=("sync_bn=true",)), REPO) == with_bn
    # `-- comm.hook=none` comes after the added `comm.hook=diloco` and wins, on every rank as here.
    assert check_comm("diloco", Workload(args=("sync_bn=true", "comm.hook=none")), REPO) == with_bn
    assert check_comm("diloco", Workload(), REPO) == Gradients(DIGITS_SHAPES, DIGITS_SETTINGS)


def test_choose_refuses_before_measuring_any_link(monkeypatch: pytest.MonkeyPatch) -> None:
    """No selection and no sessions: measuring a link would fail on them, so the refusal came first."""
    def measured(*_: object) -> None:
        raise AssertionError("links measured")

    monkeypatch.setattr(comm, "measure_links", measured)
    with pytest.raises(InputError) as info:
        choose("diloco", None, {}, Workload(args=("sync_bn=true",)), REPO, None)  # type: ignore[arg-type]
    assert str(info.value) == REFUSED.format("diloco")


def test_fab_train_refuses_before_contacting_any_host(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fab train --comm diloco -- sync_bn=true`: one line before any session opens, any code is
    synced or any record is written (the project's own checks run first, as for every flag)."""
    from meshrun.deploy.commands import train as train_cmd
    from meshrun.deploy.project import Project
    from meshrun.deploy.render.console import Renderer

    def contacted(*_: object, **__: object) -> None:
        raise AssertionError("a host was contacted")

    root = tmp_path / "project"
    root.mkdir()
    (root / "hosts.yaml").write_text("hosts:\n  h1: {address: 192.0.2.1}\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for name in ("sessions_to", "sync_code", "preflight"):
        monkeypatch.setattr(train_cmd, name, contacted)
    request = train_cmd.TrainRequest(str(root / "hosts.yaml"), None, Workload(args=("sync_bn=true",)), comm="diloco")
    with pytest.raises(InputError) as info:
        train_cmd.train(request, Renderer(), Project(root, tmp_path / "runs"))
    assert str(info.value) == REFUSED.format("diloco")
    assert not (tmp_path / "runs").exists()


# --- auto: diloco left out, and the reason says so

def test_auto_leaves_diloco_out_when_nothing_else_fits() -> None:
    """`far`: without sync_bn diloco is the one hook that fits; with it, the lowest other floor."""
    args = (6_250_000.0, 3, WIDE)
    without = plan(*args, FAR, budget_s=0.05, rtt_s=0.150)
    got = plan(*args, dataclasses.replace(FAR, sync_bn=True), budget_s=0.05, rtt_s=0.150)
    assert without.recommended is Hook.DILOCO
    assert got == dataclasses.replace(
        without, recommended=Hook.LOCALSGD,
        reason="4.51 MB of gradients, 3 nodes, 50.0 Mbit/s per node, RTT 150.0 ms: " + LEFT_OUT.format("19.7 ms")
               + "no other hook fits the budget 50.0 ms per step; localsgd has the lowest floor, 315.3 ms")


def test_auto_on_a_fast_link_still_says_what_it_left_out() -> None:
    without = plan(125_000_000.0, 3, DIGITS, DIGITS_SETTINGS)
    got = plan(125_000_000.0, 3, DIGITS, dataclasses.replace(DIGITS_SETTINGS, sync_bn=True))
    assert got == dataclasses.replace(
        without, reason="0.20 MB of gradients, 3 nodes, 1000.0 Mbit/s per node, RTT 0.0 ms: "
                        + LEFT_OUT.format("0.3 ms") + "none 2.2 ms <= budget 50.0 ms per step")


def test_auto_keeps_hier_with_sync_bn() -> None:
    """hier runs SyncBatchNorm inside each site (docs/sites.md): still a candidate."""
    sites = site_links(matrix(SITES), SITES)
    without = plan(125e6, 3, DIGITS, DIGITS_SETTINGS, budget_s=0.05, rtt_s=0.0005, sites=sites)
    got = plan(125e6, 3, DIGITS, dataclasses.replace(DIGITS_SETTINGS, sync_bn=True), budget_s=0.05, rtt_s=0.0005,
               sites=sites)
    assert got == dataclasses.replace(without, reason=(
        "0.20 MB of gradients, 3 nodes (2 sites of 2+1, between them 20.0 Mbit/s, RTT 40.0 ms; inside 1000.0 "
        "Mbit/s, RTT 0.5 ms), 20.0 Mbit/s per node, RTT 40.0 ms: " + LEFT_OUT.format("23.6 ms")
        + "none 188.4 ms > budget; fp16 134.2 ms > budget; powersgd 168.0 ms > budget; hier 17.8 ms (2.7 ms "
        "inside + 15.2 ms between) <= budget 50.0 ms per step"))
    assert got.recommended is Hook.HIER


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)

    def warn(self, message: str) -> None:
        self.lines.append(f"WARN {message}")


def test_auto_with_sync_bn_on_the_console_and_in_commplan_json(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """choose, with the links a stand-in: three hosts on `far` links (none can be had here)."""
    links = tuple((a, b, 50.0, 150.0) for a in ("h1", "h2", "h3") for b in ("h1", "h2", "h3") if a != b)
    monkeypatch.setattr(comm, "measure_links", lambda selection, sessions: (6_250_000.0, 0.150, links))
    hosts = tuple(SimpleNamespace(name=n, site=None) for n in ("h1", "h2", "h3"))
    gradients = Gradients(tuple(tuple(s) for s in WIDE), dataclasses.replace(FAR, sync_bn=True))
    said = Lines()
    workload, got = choose("auto", SimpleNamespace(hosts=hosts), {}, Workload(args=("sync_bn=true",)), REPO,
                           said, gradients)  # type: ignore[arg-type]
    reason = ("4.51 MB of gradients, 3 nodes, 50.0 Mbit/s per node, RTT 150.0 ms: " + LEFT_OUT.format("19.7 ms")
              + "no other hook fits the budget 50.0 ms per step; localsgd has the lowest floor, 315.3 ms")
    assert said.lines == [f"comm: auto: {reason}: comm.hook=localsgd"]
    assert workload.args == ("comm.hook=localsgd", "sync_bn=true")
    saved = json.loads(save_plan(tmp_path, "r1", got, "localsgd").read_text())
    assert (saved["hook"], saved["recommended"], saved["reason"]) == ("localsgd", "localsgd", reason)
