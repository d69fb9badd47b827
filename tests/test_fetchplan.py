"""Which host's checkpoints a fetch brings home (deploy/run/fetchplan.py): pure, by exact equality."""

from __future__ import annotations

from meshrun.deploy.run.fetchplan import Claim, agreed_floor, holder_order, newest_listed, prunable, worth_trying


def _listing(*steps: int, best: bool = False) -> dict[str, str]:
    names = [f"ckpt-step{s:09d}.pt" for s in steps] + (["best.pt"] if best else [])
    return {name: name[-7:-3] * 16 for name in names}


def test_the_newest_claim_comes_first_then_the_local_folder_then_what_is_home_then_run_order() -> None:
    claims = [Claim("h1", _listing(500)), Claim("h2", _listing(600), at_home=1), Claim("h3", _listing(600), at_home=3),
              Claim("h4", {}), Claim("h5", _listing(600)), Claim("local", _listing(600), here=True),
              Claim("h6", _listing(400), at_home=9), Claim("h7", _listing(best=True))]
    # h7 lists only best.pt (no step yet): a holder, last; h4's manifest lists nothing.
    assert [c.host for c in holder_order(claims)] == ["local", "h3", "h2", "h5", "h1", "h6", "h7"]


def test_a_holder_is_tried_while_it_lists_a_file_not_home() -> None:
    joined_late = Claim("h3", _listing(900, 1000))
    there_from_the_start = Claim("h2", _listing(800, 900, best=True))
    assert worth_trying(joined_late, set())  # nothing home yet
    home = set(joined_late.listed.items())  # h3's copy came, verified
    assert worth_trying(there_from_the_start, home)  # h2 holds best.pt and step 800, which h3 never saved
    assert not worth_trying(there_from_the_start, home | set(there_from_the_start.listed.items()))
    rewritten = Claim("h2", {**there_from_the_start.listed, "best.pt": "f" * 64})  # best.pt rewritten since
    assert worth_trying(rewritten, home | set(there_from_the_start.listed.items()))


def test_the_newest_listed_step_ignores_best_pt_and_is_minus_one_without_a_step() -> None:
    assert newest_listed({"best.pt": "x", "ckpt-step000000500.pt": "y", "ckpt-step000000040.pt": "z"}) == 500
    assert newest_listed({"best.pt": "x"}) == -1
    assert newest_listed([]) == -1
    assert Claim("h1", _listing(300, 500, best=True)).newest == 500


A, B, C, D = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)


def test_the_floor_is_the_oldest_step_every_host_still_keeps() -> None:
    honest = {"ckpt-step000000800.pt": A, "ckpt-step000000900.pt": B, "best.pt": C}
    assert agreed_floor([honest, {"ckpt-step000000900.pt": B}]) == 800  # one host keeps fewer: the other's 800 stands
    assert agreed_floor([honest, {"ckpt-step009999999.pt": D}]) == 800  # a lie of a newer step moves nothing
    assert agreed_floor([honest, {"ckpt-step000000100.pt": D}]) == 100  # a lie of an older one: less removed
    assert agreed_floor([honest, {}]) == 800  # the other saved none yet
    assert agreed_floor([{}, {}]) is None and agreed_floor([]) is None
    assert agreed_floor([{"best.pt": C}, {"best.pt": C}]) is None  # best.pt has no step


def test_only_unchanged_placed_checkpoints_older_than_the_floor_are_prunable() -> None:
    placed = {"ckpt-step000000700.pt": A, "ckpt-step000000750.pt": B, "ckpt-step000000800.pt": C, "best.pt": D,
              "ckpt-step000000600.pt": A}
    present = {"ckpt-step000000700.pt": A, "ckpt-step000000750.pt": "e" * 64, "ckpt-step000000800.pt": C,
               "best.pt": D}  # 750 changed here (yours), 600 already gone
    assert prunable(placed, present, 800) == ["ckpt-step000000700.pt"]
    assert prunable(placed, present, 700) == []
