"""A reused pre-flight and GPUs that filled or freed since its pass (finding stop50-commits #3).

The busy-GPU WARN reads nvidia-smi's `memory.used`, the most volatile fact the pre-flight reads,
and the reuse key did not cover it: a colleague's job that filled GPU 0 after the pass was hidden
for 5 minutes, and a WARN about a GPU freed since was replayed, under "nothing it checked has
changed". Now the host stamp lists the busy GPUs (deploy/host/stamp.py), so either change is a
new key and the pre-flight runs.

No GPU exists on this machine: GPU behaviour is mocked by a fake `nvidia-smi` shell script put
first on PATH (as tests/test_idle_cpu_on_gpu_host.py's fake_smi does), answering both the stamp's
query and the facts probe's from one file of recorded-format lines. The real stamp probe runs as
`python -c` on this machine; the controller's pre-flight runs for real over a session that runs
each argv here, with only the facts gathering and the link probes stood in (they need hosts).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest

from meshrun import layout
from meshrun.deploy.check import gpus
from meshrun.deploy.check.verdicts import Fingerprint, HostFacts
from meshrun.deploy.commands import check
from meshrun.deploy.edges import check_probes
from meshrun.deploy.edges.preflightcache import host_stamps, load_pass
from meshrun.deploy.edges.wheel import controller_identity
from meshrun.deploy.host import facts as host_facts
from meshrun.deploy.host import stamp as host_stamp
from meshrun.deploy.inventory.model import Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.render.console import Renderer
from tests.fakesession import host
from tests.test_preflight_ports import ThisMachine

STAMP = Path(host_stamp.__file__)
# The facts probe's format (index, name, memory.used, memory.total, uuid): GPU 0 free, GPU 1 idle.
FREE = ("0, NVIDIA H100 80GB HBM3, 3, 81559, GPU-8d2c1f3a-55e1-9b7e-4c0d-2f6a9e1b7c44\n"
        "1, NVIDIA H100 80GB HBM3, 3, 81559, GPU-1a2b3c4d-55e1-9b7e-4c0d-2f6a9e1b7c45\n")
FILLED = FREE.replace("0, NVIDIA H100 80GB HBM3, 3,", "0, NVIDIA H100 80GB HBM3, 8192,")  # a colleague's job
CUDA = Fingerprint("3.11.9", "2.5.0+cu124", "12.4", "2.21.5", meshrun=str(controller_identity()))


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake `nvidia-smi` first on PATH; the test writes the GPUs' lines into the returned file.
    The stamp's query (`index,memory.used`) gets fields 1 and 3 of them, any other query all."""
    state = tmp_path / "gpus.csv"
    state.write_text(FREE)
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text(f'#!/bin/sh\ncase "$1" in --query-gpu=index,memory.used) cut -d, -f1,3 "{state}";; '
                    f'*) cat "{state}";; esac\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    return state


def run_stamp() -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", STAMP.read_text()], capture_output=True, text=True, timeout=60)


def busy_in_stamp() -> list[int]:
    done = run_stamp()
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["gpus_busy"]


# --- one threshold ---

def test_the_stamp_and_the_warning_share_one_threshold_and_one_nvidia_smi() -> None:
    assert host_stamp.BUSY_MIB == gpus.BUSY_MIB == layout.GPU_BUSY_MIB == 1024
    assert host_stamp.EXTRA_PATH == host_facts.EXTRA_PATH  # where the facts probe finds nvidia-smi


# --- the host stamp (the real probe, a fake nvidia-smi) ---

@pytest.mark.parametrize(("lines", "busy"), [
    (FREE, []),
    (FILLED, [0]),
    (FREE.replace(", 3, 81559", ", 1024, 81559"), []),  # the WARN's own threshold: over 1024
    (FREE.replace(", 3, 81559", ", 1025, 81559"), [0, 1]),
    ("1, x, 9000, 81559, u\n0, x, 9000, 81559, u\n", [0, 1]),  # sorted: the stamp is compared as text
    ("0, x, [N/A], 81559, u\n1, x, 9000, 81559, u\n", [1]),  # no figure: the pre-flight skips it too
    ("garbage\n²,x, 9000, 1, u\n\n", []),
])
def test_the_stamp_lists_the_gpus_over_the_threshold(smi: Path, lines: str, busy: list[int]) -> None:
    smi.write_text(lines)
    assert busy_in_stamp() == busy


def test_without_nvidia_smi_no_gpu_is_busy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("HOME", str(tmp_path))  # EXTRA_PATH's ~/bin
    if any(os.path.exists(os.path.join(d, "nvidia-smi")) for d in host_stamp.EXTRA_PATH[1:]):
        pytest.skip("this machine has an nvidia-smi in an sbin folder")
    assert busy_in_stamp() == []


def test_an_nvidia_smi_that_fails_gives_no_stamp(smi: Path) -> None:
    """What the GPUs hold is unknown: no stamp, so the pre-flight runs (and says what nvidia-smi did)."""
    tool = smi.parent / "bin" / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    done = run_stamp()
    assert (done.returncode, done.stdout, done.stderr.strip()) == (1, "", "nvidia-smi: exit status 9")


def test_an_nvidia_smi_that_hangs_gives_no_stamp(smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (smi.parent / "bin" / "nvidia-smi").write_text("#!/bin/sh\nexec sleep 30\n")
    monkeypatch.setattr(host_stamp, "SMI_TIMEOUT_S", 0.3)  # in-process: the probe's own 10 s, shortened
    with pytest.raises(SystemExit) as ended:
        host_stamp.busy_gpus()
    assert str(ended.value).startswith("nvidia-smi: Command") and "timed out" in str(ended.value)


# --- the pre-flight's reuse (ThisMachine: each argv, the stamp probe and nvidia-smi, run here) ---

class Recorder(Renderer):
    def __init__(self) -> None:
        super().__init__()
        self.warnings: list[str] = []
        self.infos: list[str] = []

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def info(self, message: str) -> None:
        self.infos.append(message)


Box = tuple[Selection, dict[str, ThisMachine]]  # one host, this machine, and its session


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def box(smi: Path, monkeypatch: pytest.MonkeyPatch) -> Box:
    """One host, this machine; the pre-flight's facts read its GPUs through the fake nvidia-smi."""
    # `gpus: [0]`: the run's one rank on GPU 0, the GPU the colleague's job fills.
    here = dataclasses.replace(host(), name="box", address="127.0.0.1", python=sys.executable, gpus=(0,))
    sessions = {"box": ThisMachine(here)}

    def gathered(*args: object) -> tuple[HostFacts, ...]:
        found, note = check_probes._gpus(sessions["box"], "nvidia-smi")
        assert note is None
        return (HostFacts("box", "127.0.0.1", "lan", True, ssh_ms=3.0, fingerprint=CUDA, gpus=found,
                          selected_gpus=(0,), interface="eth0", mtu=1500, workdir="~/meshrun", disk_free_gib=50.0),)

    monkeypatch.setattr(check, "gather_facts", gathered)
    monkeypatch.setattr(check, "probe_network", lambda *args: check_probes.Probed(None, ()))
    return Selection((here,), Rendezvous(None, free_port())), sessions


def preflight(box: Box, cache: Path) -> tuple[bool, Recorder]:
    shown = Recorder()
    return check.preflight(box[0], box[1], shown, cache), shown


def gpu0(warnings: Sequence[str]) -> list[str]:
    return [w for w in warnings if "GPU 0 (NVIDIA H100 80GB HBM3) has 8192 of 81559 MiB in use" in w]


def reuse_said(shown: Recorder) -> list[str]:
    """The reuse lines without their age (seconds, whatever the machine's speed)."""
    return [line.split(" s ago", 1)[1] for line in shown.infos]


def test_a_gpu_filled_since_the_pass_is_checked_and_warned(box: Box, smi: Path, tmp_path: Path) -> None:
    cache = tmp_path / "preflight.json"
    reused, shown = preflight(box, cache)
    assert (reused, shown.warnings) == (False, [])  # GPU 0 free: passed, stored
    smi.write_text(FILLED)  # a colleague's job fills GPU 0 within PREFLIGHT_REUSE_S
    reused, shown = preflight(box, cache)
    assert reused is False  # before: True, and no warning
    assert len(gpu0(shown.warnings)) == 1
    reused, shown = preflight(box, cache)  # still busy: the same key, the WARN shown again
    assert reused is True and len(gpu0(shown.warnings)) == 1
    assert reuse_said(shown) == [check.reuse_message(0, True).split(" s ago", 1)[1]]


def test_a_warning_about_a_gpu_freed_since_is_not_replayed(box: Box, smi: Path, tmp_path: Path) -> None:
    cache = tmp_path / "preflight.json"
    smi.write_text(FILLED)
    reused, shown = preflight(box, cache)
    assert reused is False and len(gpu0(shown.warnings)) == 1
    assert len(gpu0(load_pass(cache).warnings)) == 1  # stored with the pass
    smi.write_text(FREE)  # that job ended
    reused, shown = preflight(box, cache)
    assert (reused, shown.warnings) == (False, [])  # before: True, replaying the stale 8192 MiB
    reused, shown = preflight(box, cache)
    assert (reused, shown.warnings) == (True, [])
    assert reuse_said(shown) == [check.reuse_message(0, False).split(" s ago", 1)[1]]


def test_a_failing_nvidia_smi_is_no_reuse(box: Box, smi: Path, tmp_path: Path) -> None:
    selection, sessions = box
    assert host_stamps(selection.hosts, sessions, sys.executable) is not None
    (smi.parent / "bin" / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    assert host_stamps(selection.hosts, sessions, sys.executable) is None


def test_the_reuse_claims_only_what_the_key_covers() -> None:
    assert check.reuse_message(41.6, False) == (
        "pre-flight: reused the pass of 42 s ago: the hosts, their installs and boot, the rendezvous port and "
        "which GPUs are busy are as it found them")
    assert check.reuse_message(-0.2, True) == (
        "pre-flight: reused the pass of 0 s ago: the hosts, their installs and boot, the rendezvous port and "
        "which GPUs are busy are as it found them; the warnings above are from that pass")
