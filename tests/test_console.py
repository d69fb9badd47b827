"""The trainer's plain console (what torchrun's per-rank log lines carry)."""

from __future__ import annotations

import io

from meshrun.train.render import PlainConsole


def test_a_resumed_epoch_counts_its_steps_out_of_the_whole_epoch() -> None:
    """Resumed 15 steps into an epoch of 23 (8 to go): the lines say 20/23 and 23/23, not 20/8
    (as a resumed run in tests/test_comm_multihost.py printed)."""
    out = io.StringIO()
    console = PlainConsole(every=20, stream=out)
    console.start_epoch(4, total_steps=8, done=15)
    for done in range(16, 24):
        console.step(done, 0.25)
    console.start_epoch(5, total_steps=23, done=0)
    for done in range(1, 24):
        console.step(done, None if done == 20 else 0.5)
    assert out.getvalue().splitlines() == ["epoch 5 step 20/23 loss 0.2500", "epoch 5 step 23/23 loss 0.2500",
                                           "epoch 6 step 23/23 loss 0.5000"]


def test_a_console_that_is_not_rank_0s_prints_nothing() -> None:
    out = io.StringIO()
    console = PlainConsole(every=1, stream=out, enabled=False)
    console.start_epoch(0, total_steps=2, done=0)
    console.step(1, 0.5)
    console.line("epoch 1/1")
    assert out.getvalue() == ""
