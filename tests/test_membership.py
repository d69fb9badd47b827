"""The membership rules are pure: each case is a state of the hosts and the verdict it must give."""

from __future__ import annotations

from meshrun.deploy.inventory.model import ElasticBounds
from meshrun.layout import AGENT_BUSY_EXIT, STATE_REFUSED_EXIT
from meshrun.deploy.run.membership import (OUTLIVED_DETAIL, RUN_END_GRACE_S, Change, HostView, Verdict, how_it_ended,
                                           judge, next_head, outlived, split_brain_risk, world_size)

E23 = ElasticBounds(2, 3)


def up(name: str, nproc: int = 1) -> HostView:
    return HostView(name, nproc, running=True)


def ended(name: str, rc: int | None, lost: bool = False, leaving: bool = False) -> HostView:
    return HostView(name, 1, running=False, rc=rc, lost=lost or rc is None, leaving=leaving)


def test_fixed_run_fails_on_any_lost_or_failed_host() -> None:
    assert judge([up("a"), up("b")], None) == Verdict(False)
    assert judge([up("a"), ended("b", 7)], None) == Verdict(True, True, "b", "host 'b' exited with status 7")
    assert judge([up("a"), ended("b", None)], None) == Verdict(True, True, "b", "host 'b' was lost")
    assert judge([ended("a", 0), ended("b", 0)], None) == Verdict(True)


def test_elastic_run_survives_losing_a_non_rendezvous_host_while_min_holds() -> None:
    assert judge([up("a"), up("b"), ended("c", None)], E23) == Verdict(False)
    assert judge([up("a"), ended("b", 1), ended("c", None)], E23) == Verdict(
        True, True, "b", "lost b, c: 1 host(s) left, below the elastic minimum of 2")
    assert judge([ended("a", 0), ended("b", 0), ended("c", None)], E23) == Verdict(True)


def test_losing_the_rendezvous_host_is_survived_by_succession_when_elastic() -> None:
    hosts = [ended("a", None), up("b"), up("c")]
    assert judge(hosts, E23) == Verdict(False)
    assert next_head(("a", "b", "c"), "a", hosts) == "b"
    assert next_head(("a", "b", "c"), "a", [ended("a", None), ended("b", None), up("c")]) == "c"
    assert next_head(("a", "b", "c"), "b", [ended("a", None), ended("b", None), up("c")]) == "c"
    assert next_head(("a", "b"), "a", [ended("a", None), ended("b", 1)]) is None
    assert judge([ended("a", None), up("b"), up("c")], None) == Verdict(True, True, "a", "host 'a' was lost")


def test_split_brain_is_impossible_only_when_min_is_more_than_half() -> None:
    assert split_brain_risk(ElasticBounds(2, 3), 3) is None
    assert split_brain_risk(ElasticBounds(3, 4), 4) is None
    assert split_brain_risk(ElasticBounds(2, 4), 4) == (
        "elastic minimum 2 of 4 hosts: a network split could leave two groups of 2 that both carry on as "
        "separate jobs; use a minimum above half the hosts (3) to rule that out")
    assert split_brain_risk(ElasticBounds(1, 3), 3) is not None


def test_a_host_leaving_on_purpose_is_not_a_failure() -> None:
    assert judge([up("a"), up("b"), ended("c", 143, leaving=True)], E23) == Verdict(False)
    assert judge([up("a"), ended("b", 143, leaving=True)], None) == Verdict(False)


def test_world_size_counts_running_processes() -> None:
    assert world_size([up("a", 2), up("b"), ended("c", None)]) == 3


def test_hosts_still_running_long_after_the_training_finished_are_stopped_not_lost() -> None:
    """One host finished with status 0: the last round's members are all through torch's exit
    barrier; what still runs RUN_END_GRACE_S later came back too late to be admitted."""
    hosts = [ended("a", 0), up("b"), up("c"), HostView("d", 1, running=True, leaving=True)]
    assert outlived(hosts, E23, finished_at=100.0, now=100.0 + RUN_END_GRACE_S) == ("b", "c")
    assert outlived(hosts, E23, finished_at=100.0, now=99.9 + RUN_END_GRACE_S) == ()
    assert outlived(hosts, E23, finished_at=None, now=1e9) == ()
    assert outlived(hosts, None, finished_at=100.0, now=1e9) == ()  # a fixed run has no late joiner
    # Stopped so, a host ends as finished, with the reason, and fails nothing.
    assert how_it_ended(-15, leaving=False, outlived=True) == (Change.FINISHED, OUTLIVED_DETAIL)
    assert judge([ended("a", 0), ended("b", -15, leaving=True)], E23) == Verdict(True)


def test_how_a_host_ended_is_named_for_the_timeline() -> None:
    assert how_it_ended(0, leaving=False, outlived=False) == (Change.FINISHED, None)
    assert how_it_ended(0, leaving=True, outlived=False) == (Change.LEFT, None)
    assert how_it_ended(143, leaving=True, outlived=False) == (Change.LEFT, "exit status 143")
    assert how_it_ended(None, leaving=False, outlived=False) == (Change.LOST, "unreachable")
    # Once training has finished, an exit status costs nothing; an unreachable host is still lost.
    assert how_it_ended(1, leaving=False, outlived=False, training_done=True) == (
        Change.FINISHED, "ended after training had finished (exit status 1)")
    assert how_it_ended(None, leaving=False, outlived=False, training_done=True) == (Change.LOST, "unreachable")
    assert how_it_ended(STATE_REFUSED_EXIT, leaving=False, outlived=False) == (
        Change.LOST, "it refused the rendezvous state: a member of the run may be compromised")
    assert how_it_ended(AGENT_BUSY_EXIT, leaving=False, outlived=False) == (
        Change.LOST, "another agent of this run already runs there; it started nothing")
