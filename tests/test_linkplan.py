"""check-network's choice of links to probe by the number of hosts (deploy/check/linkplan.py)."""

from __future__ import annotations

from collections import Counter

from meshrun.deploy.check.linkplan import ALL_PAIRS_MAX_HOSTS, LinkPlan, link_plan, offsets


def names(n: int) -> list[str]:
    return [f"h{i}" for i in range(1, n + 1)]


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
        reached, frontier = {hosts[0]}, [hosts[0]]
        while frontier:
            for peer in plan.peers[frontier.pop()]:
                if peer not in reached:
                    reached.add(peer)
                    frontier.append(peer)
        assert reached == set(hosts)
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
