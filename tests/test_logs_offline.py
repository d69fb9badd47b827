"""A finished run whose hosts are gone (day-two review, finding 5): `fab logs --run X` showed nothing
and exited 1 (`no log from h1`) although this machine held the whole log: an attached run's
controller writes every line its hosts stream to `runs/<id>/logs/<host>.log`, and `fab
fetch-checkpoints` lands a host's train.log under `runs/<id>/hosts/<host>/`. Now that copy is
shown, under one warning line naming the file. And `fab status --run X` showed only `unreachable`
for a run whose summary.json says how it ended: now it says that too.

The pure parts by exact equality; the commands as a user runs them, in a git project whose host is
a port where nothing listens (a connect there is refused at once: no sshd, no test bed)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from meshrun.deploy.commands.logs import (COPY_LINE_BYTES, LocalCopy, copy_warning, last_lines, local_copies,
                                          local_copy, shown_line, show_copy)
from meshrun.deploy.commands.status import recorded_outcome
from meshrun.deploy.edges.records import RunRecord
from meshrun.layout import SUMMARY
from tests.clirun import run_meshrun, trap_project

RUN = "20261206-180830-339c"


def written(path: Path) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))


def test_the_copies_are_the_controllers_stream_and_the_fetched_train_log(tmp_path: Path) -> None:
    home = tmp_path / "runs" / RUN
    assert local_copies(tmp_path / "runs", RUN, "h1") == (home / "logs" / "h1.log",
                                                          home / "hosts" / "h1" / "hosts" / "h1" / "train.log")


def test_the_newest_copy_is_taken_and_of_two_as_new_the_controllers(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    stream, fetched = local_copies(runs, RUN, "h1")
    assert local_copy(runs, RUN, "h1") is None
    fetched.parent.mkdir(parents=True)
    fetched.write_text("[h1:0] fetched\n")
    assert local_copy(runs, RUN, "h1") == LocalCopy(fetched, fetched.stat().st_mtime)
    stream.mkdir(parents=True)  # a folder of that name is no copy
    assert local_copy(runs, RUN, "h1") == LocalCopy(fetched, fetched.stat().st_mtime)
    stream.rmdir()
    stream.write_text("[h1:0] streamed\n")
    os.utime(stream, (1_800_000_000, 1_800_000_000))
    os.utime(fetched, (1_800_000_100, 1_800_000_100))  # a later attempt's, fetched
    assert local_copy(runs, RUN, "h1") == LocalCopy(fetched, 1_800_000_100)
    os.utime(fetched, (1_800_000_000, 1_800_000_000))
    assert local_copy(runs, RUN, "h1") == LocalCopy(stream, 1_800_000_000)


def test_last_lines_leave_out_a_cut_first_line() -> None:
    assert last_lines("a\nb\nc\n", 2, whole=True) == ["b", "c"]
    assert last_lines("a\nb\nc\n", 9, whole=True) == ["a", "b", "c"]
    assert last_lines("t of a\nb\nc", 9, whole=False) == ["b", "c"]  # read from the middle of a line
    assert last_lines("a\nb\n", 0, whole=True) == []


def test_lines_are_prefixed_as_the_live_ones_are() -> None:
    assert [shown_line("h1", t) for t in ("[h1:0] epoch 1", "[h1] meshrun: lost", "plain", "[h2:0] not h2's")] == [
        "[h1:0] epoch 1", "[h1] meshrun: lost", "[h1] plain", "[h1] [h2:0] not h2's"]


def test_the_warning_names_the_file_and_when_it_was_written(tmp_path: Path) -> None:
    copy = LocalCopy(tmp_path / "h1.log", 1_800_000_000.0)
    at = time.strftime("%Y-%m-%d %H:%M", time.localtime(1_800_000_000.0))
    assert copy_warning("host 'h1': cannot connect", copy, 3) == (
        f"host 'h1': cannot connect; its last 3 line(s) from this machine's copy instead: {tmp_path}/h1.log "
        f"(written {at})")


class Seen:
    """The renderer's two calls a copy makes, recorded."""

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.lines: list[tuple[str, str]] = []

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def log_line(self, host: str, text: str) -> None:
        self.lines.append((host, text))


def test_a_large_copy_is_read_from_its_end_only(tmp_path: Path) -> None:
    """Bounded: a log of one huge line then two short ones gives the two, never the huge one."""
    stream = local_copies(tmp_path, RUN, "h1")[0]
    stream.parent.mkdir(parents=True)
    stream.write_bytes(b"x" * (COPY_LINE_BYTES * 10) + b"\n[h1:0] one\n[h1:0] two\n")
    seen = Seen()
    assert show_copy(tmp_path, RUN, "h1", "why", seen, 2)  # type: ignore[arg-type]
    assert seen.lines == [("h1", "[h1:0] one"), ("h1", "[h1:0] two")]
    assert seen.warnings == [copy_warning("why", LocalCopy(stream, stream.stat().st_mtime), 2)]
    assert not show_copy(tmp_path, RUN, "h2", "why", seen, 2)  # type: ignore[arg-type]  # no copy of h2's


@pytest.mark.parametrize(("summary", "expected"), [
    ({"run_id": RUN, "status": "succeeded", "reason": None}, "succeeded"),
    ({"run_id": RUN, "status": "stopped", "reason": "interrupted (Ctrl-C)"}, "stopped (interrupted (Ctrl-C))"),
    ({"run_id": RUN, "status": "failed", "reason": "host 'h1' said\n\x1b[2Jhi"},
     "failed (host 'h1' said\\n\\x1b[2Jhi)"),
    ({"run_id": "20261206-000000-aaaa", "status": "succeeded"}, None),  # another run's
    ({"best_loss": 0.33}, None),  # a script's file of that name
    ({"run_id": RUN, "status": ["succeeded"]}, None),
    ([RUN], None),
])
def test_the_recorded_outcome(summary: object, expected: str | None) -> None:
    assert recorded_outcome(summary, RUN) == expected



@pytest.fixture
def project(tmp_path: Path, refused_port: int) -> Path:
    """Run RUN, attached, on gpu1 (now refused), ended `succeeded`, with its controller's copy of the log."""
    root, _key, _host = trap_project(tmp_path, refused_port)
    RunRecord(RUN, str(root / "inventory" / "hosts.yaml"), ("gpu1",), time.time() - 3600, False,
              "standalone").save(root / "runs")
    (root / "runs" / RUN / SUMMARY).write_text(json.dumps({"run_id": RUN, "status": "succeeded", "reason": None}))
    return root


def test_logs_of_a_run_whose_host_is_gone_are_the_controllers_copy(project: Path) -> None:
    stream = local_copies(project / "runs", RUN, "gpu1")[0]
    stream.parent.mkdir(parents=True)
    stream.write_text("[gpu1:0] resolved config:\n[gpu1:0] epoch 1/1 acc 0.97\n[gpu1] meshrun: exit \x1b[2J0\n")
    done = run_meshrun(project, "logs", "--run", RUN)
    assert (done.returncode, done.stdout) == (0, "[gpu1:0] resolved config:\n[gpu1:0] epoch 1/1 acc 0.97\n"
                                                 "[gpu1] meshrun: exit \\x1b[2J0\n"), done
    [warning] = done.stderr.splitlines()
    assert warning.startswith("warning: host 'gpu1': cannot connect to "), warning
    assert warning.endswith(f"; its last 3 line(s) from this machine's copy instead: {stream} "
                            f"(written {written(stream)})"), warning
    last = run_meshrun(project, "logs", "--run", RUN, "--lines", "1")
    assert (last.returncode, last.stdout) == (0, "[gpu1] meshrun: exit \\x1b[2J0\n"), last


def test_logs_of_a_fetched_run_whose_host_is_gone_are_its_fetched_train_log(project: Path) -> None:
    fetched = local_copies(project / "runs", RUN, "gpu1")[1]
    fetched.parent.mkdir(parents=True)
    fetched.write_text("[gpu1:0] epoch 3/3\nno prefix\n")
    done = run_meshrun(project, "logs", "--run", RUN)
    assert (done.returncode, done.stdout) == (0, "[gpu1:0] epoch 3/3\n[gpu1] no prefix\n"), done
    assert done.stderr.endswith(f"from this machine's copy instead: {fetched} (written {written(fetched)})\n"), done


def test_logs_with_no_copy_still_name_the_host(project: Path) -> None:
    done = run_meshrun(project, "logs", "--run", RUN)
    assert (done.returncode, done.stdout) == (1, ""), done
    assert done.stderr.endswith("error: no log from gpu1; see the lines above\n"), done


def test_status_of_a_run_that_ended_says_what_it_recorded(project: Path) -> None:
    done = run_meshrun(project, "status", "--run", RUN)
    assert done.returncode == 0, done
    assert "unreachable" in done.stdout and done.stdout.endswith(f"\nrun {RUN} recorded: succeeded\n"), done
    (project / "runs" / RUN / SUMMARY).write_text(json.dumps({"run_id": RUN, "status": "failed",
                                                               "reason": "host 'gpu1' exited with status 3"}))
    failed = run_meshrun(project, "status", "--run", RUN)
    assert failed.stdout.endswith(f"\nrun {RUN} recorded: failed (host 'gpu1' exited with status 3)\n"), failed
    as_json = run_meshrun(project, "status", "--run", RUN, "--json")  # its rows, as before
    assert [row["state"] for row in json.loads(as_json.stdout)] == ["unreachable"], as_json


def test_following_a_run_whose_host_is_gone_shows_the_copy_and_follows_nothing(project: Path) -> None:
    stream = local_copies(project / "runs", RUN, "gpu1")[0]
    stream.parent.mkdir(parents=True)
    stream.write_text("[gpu1:0] epoch 1/1 acc 0.97\n")
    done = run_meshrun(project, "logs", "-f", "--run", RUN)
    assert (done.returncode, done.stdout) == (0, "[gpu1:0] epoch 1/1 acc 0.97\n"), done
    assert done.stderr.endswith(f"from this machine's copy instead: {stream} (written {written(stream)}); "
                                "not followed\n"), done
