"""P8: the control plane at N = 3, 8, 16 and 32 simulated hosts (tests/testbed, needs root).

For each N, in one run, every host starts one process of the lightest real workload
(bench/barrier_probe.py: a torchrun c10d rendezvous, one gloo barrier, exit), and we measure:

- bare: N parallel `ssh host torchrun ...`, the same rendezvous flags meshrun plans (the baseline);
- check: `fab check-network` (SSH, facts, links, the gloo all-reduce);
- train: `fab train --script bench/barrier_probe.py` on the default path (pre-flight and sync
  included; one untimed run first, as a user's previous run) and `--no-sync --skip-checks`, each
  from the command's start to the LAST rank past its barrier;
- status / stop: a detached run of bench/hold_probe.py (barrier, then sleep): `fab status --run`,
  then `fab stop --run` until every host is reported clean;
- fetch: `fab fetch-checkpoints --run` of the default-path run (logs and records of N hosts).

With `--repeats K` (K > 1) the bare launch and `--no-sync --skip-checks` are each timed K times,
alternated (bare, fast, bare, fast, ...), and their columns are the means: one launch of each
cannot measure 10 % on 2 shared cores (1.04x and 1.16x in one run, the same code 11 s apart).
The P8 launch ratio is then the mean of every timed `fab train` (default path and fast) over the
mean of the bare ones, and a `launches` line lists each time.
Beside each launch's time, the CPU-seconds the whole machine spent from its start until every
host is quiet again (/proc/stat; the hosts and the controller share its cores): a `CPU-s` line
lists them, bare and `fab train`, with the ratio of the means. On a shared 2-core machine the
wall time of a 32-host launch drifts by 20 % between two bare launches minutes apart; what the
launch costs in CPU drifts less, and says whether meshrun adds work or only waits.

Each is printed in seconds and as a ratio to bare at the same N, with the controller's peak RSS,
its most threads and its most open SSH connections at once (sampled every 0.2 s from /proc and
`ss`). Goals at N = 32 (issue 21): launch/bare <= 1.1, check/bare <= 1.5, stop <= 15 s,
status <= 5 s, RSS <= 500 MB. The last line: `P8 N=32 launch RATIO check RATIO stop SECONDS`.

Usage: sudo .venv/bin/python bench/scale.py [--sizes 3,8,16,32] [--repeats K]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from meshrun.deploy.run.shell import remote_command  # noqa: E402
from tests.testbed import SimCluster  # noqa: E402
from tests.testbed.lock import exclusive  # noqa: E402

PROBE = "bench/barrier_probe.py"
HOLD = "bench/hold_probe.py"
BARRIER_RE = re.compile(r"BARRIER rank=(\d+) t=([\d.]+)")
RUN_RE = re.compile(r"^run (\d{8}-\d{6}-[0-9a-f]{4})", re.M)
FAST = ("--no-sync", "--skip-checks")
TASK_TIMEOUT_S = 900


@dataclass
class Usage:
    """What the controller process held at its most while a command ran."""
    rss_mb: float = 0.0
    threads: int = 0
    ssh: int = 0


@dataclass
class Timed:
    started: float  # time.time() at the command's start
    seconds: float  # to the command's end
    output: str
    usage: Usage

    def to_last_barrier(self, world: int) -> Timed:
        """The same command, timed from its start to the LAST rank past its barrier."""
        return Timed(self.started, last_barrier(self.output, world) - self.started, self.output, self.usage)


def _sample(pid: int, usage: Usage, done: threading.Event) -> None:
    """/proc every 0.2 s, `ss` (a process) every second: the sampler must not load the machine the
    hosts share (at 5 a second, `ss` cost 1.8 CPU-s in a 100 s launch of 32 hosts)."""
    tick = 0
    while not done.is_set():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        usage.rss_mb = max(usage.rss_mb, int(fields.get("VmHWM", "0 kB").split()[0]) / 1024)
        usage.threads = max(usage.threads, int(fields.get("Threads", "0")))
        if tick % 5 == 0:
            ss = subprocess.run(["ss", "-Htnp", "state", "established", "( dport = :22 )"],
                                capture_output=True, text=True, timeout=10).stdout
            usage.ssh = max(usage.ssh, ss.count(f"pid={pid},"))
        tick += 1
        done.wait(0.2)


def fab(*args: str, env: dict[str, str]) -> Timed:
    """`fab ARGS` from the repository, timed, with its controller's peak use sampled."""
    start = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "fabric", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    usage, done = Usage(), threading.Event()
    sampler = threading.Thread(target=_sample, args=(proc.pid, usage, done), daemon=True)
    sampler.start()
    try:
        output, errors = proc.communicate(timeout=TASK_TIMEOUT_S)
    finally:
        done.set()
        proc.kill()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"fab {' '.join(args)} failed ({proc.returncode}):\n{output[-3000:]}{errors[-3000:]}")
    return Timed(start, time.time() - start, output, usage)


def last_barrier(output: str, world: int) -> float:
    times = {int(r): float(t) for r, t in BARRIER_RE.findall(output)}
    if len(times) != world:
        raise RuntimeError(f"saw {len(times)} of {world} ranks past the barrier:\n{output[-2000:]}")
    return max(times.values())


def run_id_of(output: str) -> str:
    found = RUN_RE.search(output)
    if found is None:
        raise RuntimeError(f"no run id in:\n{output[-2000:]}")
    return found.group(1)


def bare_launch(cluster: SimCluster, n: int) -> float:
    """What a user types by hand on every host, in parallel: one torchrun each."""
    run_id, head = "bare-" + secrets.token_hex(3), cluster.host(1).address
    start = time.time()

    def one(i: int) -> str:
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(n), "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{head}:29400", "--rdzv-id", run_id,
                "--local-addr", cluster.host(i).address, *(["--rdzv-conf", "is_host=1"] if i == 1 else []), PROBE]
        done = subprocess.run(cluster.ssh_argv(i, remote_command("~/meshrun", argv)), capture_output=True,
                              text=True, timeout=TASK_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(done.stdout[-1500:] + done.stderr[-1500:])
        return done.stdout

    with ThreadPoolExecutor(n) as pool:
        outputs = list(pool.map(one, range(1, n + 1)))
    return last_barrier("".join(outputs), n) - start


def busy_cpu_s() -> float:
    """CPU-seconds this machine has spent busy since boot (/proc/stat: all but idle and iowait). The
    simulated hosts share its cores, so the difference over a launch is what the launch cost all
    of them together, the controller included: a measure the machine's load drifts less than wall time."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def wait_running(run_id: str, n: int, env: dict[str, str]) -> None:
    """Until every host of a detached run says its workers run AND every rank is past its barrier:
    an agent says "running" as soon as its workers start, while they still import torch (32 hosts:
    a minute of both cores), and a status timed then measures that load, not the control plane."""
    deadline = time.monotonic() + TASK_TIMEOUT_S
    while time.monotonic() < deadline:
        rows = json.loads(fab("status", "--run", run_id, "--json", env=env).output or "[]")
        states = [row.get("state") for row in rows]
        if len(states) == n and all(s == "running" for s in states):
            logs = fab("logs", "--run", run_id, "--lines", "5", env=env).output
            if len(set(BARRIER_RE.findall(logs))) == n:
                return
        time.sleep(1)
    raise RuntimeError(f"run {run_id}: not every rank past its barrier after {TASK_TIMEOUT_S} s")


def settle(cluster: SimCluster, n: int, limit_s: float = 120.0) -> None:
    """Until no host runs anything but its sshd: the simulated hosts share this machine's cores,
    so a run still exiting (32 interpreters tearing torch down) would slow the next command timed,
    and only that one (the bare launch is timed first, on a quiet machine)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if not any(cluster.processes(i, sessions=False) for i in range(1, n + 1)):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the hosts still run processes {limit_s:.0f} s after the last command")


@dataclass
class Launches:
    """Every timed launch at one N: bare ones and `fab train` ones (default path first)."""
    bare: list[float]
    meshrun: list[float]
    bare_cpu: list[float]  # CPU-s of the whole machine per launch, start to quiet (busy_cpu_s)
    meshrun_cpu: list[float]

    @property
    def ratio(self) -> float:
        """Mean meshrun launch over mean bare launch."""
        return (sum(self.meshrun) / len(self.meshrun)) / (sum(self.bare) / len(self.bare))

    @property
    def cpu_ratio(self) -> float:
        return (sum(self.meshrun_cpu) / len(self.meshrun_cpu)) / (sum(self.bare_cpu) / len(self.bare_cpu))


def measure(cluster: SimCluster, n: int, repeats: int = 1) -> dict[str, Timed | float | Launches]:
    inventory = cluster.write_inventory(Path(tempfile.mkdtemp(prefix="meshrun-p8-")) / "hosts.yaml")
    # A private cache: the pre-flight pass the default path reuses is the one stored here.
    env = {**os.environ, "XDG_CACHE_HOME": tempfile.mkdtemp(prefix="meshrun-p8-cache-")}
    inv = ("--inventory", str(inventory))
    fab("sync", *inv, env=env)
    settle(cluster, n)
    bare_cpu, train_cpu = [], []

    def costed(launch, cpu: list[float]):
        """One timed launch, and the CPU-s the whole machine spent from its start until every host
        is quiet again (its teardown included, alike for both)."""
        before = busy_cpu_s()
        result = launch()
        settle(cluster, n)
        cpu.append(busy_cpu_s() - before)
        return result

    bares = [costed(lambda: bare_launch(cluster, n), bare_cpu)]
    out: dict[str, Timed | float | Launches] = {"check": fab("check-network", *inv, env=env)}
    fab("train", *inv, "--script", PROBE, env=env)  # the user's previous run
    for name, flags in (("train", ()), ("train_fast", FAST)):
        settle(cluster, n)
        out[name] = costed(lambda: fab("train", *inv, *flags, "--script", PROBE, env=env).to_last_barrier(n),
                           train_cpu)
    fasts = [out["train_fast"]]
    for _ in range(repeats - 1):  # alternated, so a drift of the machine touches both alike
        bares.append(costed(lambda: bare_launch(cluster, n), bare_cpu))
        fasts.append(costed(lambda: fab("train", *inv, *FAST, "--script", PROBE, env=env).to_last_barrier(n),
                            train_cpu))
    out["bare"] = sum(bares) / len(bares)
    out["train_fast"] = _mean_of(fasts)  # type: ignore[arg-type]
    out["launches"] = Launches(bares, [out["train"].seconds, *(t.seconds for t in fasts)],  # type: ignore[union-attr]
                               bare_cpu, train_cpu)
    settle(cluster, n)
    detached = fab("train", *inv, *FAST, "--detach", "--script", HOLD, env=env)
    hold = run_id_of(detached.output)
    wait_running(hold, n, env)
    out["status"] = fab("status", "--run", hold, env=env)
    out["stop"] = fab("stop", "--run", hold, env=env)
    out["fetch"] = fab("fetch-checkpoints", "--run", run_id_of(out["train"].output), env=env)  # type: ignore[union-attr]
    return out


def _mean_of(runs: list[Timed]) -> Timed:
    """One column's cell for repeated launches: the mean time, the most the controller held."""
    usage = Usage(max(t.usage.rss_mb for t in runs), max(t.usage.threads for t in runs), max(t.usage.ssh for t in runs))
    return Timed(runs[0].started, sum(t.seconds for t in runs) / len(runs), runs[-1].output, usage)


COLUMNS = ("check", "train", "train_fast", "status", "stop", "fetch")


def print_table(results: dict[int, dict[str, Timed | float | Launches]], last_line: bool = True) -> None:
    print(f"{'N':>3} {'bare s':>7} " + " ".join(f"{c + ' s (x)':>17}" for c in COLUMNS)
          + f" {'peak RSS MB':>11} {'threads':>7} {'ssh':>4}")
    for n, row in results.items():
        bare = row["bare"]
        assert isinstance(bare, float)
        timed = [row[c] for c in COLUMNS]
        cells = " ".join(f"{t.seconds:>8.1f} ({t.seconds / bare:>5.2f})" for t in timed)  # type: ignore[union-attr]
        rss = max(t.usage.rss_mb for t in timed)  # type: ignore[union-attr]
        threads = max(t.usage.threads for t in timed)  # type: ignore[union-attr]
        ssh = max(t.usage.ssh for t in timed)  # type: ignore[union-attr]
        print(f"{n:>3} {bare:>7.1f} {cells} {rss:>11.0f} {threads:>7} {ssh:>4}", flush=True)
        launches = row["launches"]
        assert isinstance(launches, Launches)
        if len(launches.bare) > 1:
            print(f"    launches at {n}: bare {', '.join(f'{x:.1f}' for x in launches.bare)} s; fab train "
                  f"{', '.join(f'{x:.1f}' for x in launches.meshrun)} s; mean/mean {launches.ratio:.2f}", flush=True)
        print(f"    CPU-s per launch at {n} (start to quiet, every host and the controller): bare "
              f"{', '.join(f'{x:.0f}' for x in launches.bare_cpu)}; fab train "
              f"{', '.join(f'{x:.0f}' for x in launches.meshrun_cpu)}; mean/mean {launches.cpu_ratio:.2f}", flush=True)
    if not last_line:
        return
    for line in slope_lines(results):
        print(line)
    last = max(results)
    row = results[last]
    bare = row["bare"]
    launches = row["launches"]
    launch = launches.ratio if len(launches.bare) > 1 else row["train"].seconds / bare  # type: ignore
    print(f"P8 N={last} launch {launch:.2f} check {row['check'].seconds / bare:.2f} "  # type: ignore
          f"stop {row['stop'].seconds:.1f}")  # type: ignore[union-attr]


def slope_lines(results: dict[int, dict[str, Timed | float | Launches]]) -> list[str]:
    """Seconds per added host, least squares over the sizes measured (docs/scale.md quotes them)."""
    sizes = sorted(results)
    if len(sizes) < 2:
        return []
    lines = []
    for name in ("bare", *COLUMNS):
        ys = [results[n][name] if name == "bare" else results[n][name].seconds for n in sizes]  # type: ignore
        mx, my = sum(sizes) / len(sizes), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(sizes, ys)) / sum((x - mx) ** 2 for x in sizes)
        lines.append(f"slope {name}: {slope:.2f} s per added host")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="3,8,16,32", help="host counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=1,
                        help="time the bare and the fast launch this many times each, alternated (means shown)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    cluster = SimCluster("/tmp/meshrun-testbed")
    results: dict[int, dict[str, Timed | float | Launches]] = {}
    failures: dict[int, str] = {}
    with exclusive():
        for n in sizes:
            print(f"testbed: {n} hosts up in {cluster.up(n):.1f} s", flush=True)
            try:
                results[n] = measure(cluster, n, max(1, args.repeats))
                print_table({n: results[n]}, last_line=False)  # each size as it is measured
            except RuntimeError as err:  # a task that fails at this size is a finding, not the end
                failures[n] = str(err).splitlines()[0]
                print(f"N={n}: {failures[n]}", flush=True)
            finally:
                print(f"testbed: down in {cluster.down().seconds:.1f} s", flush=True)
    if results:
        print_table(results)
    for n, why in failures.items():
        print(f"P8 N={n} FAILED: {why}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
