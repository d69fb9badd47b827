"""`fab train --comm`: the trainer's `dist.timeout` (60 s by default) against the chosen hook's
largest collective at the measured link (slow-links finding 3): raised by a `dist.timeout=`
override with one INFO line, or a WARN naming the value when the user set it; recorded in
commplan.json. The numbers are the finding's, by exact equality (the floors' own arithmetic)."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import pytest

from meshrun.deploy.edges import comm
from meshrun.deploy.edges.comm import (Gradients, RunTimeout, choose, run_timeout, save_plan, timeout_advice,
                                       timeout_line)
from meshrun.deploy.run.commplan import (Collective, Hook, HookSettings, TimeoutAdvice, largest_collective, plan,
                                         site_links)
from meshrun.deploy.run.plan import Workload, trainer_args
from meshrun.deploy.run.workload import resumed_work
from tests.test_comm_sync_bn import Lines
from tests.test_commplan import WIDE
from tests.test_commplan_sites import matrix

# torchvision's vit_b_16: 86,567,656 parameters, 346.27 MB of fp32 gradients
VIT_LAYER = [[768], [768], [2304, 768], [2304], [768, 768], [768], [768], [768], [3072, 768], [3072], [768, 3072],
             [768]]
VIT_B_16 = [[768, 3, 16, 16], [768], [1, 1, 768], [1, 197, 768], *VIT_LAYER * 12, [768], [768], [1000, 768], [1000]]
VIT = 346_270_624
RESNET50, RESNET101 = [[25_557_032]], [[44_549_160]]  # only their size matters to these collectives
S = HookSettings(powersgd_rank=4, localsgd_period=4, diloco_inner_steps=8)
HOME, HOME_50, RTT = 2.5e6, 6.25e6, 0.040  # 20 Mbit/s, 50 Mbit/s; 40 ms
BUCKETS = 14  # ceil(VIT / 25 MiB): one latency term each


def largest(shapes: list[list[int]], hook: Hook, nodes: int, b: float = HOME,
            settings: HookSettings = S) -> Collective:
    return largest_collective(plan(b, nodes, shapes, settings, rtt_s=RTT), hook, settings)


def test_vit_b_16_shapes_are_its_size() -> None:
    assert plan(HOME, 2, VIT_B_16, S).gradient_bytes == VIT


def test_auto_on_vit_b_16_picks_powersgd_whose_warm_up_step_takes_139_s() -> None:
    got = plan(HOME, 2, VIT_B_16, S, rtt_s=RTT)
    assert got.recommended is Hook.POWERSGD  # floor 2.5 s: the lowest, nothing fits 50 ms
    warm_up = largest_collective(got, Hook.POWERSGD, S)
    assert warm_up == Collective("a powersgd warm-up step (full all-reduce)", VIT, HOME,
                                 2 * 1 / 2 * VIT / HOME + BUCKETS * 1 * RTT)
    assert round(warm_up.seconds) == 139
    assert round(largest(VIT_B_16, Hook.POWERSGD, 4).seconds) == 209  # the finding's 208 s, latency included


def test_the_init_broadcast_is_the_largest_for_a_halved_gradient() -> None:
    """fp16 sends S/2 a step, DDP's initial broadcast all of S: resnet101 71 s, resnet50 41 s at 20 Mbit."""
    assert largest(RESNET101, Hook.FP16, 2) == Collective("DDP's initial broadcast of the parameters",
                                                           178_196_640, HOME, 178_196_640 / HOME)
    assert round(largest(RESNET101, Hook.FP16, 2).seconds) == 71
    assert round(largest(RESNET50, Hook.NONE, 2).seconds) == 41  # 2 nodes: the ring's step adds its latency only
    assert largest(RESNET50, Hook.NONE, 2).what == "a full-gradient all-reduce step"


@pytest.mark.parametrize("shapes, nodes, b, seconds", [
    (RESNET50, 4, HOME, 62), (VIT_B_16, 2, HOME, 139), (VIT_B_16, 4, HOME, 209), (VIT_B_16, 4, HOME_50, 85)])
def test_diloco_outer_all_reduce_takes_the_findings_seconds(shapes: list[list[int]], nodes: int, b: float,
                                                            seconds: int) -> None:
    got = largest(shapes, Hook.DILOCO, nodes, b)
    full = 4 * sum(math.prod(s) for s in shapes)
    buckets = -(-full // (25 * 2**20))
    assert got == Collective("diloco's outer all-reduce", float(full), b,
                             2 * (nodes - 1) / nodes * full / b + buckets * (nodes - 1) * RTT)
    assert round(got.seconds) == seconds


def test_a_bf16_wire_halves_the_outer_all_reduce_and_the_broadcast_is_then_the_largest() -> None:
    bf16 = dataclasses.replace(S, diloco_wire_bytes=2)
    assert largest(VIT_B_16, Hook.DILOCO_OVERLAP, 4, settings=bf16) == \
        Collective("DDP's initial broadcast of the parameters", VIT, HOME, VIT / HOME)
    assert largest(VIT_B_16, Hook.DILOCO_OVERLAP, 4).what == "diloco-overlap's outer all-reduce"  # fp32: 1.5 S / B


def test_hier_is_judged_on_its_outer_all_reduce_between_sites() -> None:
    sites = {"a1": "office", "a2": "office", "b1": "home"}  # 1000 Mbit/s inside, 20 Mbit/s 40 ms between
    got = plan(125e6, 3, VIT_B_16, S, rtt_s=0.0005, sites=site_links(matrix(sites), sites))
    assert largest_collective(got, Hook.HIER, S) == \
        Collective("hier's outer all-reduce between sites", VIT, HOME, 2 * 1 / 2 * VIT / HOME + 1 * RTT)


def test_the_advice_raises_a_default_timeout_and_only_warns_on_the_users() -> None:
    c = largest(VIT_B_16, Hook.POWERSGD, 2)
    assert timeout_advice(c, 60.0, False) == TimeoutAdvice(c, 60.0, False, 418, 418)
    assert timeout_advice(c, 60.0, True) == TimeoutAdvice(c, 60.0, True, 418, None)
    assert timeout_advice(c, 418.0, False) == TimeoutAdvice(c, 418.0, False, 418, None)  # enough already
    assert timeout_line(timeout_advice(c, 418.0, True)) == ""
    huge = dataclasses.replace(c, seconds=40_000.0)
    # the need said (the trainer's bound), the controller's raise capped at AUTO_RAISE_MAX_S
    assert timeout_advice(huge, 60.0, False) == TimeoutAdvice(huge, 60.0, False, 86_400, 1800)


WHY = ("the largest collective, a powersgd warm-up step (full all-reduce), 346.3 MB over the slowest link "
       "(20.0 Mbit/s), takes about 139 s")
NAMED = WHY.replace("(20.0 Mbit/s)", "(20.0 Mbit/s on h1 -> h2, h2 -> h1; round trip 40.0 ms on h1 -> h2, h2 -> h1)")


def test_the_lines_say_why_and_name_the_number() -> None:
    c = largest(VIT_B_16, Hook.POWERSGD, 2)
    assert timeout_line(timeout_advice(c, 60.0, False)) == \
        f"dist.timeout raised to 418 s: {WHY} (3x that; --timeout sets another)"
    assert timeout_line(timeout_advice(c, 100.0, True), "--timeout ") == \
        f"dist.timeout 100 s is under 3x {WHY}: the run may stop with a collective timeout; set --timeout 418"
    assert timeout_line(timeout_advice(c, 100.0, True), "dist.timeout=").endswith("; set dist.timeout=418")


def test_the_runs_timeout_is_the_users_last_override_else_timeout() -> None:
    assert run_timeout(Workload(), 60, False) == RunTimeout(60.0, False, "--timeout ")
    assert run_timeout(Workload(), 300, True) == RunTimeout(300.0, True, "--timeout ")
    assert run_timeout(Workload(), None, False) == RunTimeout(60.0, True, "--timeout ")  # not said: maybe typed
    # after --, the user's own override follows the controller's dist.timeout=<--timeout> and wins
    args = ("dist.timeout=100", "optim.lr=0.1", "dist.timeout=250")
    assert run_timeout(Workload(args=args), 60, False) == RunTimeout(250.0, True, "dist.timeout=")


def chosen(monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...] = (), bandwidth: float | None = HOME,
           shapes: list[list[int]] = VIT_B_16, **timeout: object) -> tuple[Workload, object, list[str]]:
    """choose, with the links a stand-in: two hosts on a 20 Mbit/s, 40 ms link (none can be had here)."""
    links = (("h1", "h2", 20.0, 40.0), ("h2", "h1", 20.0, 40.0)) if bandwidth else ()
    monkeypatch.setattr(comm, "measure_links", lambda selection, sessions: (bandwidth, RTT, links))
    hosts = tuple(SimpleNamespace(name=n, site=None) for n in ("h1", "h2"))
    said = Lines()
    gradients = Gradients(tuple(tuple(s) for s in shapes), S)
    selection = SimpleNamespace(hosts=hosts)
    workload, got = choose("auto", selection, {}, Workload(args=args), None, said, gradients,  # type: ignore[arg-type]
                           **timeout)  # type: ignore[arg-type]
    return workload, got, said.lines


def test_a_resume_retimes_the_controllers_raise_and_keeps_the_users_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """stop51 #4: the raise, recorded in launch.json's args, beat a resume's --timeout (last override wins)
    and a resumed --comm took it for the user's own. Records made by the real `choose`."""
    raised, _, _ = chosen(monkeypatch, ("optim.lr=0.1",), timeout_s=60)
    typed = resumed_work("R", raised, 60, Workload(), 900, new_comm=False)
    assert trainer_args(typed.workload, typed.pg_timeout_s) == [
        "dist.timeout=900", "comm.hook=powersgd", "optim.lr=0.1"]  # the typed --timeout, and the hook kept
    again = resumed_work("R", raised, 60, Workload(), None, new_comm=True)
    assert again.workload.args == ("optim.lr=0.1",)
    assert run_timeout(again.workload, again.pg_timeout_s, False) == RunTimeout(60.0, False, "--timeout ")
    assert chosen(monkeypatch, again.workload.args, timeout_s=60)[0].args == raised.args  # raised anew, as at first
    plain = resumed_work("R", raised, 60, Workload(), None, new_comm=False)
    assert plain.workload.args == raised.args  # neither: the run's raise still stands (under the cap)
    own, _, _ = chosen(monkeypatch, ("dist.timeout=100",), timeout_s=60)  # the user's, never raised
    assert own.args == ("comm.hook=powersgd", "dist.timeout=100")
    for comm_again, timeout in ((True, None), (False, 900)):
        assert "dist.timeout=100" in resumed_work("R", own, 60, Workload(), timeout, comm_again).workload.args


def test_auto_on_vit_b_16_passes_a_raised_timeout_says_why_and_records_it(tmp_path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    workload, got, lines = chosen(monkeypatch, ("optim.lr=0.1",), timeout_s=60)
    assert workload.args == ("dist.timeout=418", "comm.hook=powersgd", "optim.lr=0.1")  # the raise before the hook
    assert lines[-1] == f"comm: dist.timeout raised to 418 s: {NAMED} (3x that; --timeout sets another)"
    saved = json.loads(save_plan(tmp_path, "r1", got, "powersgd").read_text())  # type: ignore[arg-type]
    assert saved["timeout"] == {"collective": {"what": "a powersgd warm-up step (full all-reduce)", "nbytes": VIT,
                                               "bandwidth_bytes_s": HOME, "seconds": VIT / HOME + 14 * RTT},
                                "timeout_s": 60.0, "user_set": False, "needed_s": 418, "raised_to": 418}
    _, _, resumed = chosen(monkeypatch, timeout_s=300)  # a resumed run's recorded --timeout, not typed now
    assert resumed[-1].startswith("comm: dist.timeout raised to 418 s")


def test_a_users_own_timeout_is_kept_with_a_warn(monkeypatch: pytest.MonkeyPatch) -> None:
    workload, got, lines = chosen(monkeypatch, ("dist.timeout=100",))
    assert workload.args == ("comm.hook=powersgd", "dist.timeout=100")
    assert lines[-1] == f"WARN comm: dist.timeout 100 s is under 3x {NAMED}: the run may stop with a collective " \
                        "timeout; set dist.timeout=418"
    workload, _, lines = chosen(monkeypatch, timeout_s=100, timeout_given=True)
    assert workload.args == ("comm.hook=powersgd",)
    assert lines[-1].startswith("WARN comm: dist.timeout 100 s is under 3x") and lines[-1].endswith("--timeout 418")
    workload, _, lines = chosen(monkeypatch)  # a caller that does not say the --timeout: never raised over
    assert workload.args == ("comm.hook=powersgd",) and lines[-1].startswith("WARN comm: dist.timeout 60 s is under")


def test_nothing_is_raised_on_a_fast_link_or_without_a_measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    workload, got, lines = chosen(monkeypatch, bandwidth=125e6, shapes=WIDE, timeout_s=60)
    assert len(workload.args) == 1 and not any("dist.timeout" in line for line in lines)  # the hook alone
    assert got.timeout is not None and got.timeout.raised_to is None  # type: ignore[attr-defined]
    workload, got, _ = chosen(monkeypatch, bandwidth=None)  # one host, or local: no guess without a measurement
    assert (workload.args, got) == (("comm.hook=none",), None)


@pytest.mark.parametrize("typed, expected", [(None, (60, False)), (120, (120, True))])
def test_fab_train_tells_the_plan_whether_the_timeout_was_typed(typed: int | None, expected: tuple) -> None:
    """A typed --timeout is the user's: `--comm` warns instead of raising it (deploy/commands/train.py)."""
    from meshrun.deploy.commands import train
    from meshrun.deploy.render.console import Renderer

    request = train.TrainRequest(None, None, Workload(), pg_timeout_s=typed)
    done = train._with_resumed_defaults(request, SimpleNamespace(), Renderer())
    assert (done.pg_timeout_s, done.timeout_given) == expected


def test_the_train_task_puts_each_flag_in_its_field(monkeypatch: pytest.MonkeyPatch) -> None:
    """`fab train`'s flags reach the request by name: a field added to TrainRequest shifted them once
    (the idle policy landed in `every_checkpoint`'s place and every run failed as an internal error)."""
    from meshrun.deploy import tasks
    from meshrun.deploy.commands import train

    seen: list = []
    monkeypatch.setattr(train, "main", lambda request, project: seen.append(request) or 0)
    monkeypatch.setattr(tasks, "remainder", lambda: ())
    monkeypatch.setattr(tasks, "_project", lambda project, runs_dir, writes=False: None)
    monkeypatch.setattr(tasks, "_exit", lambda code: None)
    tasks.train.body(None, hosts="h1,h2", inventory="inv.yaml", nnodes="1:2", timeout="120", detach=True,
                     skip_checks=True, no_sync=True, resume="R", comm="auto", firewall=True, notify=["n"],
                     every_checkpoint=True)
    request = seen[0]
    assert (request.inventory, request.hosts, request.nnodes, request.pg_timeout_s, request.detach,
            request.skip_checks, request.no_sync, request.resume, request.comm, request.firewall, request.notify,
            request.every_checkpoint, request.timeout_given) == \
        ("inv.yaml", "h1,h2", "1:2", 120, True, True, True, "R", "auto", True, ("n",), True, False)
    assert type(request.idle).__name__ == "IdlePolicy"
