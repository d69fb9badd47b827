"""A compromised host attacking the controller through what it sends back (the review
hostile-answers): a path it reports with a lone surrogate (valid JSON `"\\ud800"`, which SSH's
UTF-8 cannot carry) that the controller would run next; an attached run's log stream without end;
a usage answer whose event is a list; extreme losses and another host's name in its metrics; a
verify error with newlines. Each goes through the real controller function; a bad answer is a
one-line MeshrunError naming the host, or degrades, never "internal error", and nothing is lost."""

from __future__ import annotations

import errno
import io
import json
from pathlib import Path
from typing import Sequence

import paramiko
import pytest
from types import SimpleNamespace
from rich.console import Console

from meshrun.deploy.check.answers import facts_of
from meshrun.deploy.commands import setup, train
from meshrun.deploy.edges import check_probes, datasync, hostlines, provenance, records, transport
from meshrun.deploy.edges.beside import Beside
from meshrun.deploy.edges.livehost import LiveHost
from meshrun.deploy.edges.records import RunRecord, write_summary
from meshrun.deploy.edges.transport import CommandResult, SshSession
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Host, Network, Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.render.png import write_png
from meshrun.deploy.run.hostusage import controller_events, read_host_usage
from meshrun.deploy.run.idle import IdlePolicy
from meshrun.deploy.run.outcome import JobOutcome, JobStatus
from meshrun.deploy.run.plan import LaunchOptions, plan_launch
from meshrun.deploy.run.report import load_report
from meshrun.deploy.run.summary import build_summary
from meshrun.deploy.host.notify import Sender
from meshrun.layout import SUMMARY
from tests.fakesession import FakeSession, FakeStream, failure
from tests.test_hostile_answers import plan

BAD = "/usr/bin/nvidia-smi\ud800"  # what json.loads makes of the host's "\\ud800"
FACTS = {"python": "3.11.7", "torch": None, "cuda": None, "nccl": None, "tools": {"nvidia-smi": BAD}}
FACTS_ERROR = ("host 'h2': the facts probe gave an unexpected answer: tools.nvidia-smi is "
               r"'/usr/bin/nvidia-smi\ud800'; expected a path of printable characters or null")


def is_facts(argv: Sequence[str]) -> bool:
    """The facts probe, full or `light`: `python -c <deploy/host/facts.py> [light]`."""
    return list(argv[1:3]) == check_probes.probe_argv("python", "facts")[1:]


def named(name: str) -> Host:
    return Host(name, "10.0.0.2", ssh_address=None, user="root", port=22, identity=None, python="/venv/bin/python",
                workdir="~/meshrun", network=Network.LAN, gpus=None, nproc=None, batch_size=None, env=())


class CountingTransport:
    """paramiko's side of an SSH connection, as far as a channel's open: counts the opens."""

    def __init__(self) -> None:
        self.opened = 0

    def open_session(self, timeout: float | None = None) -> paramiko.Channel:
        self.opened += 1
        channel = paramiko.Channel(1)
        channel.transport, channel.active, channel.remote_chanid = self, True, 1  # type: ignore[assignment]
        return channel

    def is_active(self) -> bool:
        return True


class HostileSsh(SshSession):
    """The real SshSession, its connection stubbed: it answers the facts probes with `facts`; any
    other command goes through SshSession.run, as one the controller builds from that answer would."""

    def __init__(self, name: str, facts: dict) -> None:  # noqa: super() would connect
        self.host, self.timeout, self.facts = named(name), 10.0, facts
        self.transport = CountingTransport()
        self.conn = SimpleNamespace(is_connected=True,  # type: ignore[assignment]
                                    client=SimpleNamespace(get_transport=lambda: self.transport))

    def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
        if is_facts(argv):
            return CommandResult(0, json.dumps(self.facts) + "\n", "")
        if argv[0] == "true":
            return CommandResult(0, "", "")
        return SshSession.run(self, argv, timeout=timeout, create_workdir=create_workdir)


def honest(argv: Sequence[str]) -> str:
    return json.dumps({"python": "3.11.7", "tools": {}}) if is_facts(argv) else ""


def test_a_tool_path_that_is_not_printable_is_the_hosts_bad_answer() -> None:
    for path, shown in ((BAD, r"'/usr/bin/nvidia-smi\ud800'"), ("/bin/x\nrm", r"'/bin/x\nrm'"),
                        ("/bin/\x00x", r"'/bin/\x00x'")):
        assert failure(lambda: facts_of("h2", {"tools": {"nvidia-smi": path}})) == (
            f"host 'h2': the facts probe gave an unexpected answer: tools.nvidia-smi is {shown}; expected a path "
            "of printable characters or null")
    assert facts_of("h2", {"tools": {"nvidia-smi": "/usr/bin/nvidia-smi", "rsync": None}})[2] == {
        "nvidia-smi": "/usr/bin/nvidia-smi"}


def test_check_network_fails_the_hostile_host_alone_and_keeps_the_others_facts() -> None:
    h1, h2 = named("h1"), HostileSsh("h2", FACTS)
    found = check_probes.gather_facts((h1, h2.host), h1, {"h1": FakeSession(honest, the_host=h1), "h2": h2}, {},
                                      "python3")
    assert [(f.name, f.reachable) for f in found] == [("h1", True), ("h2", False)]
    assert found[0].fingerprint is not None and found[0].fingerprint.python == "3.11.7"
    assert found[1].error == FACTS_ERROR
    assert h2.transport.opened == 0


def test_ssh_refuses_a_command_it_cannot_encode_as_the_hosts_error_opening_no_channel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    session = HostileSsh("h2", FACTS)
    message = ("host 'h2': cannot send `/usr/bin/nvidia-smi\\ud800` (UnicodeEncodeError): a path it reported is "
               "not text a command can carry; fab check-network --hosts h2")
    assert failure(lambda: check_probes._gpus(session, BAD)) == message
    assert failure(lambda: session.start([BAD, "-L"])) == message
    assert session.transport.opened == 0  # refused before a channel: none is left open

    def refused(*_args: object, **_kwargs: object) -> None:  # paramiko's own refusal, past that check
        raise UnicodeEncodeError("utf-8", "x", 0, 1, "surrogates not allowed")
    monkeypatch.setattr(transport, "open_command", refused)
    assert failure(lambda: session.run(["/bin/ok"])) == message.replace("/usr/bin/nvidia-smi\\ud800", "/bin/ok")


def test_provenance_of_a_host_naming_a_bad_nvidia_smi_has_no_gpus_and_raises_nothing() -> None:
    h1, h2 = named("h1"), HostileSsh("h2", FACTS)
    found = provenance.host_versions((h1, h2.host), {"h1": FakeSession(honest, the_host=h1), "h2": h2}, "python3")
    assert found["h1"]["python"] == "3.11.7" and found["h2"] == {"error": FACTS_ERROR} and h2.transport.opened == 0


def test_setup_refuses_a_venv_python_that_is_not_printable() -> None:
    answer = json.dumps({"python": "/home/u/meshrun/.venv/bin/python\ud800", "actions": [], "torch": None})
    request = SimpleNamespace(base="python3", reuse_site=None, identity=SimpleNamespace(build="0" * 12),
                              wheel=Path("meshrun.whl"), requirements=SimpleNamespace(file=None, lines=(),
                                                                                          install_project=False))
    assert failure(lambda: setup._run_setup(named("h2"), FakeSession(answer), request, force=False)) == (
        r"host 'h2': the setup script gave an unexpected answer: python is '/home/u/meshrun/.venv/bin/python\ud800'; "
        "expected a path of printable characters")


def attached(tmp_path: Path, origin: Beside[dict]) -> tuple[dict, str]:
    """An attached run's end (train._run_attached, then _conclude), its job replaced by its outcome:
    the summary.json it left, and what it warned."""
    outcome = JobOutcome("r1", JobStatus.SUCCEEDED, 100.0, 160.5, ())
    project = Project(tmp_path, tmp_path / "runs")
    record = RunRecord("r1", str(tmp_path / "hosts.yml"), ("h1",), 100.0, False, "h1:29400", "r1", None, {}, 1800,
                       None)
    err = io.StringIO()
    renderer = Renderer(Console(file=io.StringIO()), Console(file=err, width=400))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train, "_watched", lambda *_args: (outcome, []))
        done, summary = train._run_attached(plan(), record, None, {"h1": FakeSession("")}, project,  # type: ignore
                                            renderer, origin, Sender((), renderer.warn), IdlePolicy())
    assert train._conclude(done, summary, project, renderer) == 0
    return json.loads((project.run_home("r1") / SUMMARY).read_text()), err.getvalue()


def test_an_attached_runs_summary_is_written_when_the_light_facts_answer_is_hostile(tmp_path: Path) -> None:
    h2 = HostileSsh("h2", FACTS)  # its agent ran; its light facts probe, read beside the start, is hostile
    origin = Beside(provenance.at_launch, (h2.host,), {"h2": h2}, tmp_path, b"", "python3")
    summary, _ = attached(tmp_path, origin)
    assert summary["status"] == "succeeded" and summary["provenance"]["hosts"] == {"h2": {"error": FACTS_ERROR}}


def test_an_attached_runs_summary_is_written_without_provenance_when_reading_it_failed(tmp_path: Path) -> None:
    def fails() -> dict:
        raise MeshrunError("host 'h1': SSH connection lost (EOFError: ); is it up?")
    summary, warned = attached(tmp_path, Beside(fails))
    assert (summary["status"], summary["provenance"]) == ("succeeded", None)
    assert ("warning: the run's provenance is not in its summary: host 'h1': SSH connection lost (EOFError: ); is it "
            "up?") in warned


def test_a_summary_the_disk_refuses_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*_args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(records, "atomic_write_bytes", full)
    summary = build_summary(plan(), JobOutcome("r1", JobStatus.SUCCEEDED, 100.0, 160.5, ()), None)
    assert failure(lambda: write_summary(tmp_path / "r1", summary)) == (
        f"cannot write {tmp_path / 'r1' / SUMMARY} (No space left on device): free space there; run r1 ended "
        "succeeded, and its hosts keep their files (fab fetch-checkpoints --run r1)")


def flood(tmp_path: Path, lines: int, monkeypatch: pytest.MonkeyPatch) -> tuple[LiveHost, list[str]]:
    """Host h1's stream of `lines` lines of 1000 bytes read to its end into runs/…/logs/h1.log, under a
    budget of 1 MiB; what reached the console."""
    monkeypatch.setattr(hostlines, "LOG_MAX_BYTES", 1 << 20)
    the_plan = plan_launch(Selection((named("h1"),), Rendezvous("h1", 29400)), LaunchOptions("r1"), {}, "/p")
    live = LiveHost(the_plan.hosts[0], FakeSession(""), tmp_path / "h1.log")
    live.stream = FakeStream("".join(f"{i:06d} {'x' * 992}\n" for i in range(lines)), 0)
    shown: list[str] = []
    hostlines.read_host(live, lambda _host, text: shown.append(text), None)
    return live, shown


def test_a_hosts_log_on_the_controller_stops_at_its_budget_and_says_so(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    lines = 3000  # about 3 MiB: three times the budget
    live, shown = flood(tmp_path, lines, monkeypatch)
    kept = (tmp_path / "h1.log").read_text().splitlines()
    marker = ("[h1] meshrun: this file reached 1 MiB; further lines of this host are not kept here (they stay in "
              "its own train.log: fab logs)")
    assert kept[-1] == marker and kept.count(marker) == 1
    assert (tmp_path / "h1.log").stat().st_size <= (1 << 20) + 1010 + len(marker) + 1
    assert kept[:-1] == [f"[h1] {i:06d} {'x' * 992}" for i in range(len(kept) - 1)]
    assert len(shown) == lines and shown[-1].startswith(f"[h1] {lines - 1:06d} ")  # the console got all
    assert live.tail[-1] == shown[-1] and (live.rc, live.lost) == (0, False)
    flood(tmp_path, 10, monkeypatch)  # a rejoin's reader of the same log: the budget is the file's
    assert (tmp_path / "h1.log").read_text().splitlines() == kept


def test_a_usage_answer_whose_event_is_no_text_gives_no_event() -> None:
    answer = json.dumps({"events": [{"time": 1, "event": []}, {"time": 1, "event": {}},
                                    {"time": 2, "event": "started"}]})
    assert [e.text for e in read_host_usage("h2", answer).events] == ["h2 started"]
    journal = '{"time": 1, "event": [], "host": "h2"}\n{"time": 1, "event": {"a": 1}, "host": "h2"}\n'
    assert controller_events(journal) == ()


def epochs(root: Path, losses: Sequence[float]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "metrics.jsonl").write_text("".join(json.dumps(
        {"kind": "epoch", "epoch": n, "train_loss": loss, "test_loss": 1.0, "test_acc": 0.5, "test_acc5": 0.9,
         "world_size": 2, "global_step": n, "time": float(n)}) + "\n" for n, loss in enumerate(losses, 1)))


def steps(path: Path, host: str, rank: int, sps: float) -> None:
    path.write_text(json.dumps({"kind": "step", "host": host, "rank": rank, "samples_per_s": sps, "step_s": 0.1,
                                "data_s": 0.0, "fwd_bwd_s": 0.0, "optim_s": 0.0, "peak_mem_bytes": 1}) + "\n")


def test_extreme_losses_are_skipped_and_the_picture_is_drawn(tmp_path: Path) -> None:
    epochs(tmp_path / "hosts" / "h1", [1e308, -1e308, 0.5, float("nan"), float("inf")])
    report = load_report(tmp_path / "hosts")
    assert [e.epoch for e in report.epochs] == [3, 4, 5]
    assert report.skipped == (f"{tmp_path / 'hosts' / 'h1' / 'metrics.jsonl'}: 2 of 5 line(s) skipped, not a metrics "
                              "record the report can use (the first, line 1: train_loss is 1e+308; expected a number "
                              "within ±1e+30, NaN or ±inf)",)
    assert write_png(report, tmp_path / "report.png").stat().st_size > 0


def test_a_picture_matplotlib_cannot_lay_out_says_so_and_the_report_goes_on(tmp_path: Path) -> None:
    from meshrun.deploy.run.report import EpochPoint, RunReport

    report = RunReport(tmp_path, tuple(EpochPoint(n, loss, 1.0, 0.5, 0.9, 1, n, float(n))
                                       for n, loss in enumerate((1e308, -1e308))), (), 0)
    from PIL import Image

    with Image.open(write_png(report, tmp_path / "report.png")) as image:  # was ValueError: arange: cannot …
        assert image.size == (800, 150)  # the one line saying the plot was not drawn, and why


def test_a_fetched_ranks_row_is_the_folders_host_whatever_its_records_claim(tmp_path: Path) -> None:
    epochs(tmp_path / "h1", [0.5])
    steps(tmp_path / "h1" / "metrics.rank0.jsonl", "h1", 0, 500.0)
    (tmp_path / "h2").mkdir()
    steps(tmp_path / "h2" / "metrics.rank1.jsonl", "h1", 0, 5.0)  # h2 says it is h1's rank 0
    report = load_report(tmp_path)
    assert [(r.host, r.rank, r.samples_per_s) for r in report.ranks] == [("h1", 0, 500.0), ("h2", 0, 5.0)]
    assert report.skipped == (f"{tmp_path / 'h2' / 'metrics.rank1.jsonl'}: its records name host 'h1'; shown under "
                              "the host it was fetched from",)
    shared = tmp_path / "shared"  # one run dir every rank wrote to: there the record's host is all there is
    shared.mkdir()
    steps(shared / "metrics.rank1.jsonl", "h2", 1, 7.0)
    assert [(r.host, r.rank) for r in load_report(shared).ranks] == [("h2", 1)]


def test_a_verify_error_from_the_host_is_one_line() -> None:
    class Failing(FakeSession):
        def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
            return CommandResult(1, "", "oops\nh1: data /data: 1200 files verified by sha256; unchanged\n\x1b[2J")
    message = failure(lambda: datasync.verify(Failing(""), "python3", "/data", {}, 10))
    assert message == ("host 'h1': could not verify /data: oops\\nh1: data /data: 1200 files verified by sha256; "
                       "unchanged\\n\\x1b[2J")
