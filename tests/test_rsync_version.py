"""Every sync passes rsync's --mkpath (3.2.3 and later). An older rsync on this machine (macOS's
2.6.9, openrsync, Ubuntu 20.04's 3.1.3) is one line before any transfer, and one on the far end
gets a hint that names it (deploy/edges/rsyncrun.py). Fake rsync programs: what is under test is
how meshrun reads their words."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshrun.deploy.edges import rsyncrun
from meshrun.deploy.errors import MeshrunError


def fake_rsync(tmp_path: Path, version_line: str, transfer: str = "exit 0") -> str:
    program = tmp_path / "rsync"
    program.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "{version_line}"; exit 0; fi\n{transfer}\n')
    program.chmod(0o755)
    return str(program)


@pytest.mark.parametrize("line,shown", [("rsync  version 3.1.3  protocol version 31", "3.1.3"),
                                         ("openrsync: protocol version 29", "0.0.0")])
def test_an_old_rsync_here_is_one_line_before_any_transfer(tmp_path: Path, line: str, shown: str) -> None:
    with pytest.raises(MeshrunError) as info:
        rsyncrun.run_rsync([fake_rsync(tmp_path, line), "x"], host="h1", what="code sync", timeout=30, hint="retry")
    assert str(info.value) == (f"host 'h1': code sync: the rsync on this machine is {shown}, older than 3.2.3, which "
                               "meshrun needs (--mkpath); install a newer one (macOS: brew install rsync)")


def test_an_old_rsync_on_the_host_is_named_in_the_hint(tmp_path: Path) -> None:
    far_end = "echo 'rsync: on remote machine: --mkpath: unknown option' >&2; exit 1"
    program = fake_rsync(tmp_path, "rsync  version 3.4.1  protocol version 32", far_end)
    with pytest.raises(MeshrunError) as info:
        rsyncrun.run_rsync([program, "x"], host="h1", what="code sync", timeout=30, hint="retry")
    assert str(info.value) == ("host 'h1': code sync failed (rsync exit 1): rsync: on remote machine: --mkpath: "
                               "unknown option; the host's rsync is older than 3.2.3: install a newer one there")
    rsyncrun.run_rsync([fake_rsync(tmp_path, "rsync  version 3.4.1  protocol version 32")], host="h1", what="code sync",
                       timeout=30, hint="retry")  # new enough, and it worked: nothing said
