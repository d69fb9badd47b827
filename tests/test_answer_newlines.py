"""A host's answer cannot print lines that read as meshrun's own (sec51 finding 3). A version, a label or
an action a host reports goes into one of our lines: before, a newline in it started a new console line,
so a host's `torch` of `2.5.1\\nPASS gpu1: ...` printed a PASS about another host in check-network, and
a `fab setup` action printed `error: host 'gpu1': ... run fab trust --replace`. Now deploy/run/answers.py
escapes what does not print in a short field (honest text, all printable, comes back as it was), and
deploy/cli.py prints every MeshrunError on one line. Each test feeds the answer through the real reader
(the facts probe's `facts_of`, `fab setup`'s `_run_setup`) and counts the lines printed."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Iterable

import pytest
from invoke.exceptions import Exit

from meshrun.deploy.check.answers import facts_of, host_path
from meshrun.deploy.check.findings import Finding, Level
from meshrun.deploy.check.verdicts import Fingerprint, Gpu, HostFacts, host_findings, version_findings
from meshrun.deploy.cli import guarded
from meshrun.deploy.commands import setup
from meshrun.deploy.edges.wheel import Identity
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.project import Project
from meshrun.deploy.render.check import finding_text
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.render.neutral import NeutralConsole
from meshrun.deploy.run.answers import Answer
from meshrun.deploy.run.firewall import host_answer
from meshrun.deploy.run.requirements import Requirements
from tests.fakesession import FakeSession

BREAKS = ("\n", "\r", "\r\n")  # the newline alone prints a line on the old code; CR is escaped on print too
SHOWN = {"\n": "\\n", "\r": "\\x0d", "\r\n": "\\x0d\\n"}  # as deploy/render/neutral.py writes them
FORGED = "PASS gpu1: GPU 0 free; all checks passed"
H100 = (Gpu(0, "NVIDIA H100", 2, 81559),)


def facts(torch: str, cuda: str | None = None) -> dict:
    """The facts probe's answer as deploy/host/facts.py prints it."""
    return {"python": "3.11.9", "torch": torch, "cuda": cuda, "nccl": None, "error": None, "disk_free": 10**11,
            "tools": {}}


def host(name: str, fingerprint: Fingerprint) -> HostFacts:
    return HostFacts(name=name, address="10.0.0.3", network="lan", reachable=True, ssh_ms=3.0,  # type: ignore[call-arg]
                     fingerprint=fingerprint, gpus=H100, selected_gpus=(0,), processes=1, interface="eth0", mtu=1500,
                     workdir="~/meshrun", disk_free_gib=50.0)


def printed(findings: Iterable[Finding]) -> list[str]:
    """The findings as check-network prints them, one per line: the console's lines, however split."""
    out = io.StringIO()
    console = NeutralConsole(file=out, width=10_000, soft_wrap=True, highlight=False, color_system=None)
    for finding in findings:
        console.print(finding_text(finding))
    return out.getvalue().splitlines()


def test_a_cpu_torch_version_holding_a_line_break_warns_on_one_line() -> None:
    honest = facts_of("gpu2", facts("2.5.0+cpu"))[0]
    assert honest == Fingerprint("3.11.9", "2.5.0+cpu", None, None, None, None)  # as it was sent
    assert host_findings(host("gpu2", honest), {}) == [Finding(Level.WARN, "gpu2", (
        "torch 2.5.0+cpu is a build without CUDA: gpu2 trains on CPU and its GPUs stay idle; to use them, put "
        "`--extra-index-url https://download.pytorch.org/whl/cuXYZ` and `torch==2.5.0+cuXYZ` in requirements.txt, "
        "XYZ a CUDA its driver runs (https://pytorch.org/get-started/locally/), and run "
        "`fab setup --hosts gpu2`; or point `python:` in the inventory at an env with a CUDA build"))]
    for brk in BREAKS:
        hostile = facts_of("gpu2", facts(f"2.5.1{brk}PASS gpu2: torch 2.5.1+cu121 with CUDA 12.1: trains on GPU 0"))[0]
        found = host_findings(host("gpu2", hostile), {})
        lines = printed(found)
        assert [f.level for f in found] == [Level.WARN] and len(lines) == 1, (brk, lines)
        assert lines[0].startswith("WARN gpu2: torch 2.5.1" + repr(brk)[1:-1] + "PASS gpu2: torch"), lines


def test_a_torch_version_holding_a_line_break_fails_the_version_check_on_one_line() -> None:
    gpu1 = host("gpu1", facts_of("gpu1", facts("2.5.1+cu121", "12.1"))[0])
    honest = host("gpu2", facts_of("gpu2", facts("2.4.1+cu121", "12.1"))[0])
    assert version_findings([gpu1, honest]) == [Finding(Level.FAIL, "cluster", (
        "torch versions differ (gpu1 2.5.1+cu121, gpu2 2.4.1+cu121); install the same version on every host "
        "(mismatched collectives hang or return garbage)"))]
    for brk in BREAKS:
        hostile = host("gpu2", facts_of("gpu2", facts(f"2.5.1{brk}{FORGED}", "12.1"))[0])
        found = version_findings([gpu1, hostile])
        lines = printed(found)
        assert len(found) == 1 and len(lines) == 1, (brk, lines)
        assert f"gpu2 2.5.1{repr(brk)[1:-1]}{FORGED})" in lines[0] and lines[0].startswith("FAIL cluster: "), lines


REQUEST = (Path("meshrun-0.1.0-py3-none-any.whl"), Identity("0.1.0", "0123456789ab"))
VENV = "/home/u/meshrun/.venv/bin/python"
KEY_CHANGED = ("error: host 'gpu1': setup failed: its sshd host key changed; run `fab trust --hosts gpu1 --replace` "
               "to accept the new one")


def setup_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                answers: dict[str, dict]) -> list[str]:
    """`fab setup`'s output: the real main and the real reading of each host's answer; only SSH is faked."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts:\n" + "".join(f"  {name}: {{address: 10.9.0.{i + 1}, python: {VENV}}}\n"
                                              for i, name in enumerate(answers)))
    monkeypatch.setattr(setup, "controller_wheel", lambda: REQUEST[0])
    monkeypatch.setattr(setup, "controller_identity", lambda: REQUEST[1])
    monkeypatch.setattr(setup, "project_requirements", lambda _root: Requirements())
    monkeypatch.setattr(setup, "setup_hosts", lambda hosts, _inv, _project, _renderer, request: {
        h.name: setup._run_setup(h, FakeSession(json.dumps(answers[h.name])), request, False) for h in hosts})
    setup.main(str(inventory), None, "python3", None, Project(tmp_path, tmp_path / "runs"))
    shown = capsys.readouterr()
    return (shown.out + shown.err).splitlines()


def test_setup_prints_one_line_per_host_whatever_its_actions_and_torch_hold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    honest = {"actions": ["created venv /home/u/meshrun/.venv"], "python": VENV, "torch": "2.5.1+cu121"}
    done = {"actions": [], "python": VENV, "torch": "2.5.1+cu121"}
    assert setup_lines(tmp_path, monkeypatch, capsys, {"gpu1": done, "gpu2": honest}) == [
        "gpu1: already set up, nothing to do; meshrun 0.1.0 (build 0123456789ab), python "
        f"{VENV} (torch 2.5.1+cu121)",
        "gpu2: created venv /home/u/meshrun/.venv; meshrun 0.1.0 (build 0123456789ab), python "
        f"{VENV} (torch 2.5.1+cu121)"]
    for brk in BREAKS:
        hostile = {"actions": [f"created venv{brk}{KEY_CHANGED}"], "python": VENV,
                   "torch": f"2.5.1){brk}gpu1: already set up, nothing to do; meshrun ok (torch 2.5.1"}
        lines = setup_lines(tmp_path, monkeypatch, capsys, {"gpu1": done, "gpu2": hostile})
        assert [line.split(":")[0] for line in lines] == ["gpu1", "gpu2"], (brk, lines)
        assert lines[1].startswith(f"gpu2: created venv{repr(brk)[1:-1]}error: host 'gpu1'"), lines


def test_a_finding_carrying_a_hosts_raw_text_prints_on_one_line() -> None:
    """A finding is one line whatever a host put in the text it carries: here the route query's error,
    which quotes what `ip route get` printed on the host, unescaped (deploy/edges/check_probes.py)."""
    for brk in BREAKS:
        error = f"host 'gpu2': `ip route get` failed: no route{brk}PASS gpu1: GPU 0 free; all checks passed"
        found = host_findings(replace(host("gpu2", Fingerprint("3.11.9", "2.5.1", None, None, None, None)),
                                      interface_error=error), {})
        assert Finding(Level.FAIL, "gpu2", error) in found
        lines = printed(found)
        assert len(lines) == len(found) and not any(line.startswith("PASS") for line in lines), (brk, lines)


def test_a_warning_quoting_a_host_prints_on_one_line() -> None:
    """Every warning is one line (deploy/render/console.py): the pre-flight's WARN findings, a fetch's
    word on a holder passed over, each quoting what a host said."""
    for brk in BREAKS:
        out = io.StringIO()
        console = NeutralConsole(file=out, width=10_000, soft_wrap=True, highlight=False, color_system=None)
        Renderer(console, console).warn(f"pre-flight: gpu2: nvidia-smi failed (gone{brk}PASS gpu1: all checks passed)")
        assert out.getvalue().splitlines() == [
            f"warning: pre-flight: gpu2: nvidia-smi failed (gone{SHOWN[brk]}PASS gpu1: all checks passed)"]


def test_every_error_the_boundary_prints_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A failure quoting a host (a pre-flight's findings, an answer) kept its newlines: only bad input
    was put on one line. A long failure is still printed whole."""
    @guarded
    def task(error: MeshrunError) -> None:
        raise error

    for brk in BREAKS:
        with pytest.raises(Exit) as info:
            task(MeshrunError(f"pre-flight failed: gpu2: torch 2.5.1{brk}{KEY_CHANGED}"))
        err = capsys.readouterr().err
        assert info.value.code == 1 and len(err.splitlines()) == 1 and err.startswith("error: pre-flight"), (brk, err)
    with pytest.raises(Exit):
        task(MeshrunError(f"host 'gpu2': a{'f' * 400}\n{KEY_CHANGED}"))
    assert capsys.readouterr().err == f"error: host 'gpu2': a{'f' * 400}\\n{KEY_CHANGED}\n"


def test_short_fields_are_escaped_and_long_ones_kept_as_sent() -> None:
    """The reader: a short field (a version, a label, an action) has what does not print escaped, as
    `said` quotes a host's message; printable text is unchanged. A command's output (the firewall's,
    split into lines by its caller) and a path host_path checks keep their characters: the path is still
    refused, not escaped into one that looks valid."""
    reader = Answer("gpu2", "the facts probe")
    assert reader.text("2.5.1+cu121", "torch", limit=80) == "2.5.1+cu121"
    assert reader.text("2.5.1\n\r\x1bPASS", "torch", limit=80) == "2.5.1\\n\\r\\x1bPASS"
    assert reader.texts(["created venv /v", "a\nb"], "actions") == ("created venv /v", "a\\nb")
    assert reader.text("x" * 300 + "\n", "error") == "x" * 240  # clipped first, as before
    assert reader.text("\n" * 200, "error") == "\\n" * 120 + "…"  # and the escaped text too
    assert facts_of("gpu2", {**facts("2.5.1"), "torch": None, "error": "ImportError: a\nb"})[0].error == \
        "ImportError: a\\nb"
    rules = "-N MESHRUN\n-A MESHRUN -i lo -j RETURN\n"
    answer = host_answer("gpu2", {"results": [{"argv": ["iptables", "-S", "MESHRUN"], "stdout": rules}], "error": None})
    assert answer.output == rules and answer.ran == (("iptables", "-S", "MESHRUN"),)
    with pytest.raises(MeshrunError, match="tools.rsync is '/usr/bin/rsync\\\\nx'; expected a path of printable"):
        host_path(reader, "/usr/bin/rsync\nx", "tools.rsync", 1000)
