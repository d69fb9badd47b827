"""torchrun as meshrun starts it reads its ranks' log files for `--tee` every `TAIL_EVERY_S`, not
torch's 0.1 s (deploy/host/torchrun.py `slow_tails`): with torch's own TailLog, and a real torchrun
whose worker's last lines, written just before it exits, still all arrive with their prefix."""

from __future__ import annotations

import io
import subprocess
import sys
import types
from pathlib import Path

from torch.distributed.elastic.multiprocessing import tail_log

from meshrun import layout
from meshrun.deploy.host import torchrun as entry


def test_torchs_tail_log_built_as_its_launcher_builds_it_gets_our_interval(tmp_path: Path) -> None:
    api = types.SimpleNamespace(TailLog=tail_log.TailLog)
    assert entry.slow_tails(api)
    files = {0: str(tmp_path / "stdout.log")}
    assert api.TailLog("t", files, io.StringIO(), None)._interval_sec == entry.TAIL_EVERY_S == 0.5
    assert api.TailLog("t", files, io.StringIO(), None, 0.2)._interval_sec == 0.2  # a caller's own stays
    assert api.TailLog("t", files, io.StringIO(), interval_sec=0.3)._interval_sec == 0.3
    assert isinstance(api.TailLog("t", files, io.StringIO()), tail_log.TailLog)
    wrapped = api.TailLog
    assert entry.slow_tails(api) and api.TailLog is wrapped  # installed once


def test_a_tail_log_without_an_interval_is_left_as_it_is() -> None:
    class Other:
        def __init__(self, name: str, log_files: dict, dst: object) -> None:
            pass

    api = types.SimpleNamespace(TailLog=Other)
    assert not entry.slow_tails(api) and api.TailLog is Other


WORKER = """import sys
for i in range(200):
    print(f"out {i}")
    print(f"err {i}", file=sys.stderr)
"""


def test_a_real_torchruns_tee_still_brings_every_line_of_a_worker_that_ends_at_once(tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    done = subprocess.run(
        [sys.executable, "-m", layout.TORCHRUN_MODULE, "--standalone", "--nproc-per-node", "1",
         "--max-restarts", "0", "--log-dir", str(tmp_path / "logs"), "--tee", "3",
         "--log-line-prefix-template", "[h1:${rank}] ", "worker.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line for line in done.stdout.splitlines() if line.startswith("[h1:0]")] == \
        [f"[h1:0] out {i}" for i in range(200)]
    assert [line for line in done.stderr.splitlines() if line.startswith("[h1:0]")] == \
        [f"[h1:0] err {i}" for i in range(200)]
