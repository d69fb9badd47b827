"""`fab trust`'s prompt at end of input (Ctrl-D, a closed stdin): a "no", nothing written, one line
saying so; before, the EOFError reached deploy/cli.guarded as an internal error with a traceback.
The host's key scan is replaced (no SSH here); the inventory, the prompt and known_hosts are real."""

from __future__ import annotations

import builtins
from pathlib import Path

import paramiko
import pytest

from meshrun.deploy.commands import trust
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.render.console import Renderer
from meshrun.layout import ENV_SSH_CONFIG


def no_more_input(_prompt: str = "") -> str:
    raise EOFError


def test_end_of_input_at_the_prompt_is_a_no(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(builtins, "input", no_more_input)
    assert trust._ask("Trust the new key(s) of h1?") is False
    assert capsys.readouterr().out == "(no answer: taken as no)\n"


def test_trust_at_end_of_input_writes_nothing_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    known = tmp_path / "known_hosts"
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts:\n  h1: {{address: 10.147.17.11}}\nknown_hosts: {known}\n")
    monkeypatch.setenv(ENV_SSH_CONFIG, "/dev/null")
    key = paramiko.ECDSAKey.generate()
    offer = trust.KeyOffer("h1", "10.147.17.11", key, trust.KeyStatus.NEW)
    monkeypatch.setattr(trust, "offers_for", lambda _host, _known, _timeout: (offer,))
    monkeypatch.setattr(builtins, "input", no_more_input)
    request = trust.TrustRequest(str(inventory), "h1")
    with pytest.raises(MeshrunError) as info:
        trust.trust(request, Renderer(), True, trust._ask, tmp_path)
    assert str(info.value) == "fab trust: nothing written; the key(s) of h1 stay untrusted"
    assert not known.exists()
