"""Host clocks in the pre-flight (longrun56, 1): torch's c10d rendezvous stamps each heartbeat with its
node's own clock and drops a peer whose stamp looks older than keep_alive_interval x keep_alive_max_attempt
(2 s x 3 in an elastic run), so hosts whose clocks are more than 6 - 2 = 4 s apart cannot regroup. The
facts probe reads the host's clock inside the controller's round trip; the verdict is on pairs of hosts,
blamed on the one off the median of all the clocks. By exact equality; the hosts' answers are hostile."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from meshrun.deploy.check.answers import LAST_CLOCK, clock_of
from meshrun.deploy.check.clocks import (ELASTIC_SLACK, SYNC, Clock, NoClock, Slack, apart_s, clock_findings, reading,
                                         slack_of)
from meshrun.deploy.check.findings import Finding, Level
from meshrun.deploy.check.verdicts import AllReduceResult, Fingerprint, HostFacts, ProbeStatus, build_report
from meshrun.deploy.edges import host_queries as probes
from meshrun.deploy.edges.check_probes import probe_argv
from meshrun.deploy.edges.transport import LocalSession
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.run.plan import ELASTIC_RDZV_CONF

DROPS = "an elastic run's rendezvous drops a host whose heartbeats look older than 6 s"
LOST = f"{DROPS}, so it cannot regroup after a host is lost; {SYNC}"
NEAR = (f"{DROPS}, and one may be 2 s old when read, so clocks past 4 s apart can be dropped; clocks without time "
        f"sync drift apart by seconds a day; {SYNC}")
U = 0.125  # each reading's uncertainty: half of a 0.25 s window, a binary fraction so sums stay exact


def test_the_slack_is_read_from_the_plans_rendezvous_settings() -> None:
    assert "keep_alive_interval=2" in ELASTIC_RDZV_CONF and "keep_alive_max_attempt=3" in ELASTIC_RDZV_CONF
    assert (ELASTIC_SLACK, ELASTIC_SLACK.expiry_s, ELASTIC_SLACK.margin_s) == (Slack(2.0, 3), 6.0, 4.0)
    assert slack_of(("is_host=1", "keep_alive_interval=5", "keep_alive_max_attempt=3")) == Slack(5.0, 3)  # torch's


def test_the_reading_is_the_middle_of_the_window_after_the_probe_had_run() -> None:
    # Asked at 100, answered at 101; the probe had run 0.5 s when it read 150: it read in [100.5, 101].
    assert reading(100.0, 101.0, 150.0, 0.5) == Clock(49.25, 0.25)
    assert reading(100.0, 101.0, 150.0, 0.0) == Clock(49.5, 0.5)  # the whole round trip
    assert reading(100.0, 101.0, 150.0, 5.0) == Clock(49.5, 0.5)  # longer than the round trip: no honest figure
    assert reading(100.0, 101.0, 150.0, 1.0) == Clock(49.0, 0.0)
    assert reading(100.0, 99.0, 150.0, 0.0) == Clock(50.0, 0.0)  # no window at all (never from timed_run)


def test_hosts_that_agree_or_a_controller_off_alone_say_nothing() -> None:
    assert clock_findings({"h1": Clock(0.0, U), "h2": Clock(0.5, U), "h3": Clock(-0.5, U)}, True) == []
    # This machine's clock takes no part in the rendezvous: 30 s off every host's is no finding.
    assert clock_findings({"h1": Clock(30.0, U), "h2": Clock(30.5, U), "h3": Clock(29.75, U)}, True) == []
    assert clock_findings({"h1": Clock(-600.0, U)}, True) == []  # one host has no peer to disagree with


def test_a_host_8_s_behind_fails_an_elastic_run_and_only_it_is_named() -> None:
    clocks = {"h1": Clock(0.0, U), "h2": Clock(-8.0, U), "h3": Clock(0.25, U)}
    said = "its clock is 8.0 s behind this machine's (±0.2 s) and 8.2 s behind host h3's"
    assert clock_findings(clocks, True) == [Finding(Level.FAIL, "h2", f"{said}: {LOST}")]
    assert clock_findings(clocks, False) == [Finding(Level.WARN, "h2", f"{said}: {LOST}")]  # a fixed run: warned


def test_from_1_s_apart_a_warning_and_the_fail_starts_past_the_margin_less_the_uncertainty() -> None:
    assert clock_findings({"h1": Clock(0.0, U), "h2": Clock(1.25, U)}, True) == [Finding(
        Level.WARN, "h2", f"its clock is 1.2 s ahead of this machine's (±0.2 s) and 1.2 s ahead of host h1's: {NEAR}")]
    assert clock_findings({"h1": Clock(0.0, U), "h2": Clock(1.125, U)}, True) == []  # 0.875 s certainly: under 1 s
    # 4.25 s less 0.25 s of uncertainty is 4 s: not past the margin, a WARN; 4.5 s is.
    edge = clock_findings({"h1": Clock(0.0, U), "h2": Clock(4.25, U)}, True)
    assert [(f.level, f.message.endswith(NEAR)) for f in edge] == [(Level.WARN, True)]
    past = clock_findings({"h1": Clock(0.0, U), "h2": Clock(4.5, U)}, True)
    assert [(f.level, f.message.endswith(LOST)) for f in past] == [(Level.FAIL, True)]
    assert apart_s(Clock(0.0, U), Clock(4.25, U)) == ELASTIC_SLACK.margin_s


def test_two_camps_apart_are_all_named_since_none_of_them_is_the_odd_one() -> None:
    """Each host 3 s off this machine's: half the slack, yet 6 s from the other camp."""
    clocks = {"h1": Clock(3.0, U), "h2": Clock(3.0, U), "h3": Clock(-3.0, U), "h4": Clock(-3.0, U)}
    assert clock_findings(clocks, True) == [
        Finding(Level.FAIL, "h1", f"its clock is 3.0 s ahead of this machine's (±0.2 s) and 6.0 s ahead of host h3's: {LOST}"),
        Finding(Level.FAIL, "h2", f"its clock is 3.0 s ahead of this machine's (±0.2 s) and 6.0 s ahead of host h3's: {LOST}"),
        Finding(Level.FAIL, "h3", f"its clock is 3.0 s behind this machine's (±0.2 s) and 6.0 s behind host h1's: {LOST}"),
        Finding(Level.FAIL, "h4", f"its clock is 3.0 s behind this machine's (±0.2 s) and 6.0 s behind host h1's: {LOST}")]


def test_a_clock_reset_to_1970_is_said_in_days_and_a_host_at_this_machines_time_says_so() -> None:
    assert clock_findings({"h1": Clock(-1767225600.0, 0.5), "h2": Clock(0.0, U)}, True) == [Finding(
        Level.FAIL, "h1", f"its clock is 20454 days behind this machine's (±0.5 s) and 20454 days behind host h2's: {LOST}")]
    # h1 matches this machine's clock; the median of all clocks is 5 s off it, as far as from h2 and h3.
    found = clock_findings({"h1": Clock(0.0, U), "h2": Clock(10.0, U), "h3": Clock(10.0, U)}, True)
    assert found[0] == Finding(Level.FAIL, "h1", f"its clock is within 0.2 s of this machine's and 10.0 s behind host "
                                                 f"h2's: {LOST}")
    assert [f.where for f in found] == ["h1", "h2", "h3"]


def test_a_clock_the_answer_does_not_give_is_a_warning_naming_the_host() -> None:
    clocks = {"h1": Clock(0.0, U), "h2": NoClock("the facts probe's clock is 'soon'; expected …"), "h3": None}
    assert clock_findings(clocks, True) == [Finding(
        Level.WARN, "h2", "its clock could not be read (the facts probe's clock is 'soon'; expected …): whether it "
                          "is within 4 s of the other hosts' clocks, which an elastic run's regroup needs, is unknown")]


EXPECTED = f"expected seconds since 1970, up to {LAST_CLOCK}"


@pytest.mark.parametrize("facts, error", [
    ({}, f"the facts probe's clock is missing; {EXPECTED}"),
    ({"clock": None}, f"the facts probe's clock is None; {EXPECTED}"),
    ({"clock": "1767225600"}, f"the facts probe's clock is '1767225600'; {EXPECTED}"),
    ({"clock": True}, f"the facts probe's clock is True; {EXPECTED}"),
    ({"clock": [1767225600]}, f"the facts probe's clock is [1767225600]; {EXPECTED}"),
    ({"clock": math.nan}, f"the facts probe's clock is nan; {EXPECTED}"),
    ({"clock": math.inf}, f"the facts probe's clock is inf; {EXPECTED}"),
    ({"clock": -math.inf}, f"the facts probe's clock is -inf; {EXPECTED}"),
    ({"clock": -1}, f"the facts probe's clock is -1; {EXPECTED}"),
    ({"clock": 1e300}, f"the facts probe's clock is 1e+300; {EXPECTED}"),
    ({"clock": 10**400}, f"the facts probe's clock is {'1' + '0' * 39}…; {EXPECTED}"),
    ({"clock": "\x1b[2J" * 30}, "the facts probe's clock is '" + "\\x1b[2J" * 10 + f"'…; {EXPECTED}"),  # escaped, clipped
    ({"clock": 1767225600}, "the facts probe's clock_after_s is missing; expected a number of seconds >= 0"),
    ({"clock": 1767225600, "clock_after_s": -0.5}, "the facts probe's clock_after_s is -0.5; expected a number of "
                                                   "seconds >= 0"),
    ({"clock": 1767225600, "clock_after_s": math.nan}, "the facts probe's clock_after_s is nan; expected a number "
                                                       "of seconds >= 0"),
    ({"clock": 1767225600, "clock_after_s": "0.1"}, "the facts probe's clock_after_s is '0.1'; expected a number "
                                                    "of seconds >= 0"),
])
def test_a_hostile_clock_is_no_clock_and_never_a_crash(facts: dict, error: str) -> None:
    assert clock_of("h2", facts, 1767225600.0, 1767225601.0) == NoClock(error)


def test_a_clock_is_read_strictly_from_the_answers_json() -> None:
    """json.loads takes NaN, Infinity and 1e999 (inf): each is no time; a whole number is one."""
    for text in ('{"clock": NaN, "clock_after_s": 0}', '{"clock": Infinity, "clock_after_s": 0}',
                 '{"clock": 1e999, "clock_after_s": 0}', '{"clock": 1767225600, "clock_after_s": Infinity}'):
        answer = probes.parse_json_object(text)
        assert isinstance(answer, dict) and isinstance(clock_of("h2", answer, 0.0, 1.0), NoClock), text
    answer = probes.parse_json_object('warning: a login line\n{"clock": 1767225650, "clock_after_s": 0.5}\n')
    assert clock_of("h2", answer, 1767225600.0, 1767225601.0) == Clock(49.25, 0.25)
    assert clock_of("h2", {"clock": 0, "clock_after_s": 0}, 1767225600.0, 1767225601.0) == Clock(-1767225600.5, 0.5)
    assert clock_of("h2", {"clock": LAST_CLOCK, "clock_after_s": 0}, 0.0, 0.0) == Clock(float(LAST_CLOCK), 0.0)


def host(name: str, clock: Clock | NoClock | None) -> HostFacts:
    return HostFacts(name=name, address=f"10.0.0.{name[-1]}", network="lan", reachable=True,
                     fingerprint=Fingerprint("3.11.9", "2.5.0+cpu"), workdir="~/meshrun", disk_free_gib=50.0,
                     clock=clock)


def test_the_report_judges_the_clocks_and_only_an_elastic_run_fails() -> None:
    hosts = (host("h1", Clock(0.0, U)), host("h2", Clock(-8.0, U)), host("h3", None))
    skipped = AllReduceResult(ProbeStatus.SKIPPED)
    said = f"its clock is 8.0 s behind this machine's (±0.2 s) and 8.0 s behind host h1's: {LOST}"
    elastic = build_report(hosts, None, (), skipped, "lan", 1.0, elastic=True)
    assert (elastic.level, elastic.findings) == (Level.FAIL, (Finding(Level.FAIL, "h2", said),))
    fixed = build_report(hosts, None, (), skipped, "lan", 1.0)
    assert (fixed.level, fixed.findings) == (Level.WARN, (Finding(Level.WARN, "h2", said),))
    assert json.loads(json.dumps(asdict(elastic)))["hosts"][1]["clock"] == {"offset_s": -8.0, "uncertainty_s": U}


def test_the_real_probe_read_in_one_round_trip_agrees_with_this_machines_clock(tmp_path: Path) -> None:
    """`address: local`: the host is this machine, so the offset is within its own uncertainty, and the
    probe's own time before its reading narrows the window below the whole round trip."""
    inventory = tmp_path / "local.yaml"
    inventory.write_text("hosts:\n  me:\n    address: local\n    workdir: .\n")
    session = LocalSession(load_inventory(inventory).host("me"), tmp_path)
    result, sent_at, answered_at = probes.timed_run(session, probe_argv(sys.executable, "facts", "light"), 60)
    answer = probes.parse_json_object(result.stdout)
    assert result.ok and answer is not None, result.stderr
    clock = clock_of("me", answer, sent_at, answered_at)
    assert isinstance(clock, Clock)
    assert abs(clock.offset_s) <= clock.uncertainty_s + 0.005
    assert 0 < clock.uncertainty_s < (answered_at - sent_at) / 2
    assert clock_findings({"me": clock, "me2": clock}, True) == []
