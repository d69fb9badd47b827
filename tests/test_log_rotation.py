"""The agent's train.log follows a rotation (findings longrun56, 5): the agent opened train.log once
and never again, so after logrotate's default `create` (rename train.log to train.log.1, make a new
empty train.log) it wrote on into train.log.1 while `fab logs` (`tail -F train.log`) showed nothing
new; with `compress` the renamed file was removed and the lines with it.

The real RunLog on real files, renamed as logrotate renames them. The one stand-in is the clock of
the reopen's throttle (a look at most once per `check_s`), moved by hand so that no test sleeps."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

from meshrun.deploy.host.outpipe import RunLog, names_other_file

CHECK_S = 1.0


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run_log(path: Path) -> tuple[RunLog, Clock, list[str]]:
    clock, said = Clock(), []
    return RunLog(path, said.append, check_s=CHECK_S, clock=clock), clock, said


def rotate(log: Path, create: bool = True) -> Path:
    """What logrotate does to `log` in its default `create` mode (`nocreate`: the rename alone)."""
    rotated = log.with_name(log.name + ".1")
    log.rename(rotated)
    if create:
        log.touch()
    return rotated


def test_lines_after_a_rotation_go_to_the_new_file_at_the_path(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    log, clock, said = run_log(path)
    log.write(b"before 1\n")
    log.write(b"before 2\n")
    rotated = rotate(path)
    clock.now += CHECK_S - 0.5  # within the throttle: no look yet, the line goes to the file held
    log.write(b"in the window\n")
    clock.now += 0.5
    log.write(b"after 1\n")
    log.write(b"after 2\n")
    assert rotated.read_bytes() == b"before 1\nbefore 2\nin the window\n"
    assert path.read_bytes() == b"after 1\nafter 2\n"
    assert said == []


def test_a_rotation_without_a_new_file_makes_one(tmp_path: Path) -> None:
    """logrotate's `nocreate`, or the log removed by hand: the name is gone, a new train.log is made."""
    path = tmp_path / "train.log"
    log, clock, said = run_log(path)
    log.write(b"before\n")
    rotated = rotate(path, create=False)
    clock.now += CHECK_S
    log.write(b"after\n")
    assert (rotated.read_bytes(), path.read_bytes(), said) == (b"before\n", b"after\n", [])


def test_a_rotated_file_compressed_and_removed_loses_no_later_line(tmp_path: Path) -> None:
    """`compress` without `delaycompress`: train.log.1 is compressed and removed at once."""
    path = tmp_path / "train.log"
    log, clock, _ = run_log(path)
    log.write(b"before\n")
    rotate(path).unlink()
    clock.now += CHECK_S
    log.write(b"after\n")
    assert path.read_bytes() == b"after\n"


def test_a_file_still_at_its_name_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    log, clock, _ = run_log(path)
    log.write(b"one\n")
    held = log.file
    clock.now += 10 * CHECK_S
    log.write(b"two\n")
    assert log.file is held
    assert path.read_bytes() == b"one\ntwo\n"
    assert not names_other_file(path, held)


def test_a_symlink_planted_after_the_rename_is_not_followed(tmp_path: Path) -> None:
    """The path was a regular file at the start: a link found there at the reopen is refused, said
    once, and the lines go on into the renamed file; the reopen is tried again at each look."""
    path, target = tmp_path / "train.log", tmp_path / "elsewhere"
    target.write_bytes(b"")
    log, clock, said = run_log(path)
    log.write(b"before\n")
    rotated = rotate(path, create=False)
    path.symlink_to(target)
    clock.now += CHECK_S
    log.write(b"after 1\n")
    clock.now += CHECK_S
    log.write(b"after 2\n")
    assert target.read_bytes() == b""
    assert rotated.read_bytes() == b"before\nafter 1\nafter 2\n"
    assert said == [f"cannot reopen {path}, which no longer names the log's file ({os.strerror(errno.ELOOP)}); the run's "
                    "lines go on into that file, renamed or removed"]
    path.unlink()  # the link gone: the next look makes train.log
    clock.now += CHECK_S
    log.write(b"after 3\n")
    assert (path.read_bytes(), target.read_bytes(), len(said)) == (b"after 3\n", b"", 1)


def test_a_dangling_symlink_planted_after_the_rename_is_not_followed(tmp_path: Path) -> None:
    """A link to where nothing is: following it would create the file it names."""
    path, target = tmp_path / "train.log", tmp_path / "made-through-the-link"
    log, clock, said = run_log(path)
    rotated = rotate(path, create=False)
    path.symlink_to(target)
    clock.now += CHECK_S
    log.write(b"after\n")
    assert not target.exists()
    assert (rotated.read_bytes(), len(said)) == (b"after\n", 1)


def test_a_fifo_planted_at_the_path_does_not_hold_the_writer(tmp_path: Path) -> None:
    """No reader on the FIFO: a blocking open would wait for one for ever (and the tee with it)."""
    path = tmp_path / "train.log"
    log, clock, said = run_log(path)
    rotated = rotate(path, create=False)
    os.mkfifo(path)
    clock.now += CHECK_S
    writer = threading.Thread(target=log.write, args=(b"after\n",), daemon=True)
    writer.start()
    writer.join(10)
    assert not writer.is_alive(), "the reopen blocked on a FIFO"
    assert (rotated.read_bytes(), len(said)) == (b"after\n", 1)


def test_a_log_that_was_a_link_at_the_start_is_followed_again(tmp_path: Path) -> None:
    """A user's train.log that links to a file elsewhere (set before the run), rotated there: the
    reopen goes through the link, as the first open did."""
    elsewhere = tmp_path / "disk2"
    elsewhere.mkdir()
    real, path = elsewhere / "train.log", tmp_path / "train.log"
    real.touch()
    path.symlink_to(real)
    log, clock, said = run_log(path)
    log.write(b"before\n")
    rotated = rotate(real)
    clock.now += CHECK_S
    log.write(b"after\n")
    assert (rotated.read_bytes(), real.read_bytes(), said) == (b"before\n", b"after\n", [])


def test_a_link_to_a_device_is_not_taken_for_a_rotation(tmp_path: Path) -> None:
    """train.log linked to /dev/full (tests/test_disk_full.py): the name still leads to the file held,
    so it is never reopened; the full disk is said once, as before."""
    path = tmp_path / "train.log"
    path.symlink_to("/dev/full")
    log, clock, said = run_log(path)
    held = log.file
    for _ in range(3):
        clock.now += CHECK_S
        log.write(b"line\n")
    assert log.file is held
    assert said == [f"cannot write {path} (No space left on device): free space there; the run goes on, its "
                    "lines sent to the controller only"]
