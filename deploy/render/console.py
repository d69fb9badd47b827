"""The output layer: the only module that imports rich. Results in, text out."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.text import Text

from meshrun.deploy.render import hints
from meshrun.deploy.render.hints import repeated_flags
from meshrun.deploy.render.neutral import NeutralConsole, PlainTable, neutral, one_line, plain
from meshrun.deploy.run.outcome import JobOutcome, JobStatus
from meshrun.deploy.run.plan import SCRIPT_OUTPUT
from meshrun.deploy.run.summary import RunSummary
from meshrun.layout import HOSTS, STARTS_FILE

HOST_STYLES = ("cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan", "bright_magenta")
_HINT_FLAGS: dict[str, str] = {}  # this command's --inventory, --project, --runs-dir, repeated in hints


def repeat_in_hints(given: Mapping[str, object]) -> None:
    """Hints printed from now on repeat the flags of `given` (a task's keyword arguments) that a
    later command needs to find the same hosts and runs (deploy/render/hints.py)."""
    _HINT_FLAGS.clear()
    _HINT_FLAGS.update(repeated_flags(given))


def as_run(message: str) -> str:
    """`message` with its `fab TASK` hints as this very command's user can run them."""
    return hints.as_run(message, os.path.basename(sys.argv[0]), _HINT_FLAGS)


def script_files_lines(script: str, home: str, reports: list) -> list[str]:
    """Where a --script run's own files are after a fetch: a host fetched into `hosts/<host>/` had them
    in its run directory; a local host whose workdir is this project (its report landed in the run's
    own folder) gave the script a folder of its own beside the agent's files (deploy/run/plan.py `script_run_dir`).
    A host that sent files, all of them meshrun's, is named: its script saved nothing there, likely by a
    relative path into the host's workdir, which no fetch brings (a user saw no checkpoint, and no word why)."""
    local = [r.host for r in reports if str(r.landed) == home]
    lines = [f"what {script} wrote under $MESHRUN_RUN_DIR on {name}: {home}/{HOSTS}/{name}/{SCRIPT_OUTPUT}/; "
             f"its logs: {home}/{HOSTS}/{name}/ (docs/scripts.md)" for name in local]
    fetched = [r for r in reports if str(r.landed) != home]
    silent = [r.host for r in fetched if _sent_only_meshruns(r)]
    if len(silent) < len(fetched) or not reports:
        lines.insert(0, f"what {script} wrote under $MESHRUN_RUN_DIR, and the logs: {home}/{HOSTS}/<host>/ "
                        "(as each host had it; docs/scripts.md)")
    if silent:
        lines.append(f"{script} wrote nothing under $MESHRUN_RUN_DIR on {', '.join(silent)}: files it saved by a "
                     "relative path stay in each host's workdir, which fetch does not bring; save them under "
                     f"$MESHRUN_RUN_DIR (docs/scripts.md). The logs: {home}/{HOSTS}/<host>/")
    return lines


def _sent_only_meshruns(report: Any) -> bool:
    """The host's run directory held files, and only meshrun's of a script run: the runner's starts.json and
    the agents' `hosts/` (every host's, where hosts share a workdir). A host that sent nothing at all (its run
    directory gone) or held files the fetch could not bring (links, too deep a folder) is not said to be empty."""
    names = [*report.new, *report.updated, *report.unchanged, *report.conflicts, *report.corrupt, *report.kept_home]
    if not names or report.skipped.total or report.refused:
        return False
    return all(name == STARTS_FILE or name.startswith(f"{HOSTS}/") for name in names)


class Renderer:
    def __init__(self, console: Console | None = None, err_console: Console | None = None) -> None:
        # Neutral consoles: much of what is printed comes from hosts (deploy/render/neutral.py).
        self.console = console or NeutralConsole(highlight=False, soft_wrap=True)
        self.err = err_console or NeutralConsole(stderr=True, highlight=False, soft_wrap=True)
        self._styles: dict[str, str] = {}
        self._lock = threading.Lock()  # log lines arrive from one thread per host

    def log_line(self, host: str, text: str) -> None:
        style = self._styles.setdefault(host, HOST_STYLES[len(self._styles) % len(HOST_STYLES)])
        text = neutral(text)
        line = Text(text)
        end = text.find("] ")
        if text.startswith("[") and end > 0:
            line.stylize(style, 0, end + 1)
        with self._lock:
            self.console.print(line)

    def info(self, message: str) -> None:
        with self._lock:
            self.console.print(plain(as_run(message)))

    def warn(self, message: str) -> None:
        """One line whatever `message` quotes from a host: no line of its own can follow ours."""
        with self._lock:
            self.err.print(Text("warning: ", style="yellow bold") + plain(one_line(as_run(message))))

    def error(self, message: str) -> None:
        with self._lock:
            self.err.print(Text("error: ", style="red bold") + plain(one_line(as_run(message))))

    def json(self, data: Any) -> None:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        sys.stdout.flush()

    def membership(self, event: Any) -> None:
        """A host joined, left, finished or was lost during the run."""
        detail = f" ({event.detail})" if event.detail else ""
        style = {"lost": "red bold", "joined": "green", "left": "yellow"}.get(event.event.value, "")
        with self._lock:
            self.console.print(plain(f"meshrun: {event.host} {event.event.value}{detail}; "
                                     f"{event.world_size} process(es) remain in the job", style=style))

    def run_started(self, run_id: str, hosts: list[str], world_size: int, run_dir: str) -> None:
        self.info(f"run {run_id}: {len(hosts)} host(s) ({', '.join(hosts)}), world size {world_size}; "
                  f"logs and summary in {run_dir}/")

    def failure_tail(self, outcome: JobOutcome, remote_log: str) -> None:
        """The failed host's last lines and where its full log is: what its ranks printed last,
        then torchrun's root-cause report (which alone would push the ranks' error out of view)."""
        host = next(h for h in outcome.hosts if h.host == outcome.failed_host)
        report = _root_cause(host.tail)
        with self._lock:
            if host.worker_tail:
                self.err.print(plain(f"--- last {len(host.worker_tail)} lines from {host.host}'s ranks ---", "red"))
                for line in host.worker_tail:
                    self.err.print(plain(line))
            self.err.print(plain(f"--- last {len(report)} lines from {host.host} ---", style="red"))
            for line in report:
                self.err.print(plain(line))
            self.err.print(plain(f"--- full log: {host.log} (on the host: {remote_log}) ---", style="red"))

    def job_summary(self, summary: RunSummary, outcome: JobOutcome, summary_path: str) -> None:
        table = PlainTable("host", "exit", "log", "left running", title=f"run {summary.run_id}: {summary.status}")
        for host in outcome.hosts:
            left = "none" if not host.remaining and not host.stop_error else (host.stop_error or str(list(host.remaining)))
            table.add_row(host.host, "lost" if host.rc is None else host.rc, host.log, left)
        metrics = ", ".join(f"{k} {v:.4f}" for k, v in sorted(summary.metrics.items())) or "none"
        style = {"succeeded": "green", "failed": "red", "stopped": "yellow"}[summary.status]
        # Epochs are the built-in trainer's count: a --script run reports none ("0 epoch(s)" read as nothing ran).
        epochs = f"{summary.epochs_completed} epoch(s), " if summary.epochs_completed or summary.metrics else ""
        with self._lock:
            self.console.print(table)
            self.console.print(plain(
                f"{summary.status}: {epochs}world size {summary.world_size}, "
                f"{summary.duration_s:.1f} s; metrics: {metrics}; summary: {summary_path}", style=style))
            if summary.status != JobStatus.SUCCEEDED.value and summary.reason:  # the summary's word, resume hints too
                self.console.print(plain(as_run(f"reason: {summary.reason}"), style=style))
            if summary.status == JobStatus.STOPPED.value:
                clean = all(not h.remaining and not h.stop_error for h in outcome.hosts)
                self.console.print(Text("every host is clean: no run process left" if clean else
                                        "some hosts may still run processes: see 'left running'",
                                        style="green" if clean else "red bold"))

    def run_states(self, states: list, recorded: Mapping[str, str] | None = None) -> None:
        """`fab status`: one row per (run, host); then, for each run in `recorded` ({run id: what its
        summary.json says}), a line of its own: a finished run's hosts may be gone, its outcome is not."""
        table = PlainTable("run", "host", "state", "exit", "epoch", "step", "uptime", "detail", title="runs")
        colors = {"running": "green", "exited": "blue", "stopped": "yellow", "lost": "red", "unreachable": "red",
                  "stuck": "red"}
        for s in states:
            uptime = f"{s.uptime_s:.0f} s" if s.uptime_s is not None else "-"
            table.add_row(s.run_id, s.host, plain(s.state, style=colors.get(s.state, "")), _dash(s.rc), _dash(s.epoch),
                          _dash(s.step), uptime, s.detail or "")
        with self._lock:
            self.console.print(table)
            for run_id, outcome in (recorded or {}).items():
                self.console.print(plain(f"run {run_id} recorded: {outcome}"))

    def fetch_reports(self, run_id: str, home: str, reports: list, script: str | None = None,
                      runs_dir: str | None = None) -> None:
        """Where everything landed, what was refused, and how to resume from it (a `--script` run's
        own files: meshrun verifies and pushes back the built-in trainer's checkpoints only). `runs_dir`:
        the runs folder fetched into (`--dest`) when it is not this command's: a resume pushes the
        checkpoints of the folder it runs with, so its hint names that one."""
        table = PlainTable("host", "landed in", "new", "updated", "unchanged", "not overwritten",
                           "corrupt (not kept)", title=f"fetched run {run_id}")
        for r in reports:
            kept = [*r.conflicts, *r.kept_home]
            table.add_row(r.host, r.landed, len(r.new), len(r.updated), len(r.unchanged),
                          plain(", ".join(kept) or "-", style="yellow" if kept else ""),
                          plain(", ".join(r.corrupt) or "-", style="red bold" if r.corrupt else ""))
        with self._lock:
            self.console.print(table)
            for r in reports:
                for where in [f"{r.landed}/{name}" for name in r.conflicts] + [f"{home}/{n}" for n in r.kept_home]:
                    self.console.print(plain(f"not overwritten: {where} differs from {r.host}'s copy; "
                                             "kept yours (--force replaces it)", style="yellow"))
            if script:
                for line in script_files_lines(script, home, reports):
                    self.console.print(plain(line))
                self.console.print(plain(as_run(f"resume this run: fab train --resume {run_id} (same hosts; your "
                                                "script reloads what it saved there)")))
                return
            self.console.print(plain(f"checkpoints: {home}/checkpoints/ (verified against MANIFEST.sha256); "
                                     f"logs and metrics: {home}/hosts/<host>/"))
            flags = {**_HINT_FLAGS, "runs_dir": runs_dir} if runs_dir else _HINT_FLAGS
            self.console.print(plain(hints.as_run(f"resume this run: fab train --resume {run_id} (same hosts; the "
                                                  "newest checkpoint is pushed back if the hosts lost it)",
                                                  os.path.basename(sys.argv[0]), flags)))

    def run_report(self, run_id: str, report: Any, png: str, comm: dict | None = None,
                   ended: str | None = None, finished: bool = True) -> None:
        """`fab report`: how the run ended (`ended`, report.py's line), throughput and step-time breakdown
        per rank, then accuracy: the last epoch's is the final one unless the run did not `finish` (stopped, failed)."""
        table = PlainTable(title=f"run {run_id}: throughput per rank (medians over steps)")
        for column in ("host", "rank", "samples/s", "step ms", "data ms", "fwd+bwd ms", "optim ms", "comm ms",
                       "peak MiB"):
            table.add_column(column, justify="right" if column not in ("host",) else "left")
        for r in report.ranks:
            rank_comm = f"{r.comm_s * 1e3:.1f}" if r.comm_s is not None else "-"
            table.add_row(r.host, r.rank, f"{r.samples_per_s:.0f}", f"{r.step_s * 1e3:.1f}",
                          f"{r.data_s * 1e3:.1f}", f"{r.fwd_bwd_s * 1e3:.1f}", f"{r.optim_s * 1e3:.1f}", rank_comm,
                          f"{r.peak_mem_bytes / 2**20:.0f}")
        final = f"{report.final_test_acc:.4f}" if report.final_test_acc is not None else "-"
        best = f"{report.best_test_acc:.4f}" if report.best_test_acc is not None else "-"
        last = "final" if finished else "last"
        with self._lock:
            if ended is not None:
                self.console.print(plain(as_run(ended)))
            self.console.print(table)
            self.console.print(plain(f"total {report.total_samples_per_s:.0f} samples/s; {len(report.epochs)} "
                                     f"epoch(s); {last} test acc {final}, best {best}; resumes {report.resumes}; "
                                     f"plot: {png}"))
            if comm is not None:
                measured = f"{comm['measured_s'] * 1e3:.1f} ms" if comm["measured_s"] is not None else "not measured"
                self.console.print(plain(f"comm {comm['hook']}: all-reduce {measured} per step, ring floor "
                                         f"{comm['floor_s'] * 1e3:.1f} ms at {comm['bandwidth_mbit_s']} Mbit/s x "
                                         f"{comm['nodes']} nodes (ratio {comm['ratio']}); recommended "
                                         f"{comm['recommended']}: {comm['reason']}"))
        for line in report.skipped:
            self.warn(line)


def _root_cause(tail: tuple[str, ...]) -> tuple[str, ...]:
    """From torchrun's failure report, the part from "Root Cause" on; else the whole tail."""
    for i, line in enumerate(tail):
        if "Root Cause" in line:
            return tail[max(0, i - 2):]
    return tail


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


class HostProgress:
    """One progress bar per host, for transfers (sync, fetch). Thread-safe updates by percent."""

    def __init__(self, renderer: Renderer, title: str, hosts: list[str]) -> None:
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

        # No markup: the host name is a value, shown as written (deploy/render/neutral.py).
        self.progress = Progress(TextColumn(title, markup=False),
                                 TextColumn("{task.fields[host]}", style="bold", markup=False),
                                 BarColumn(), TaskProgressColumn(), console=renderer.console, transient=False)
        self.tasks = {h: self.progress.add_task("", total=100, host=one_line(h)) for h in hosts}

    def __enter__(self) -> HostProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, host: str, percent: int) -> None:
        self.progress.update(self.tasks[host], completed=percent)
