"""What a fetch into another runs folder (`fab fetch-checkpoints --dest DIR`) copies of the
controller's own records of a run, pure: the effects, reading the mtimes and copying the files, are
deploy/edges/checkpointpush.py's `copy_records`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from meshrun.layout import COMM_PLAN, LAUNCH_RECORD, PROVENANCE, SUMMARY

# What one attempt of a run leaves that the next must not inherit (a resume sets them aside:
# deploy/edges/records.py's retire_attempt).
RETIRED = (SUMMARY, PROVENANCE, COMM_PLAN)
# The controller's own records of a run, what `--runs-dir` reads of it: launch.json, then RETIRED.
RECORDS = (LAUNCH_RECORD, *RETIRED)


@dataclass(frozen=True)
class RecordsHeld:
    """A runs folder's records of a run: the attempt its launch.json is of (None: none there)."""

    started: float | None
    written: Mapping[str, int]  # each record there (RECORDS) -> its st_mtime_ns


def records_to_copy(ours: RecordsHeld, theirs: RecordsHeld) -> tuple[bool, tuple[str, ...]]:
    """What a fetch into another runs folder copies of the controller's records (`ours`) into the
    run's folder there (`theirs`): (whether the records of the attempt there become *.prev.json
    first, as a resume leaves them; the names to copy, launch.json first). A later attempt there
    (resumed with `--runs-dir` it) is kept whole; for a later one here, every record; of the same
    attempt, each written here since it was copied there (the summary at its end, a join's
    launch.json), never one written there later."""
    if ours.started is None or (theirs.started is not None and theirs.started > ours.started):
        return False, ()
    present = [name for name in RECORDS if name in ours.written]
    if theirs.started is None or ours.started > theirs.started:
        return theirs.started is not None, tuple(present)
    return False, tuple(n for n in present if ours.written[n] > theirs.written.get(n, -1))
