"""`--comm`'s measured figure at a run's end: what the controller asks rank 0's host for, and how
it reads the answer (deploy/edges/comm.py's `read_comm_record` asks; deploy/commands/trainend.py
puts the result in summary.json).

Rank 0's step-metrics file (`runs/<id>/metrics.rank0.jsonl`, train/metrics.py) grows for the whole
run: a step record every `perf.every_steps` steps, some 8 MiB a day at 5 steps/s. The `comm`
record `--comm` needs is one line of it per start of the workers (the trainer's all-reduce probe),
near where each start began. Asking for the whole file sent tens of MiB over a home link at the
end of a long run, past the 20 s the end allows, and `measured_s` was null; what did arrive was cut
in its middle (capped.py keeps the head and the tail), where a restarted run's newer record lies.
So the host is asked for those lines only, by `grep` reading its own disk: the answer is a few
hundred bytes whatever the file's size, and it is still bounded and read line by line, strictly,
as any host's answer.
"""

from __future__ import annotations

from meshrun.layout import RecordKind, rank_metrics, run_dir
from meshrun.deploy.run.answers import from_json, is_real

# How the trainer writes the record's kind: `json.dumps` with its default separators
# (train/metrics.py MetricsSink.rank_record; tests/test_comm_metrics_line.py writes with it).
COMM_LINE = f'"kind": "{RecordKind.COMM.value}"'


def comm_record_argv(run_id: str) -> list[str]:
    """The host's command for the run's `comm` lines of rank 0's metrics file, run in its workdir.
    `-F`: the text as it is, no pattern; `-e`: it is the pattern whatever it starts with; `-a`: a
    file with NUL bytes in it (the zeros a host's crash can leave at the end of an appended file)
    is still text, not "binary file matches" and no lines. No match, or no file: exit status 1 or
    2, and the next host is asked, as for a `cat` that failed."""
    return ["grep", "-a", "-F", "-e", COMM_LINE, "--", f"{run_dir(run_id)}/{rank_metrics(0)}"]


def last_comm_record(text: str) -> dict | None:
    """The last sound `comm` record of a metrics file's lines. The file comes from a host, and a
    line may be cut short (a host killed mid-write) or crafted: such a line is skipped, never
    fatal. A NUL ends a line too: json.dumps never writes one, and a crash's zeros with no newline
    after them would otherwise glue the next start's first record to them."""
    found = None
    for line in text.replace("\0", "\n").splitlines():
        row = from_json(line)
        comm_s = row.get("comm_s") if isinstance(row, dict) and row.get("kind") == "comm" else None
        if is_real(comm_s) and comm_s >= 0:  # not math.isfinite: `10**400` (an int) would raise OverflowError
            found = row
    return found
