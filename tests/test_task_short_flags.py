"""Short flags are part of the command line users type and script: a flag added to a task must not
take another's letter (invoke gives them in signature order). `fab fetch-checkpoints -p DIR` was
`--project` before `--prune` came, and stays so."""

from __future__ import annotations

from meshrun.deploy import tasks


def short_flags(task) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {a.name: next(n for n in a.names if len(n) == 1) for a in task.get_arguments() if any(len(n) == 1 for n in a.names)}


def test_fetch_checkpoints_keeps_its_short_flags_and_the_new_ones_take_free_letters() -> None:
    assert short_flags(tasks.fetch_checkpoints) == {
        "run": "r", "dest": "d", "force": "f", "project": "p", "runs_dir": "u", "debug": "e",  # as before --every-copy
        "every_copy": "v", "prune": "n", "inventory": "i"}
