"""summary.json of an attached run whose controller went silent (a laptop closed) past the agents'
heartbeat timeout (day2 #1).

The agents stop the run themselves after HEARTBEAT_TIMEOUT_S without a heartbeat, each writing why in
its `hosts/<host>/exit.json` (deploy/host/agent.py). The controller, once awake, found every agent gone
with status 143 and wrote `failed`, `host 'h1' exited with status 143`, `failed_host: h1`,
`lost_hosts: ["h1"]`: a healthy host blamed, and no word of the cause or of `--resume`. Now the end's one
read per host (deploy/commands/trainend.py `read_ends`: starts.json, and in the same command the
agent's exit.json) tells that end apart: the summary says `stopped`, names this controller's silence
and `fab train --resume ID`, and counts no host that stopped for it as lost. The agent's own words are
checked against the reader with the real agent; the read against real `tail`, the hosts' files on disk.

The silence counts only where it explains the failure: the host the controller blamed says so itself
(stop54-attacker #3). One host's exit.json alone turned a run whose honest h2 crashed (exit 1, the
controller awake) into `stopped`, `failed_host: null`, "this controller was silent": a compromised
member, or an honest one cut off alone, recast the whole run. Its word now stays in its timeline detail."""

from __future__ import annotations

import dataclasses
import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest

from meshrun import layout
from meshrun.deploy.commands import trainend
from meshrun.deploy.edges.beside import Beside
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.edges.transport import CommandResult
from meshrun.deploy.inventory.model import Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.membership import Change, MembershipEvent
from meshrun.deploy.run.outcome import HostOutcome, JobOutcome, JobStatus
from meshrun.deploy.run.plan import LaunchOptions, LaunchPlan, Workload, plan_launch
from meshrun.deploy.run.summary import (HostEnd, build_summary, end_files, end_read, exit_silence, host_end,
                                        silence_reason)
from tests.fakesession import DEEP, HostFiles, host

RUN = "20261206-181241-18eb"
RDZV = RUN
REASON = (f"this controller was silent (suspended or cut off): after 31 s with no heartbeat from it the agents "
          f"stopped the run; resume it: fab train --resume {RUN}")


def a_plan(names: Sequence[str] = ("h1",), script: str | None = None) -> LaunchPlan:
    """A fixed run (no --nnodes), two processes per host."""
    hosts = tuple(dataclasses.replace(host(), name=name, address=f"10.0.0.{i}", nproc=2)
                  for i, name in enumerate(names, 1))
    options = LaunchOptions(RUN, Workload(script=script), rdzv_id=RDZV)
    return plan_launch(Selection(hosts, Rendezvous(names[0], 29400)), options, {}, "/v/python")


def woke(names: Sequence[str] = ("h1",)) -> JobOutcome:
    """What the controller saw on waking: every agent gone with 143; the first one blamed."""
    size = 2 * len(names)
    events = [MembershipEvent(1.0, Change.STARTED, name, 2 * i) for i, name in enumerate(names, 1)]
    events += [MembershipEvent(50.0 + i, Change.LOST, name, size - 2 * i, "exit status 143")
               for i, name in enumerate(names, 1)]
    return JobOutcome(RUN, JobStatus.FAILED, 0.0, 52.3,
                      tuple(HostOutcome(name, 143, Path(f"runs/{RUN}/logs/{name}.log"), ()) for name in names),
                      failed_host=names[0], reason=f"host '{names[0]}' exited with status 143", events=tuple(events))


def exit_record(reason: str, rc: int = 143) -> str:
    """exit.json as the agent writes it (deploy/host/agent.py `run`)."""
    return json.dumps({"rc": rc, "reason": reason, "ended": 1765041213.4, "generation": 0})


# --- the pure rule ------------------------------------------------------------------------------------

def test_a_run_its_agents_stopped_for_this_controllers_silence_is_stopped_and_no_host_is_lost() -> None:
    summary = build_summary(a_plan(), woke(), None, ends=[HostEnd("h1", silent_s=31)])
    assert (summary.status, summary.reason, summary.failed_host, summary.lost_hosts, summary.world_size) == (
        "stopped", REASON, None, [], 2)
    assert summary.reason == silence_reason(RUN, 31)
    assert summary.timeline[-1] == {"time": 51.0, "event": "lost", "host": "h1", "world_size": 0, "detail": (
        "exit status 143; its agent stopped the run: no heartbeat from this controller for 31 s")}
    # The same end without the agents' word (no host answered, or an older agent): what the controller saw.
    bare = build_summary(a_plan(), woke(), None)
    assert (bare.status, bare.reason, bare.failed_host, bare.lost_hosts) == (
        "failed", "host 'h1' exited with status 143", "h1", ["h1"])


def test_the_longest_silence_is_said_and_only_the_hosts_that_stopped_for_it_are_not_lost() -> None:
    """Two hosts: h1's agent stopped for the silence; h2's workers died with their peer a moment
    before its agent looked (exit 1, `exited`): h2 stays lost, the run is still the silence's."""
    plan, outcome = a_plan(("h1", "h2")), woke(("h1", "h2"))
    summary = build_summary(plan, outcome, None, ends=[HostEnd("h1", silent_s=31), HostEnd("h2")])
    assert (summary.status, summary.failed_host, summary.lost_hosts, summary.world_size) == ("stopped", None, ["h2"], 4)
    both = build_summary(plan, outcome, None, ends=[HostEnd("h1", silent_s=31), HostEnd("h2", silent_s=44)])
    assert (both.lost_hosts, both.reason) == ([], silence_reason(RUN, 44))


def test_only_a_failed_run_is_read_as_silenced() -> None:
    """Ctrl-C on waking, or a run that succeeded: the controller's own word stands."""
    ends = [HostEnd("h1", silent_s=31)]
    for status, reason in ((JobStatus.STOPPED, "interrupted (Ctrl-C)"), (JobStatus.SUCCEEDED, None)):
        outcome = dataclasses.replace(woke(), status=status, reason=reason, failed_host=None)
        assert (build_summary(a_plan(), outcome, None, ends=ends).status,
                build_summary(a_plan(), outcome, None, ends=ends).reason) == (status.value, reason)


@pytest.mark.parametrize("text, silent", [
    (exit_record("no heartbeat from the controller for 31 s"), 31),
    (exit_record("no heartbeat from the controller for 3600 s"), 3600),
    (exit_record("exited", rc=1), None), (exit_record("signal SIGTERM"), None),
    (exit_record("the controller's connection closed"), None),
    (exit_record("no heartbeat from the controller for 31 s; and more"), None),
    (exit_record("no heartbeat from the controller for -1 s"), None),
    (exit_record("no heartbeat from the controller for ١ s"), None),  # not an ASCII digit
    (json.dumps({"reason": 31}), None), ("[]", None), ("not json", None), ("", None), (DEEP, None),
    (json.dumps({"reason": "no heartbeat from the controller for 31 s", "pad": "x" * (4 << 10)}), None),  # too long
])
def test_an_exit_record_of_any_shape_is_a_silence_or_none(text: str, silent: int | None) -> None:
    assert exit_silence(text) == silent


def crashed(evil_lost: bool = False) -> JobOutcome:
    """What the controller saw, awake: h2's trainer crashed (exit 1) and failed the run; `evil_lost`: evil's
    agent then ended by itself (status 143) before the controller stopped it."""
    events = [MembershipEvent(1.0, Change.STARTED, "evil", 2), MembershipEvent(1.0, Change.STARTED, "h2", 4),
              MembershipEvent(40.0, Change.LOST, "h2", 2, "exit status 1")]
    events += [MembershipEvent(40.5, Change.LOST, "evil", 0, "exit status 143")] if evil_lost else []
    hosts = (HostOutcome("evil", 143, Path("evil.log"), ()), HostOutcome("h2", 1, Path("h2.log"), ()))
    return JobOutcome(RUN, JobStatus.FAILED, 0.0, 41.0, hosts, failed_host="h2",
                      reason="host 'h2' exited with status 1", events=tuple(events))


def test_one_hosts_word_of_silence_does_not_recast_a_run_another_host_failed() -> None:
    """The attack's run: only evil says the controller was silent; h2, the host that failed, does not."""
    plan = a_plan(("evil", "h2"))
    for ends in ([HostEnd("evil", silent_s=31), HostEnd("h2")], [HostEnd("evil", silent_s=31)]):  # h2 silent, or none
        summary = build_summary(plan, crashed(), None, ends=ends)
        assert (summary.status, summary.failed_host, summary.lost_hosts, summary.reason) == (
            "failed", "h2", ["h2"], "host 'h2' exited with status 1")
        assert [event["detail"] for event in summary.timeline] == [None, None, "exit status 1"]
    # evil's agent ended by itself too: lost, and its word is told beside its loss as its own, not the run's cause.
    summary = build_summary(plan, crashed(evil_lost=True), None, ends=[HostEnd("evil", silent_s=31), HostEnd("h2")])
    assert (summary.status, summary.failed_host, summary.lost_hosts) == ("failed", "h2", ["evil", "h2"])
    assert summary.timeline[-1]["detail"] == (
        "exit status 143; its agent says it had no heartbeat from this controller for 31 s")
    # h2, the host blamed, says so itself: the silence explains the failure.
    both = build_summary(plan, crashed(evil_lost=True), None, ends=[HostEnd("evil", silent_s=31),
                                                                    HostEnd("h2", silent_s=33)])
    assert (both.status, both.failed_host, both.lost_hosts, both.reason) == (
        "stopped", None, [], silence_reason(RUN, 33))


# --- the agent's own words, and the read ------------------------------------------------------------

def test_the_agents_words_when_the_controller_goes_silent_are_what_the_summary_reads(tmp_path: Path) -> None:
    """The real agent, its controller silent (stdin open, nothing written) past a 1 s timeout."""
    run_id = f"20260101-000000-{secrets.token_hex(2)}"  # agents sweep by run id and host, machine-wide
    argv = [sys.executable, "-m", layout.AGENT_MODULE, "run", "--run-id", run_id, "--host", "h1",
            "--heartbeat-timeout", "1", "--grace", "2", "--quiet", "--", sys.executable, "-c",
            "import time; time.sleep(120)"]
    agent = subprocess.Popen(argv, cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        rc = agent.wait(timeout=60)
    finally:
        agent.kill()
        agent.wait()
        assert agent.stdin is not None
        agent.stdin.close()
    record = (tmp_path / layout.host_dir(run_id, "h1") / layout.EXIT_RECORD).read_text()
    silent = json.loads(record)["reason"].removeprefix("no heartbeat from the controller for ").removesuffix(" s")
    assert (rc, exit_silence(record)) == (143, int(silent))



def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def ended(tmp_path: Path, plan: LaunchPlan, outcome: JobOutcome, record: RunRecord,
          asked: list[tuple[str, list[str]]]):  # type: ignore[no-untyped-def]
    sessions = {h.host.name: HostFiles(h.host.name, tmp_path / h.host.name, asked) for h in plan.hosts}
    return trainend.gathered(plan, outcome, record, sessions, Project(tmp_path, tmp_path / "runs"), Renderer(),
                             Beside(lambda: None))


def a_record(plan: LaunchPlan, script: str | None = None) -> RunRecord:
    return RunRecord(RUN, "/p/inventory.yaml", tuple(h.host.name for h in plan.hosts), 0.0, False, "10.0.0.1:29400",
                     RDZV, None, {"script": script, "config": None, "args": []})


def test_the_end_reads_each_agents_exit_record_in_the_round_that_reads_its_starts(tmp_path: Path) -> None:
    """The evidence's run: h1's agent stopped after 31 s of silence; the trainer wrote no result.json."""
    plan, asked = a_plan(), []
    write(tmp_path / "h1" / layout.host_dir(RUN, "h1") / layout.EXIT_RECORD,
          exit_record("no heartbeat from the controller for 31 s"))
    write(tmp_path / "h1" / layout.run_dir(RUN) / layout.STARTS_FILE, json.dumps({RDZV: 1}))
    summary = ended(tmp_path, plan, woke(), a_record(plan), asked)
    files = end_files(RUN, "h1", trainer=True)
    assert asked == [("h1", ["cat", f"runs/{RUN}/result.json"]), ("h1", end_read(files))]
    assert end_read(files) == ["tail", "-c", str((1 << 20) + 1), "--", f"runs/{RUN}/starts.json",
                               f"runs/{RUN}/hosts/h1/exit.json", f"runs/{RUN}/progress.json",
                               f"runs/{RUN}/metrics.jsonl"]
    assert (summary.status, summary.reason, summary.failed_host, summary.lost_hosts, summary.restarts) == (
        "stopped", REASON, None, [], 0)


def test_a_script_runs_end_reads_the_exit_record_too(tmp_path: Path) -> None:
    """A --script run's agents stop it the same way; its round reads no trainer file."""
    plan, asked = a_plan(("h1", "h2"), script="job.py"), []
    for name in ("h1", "h2"):
        write(tmp_path / name / layout.host_dir(RUN, name) / layout.EXIT_RECORD,
              exit_record("no heartbeat from the controller for 33 s"))
        write(tmp_path / name / layout.run_dir(RUN) / layout.STARTS_FILE, json.dumps({f"{RDZV}@{name}": 1}))
    summary = ended(tmp_path, plan, woke(("h1", "h2")), a_record(plan, "job.py"), asked)
    assert sorted(asked) == [(name, end_read(end_files(RUN, name, trainer=False))) for name in ("h1", "h2")]
    assert (summary.status, summary.reason, summary.lost_hosts, summary.world_size) == (
        "stopped", silence_reason(RUN, 33), [], 4)


def test_a_host_that_answers_no_exit_record_or_another_reason_leaves_the_failure_as_it_was(tmp_path: Path) -> None:
    plan = a_plan()
    write(tmp_path / "h1" / layout.host_dir(RUN, "h1") / layout.EXIT_RECORD, exit_record("exited", rc=1))
    summary = ended(tmp_path, plan, woke(), a_record(plan), [])
    assert (summary.status, summary.failed_host, summary.lost_hosts) == ("failed", "h1", ["h1"])
    answer = host_end("h1", "==> x <==\n" + exit_record("no heartbeat from the controller for 31 s"),
                      end_files(RUN, "h1", False), RDZV, False)
    assert answer == HostEnd("h1")  # a file it did not ask for says nothing


def test_a_hosts_answer_is_read_from_its_exit_record_alone(tmp_path: Path) -> None:
    """Only exit.json there (no starts.json: tail exits 1 for it): its header still finds it."""
    files = end_files(RUN, "h1", trainer=False)
    write(tmp_path / files[1], exit_record("no heartbeat from the controller for 31 s"))
    done = subprocess.run(end_read(files), cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 1
    assert host_end("h1", done.stdout, files, RDZV, False) == HostEnd("h1", silent_s=31)


def test_the_end_reads_a_hosts_claim_of_silence_and_keeps_the_failure_of_the_host_that_failed(
        tmp_path: Path) -> None:
    """The attack's files on disk, read by real `tail`: evil's exit.json says silence; h2's, that it exited."""
    plan = a_plan(("evil", "h2"))
    write(tmp_path / "evil" / layout.host_dir(RUN, "evil") / layout.EXIT_RECORD,
          exit_record("no heartbeat from the controller for 31 s"))
    write(tmp_path / "h2" / layout.host_dir(RUN, "h2") / layout.EXIT_RECORD, exit_record("exited", rc=1))
    summary = ended(tmp_path, plan, crashed(), a_record(plan), [])
    assert (summary.status, summary.failed_host, summary.lost_hosts, summary.reason) == (
        "failed", "h2", ["h2"], "host 'h2' exited with status 1")


def test_a_host_whose_read_fails_adds_nothing_and_costs_the_others_nothing(tmp_path: Path) -> None:
    """read_ends asks every host at once: one whose command fails (no answer in time) adds no end."""
    plan = a_plan(("h1", "h2"))

    class Hung(HostFiles):
        def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
            from meshrun.deploy.errors import MeshrunError
            raise MeshrunError(f"host '{self.host.name}': no answer within {timeout} s")

    write(tmp_path / "h1" / layout.host_dir(RUN, "h1") / layout.EXIT_RECORD,
          exit_record("no heartbeat from the controller for 31 s"))
    sessions = {"h1": HostFiles("h1", tmp_path / "h1", []), "h2": Hung("h2", tmp_path / "h2", [])}
    assert trainend.read_ends(sessions, plan, RDZV, False) == [HostEnd("h1", silent_s=31)]
