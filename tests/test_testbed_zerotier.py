"""The ZeroTier part of the test bed that needs no root: where the binary comes from, what is
reported when it is missing, the ~/bin/zerotier-cli wrapper. The daemons themselves are proven in
tests/test_zerotier_real.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.testbed.requirements import ZEROTIER_ENV, missing_requirements, zerotier_binary
from tests.testbed.zerotier import cli_wrapper_text, executable


def test_binary_is_found_beside_the_clone_or_where_the_variable_points(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ZEROTIER_ENV, raising=False)
    assert zerotier_binary(Path("/ci/work/meshrun")) == Path("/ci/work/shared/vendor/zerotier/zerotier-one")
    monkeypatch.setenv(ZEROTIER_ENV, "/opt/zt/zerotier-one")
    assert zerotier_binary(Path("/ci/work/meshrun")) == Path("/opt/zt/zerotier-one")


def test_missing_binary_is_a_reason_naming_the_path_and_the_variable(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    missing = tmp_path / "no" / "zerotier-one"
    monkeypatch.setenv(ZEROTIER_ENV, str(missing))
    expected = (f"no zerotier-one binary at {missing} (set MESHRUN_ZEROTIER_ONE to a ZeroTier One 1.14 binary, "
                "see ../shared/vendor/zerotier/README.md)")
    assert expected in missing_requirements(wireguard=False, zerotier=True)
    assert expected not in missing_requirements(wireguard=False, zerotier=False)


def test_a_binary_without_exec_bits_is_copied_never_changed(tmp_path: Path) -> None:
    shared = tmp_path / "shared" / "zerotier-one"
    shared.parent.mkdir()
    shared.write_bytes(b"\x7fELF not really")
    shared.chmod(0o444)
    state = tmp_path / "state"
    state.mkdir()
    copy = executable(shared, state)
    assert (copy, copy.read_bytes(), copy.stat().st_mode & 0o777) == (state / "zerotier-one", shared.read_bytes(), 0o755)
    assert shared.stat().st_mode & 0o777 == 0o444
    shared.chmod(0o555)
    assert executable(shared, state) == shared


def test_cli_wrapper_passes_the_daemon_home_and_every_argument_literally(tmp_path: Path) -> None:
    """The wrapper runs `<binary> -q -D<home> ARGS`; here the binary is `echo`-like, paths hostile."""
    binary = tmp_path / "bin dir $(x)" / "zerotier-one"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\nfor a in \"$@\"; do printf '[%s]\\n' \"$a\"; done\n")
    binary.chmod(0o755)
    home = tmp_path / "home 'q'"
    wrapper = tmp_path / "zerotier-cli"
    wrapper.write_text(cli_wrapper_text(str(binary), home))
    wrapper.chmod(0o755)
    out = subprocess.run([str(wrapper), "-j", "listnetworks", "a b;c"], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["[-q]", f"[-D{home}]", "[-j]", "[listnetworks]", "[a b;c]"]
