"""deploy/check/sites.py: places from the measured link matrix and the WARN with the `site:` lines
that would declare them, by exact equality."""

from __future__ import annotations

from meshrun.deploy.check.findings import Level
from meshrun.deploy.check.sites import clusters, pair_stats, site_findings, site_lines

HOSTS = ("a1", "b1", "a2")  # a1, a2 share a LAN; b1 is at home


def matrix(fast: float = 900.0, slow: float = 20.0, lan_ms: float = 0.4, wan_ms: float = 40.0) -> list:
    near = {frozenset(("a1", "a2"))}
    return [(s, t, fast if frozenset((s, t)) in near else slow, lan_ms if frozenset((s, t)) in near else wan_ms)
            for s in HOSTS for t in HOSTS if s != t]


def test_pairs_take_the_best_direction() -> None:
    got = pair_stats([("a", "b", 10.0, 5.0), ("b", "a", 30.0, 4.0), ("a", "c", None, None), ("a", "a", 1.0, 1.0)])
    assert got == {frozenset("ab"): (30.0, 4.0), frozenset("ac"): (None, None)}


def test_bandwidth_gap_makes_places_in_host_order() -> None:
    assert clusters(HOSTS, matrix()) == (("a1", "a2"), ("b1",))
    assert clusters(HOSTS, matrix(slow=200.0, wan_ms=0.5)) is None  # 4.5x, same RTT: one place
    assert clusters(HOSTS, matrix(slow=200.0, wan_ms=40.0)) == (("a1", "a2"), ("b1",))  # 100x RTT


def test_no_clean_cut_is_no_places() -> None:
    chain = [("a", "b", 1000.0, None), ("b", "c", 1000.0, None), ("a", "c", 10.0, None)]
    assert clusters(("a", "b", "c"), chain) is None  # a-c slow, but a and c share b's LAN


def test_warn_names_the_places_and_the_site_lines() -> None:
    (finding,) = site_findings(HOSTS, {}, matrix())
    assert (finding.level, finding.where) == (Level.WARN, "cluster")
    assert finding.message == (
        "the measured links fall into 2 places (a1, a2 | b1; >= 5x bandwidth or >= 10x RTT between them) that the "
        "inventory's sites do not declare; write: a1: {site: site-1}; a2: {site: site-1}; b1: {site: site-2} "
        "(docs/sites.md)")
    assert site_findings(HOSTS, {"a1": "office", "a2": "office"}, matrix()) == []  # b1: a place of its own
    assert site_findings(HOSTS, {"a1": "office", "a2": "office", "b1": "home"}, matrix()) == []
    assert site_findings(HOSTS, {}, matrix(slow=800.0, wan_ms=0.5)) == []
    wrong = site_findings(HOSTS, {"a1": "office", "b1": "office"}, matrix())
    assert len(wrong) == 1 and wrong[0].message.endswith(
        "write: a1: {site: office}; a2: {site: office}; b1: {site: site-2} (docs/sites.md)")


def test_site_lines_keep_a_declared_name_once() -> None:
    assert site_lines((("a1", "a2"), ("b1",)), {"a1": "x", "a2": "x", "b1": "x"}) == (
        "a1: {site: x}", "a2: {site: x}", "b1: {site: site-2}")
