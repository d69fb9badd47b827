"""deploy/run/commplan.py with sites (docs/sites.md): the measured matrix split into links inside
and between sites, the hierarchical floor (inside + between), the flat hooks judged on the link
between sites, and `auto`'s choice with its reason, by exact equality."""

from __future__ import annotations

import dataclasses

from meshrun.deploy.run.commplan import (GRAD_BYTES, Hook, HookFloor, HookSettings, LinkStats, SiteLinks, places_hint,
                                         plan, site_links, wire_hint)
from tests.test_commplan import DIGITS

SITES = {"a1": "office", "a2": "office", "b1": "home"}
LAN, HOME = (1000.0, 0.5), (20.0, 40.0)  # Mbit/s, RTT ms


def matrix(sites: dict[str, str]) -> list[tuple[str, str, float, float]]:
    return [(a, b, *(LAN if sites[a] == sites[b] else HOME)) for a in sites for b in sites if a != b]


def test_links_split_inside_and_between_sites() -> None:
    got = site_links(matrix(SITES), SITES)
    assert got == SiteLinks((("office", ("a1", "a2")), ("home", ("b1",))), LinkStats(125e6, 0.0005),
                            LinkStats(2.5e6, 0.04))
    assert got.places and got.largest == 2
    alone = {"a1": "host:a1", "b1": "host:b1"}  # no site declared: each host its own
    assert site_links(matrix(alone), alone) == SiteLinks(
        (("host:a1", ("a1",)), ("host:b1", ("b1",))), None, LinkStats(2.5e6, 0.04))
    one = {"a1": "office", "a2": "office"}
    assert site_links(matrix(one), one) == SiteLinks((("office", ("a1", "a2")),), LinkStats(125e6, 0.0005), None)


def test_two_sites_choose_hier_and_say_why() -> None:
    s = HookSettings(powersgd_rank=4, localsgd_period=4, diloco_inner_steps=8)
    sites = site_links(matrix(SITES), SITES)
    got = plan(125e6, 3, DIGITS, s, budget_s=0.05, rtt_s=0.0005, sites=sites)
    full = GRAD_BYTES * (256 * 64 + 256 + 128 * 256 + 128 + 10 * 128 + 10)
    # Flat hooks ride the slow link: 2.5 MB/s and 40 ms.
    assert (got.bandwidth_bytes_s, got.rtt_s) == (2.5e6, 0.04)
    assert got.floor_of(Hook.NONE) == HookFloor(Hook.NONE, full, 4 / 3 * full / 2.5e6 + 2 * 0.04, 2 * 0.04)
    # hier: DDP over 2 office hosts every step (+ the round's in-site sum and broadcast, over H),
    # one all-reduce of the pseudo-gradient between the 2 sites every H = 8 steps.
    inside = full / 125e6 + 0.0005 + (2 * full / 125e6 + 2 * 0.0005) / 8
    between = full / 2.5e6 / 8 + 0.04 / 8
    assert got.floor_of(Hook.HIER) == HookFloor(Hook.HIER, full / 8, inside + between,
                                                 0.0005 + 2 * 0.0005 / 8 + 0.04 / 8, inside, between)
    assert got.recommended is Hook.HIER
    assert got.reason == (
        "0.20 MB of gradients, 3 nodes (2 sites of 2+1, between them 20.0 Mbit/s, RTT 40.0 ms; inside 1000.0 "
        "Mbit/s, RTT 0.5 ms), 20.0 Mbit/s per node, RTT 40.0 ms: none 188.4 ms > budget; fp16 134.2 ms > budget; "
        "powersgd 168.0 ms > budget; hier 17.8 ms (2.7 ms inside + 15.2 ms between) <= budget 50.0 ms per step")


def test_a_bf16_wire_halves_what_crosses_between_sites() -> None:
    s = HookSettings(diloco_inner_steps=8, diloco_wire_bytes=2)
    got = plan(125e6, 3, DIGITS, s, budget_s=0.05, rtt_s=0.0005, sites=site_links(matrix(SITES), SITES))
    full = GRAD_BYTES * (256 * 64 + 256 + 128 * 256 + 128 + 10 * 128 + 10)
    inside = full / 125e6 + 0.0005 + (2 * full / 125e6 + 2 * 0.0005) / 8  # DDP inside: fp32 as ever
    between = full / 2 / 2.5e6 / 8 + 0.04 / 8
    assert got.floor_of(Hook.HIER) == HookFloor(Hook.HIER, full / 2 / 8, inside + between,
                                                 0.0005 + 2 * 0.0005 / 8 + 0.04 / 8, inside, between)
    assert got.floor_of(Hook.DILOCO) == HookFloor(Hook.DILOCO, full / 2 / 8, 4 / 3 * full / 2 / 2.5e6 / 8 + 2 * 0.04 / 8,
                                                   2 * 0.04 / 8)


def test_the_plan_hints_at_the_bf16_wire_where_the_link_is_what_limits() -> None:
    sites = site_links(matrix(SITES), SITES)  # floors below: the formulas of the two tests above
    slow = plan(125e6, 3, DIGITS, HookSettings(diloco_inner_steps=8), budget_s=0.005, rtt_s=0.0005, sites=sites)
    assert wire_hint(Hook.HIER, slow, DIGITS, HookSettings(diloco_inner_steps=8)) == (
        "comm.diloco_wire_dtype=bf16 would send hier's pseudo-gradient between sites in half the bytes: floor "
        "12.7 ms per step instead of 17.8 ms (rounded to bfloat16, docs/sites.md)")
    assert wire_hint(Hook.DILOCO_OVERLAP, slow, DIGITS, HookSettings(diloco_inner_steps=8)) == (
        "comm.diloco_wire_dtype=bf16 would send diloco-overlap's pseudo-gradient in half the bytes: floor "
        "16.8 ms per step instead of 23.6 ms (rounded to bfloat16, docs/sites.md)")
    # Already bf16, a hook with nothing to narrow, or a floor within the budget: no hint.
    assert wire_hint(Hook.HIER, slow, DIGITS, HookSettings(diloco_inner_steps=8, diloco_wire_bytes=2)) == ""
    assert wire_hint(Hook.POWERSGD, slow, DIGITS, HookSettings(diloco_inner_steps=8)) == ""
    roomy = plan(125e6, 3, DIGITS, HookSettings(diloco_inner_steps=8), budget_s=0.05, rtt_s=0.0005, sites=sites)
    assert wire_hint(Hook.HIER, roomy, DIGITS, HookSettings(diloco_inner_steps=8)) == ""


def test_a_fast_link_between_sites_keeps_plain_ddp() -> None:
    sites = site_links([(a, b, 1000.0, 0.5) for a in SITES for b in SITES if a != b], SITES)
    got = plan(125e6, 3, DIGITS, HookSettings(), budget_s=0.05, rtt_s=0.0005, sites=sites)
    assert got.recommended is Hook.NONE and got.floor_of(Hook.HIER) is not None


def test_hosts_without_sites_offer_hier_but_never_choose_it() -> None:
    """Each host its own site: hier is flat DiLoCo-overlap there, so auto keeps the flat order."""
    alone = {"a1": "host:a1", "a2": "host:a2", "b1": "host:b1"}
    sites = site_links(matrix(alone), alone)
    got = plan(2.5e6, 3, DIGITS, HookSettings(), budget_s=0.05, rtt_s=0.04, sites=sites)
    assert not sites.places and got.recommended is not Hook.HIER
    assert got.reason.startswith("0.20 MB of gradients, 3 nodes, 20.0 Mbit/s per node")
    assert plan(2.5e6, 3, DIGITS, HookSettings(), budget_s=0.05, rtt_s=0.04).floor_of(Hook.HIER) is None


def test_commplan_json_holds_the_sites_and_the_matrix(tmp_path) -> None:
    from meshrun.deploy.edges.comm import beside_floor, load_plan, save_plan

    links = tuple(matrix(SITES))
    got = plan(125e6, 3, DIGITS, HookSettings(), budget_s=0.05, rtt_s=0.0005, sites=site_links(links, SITES))
    hint = wire_hint(Hook.HIER, dataclasses.replace(got, budget_s=0.005), DIGITS, HookSettings())
    save_plan(tmp_path, "r1", dataclasses.replace(got, links=links, hint=hint), "hier")
    saved = load_plan(tmp_path, "r1")
    assert saved["hint"] == hint and hint.startswith("comm.diloco_wire_dtype=bf16 would send hier's")
    assert saved["links"][0] == {"source": "a1", "target": "a2", "mbit_s": 1000.0, "rtt_ms": 0.5}
    assert saved["site_links"]["sites"] == [["office", ["a1", "a2"]], ["home", ["b1"]]]
    hier = next(f for f in saved["floors"] if f["hook"] == "hier")
    assert (hier["inside_s"], hier["between_s"]) == (got.floor_of(Hook.HIER).inside_s, got.floor_of(Hook.HIER).between_s)
    assert beside_floor(saved, None)["floor_s"] == got.floor_of(Hook.HIER).floor_s


def test_three_places_ring_the_representatives_at_the_slowest_ones_pace() -> None:
    """Office (2 hosts, 1 Gbit/s), a rented pair (25 Gbit/s) and home: hier's floor between sites
    is one ring over the 3 representatives, paced by home's 20 Mbit/s and the slowest RTT; inside,
    the largest site's ring at the slower of the two LANs."""
    three = {"o1": "office", "b1": "dc", "o2": "office", "h1": "home", "b2": "dc"}
    speeds = {frozenset({"office"}): (1000.0, 0.3), frozenset({"dc"}): (25000.0, 0.3),
              frozenset({"office", "dc"}): (100.0, 30.0), frozenset({"office", "home"}): (20.0, 40.0),
              frozenset({"dc", "home"}): (20.0, 150.0)}
    links = [(a, b, *speeds[frozenset({three[a], three[b]})]) for a in three for b in three if a != b]
    got = site_links(links, three)
    assert got == SiteLinks((("office", ("o1", "o2")), ("dc", ("b1", "b2")), ("home", ("h1",))),
                            LinkStats(125e6, 0.0003), LinkStats(2.5e6, 0.15))
    s = HookSettings(diloco_inner_steps=8)
    full = GRAD_BYTES * (256 * 64 + 256 + 128 * 256 + 128 + 10 * 128 + 10)
    hier = plan(125e6, 5, DIGITS, s, budget_s=0.05, rtt_s=0.0003, sites=got).floor_of(Hook.HIER)
    assert hier.between_s == (2 * 2 / 3 * full / 2.5e6 + 2 * 0.15) / 8
    assert hier.inside_s == full / 125e6 + 0.0003 + (2 * full / 125e6 + 2 * 0.0003) / 8


def test_undeclared_places_hint_at_what_hier_would_do_declared() -> None:
    """No `site:` lines (each host a place of its own): auto picks a flat hook; the measured places
    (a1, a2 | b1), declared, would have it pick hier, and the hint says so with both floors."""
    s = HookSettings(powersgd_rank=4, localsgd_period=4, diloco_inner_steps=8)
    alone = {h: f"host:{h}" for h in SITES}
    links = tuple(matrix(SITES))
    now = dataclasses.replace(plan(125e6, 3, DIGITS, s, budget_s=0.05, rtt_s=0.0005, sites=site_links(links, alone)),
                              links=links)
    assert now.recommended is Hook.LOCALSGD
    places = (("a1", "a2"), ("b1",))
    assert places_hint(Hook.LOCALSGD, now, DIGITS, s, places, "WARN TEXT") == (
        "WARN TEXT; with them declared, --comm auto would choose hier 17.8 ms (2.7 ms inside + 15.2 ms between) "
        "per step (this run's localsgd 47.1 ms)")
    # Undeclared, hier is flat DiLoCo-overlap: one ring over all three hosts, nothing inside.
    assert places_hint(Hook.HIER, now, DIGITS, s, places, "W").endswith(
        "(this run's hier 23.6 ms (0.0 ms inside + 23.6 ms between))")
    # Where even declared places would not make auto choose hier, nothing is said.
    roomy = dataclasses.replace(now, budget_s=1.0)
    assert places_hint(Hook.NONE, roomy, DIGITS, s, places, "W") == ""
