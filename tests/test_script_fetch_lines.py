"""deploy/render/console.script_files_lines: after `fab fetch-checkpoints` of a --script run, a host
whose run directory held only meshrun's own files (the runner's starts.json, the agent's log and
records under hosts/) is named as one whose script wrote nothing under $MESHRUN_RUN_DIR, with where
files saved by a relative path went; the seeds save `%d.ckpt` and `checkpoint.pth.tar` into the cwd,
and the fetch used to point at hosts/<host>/ as if they were there."""

from __future__ import annotations

from pathlib import Path

from meshrun.deploy.edges.fetch import FetchReport
from meshrun.deploy.render.console import script_files_lines

HOME = "/p/runs/r1"
EVERY_HOST = f"what main.py wrote under $MESHRUN_RUN_DIR, and the logs: {HOME}/hosts/<host>/ (as each host had it; " \
             "docs/scripts.md)"


def nothing_on(hosts: str) -> str:
    return (f"main.py wrote nothing under $MESHRUN_RUN_DIR on {hosts}: files it saved by a relative path stay in "
            "each host's workdir, which fetch does not bring; save them under $MESHRUN_RUN_DIR (docs/scripts.md). "
            f"The logs: {HOME}/hosts/<host>/")


def meshruns_only(host: str, **more: list[str]) -> FetchReport:
    """What a host sends when the script saved nothing in its run directory (a first fetch, then a later one)."""
    return FetchReport(host, Path(HOME) / "hosts" / host, new=["starts.json", f"hosts/{host}/train.log"],
                       unchanged=[f"hosts/{host}/exit.json", f"hosts/{host}/events.jsonl"], **more)


def test_hosts_that_sent_only_meshruns_files_are_named() -> None:
    assert script_files_lines("main.py", HOME, [meshruns_only("gpu1"), meshruns_only("gpu2")]) == [
        nothing_on("gpu1, gpu2")]


def test_a_shared_workdir_holds_every_hosts_records_and_still_nothing_of_the_script() -> None:
    report = meshruns_only("gpu1", updated=["hosts/gpu2/train.log", "hosts/gpu2/torchrun/r1/attempt_0/0/stdout.log"])
    assert script_files_lines("main.py", HOME, [report]) == [nothing_on("gpu1")]


def test_a_host_whose_script_saved_there_keeps_the_line_that_points_home() -> None:
    saved = meshruns_only("gpu1", updated=["checkpoint-3.pt"])
    in_checkpoints = meshruns_only("gpu3", conflicts=["checkpoints/model.pt"])
    assert script_files_lines("main.py", HOME, [saved, meshruns_only("gpu2"), in_checkpoints]) == [
        EVERY_HOST, nothing_on("gpu2")]


def test_no_files_at_all_or_files_that_could_not_come_are_not_called_nothing() -> None:
    empty = FetchReport("gpu1", Path(HOME) / "hosts/gpu1")  # its run directory gone: nothing to judge
    deep = meshruns_only("gpu2", refused=["host 'gpu2': out/a/b/...: a folder more than 32 levels deep; not placed"])
    linked = meshruns_only("gpu3")
    linked.skipped.add("latest.pt")  # a symlink the script made: not brought, but written
    assert script_files_lines("main.py", HOME, [empty, deep, linked]) == [EVERY_HOST]
    assert script_files_lines("main.py", HOME, []) == [EVERY_HOST]


def test_a_local_host_on_the_project_itself_keeps_its_own_line() -> None:
    local = FetchReport("local", Path(HOME))  # the run already lives here: nothing is fetched from it
    assert script_files_lines("main.py", HOME, [local, meshruns_only("gpu1")]) == [
        f"what main.py wrote under $MESHRUN_RUN_DIR on local: {HOME}/hosts/local/output/; its logs: "
        f"{HOME}/hosts/local/ (docs/scripts.md)", nothing_on("gpu1")]
