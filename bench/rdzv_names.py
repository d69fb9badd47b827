"""What torch's rendezvous spends naming its events, at N nodes (deploy/host/torchrun.py
`quick_event_names`; no test bed needed).

torch's c10d rendezvous names each event it could record with `inspect.stack()` (twice), even when
nobody records events, on every pass of its state loop; every member of an N-node rendezvous
contends for the one state in the store, so the passes grow with N. meshrun's torchrun names them
from the frame. This bench starts N torchruns on this machine, one c10d rendezvous on 127.0.0.1,
one process each, the worker `true` (so what is measured is torchrun: its import, rendezvous,
workers' start and exit barrier), twice per repetition, alternated:

- torch: meshrun's torchrun with `quick_event_names` switched off (torch's own `get_method_name`);
- quick: meshrun's torchrun as it ships.

For each: the wall time from the start to the last torchrun's exit, and the CPU-seconds of all N
(each torchrun's rusage, its worker's included). A rendezvous that does not complete within
`--join-timeout` counts as failed (torch raises its RendezvousTimeoutError). The last line:
`RDZV N=... cpu RATIO wall RATIO` (quick ÷ torch, means).

Usage: .venv/bin/python bench/rdzv_names.py [--sizes 16,32] [--repeats 3] [--join-timeout 300]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.trainer.harness import free_port  # noqa: E402

TORCHS = ("import sys\nfrom meshrun.deploy.host import torchrun as t\n"
          "t.quick_event_names = lambda module: False\nsys.exit(t.main())\n")
QUICK = ("import sys\nfrom meshrun.deploy.host import torchrun as t\nsys.exit(t.main())\n")


@dataclass(frozen=True)
class Launch:
    wall_s: float
    cpu_s: float
    failed: int  # torchruns that exited non-zero


def launch(code: str, n: int, join_timeout: int, rdzv_id: str) -> Launch:
    port = free_port()
    argv = [sys.executable, "-c", code, "--nnodes", str(n), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", rdzv_id, "--local-addr", "127.0.0.1",
            "--max-restarts", "0"]
    logs = tempfile.mkdtemp(prefix="meshrun-rdzv-names-")
    started = time.monotonic()
    procs = []
    for i in range(n):  # the store's host first, as meshrun's launch names it
        conf = [f"join_timeout={join_timeout}", f"is_host={int(i == 0)}"]  # 127.0.0.1 is every node's own
        with open(os.path.join(logs, f"{i}.log"), "wb") as out:
            procs.append(subprocess.Popen([*argv, "--rdzv-conf", ",".join(conf), "--no-python", "true"],
                                          stdout=out, stderr=subprocess.STDOUT))
    cpu, failed = 0.0, 0
    for proc in procs:
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        cpu += usage.ru_utime + usage.ru_stime
        failed += proc.returncode != 0
    return Launch(time.monotonic() - started, cpu, failed)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="16,32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--join-timeout", type=int, default=300)
    args = parser.parse_args()
    print(f"{'N':>3} {'naming':>6} {'wall s':>7} {'CPU-s':>7} {'failed':>6}", flush=True)
    last = ""
    for n in (int(x) for x in args.sizes.split(",")):
        runs: dict[str, list[Launch]] = {"torch": [], "quick": []}
        for k in range(args.repeats):
            order = (("torch", TORCHS), ("quick", QUICK)) if k % 2 == 0 else (("quick", QUICK), ("torch", TORCHS))
            for name, code in order:
                done = launch(code, n, args.join_timeout, f"names-{n}-{k}-{name}")
                runs[name].append(done)
                print(f"{n:>3} {name:>6} {done.wall_s:>7.1f} {done.cpu_s:>7.1f} {done.failed:>6}", flush=True)
        mean = {name: (sum(r.wall_s for r in rs) / len(rs), sum(r.cpu_s for r in rs) / len(rs))
                for name, rs in runs.items()}
        fails = {name: sum(r.failed > 0 for r in rs) for name, rs in runs.items()}
        last = (f"RDZV N={n} cpu {mean['quick'][1] / mean['torch'][1]:.2f} wall "
                f"{mean['quick'][0] / mean['torch'][0]:.2f}")
        print(f"{n:>3} means: torch {mean['torch'][0]:.1f} s, {mean['torch'][1]:.1f} CPU-s ({fails['torch']} failed); "
              f"quick {mean['quick'][0]:.1f} s, {mean['quick'][1]:.1f} CPU-s ({fails['quick']} failed)", flush=True)
    print(last)
    return 0


if __name__ == "__main__":
    sys.exit(main())
