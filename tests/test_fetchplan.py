"""Which host's checkpoints a fetch brings home (deploy/run/fetchplan.py): pure, by exact equality."""

from __future__ import annotations

from meshrun.deploy.run.fetchplan import Claim, holder_order, newest_listed, worth_trying


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
