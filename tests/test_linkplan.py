"""check-network's choice of links to probe by the number of hosts (deploy/check/linkplan.py)."""

from __future__ import annotations

from collections import Counter

from meshrun.deploy.check.linkplan import ALL_PAIRS_MAX_HOSTS, LinkPlan, link_plan, offsets


def names(n: int) -> list[str]:
    return [f"h{i}" for i in range(1, n + 1)]


def reached_from_the_first(plan: LinkPlan, hosts: list[str]) -> set[str]:
    """The hosts that probed links join to the first one."""
    reached, frontier = {hosts[0]}, [hosts[0]]
    while frontier:
        for peer in plan.peers[frontier.pop()]:
            if peer not in reached:
                reached.add(peer)
                frontier.append(peer)
    return reached


def test_up_to_the_limit_every_pair_is_probed() -> None:
    assert link_plan(["a", "b", "c"]) == LinkPlan({"a": ("b", "c"), "b": ("c", "a"), "c": ("a", "b")},
                                                  "every pair")
    at_limit = link_plan(names(ALL_PAIRS_MAX_HOSTS))
    assert at_limit.pairs == 32 * 31 and at_limit.rule == "every pair"
    assert link_plan(["solo"]) == LinkPlan({"solo": ()}, "every pair")


def test_past_the_limit_each_host_probes_the_hosts_at_power_of_two_offsets() -> None:
    plan = link_plan(names(40))
    assert offsets(40) == (1, 2, 4, 8, 16, 32)
    assert plan.peers["h1"] == ("h2", "h3", "h5", "h9", "h17", "h33")
    assert plan.peers["h40"] == ("h1", "h2", "h4", "h8", "h16", "h32")  # wraps round
    assert plan.pairs == 240
    assert plan.rule == ("sampled, of 1560 pairs: each host to the hosts 1, 2, 4, … 32 places after it in "
                         "inventory order; every pair up to 32 hosts")


def test_a_sampled_plan_covers_every_host_both_ways_and_joins_them_all() -> None:
    for n in (33, 100, 1000):
        hosts = names(n)
        plan = link_plan(hosts)
        k = len(offsets(n))
        assert all(len(set(targets)) == k and source not in targets for source, targets in plan.peers.items())
        assert set(Counter(t for targets in plan.peers.values() for t in targets).values()) == {k}
        assert reached_from_the_first(plan, hosts) == set(hosts)
    assert link_plan(names(1000)).pairs == 10_000


def test_at_each_step_every_host_sends_to_one_host_and_receives_from_one() -> None:
    """`--bandwidth` measures a host's peers one after another, all hosts at once: the k-th peers
    of all hosts are a permutation, so no two transfers share a receiver (in host order, h2 and h3
    both sent to h1 first and each measured half its link)."""
    for n in (2, 3, 4, 7, 32, 40, 100):
        plan = link_plan(names(n))
        for step in range(len(plan.peers["h1"])):
            receivers = [targets[step] for targets in plan.peers.values()]
            assert sorted(receivers) == sorted(names(n)), (n, step)


def sites_of(*sizes: int) -> tuple[list[str], dict[str, str]]:
    """Hosts h1..hN in inventory order, the first sizes[0] in site s1, and so on."""
    hosts, site_of = names(sum(sizes)), {}
    for s, size in enumerate(sizes):
        start = sum(sizes[:s])
        site_of.update({h: f"s{s + 1}" for h in hosts[start:start + size]})
    return hosts, site_of


def test_past_the_limit_with_sites_each_host_probes_its_own_site_then_one_host_per_other_site() -> None:
    hosts, site_of = sites_of(20, 20)
    plan = link_plan(hosts, site_of)
    assert plan.peers["h1"] == (*names(20)[1:], "h21")
    assert plan.peers["h20"] == (*names(19), "h40")  # its own site in order of offset, wrapping round
    assert plan.peers["h40"] == (*(f"h{i}" for i in range(21, 40)), "h20")
    assert plan.pairs == 40 * 20
    assert plan.rule == ("sampled by site, of 1560 pairs (2 sites): each host to every host of its own site, "
                         "then to the host at its index in each other site; past 32 sites or hosts in a site, to "
                         "those 1, 2, 4, … places after it")


def test_uneven_sites_never_send_two_hosts_of_a_site_to_one_receiver_of_another() -> None:
    """30 office hosts and 5 at home: the first 5 office hosts carry the office's links home, one
    receiver each (all 30 on 5 receivers would each have measured a sixth of the link)."""
    hosts, site_of = sites_of(30, 5)
    plan = link_plan(hosts, site_of)
    across = [(a, b) for a, targets in plan.peers.items() for b in targets if site_of[a] != site_of[b]]
    assert sorted(across) == sorted([(f"h{i}", f"h{30 + i}") for i in range(1, 6)]
                                    + [(f"h{30 + i}", f"h{i}") for i in range(1, 6)])
    assert plan.peers["h6"] == tuple(f"h{(5 + d) % 30 + 1}" for d in range(1, 30))  # inside only


def test_a_plan_by_site_probes_every_pair_inside_a_site_wherever_its_hosts_are_listed() -> None:
    """Sites interleaved in the inventory (h1 office, h2 home, h3 office, …): the offset sample
    probes a quarter of the pairs inside them; by site, all of them."""
    hosts = names(40)
    site_of = {h: ("office" if i % 2 == 0 else "home") for i, h in enumerate(hosts)}
    plan = link_plan(hosts, site_of)
    probed = {(a, b) for a, targets in plan.peers.items() for b in targets}
    inside = {(a, b) for a in hosts for b in hosts if a != b and site_of[a] == site_of[b]}
    assert inside <= probed
    assert plan.peers["h1"][-1] == "h2" and plan.peers["h2"][-1] == "h1"  # then one host of the other site
    by_offset = {(a, b) for a, targets in link_plan(hosts).peers.items() for b in targets}
    assert len(inside) == 760 and len(inside & by_offset) == 200  # without sites: 5 of each host's 19


def test_a_plan_by_site_keeps_one_receiver_per_host_at_each_step_when_sites_are_equal() -> None:
    for sizes in ((20, 20), (11, 11, 11), (40, 40, 40)):
        hosts, site_of = sites_of(*sizes)
        plan = link_plan(hosts, site_of)
        for step in range(len(plan.peers["h1"])):
            receivers = [targets[step] for targets in plan.peers.values()]
            assert sorted(receivers) == sorted(hosts), (sizes, step)


def test_a_plan_by_site_covers_every_host_joins_them_all_and_stays_bounded() -> None:
    for sizes in ((30, 5, 1), (100,) * 10, (2,) * 40, (1, 33)):
        hosts, site_of = sites_of(*sizes)
        plan = link_plan(hosts, site_of)
        assert all(source not in targets and len(set(targets)) == len(targets)
                   for source, targets in plan.peers.items())
        assert {t for targets in plan.peers.values() for t in targets} == set(hosts)  # every host is probed
        assert reached_from_the_first(plan, hosts) == set(hosts), sizes
    ten_sites = link_plan(*sites_of(*(100,) * 10))
    assert {len(targets) for targets in ten_sites.peers.values()} == {9 + 7}  # 9 other sites, offsets 1..64 inside
    forty_sites = link_plan(*sites_of(*(2,) * 40))
    # sites at offsets 1, 2, … 32, and the one other host of its site
    assert {len(targets) for targets in forty_sites.peers.values()} == {6 + 1}


def test_without_sites_or_with_one_site_the_plan_is_the_offset_sample() -> None:
    hosts = names(40)
    assert link_plan(hosts, {}) == link_plan(hosts)
    assert link_plan(hosts, {h: None for h in hosts}) == link_plan(hosts)
    assert link_plan(hosts, {h: "office" for h in hosts}) == link_plan(hosts)
    assert link_plan(names(5), {"h1": "a", "h2": "b"}) == link_plan(names(5))  # every pair up to the limit
