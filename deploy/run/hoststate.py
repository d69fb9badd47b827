"""A host agent's `status` answer → HostState, pure. The answer comes from a host, so it is
data: garbage, truncated JSON or wrong types give the state `unknown` with a one-line detail,
never an exception (docs/security.md, "What hosts print")."""

from __future__ import annotations

from dataclasses import dataclass

from meshrun.deploy.run.answers import MISSING, from_json, is_real
from meshrun.deploy.run.progress import Progress, parse_progress

STATES = ("running", "exited", "stopped", "lost")  # what a sound agent reports
DETAIL_CLIP = 120


@dataclass(frozen=True)
class HostState:
    """What one host's agent says about a run (`python -m meshrun.deploy.host.agent status`)."""

    run_id: str
    host: str
    state: str  # running | exited | stopped | lost | unreachable | stuck (SSH answers, the command did not) | unknown
    rc: int | None = None
    epoch: int | None = None
    step: int | None = None
    uptime_s: float | None = None
    detail: str | None = None
    generation: int | None = None  # the rendezvous succession's generation its agent is at
    progress: Progress | None = None  # the trainer's progress.json, on rank 0's host


def _int(value: object) -> int | None:
    """A whole number a status cell can show (not 4000 digits of one)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63 else None


def _num(value: object) -> float | None:
    return float(value) if is_real(value) else None  # type: ignore[arg-type]


def _text(value: object) -> str | None:
    return value[:DETAIL_CLIP] if isinstance(value, str) else None


def parse_status(run_id: str, host: str, stdout: str) -> HostState:
    """The report for `run_id` in the agent's answer (a JSON list of reports)."""
    return _from_reports(run_id, host, from_json(stdout or "[]"), stdout)


def parse_statuses(run_ids: tuple[str, ...], host: str, stdout: str) -> dict[str, HostState]:
    """{run id: its state} from the answer of an agent asked with no run id (a report for every run
    it knows there), each read as if the agent had been asked about that run alone: the answer is
    parsed once, however many runs are looked for in it (`fab status` asks each host once)."""
    reports = from_json(stdout or "[]")

    def alone(run_id: str) -> object:
        if not isinstance(reports, list):
            return reports
        return [r for r in reports if isinstance(r, dict) and r.get("run_id") == run_id]

    return {run_id: _from_reports(run_id, host, alone(run_id), stdout) for run_id in run_ids}


def _from_reports(run_id: str, host: str, reports: object, stdout: str) -> HostState:
    unknown = lambda why: HostState(run_id, host, "unknown", detail=why)  # noqa: E731
    if reports is MISSING:
        return unknown(f"the agent's answer is not JSON: {stdout.strip()[:60]!r}")
    if not isinstance(reports, list):
        return unknown("the agent's answer is not a list of reports")
    report = next((r for r in reports if isinstance(r, dict) and r.get("run_id") == run_id), None)
    if report is None:
        return unknown("the agent does not know this run" if not reports else "no report for this run")
    if report.get("state") not in STATES:
        return unknown(f"the agent reports an unknown state: {str(report.get('state'))[:40]!r}")
    progress = report.get("progress") if isinstance(report.get("progress"), dict) else {}
    started, end = _num(report.get("started")), _num(report.get("ended")) or _num(report.get("now"))
    uptime = end - started if end is not None and started is not None else None
    return HostState(run_id, host, report["state"], _int(report.get("rc")), _int(progress.get("epoch")),
                     _int(progress.get("global_step")), uptime, _text(report.get("reason")),
                     _int(report.get("generation")), parse_progress(progress, report.get("now")))
