"""The membership rules are pure: each case is a state of the hosts and the verdict it must give."""

from __future__ import annotations

from deploy.inventory.model import ElasticBounds
from deploy.run.membership import HostView, Verdict, judge, world_size

E23 = ElasticBounds(2, 3)


def up(name: str, nproc: int = 1) -> HostView:
    return HostView(name, nproc, running=True)


def ended(name: str, rc: int | None, lost: bool = False, leaving: bool = False) -> HostView:
    return HostView(name, 1, running=False, rc=rc, lost=lost or rc is None, leaving=leaving)


def test_fixed_run_fails_on_any_lost_or_failed_host() -> None:
    assert judge([up("a"), up("b")], "a", None) == Verdict(False)
    assert judge([up("a"), ended("b", 7)], "a", None) == Verdict(True, True, "b", "host 'b' exited with status 7")
    assert judge([up("a"), ended("b", None)], "a", None) == Verdict(True, True, "b", "host 'b' was lost")
    assert judge([ended("a", 0), ended("b", 0)], "a", None) == Verdict(True)


def test_elastic_run_survives_losing_a_non_rendezvous_host_while_min_holds() -> None:
    assert judge([up("a"), up("b"), ended("c", None)], "a", E23) == Verdict(False)
    assert judge([up("a"), ended("b", 1), ended("c", None)], "a", E23) == Verdict(
        True, True, "b", "lost b, c: 1 host(s) left, below the elastic minimum of 2")
    assert judge([ended("a", 0), ended("b", 0), ended("c", None)], "a", E23) == Verdict(True)


def test_losing_the_rendezvous_host_is_fatal_even_when_elastic() -> None:
    verdict = judge([ended("a", None), up("b"), up("c")], "a", E23)
    assert verdict.failed and verdict.failed_host == "a"
    assert verdict.reason == ("rendezvous host 'a' was lost; torchrun's store lives there, so the job cannot "
                              "survive it")


def test_a_host_leaving_on_purpose_is_not_a_failure() -> None:
    assert judge([up("a"), up("b"), ended("c", 143, leaving=True)], "a", E23) == Verdict(False)
    assert judge([up("a"), ended("b", 143, leaving=True)], "a", None) == Verdict(False)


def test_world_size_counts_running_processes() -> None:
    assert world_size([up("a", 2), up("b"), ended("c", None)]) == 3
