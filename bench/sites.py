"""P9: hierarchical synchronisation on two sites (issue 22, docs/sites.md).

3 simulated hosts (tests/testbed, needs root; `--hosts 4` for 2 + 2), one process each, declared
as sites: the first half (rounded up) `office`, the rest `home`, as the test bed's `two-site`
profile places them: inside a site the unshaped LAN, every packet between the sites shaped and
delayed as `home` (20 Mbit/s, 40 ms RTT). The job,
H = 32 and the target are bench/wan.py's (an MLP with 4.55 MB of fp32 gradients whose optimizer
step computes ~100 ms on 2 shared cores, target test accuracy 0.96).

- P9: time to the target (train + eval seconds of the epochs until the first at or above it) on
  `two-site` ÷ the same method on `lan`, for plain DDP (`none`), flat `diloco-overlap` and
  `hier`. Goal: hier <= 1.1 and better than flat DiLoCo-overlap, its final accuracy on lan within
  1 point of plain DDP's on lan. A method `hier+bf16` (or `diloco-overlap+bf16`) is that hook with
  `comm.diloco_wire_dtype=bf16`: the pseudo-gradient crosses between sites in half the bytes.
  `none` on two-site crosses the 20 Mbit/s link every step (~11 min
  an epoch, as on home): by default it runs a short epoch that gives its bytes per step, and has
  no ratio (`--none-to-target` runs it to the target).
  Without `--none-to-target`, `none`'s time to the target on two-site is bounded from below:
  the optimizer steps it took on lan (a profile changes timing, not arithmetic) × the fastest of
  its steps measured on two-site (rank 0's per-step records), eval excluded; its ratio is `>=`.
- Bytes between sites per optimizer step: what the office hosts received from the home hosts over
  the training phase (the byte counters of the test bed's delay chain, which holds exactly the
  packets from the other site) ÷ optimizer steps: one direction, the same both ways for these
  all-reduces.
- `--comm auto`'s decision on the same profile: every two-site run is started with
  `fab train --comm METHOD`, which measures the links (check-network's pairwise probe), sizes
  the job's gradients and records in `runs/<run_id>/commplan.json` the floors and the hook
  `auto` would choose (`recommended`, deploy/run/commplan.py) — one decision per run.

Ends with the line `P9 best: METHOD RATIO; fastest on two-site: METHOD SECONDS; auto: METHOD (...)`,
saying whether auto's choice is P9's best (by ratio) and the method that reached the target first
on two-site (by seconds), else how many seconds behind it.
With `--repeats K` every method but `none` runs K times on each profile, its order reversed from one
repetition to the next, and the table holds the means (and each run's time): one run of each cannot
separate methods 5 % apart on 2 shared cores.
`--profile two-site-far` puts the sites `far` apart (50 Mbit/s, 150 ms RTT) instead; the table
and the last line then name that profile.
`--profile three-site --hosts 5` puts office h1, h2 | lab h3, h4 | home h5 in three places, home
apart from each other (the outer all-reduce rings three representatives).

Usage: sudo .venv/bin/python bench/sites.py [--hosts 3] [--epochs 3] [--methods none,diloco-overlap,hier,hier+bf16]
                                            [--profile two-site|two-site-far|three-site]
                                            [--none-to-target] [--repeats K]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.wan import HOSTS, STEPS_PER_EPOCH, TARGET, Run, hook_of, run_all  # noqa: E402
from tests.testbed import SimCluster  # noqa: E402
from tests.testbed.latency import lookup  # noqa: E402
from tests.testbed.lock import exclusive  # noqa: E402

METHODS = "none,diloco-overlap,hier"
GOAL = 1.1


SITE_NAMES = {2: ("office", "home"), 3: ("office", "lab", "home")}


def sites(hosts: int, places: int = 2) -> dict[str, str]:
    """h1..hN by site as the test bed's profile of `places` places puts them (latency.places):
    contiguous, the first ones rounded up; two: `office`, `home`; three: `office`, `lab`, `home`."""
    size = -(-hosts // places)
    return {f"h{i}": SITE_NAMES[places][(i - 1) // size] for i in range(1, hosts + 1)}


def between_per_step(run: Run, hosts: int, places: int = 2) -> float:
    """Bytes per optimizer step the office hosts received from the other sites (the delay chain's
    counters)."""
    office = [i for i, site in enumerate(sites(hosts, places).values()) if site == "office"]
    return sum(run.delayed_rx_per_step[i] for i in office)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=HOSTS, help="simulated hosts, >= 3 (4: office 2 + home 2)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs on lan (two-site runs stop at the target)")
    parser.add_argument("--methods", default=METHODS)
    parser.add_argument("--none-to-target", action="store_true")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run each method (but none) K times on each profile, in alternating order; "
                             "the table holds the means")
    parser.add_argument("--profile", default="two-site", choices=("two-site", "two-site-far", "three-site"),
                        help="the sites' link: home (two-site) or far; three-site: three places, home apart")
    parser.add_argument("--wait", type=float, default=900, help="seconds to wait for the test bed lock")
    args = parser.parse_args()
    methods, hosts, places = args.methods.split(","), args.hosts, lookup(args.profile).sites
    if hosts < places + 1:
        parser.error(f"--hosts: at least {places + 1} on {args.profile} (a site of two hosts, or hier is flat DiLoCo)")
    if args.repeats < 1:
        parser.error("--repeats: at least 1")
    cluster = SimCluster("/tmp/meshrun-testbed")
    started = time.time()
    runs: list[Run] = []
    with exclusive(timeout=args.wait):
        cluster.up(hosts)
        try:
            inventory = cluster.write_inventory(Path("/tmp/meshrun-bench-sites.yaml"),
                                                host_overrides={h: {"site": s} for h, s in sites(hosts, places).items()})
            for order in repeated(methods, args.repeats):
                runs += run_all(cluster, inventory, [("lan", order), (args.profile, order)], args.epochs,
                                args.none_to_target, show(hosts, places), extra=flags, hosts=hosts, synced=bool(runs))
        finally:
            cluster.down()
    print(f"bench total {time.time() - started:.0f} s")
    report(runs, methods, hosts, args.profile, places)
    return 0


def repeated(methods: list[str], repeats: int) -> list[list[str]]:
    """The methods' order in each repetition: as given, then reversed, and so on (a drift of the
    machine over the bench weighs on every method alike); `none`, the accuracy baseline whose
    two-site time is a bound, runs in the first only."""
    timed = [m for m in methods if m != "none"]
    return [methods] + [timed[::-1] if k % 2 else timed for k in range(1, repeats)]


def flags(profile: str, method: str) -> list[str]:
    """Each two-site run starts with `--comm METHOD` (which records auto's choice in commplan.json)."""
    return [] if profile == "lan" else ["--comm", hook_of(method), *(["perf.every_steps=1"] if method == "none" else [])]


def show(hosts: int, places: int = 2) -> Callable[[Run], str]:
    return lambda run: (f"to {TARGET:.2f}: {run.time_to_target} (epoch {run.hit_epoch}), final "
                        f"{run.final_acc:.4f}, step {run.step_s * 1e3:.1f} ms, into office "
                        f"{between_per_step(run, hosts, places) / 1e3:.0f} kB/step ({run.wall_s:.0f} s)")


def mean(values: list[float | None]) -> float | None:
    """The mean, or None when any run did not reach the target (a mean that hides a miss is wrong)."""
    return None if not values or any(v is None for v in values) else sum(values) / len(values)  # type: ignore[arg-type]


def none_bound(lan: Run, two_site: Run) -> float | None:
    """A lower bound on `none`'s time to the target on two-site from its short run: lan's steps to
    the target × the fastest two-site step measured (eval excluded). None without them."""
    if lan.hit_epoch is None or not two_site.step_times:
        return None
    return lan.hit_epoch * (lan.steps // max(1, lan.epochs_run)) * min(two_site.step_times)


def auto_choices(runs: list[Run], profile: str) -> list[tuple[str, str]]:
    """(recommended, reason) of each two-site run's commplan.json (`fab train --comm`)."""
    out = []
    for run in runs:
        path = REPO / "runs" / run.run_id / "commplan.json"
        if run.shape == profile and run.run_id and path.is_file():
            saved = json.loads(path.read_text())
            out.append((saved["recommended"], saved["reason"]))
    return out


def report(runs: list[Run], methods: list[str], hosts: int, profile: str = "two-site", places: int = 2) -> None:
    by: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        by.setdefault((run.shape, run.hook), []).append(run)
    base = by.get(("lan", "none"), [None])[0]
    placed = sites(hosts, places)
    where = " | ".join(f"{site} {', '.join(h for h, s in placed.items() if s == site)}" for site in SITE_NAMES[places])
    repeats = max(len(v) for v in by.values()) if by else 0
    print(f"\nP9: time to test accuracy {TARGET:.2f}, {profile} ÷ lan, {hosts} hosts ({where}); "
          f"goal: hier <= {GOAL} and below diloco-overlap, within 1 point of none on lan"
          + (f"; means of {repeats} runs of each method (but none) on each profile" if repeats > 1 else ""))
    print(f"{'method':>14}  {'lan s':>6}  {profile + ' s':>10}  {'ratio':>7}  {'final acc':>9}  {'Δ vs none':>9}  "
          f"{'between kB/step':>15}  {'sync s lan/' + profile:>19}")
    rows: list[tuple[str, float, float, bool]] = []  # (method, the sites' profile s, ratio, a lower bound)
    for method in methods:
        lan, two_site = by.get(("lan", method)), by.get((profile, method))
        if not lan or not two_site:
            continue
        a_s, two, bound = mean([r.time_to_target for r in lan]), mean([r.time_to_target for r in two_site]), False
        if two is None and method == "none":
            two, bound = none_bound(lan[0], two_site[0]), True
        ratio = two / a_s if a_s and two else None
        delta = (lan[0].final_acc - base.final_acc) * 100 if base else float("nan")
        ge = ">=" if bound else ""
        between = sum(between_per_step(r, hosts, places) for r in two_site) / len(two_site)
        two_sync = None if bound else mean([r.sync_to_target for r in two_site])
        print(f"{method:>14}  {_f(a_s):>6}  {ge + _f(two):>10}  "
              f"{(ge + f'{ratio:.2f}' if ratio else '-'):>7}  {lan[0].final_acc:>9.4f}  {_delta(delta) if base else '-':>9}  "
              f"{between / 1e3:>15.0f}  {_f(mean([r.sync_to_target for r in lan])) + '/' + _f(two_sync):>19}")
        if len(lan) > 1:
            print(f"{'':>14}  each run: lan {', '.join(_f(r.time_to_target) for r in lan)}; {profile} "
                  f"{', '.join(_f(r.time_to_target) for r in two_site)}")
        if ratio is not None and two is not None and (base is None or delta >= -1.0):  # no `none` run: not compared
            rows.append((method, two, ratio, bound))
    print(f"between kB/step: bytes per optimizer step the office received from the other sites on {profile} (the "
          "test bed's delay-chain counters: one direction)")
    print("sync s: of the time to the target, making the replicas one model before each evaluation (DiLoCo and "
          "hier: the rounds in flight cross the links; epoch records' sync_seconds)")
    if any(bound for *_, bound in rows):
        print(f"none on {profile}: a lower bound (steps to the target on lan × its fastest {profile} step; "
              f"{STEPS_PER_EPOCH}-step epochs not run to the target: --none-to-target)")
    choices = auto_choices(runs, profile)
    for hook, reason in sorted(set(choices)):
        print(f"auto on {profile} ({choices.count((hook, reason))} run(s)): {hook} ({reason})")
    print(last_line(rows, [hook for hook, _ in choices], profile))


def last_line(rows: list[tuple[str, float, float, bool]], auto: list[str], profile: str = "two-site") -> str:
    """`P9 best: METHOD RATIO; fastest on two-site: METHOD S; auto: METHOD (...)`: whether auto's
    choice is P9's best (by ratio) and the fastest on two-site (by seconds); a bound only rules a
    method out when it exceeds a measured one."""
    measured = [r for r in rows if not r[3]]
    best = min(measured, key=lambda r: r[2], default=None)
    fastest = min(measured, key=lambda r: r[1], default=None)
    open_ = [r[0] for r in rows if r[3] and fastest is not None and r[1] < fastest[1]]
    text = f"P9 best: {best[0]} {best[2]:.2f}" if best else "P9 best: - nan"
    text += f"; fastest on {profile}: {fastest[0]} {fastest[1]:.1f} s" if fastest else f"; fastest on {profile}: -"
    text += f" (undecided against {', '.join(open_)}: only bounded)" if open_ else ""
    if not auto:
        return text + "; auto: - (no commplan.json)"
    chosen = sorted(set(auto))
    seconds = {r[0]: r[1] for r in measured}
    verdicts = []  # auto names a hook; a method `hier+bf16` is the hook `hier` with a wire dtype
    if best:
        verdicts.append(_same("P9 best", chosen, best[0]))
    if fastest and not open_:
        mine = _seconds_of(seconds, chosen[0]) if len(chosen) == 1 else None
        verdicts.append(_same("fastest", chosen, fastest[0]) if chosen == [hook_of(fastest[0])] else
                        f"{mine - fastest[1]:+.1f} s vs the fastest" if mine is not None else "not the fastest")
    return text + f"; auto: {'/'.join(chosen)} ({', '.join(verdicts) or 'nothing measured'})"


def _seconds_of(seconds: dict[str, float], hook: str) -> float | None:
    """The two-site time of the method auto's hook names: that method, else the one `hook+…`."""
    if hook in seconds:
        return seconds[hook]
    return next((s for method, s in seconds.items() if hook_of(method) == hook), None)


def _same(what: str, chosen: list[str], method: str) -> str:
    """`= P9 best`, `= P9 best's hook` (auto chose hier, the best was hier+bf16), or `not P9 best`."""
    if chosen == [method]:
        return f"= {what}"
    return f"= {what}'s hook" if chosen == [hook_of(method)] else f"not {what}"


def _delta(points: float) -> str:
    return f"{points:+.1f}p"


def _f(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


if __name__ == "__main__":
    sys.exit(main())
