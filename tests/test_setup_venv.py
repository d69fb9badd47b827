"""`fab setup`'s venv step on the host (deploy/host/setup.py), on real files with real interpreters:
a venv that fails says why (venv's own last lines and the fix), and a venv left without pip by
such a failure is made again instead of failing every later setup with "No module named pip"."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshrun.deploy.host import setup


def test_a_failing_venv_says_its_own_words_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing = tmp_path / "python3"
    failing.write_text("#!/bin/sh\necho 'The virtual environment was not created successfully because ensurepip "
                       "is not available.' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(setup.sys, "executable", str(failing))
    with pytest.raises(setup.SetupFailed) as info:
        setup.make_venv(None, [])
    assert str(info.value) == (f"{failing} -m venv failed: The virtual environment was not created successfully "
                               "because ensurepip is not available.; on Debian or Ubuntu install python3-venv (apt "
                               "install python3-venv), or pass --base another Python >= 3.10")


def test_a_venv_left_without_pip_is_made_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Made again in place: the wheel `fab setup` pushed into .venv before this step must stay (a
    `venv --clear` removed it, and pip then found no wheel to install)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text("half a venv\n")
    wheel = tmp_path / ".venv" / "meshrun-wheels" / "b" / "meshrun-0.1.0-py3-none-any.whl"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"a wheel")
    actions: list[str] = []
    setup.make_venv(None, actions)
    assert actions == [f"created venv {tmp_path / '.venv'}"]
    assert (tmp_path / ".venv" / "bin" / "pip").exists() and wheel.read_bytes() == b"a wheel"
    again: list[str] = []
    setup.make_venv(None, again)  # whole now: nothing to do
    assert again == []
