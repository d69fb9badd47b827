"""Which host's checkpoints a fetch brings home (deploy/run/fetchplan.py): pure, by exact equality."""

from __future__ import annotations

from meshrun.deploy.run.fetchplan import Claim, agreed_floor, holder_order, newest_listed, prunable, worth_trying


def test_the_newest_claim_comes_first_then_the_local_folder_then_what_is_home_then_run_order() -> None:
    claims = [Claim("h1", 500), Claim("h2", 600, at_home=1), Claim("h3", 600, at_home=3), Claim("h4", -1, lists=0),
              Claim("h5", 600), Claim("local", 600, here=True), Claim("h6", 400, at_home=9), Claim("h7", -1)]
    # h7 lists only best.pt (no step yet): a holder, last; h4's manifest lists nothing.
    assert [c.host for c in holder_order(claims)] == ["local", "h3", "h2", "h5", "h1", "h6", "h7"]


def test_a_holder_is_tried_only_while_it_claims_more_than_what_came_home_verified() -> None:
    assert worth_trying(Claim("h2", 600), None)  # nothing home verified yet
    assert worth_trying(Claim("h2", -1), None)  # only best.pt, and nothing else came
    assert not worth_trying(Claim("h2", -1), -1)  # a best.pt came verified already
    assert worth_trying(Claim("h2", 600), -1)
    assert worth_trying(Claim("h2", 600), 500)  # the first holder's newest failed its checksum
    assert not worth_trying(Claim("h2", 600), 600)
    assert not worth_trying(Claim("h2", 500), 600)


def test_the_newest_listed_step_ignores_best_pt_and_is_minus_one_without_a_step() -> None:
    assert newest_listed({"best.pt": "x", "ckpt-step000000500.pt": "y", "ckpt-step000000040.pt": "z"}) == 500
    assert newest_listed({"best.pt": "x"}) == -1
    assert newest_listed([]) == -1


A, B, C, D = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)


def test_the_floor_is_the_oldest_step_two_hosts_agree_on() -> None:
    honest = {"ckpt-step000000800.pt": A, "ckpt-step000000900.pt": B, "best.pt": C}
    evil = {"ckpt-step009999999.pt": D, "ckpt-step000000100.pt": D}  # newer steps, and an old one of its own
    assert agreed_floor([honest, dict(honest), evil]) == 800
    assert agreed_floor([honest, {"ckpt-step000000900.pt": B}]) == 900  # one host keeps fewer: 800 is one's word
    assert agreed_floor([honest, evil]) is None  # no step two hosts list alike: nothing pruned
    assert agreed_floor([honest, {}]) == 800  # the only host listing any (the other saved none yet)
    assert agreed_floor([{}, {}]) is None and agreed_floor([]) is None
    assert agreed_floor([{"best.pt": C}, {"best.pt": C}]) is None  # best.pt has no step


def test_only_unchanged_placed_checkpoints_older_than_the_floor_are_prunable() -> None:
    placed = {"ckpt-step000000700.pt": A, "ckpt-step000000750.pt": B, "ckpt-step000000800.pt": C, "best.pt": D,
              "ckpt-step000000600.pt": A}
    present = {"ckpt-step000000700.pt": A, "ckpt-step000000750.pt": "e" * 64, "ckpt-step000000800.pt": C,
               "best.pt": D}  # 750 changed here (yours), 600 already gone
    assert prunable(placed, present, 800) == ["ckpt-step000000700.pt"]
    assert prunable(placed, present, 700) == []
