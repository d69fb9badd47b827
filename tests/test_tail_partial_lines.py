"""torchrun's `--tee` tail, as meshrun's torchrun runs it, writes whole lines with one prefix each
(user-script finding 9; deploy/host/linetail.py).

torch's own tail wrote the unfinished end of a rank's output with its `[host:rank] ` prefix, so a tqdm
bar (`"\\r" + bar`, no newline until the next redraw) came out as `[gpu1:0]  25%|##  | 25/100[gpu1:0] `,
after a blank prefixed line. The tail is driven here as /tmp/us/tail_demo.py drove torch's: the rank's
writes land one at a time, each while the tail waits at the end of the file. Its clock and sleep are a
stand-in that lands the next write, so no outcome depends on timing."""

from __future__ import annotations

import io
import threading
import types
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing import tail_log

from meshrun.deploy.host import linetail
from meshrun.deploy.host import torchrun as entry
from meshrun.deploy.host.linetail import HOLD_S, Lines, tail_whole_lines

HEADER = "[gpu1:0] "
BAR = [f"\r{i:3d}%|{'#' * (i // 10):10s}| {i}/100" for i in range(0, 101, 25)]  # tqdm's status_printer


class Rank:
    """The rank writing its log, as the tail's `time`: the tail sleeps only once it has read all there
    is, and each sleep lands the rank's next write (None: nothing this time) and moves the clock on.
    Once all is written, the next sleep sets `finished`, as torch's TailLog.stop does."""

    def __init__(self, path: Path, writes: list[bytes | None], step_s: float = 0.5) -> None:
        self.path, self.writes, self.step_s = path, list(writes), step_s
        self.finished, self.now, self.sleeps = threading.Event(), 0.0, 0
        self.out = io.StringIO()
        self.seen_at_write: list[str] = []  # what the tail had written when each write landed

    def sleep(self, _seconds: float) -> None:
        self.sleeps += 1
        assert self.sleeps < 1000, "the tail never ended"
        self.now += self.step_s
        if not self.writes:
            self.finished.set()
            return
        data = self.writes.pop(0)
        self.seen_at_write.append(self.out.getvalue())
        if data is not None:
            with open(self.path, "ab") as f:
                f.write(data)

    def monotonic(self) -> float:
        return self.now


def tailed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writes: list[bytes | None]) -> Rank:
    rank = Rank(tmp_path / "stdout.log", writes)  # not there yet: the first sleep makes it
    monkeypatch.setattr(linetail, "time", types.SimpleNamespace(sleep=rank.sleep, monotonic=rank.monotonic))
    monkeypatch.setattr(linetail, "locale", types.SimpleNamespace(getpreferredencoding=lambda _do_set: "utf-8"))
    tail_whole_lines(HEADER, str(rank.path), rank.out, rank.finished, 0.1, lambda _line: True)
    return rank


def test_a_tqdm_bar_comes_out_one_line_per_redraw_each_with_one_prefix(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # print("epoch 1") split in two writes (PYTHONUNBUFFERED), the bar, its closing newline, a blank print().
    writes = [b"epoch 1", b"\n", *(bar.encode() for bar in BAR), b"\n", b"\n", b"done\n"]
    assert tailed(tmp_path, monkeypatch, writes).out.getvalue().splitlines(keepends=True) == [
        "[gpu1:0] epoch 1\n",
        "[gpu1:0]   0%|          | 0/100\n",
        "[gpu1:0]  25%|##        | 25/100\n",
        "[gpu1:0]  50%|#####     | 50/100\n",
        "[gpu1:0]  75%|#######   | 75/100\n",
        "[gpu1:0] 100%|##########| 100/100\n",
        "[gpu1:0] \n",  # the script's own empty line stays
        "[gpu1:0] done\n",
    ]


def test_a_line_end_or_a_character_cut_between_writes_is_put_back_together(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    block = "█".encode()
    writes = [b"a\r", b"\nb\r\n", b"\r 50%|" + block[:1], block[1:] + b"|\n", b"no end at all"]
    assert tailed(tmp_path, monkeypatch, writes).out.getvalue().splitlines(keepends=True) == [
        "[gpu1:0] a\n", "[gpu1:0] b\n", "[gpu1:0]  50%|█|\n", "[gpu1:0] no end at all\n"]


def test_an_unfinished_line_comes_out_after_the_hold_not_only_at_the_end(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    pause = [None] * int(HOLD_S / 0.5 + 2)  # the rank writes nothing for longer than the hold
    rank = tailed(tmp_path, monkeypatch, [b"Overwrite? [y/N] ", *pause, b"y\n", b"\n", b"next\n"])
    assert f"{HEADER}Overwrite? [y/N] \n" in rank.seen_at_write  # out before the rest of it came
    # The rest is a line of its own; the bare line end after it makes none.
    assert rank.out.getvalue().splitlines(keepends=True) == [
        "[gpu1:0] Overwrite? [y/N] \n", "[gpu1:0] y\n", "[gpu1:0] \n", "[gpu1:0] next\n"]


def test_the_splitter_gives_exact_lines() -> None:
    lines = Lines()
    assert lines.feed("\r  0%|") == []  # a carriage return that ends nothing makes no line
    assert lines.feed(" 0/1\r") == ["  0%| 0/1\n"]
    assert lines.feed("\n") == []  # the "\r\n" cut in two
    assert lines.feed("x\n\n\r\ry") == ["x\n", "\n"]
    assert lines.flush() == ["y\n"] and lines.flush() == []
    assert lines.feed("\r") == [] and lines.feed("z\n") == ["z\n"]
    assert Lines().feed("a" * linetail.MAX_HELD) == ["a" * linetail.MAX_HELD + "\n"]  # no line end ever: still out


def test_meshruns_torchrun_puts_it_in_torchs_tail_log_for_every_rank(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tail_log, "tail_logfile", tail_log.tail_logfile)  # put back after the test
    assert entry.whole_line_tails(tail_log) and tail_log.tail_logfile is tail_whole_lines
    assert entry.whole_line_tails(tail_log)  # installed once
    other = types.SimpleNamespace(tail_logfile=lambda header, file, dst: None)
    assert not linetail.install(other)  # a torch whose tail takes other arguments keeps its own
    files = {0: str(tmp_path / "0.log"), 1: str(tmp_path / "1.log")}
    Path(files[0]).write_text("\r  0%|\r 50%|\r100%|\n")
    Path(files[1]).write_text("prompt: ")
    out = io.StringIO()
    tail = tail_log.TailLog("t", files, out, {0: "[a:0] ", 1: "[a:1] "}).start()
    tail.stop()  # reads each file to its end, whatever the timing: the same lines
    assert sorted(out.getvalue().splitlines(keepends=True)) == [
        "[a:0]   0%|\n", "[a:0]  50%|\n", "[a:0] 100%|\n", "[a:1] prompt: \n"]
