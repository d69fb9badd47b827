"""deploy/check/sites.py: places from the measured link matrix and the WARN with the `site:` lines
that would declare them, by exact equality."""

from __future__ import annotations

from meshrun.deploy.check.findings import Level
from meshrun.deploy.check.sites import PlaceLinks, clusters, pair_stats, place_links, site_findings, site_lines

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


THREE = ("o1", "b1", "o2", "h1", "b2")  # an office pair, a rented pair in a datacenter, one at home


def three_places(rtt: bool = True) -> list:
    """Office LAN 1 Gbit/s 0.3 ms; datacenter LAN 25 Gbit/s 0.3 ms; office-datacenter 100 Mbit/s
    30 ms; home 20 Mbit/s, 40 ms from the office, 150 from the datacenter."""
    def link(s: str, t: str) -> tuple[float, float]:
        kinds = {s[0], t[0]}
        if kinds == {"o"}:
            return 1000.0, 0.3
        if kinds == {"b"}:
            return 25000.0, 0.3
        if kinds == {"o", "b"}:
            return 100.0, 30.0
        return (20.0, 40.0) if "o" in kinds else (20.0, 150.0)
    return [(s, t, link(s, t)[0], link(s, t)[1] if rtt else None) for s in THREE for t in THREE if s != t]


def test_nested_places_are_cut_where_both_measures_agree() -> None:
    """The widest bandwidth gap (25x, datacenter against office LAN) would split the office in
    two; the cut at 1 Gbit/s separates 10x in bandwidth and 100x in RTT, and wins."""
    assert clusters(THREE, three_places()) == (("o1", "o2"), ("b1", "b2"), ("h1",))
    (finding,) = site_findings(THREE, {}, three_places())
    assert finding.message.endswith(
        "write: o1: {site: site-1}; o2: {site: site-1}; b1: {site: site-2}; b2: {site: site-2}; "
        "h1: {site: site-3} (docs/sites.md)")
    assert site_findings(THREE, {"o1": "office", "o2": "office", "b1": "dc", "b2": "dc"}, three_places()) == []
    # Bandwidth alone cannot tell a slower LAN from a link between places: the widest gap wins.
    assert clusters(THREE, three_places(rtt=False)) == (("o1",), ("b1", "b2"), ("o2",), ("h1",))


def test_nested_places_on_a_loaded_test_bed_are_cut_where_the_rtt_says() -> None:
    """The `nested` profile as a CI run measured it (2026-12-05): a Wi-Fi pair h1, h2 (191 Mbit/s),
    a datacenter pair h3, h4 (15.9 Gbit/s), 12-19 Mbit/s and 40 ms between places. Loaded, the
    Wi-Fi pair's handshake takes 0.7 ms (or 3, behind a transfer in its shaped queue) against the
    datacenter's 0.05: 14x (60x) by the RTT too, and the product of the two separations split the
    Wi-Fi pair (83x by bandwidth). Below a millisecond RTTs count as one LAN's, and a cut the RTT
    separates wins: three places."""
    hosts = ("h1", "h2", "h3", "h4", "h5")
    cross = {"13": 18.9, "14": 12.4, "15": 18.4, "23": 15.4, "24": 15.2, "25": 18.7, "35": 18.7, "45": 19.1}
    for wifi_ms in (0.7, 3.0):
        def link(s: str, t: str) -> tuple[float, float]:
            pair = "".join(sorted(s[1] + t[1]))
            return {"12": (191.1, wifi_ms), "34": (15864.2, 0.05)}.get(pair, (cross.get(pair, 0.0), 40.0))
        links = [(s, t, *link(s, t)) for s in hosts for t in hosts if s != t]
        assert clusters(hosts, links) == (("h1", "h2"), ("h3", "h4"), ("h5",)), wifi_ms


def test_a_cut_must_separate_in_one_measure() -> None:
    # 4.5x in bandwidth and 1.25x in RTT: no place; 100x in RTT alone: two.
    assert clusters(HOSTS, matrix(slow=200.0, wan_ms=0.5)) is None
    assert clusters(HOSTS, matrix(slow=900.0, wan_ms=40.0)) == (("a1", "a2"), ("b1",))


def test_place_links_sum_the_matrix_up_by_declared_site() -> None:
    """Inside each site and between each two: the slowest pair's best bandwidth, the farthest
    pair's smallest RTT; a host without `site:` is a place of its own; nothing without sites."""
    sites = {"o1": "office", "o2": "office", "b1": "dc", "b2": "dc"}
    assert place_links(THREE, sites, three_places()) == (
        PlaceLinks("office", "office", 1, 1000.0, 0.3), PlaceLinks("office", "dc", 4, 100.0, 30.0),
        PlaceLinks("office", "host:h1", 2, 20.0, 40.0), PlaceLinks("dc", "dc", 1, 25000.0, 0.3),
        PlaceLinks("dc", "host:h1", 2, 20.0, 150.0))
    # Without --bandwidth only the RTTs; a pair never probed (past 32 hosts) counts for nothing.
    rtt_only = [(s, t, None, r) for s, t, _, r in three_places() if {s, t} != {"o1", "h1"}]
    assert place_links(THREE, sites, rtt_only)[2] == PlaceLinks("office", "host:h1", 1, None, 40.0)
    assert place_links(THREE, {}, three_places()) == ()
