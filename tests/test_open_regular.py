"""`fsutil.open_regular`, the open `read_regular` and `fab logs`' read of a log's end share: a FIFO
(or a directory) under the name is refused at once, never waited on for a writer, and no descriptor
is left open; a regular file gives a descriptor of its bytes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meshrun.fsutil import FileRefused, open_regular, read_regular


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_fifo_is_refused_without_blocking_and_nothing_stays_open(tmp_path: Path) -> None:
    fifo = tmp_path / "train.log"
    os.mkfifo(fifo)
    before = _open_fds()
    with pytest.raises(FileRefused) as refused:
        open_regular(fifo)  # no writer: a blocking open would hang here
    assert (str(refused.value), refused.value.too_large) == ("is a FIFO, not a regular file", False)
    assert _open_fds() == before
    with pytest.raises(FileRefused) as refused:
        open_regular(tmp_path)
    assert str(refused.value) == "is a directory, not a regular file"
    assert _open_fds() == before


def test_a_regular_file_is_opened_for_reading(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"step 1\n")
    fd = open_regular(log)
    try:
        assert os.read(fd, 100) == b"step 1\n"
    finally:
        os.close(fd)
    assert read_regular(log, 7) == b"step 1\n"
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "gone")
