"""A fetch after the first sends only what changed on the host (longrun review, finding 1): the
staging tree is emptied once placed, so rsync is given the host's tree as the last fetch left it,
`runs/<id>/hosts/<host>/`, as its `--link-dest` basis. Exact argv, the basis rule on real trees,
real rsync from a local host (no sshd) counting the bytes it sent, and real rsync against a
recording stand-in for ssh to show the basis path never reaches the host."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from meshrun.deploy.commands.fetch import main
from meshrun.deploy.edges import fetch as fetch_module
from meshrun.deploy.edges.fetch import BUT_CHECKPOINTS, ONLY_CHECKPOINTS, fetch_argv
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.edges.staging import MAX_DEPTH, Staging, fetch_basis
from meshrun.deploy.edges.sync import ssh_argv
from meshrun.deploy.inventory.model import Host, Network
from meshrun.deploy.project import Project
from tests.localrun import local_h2_project
from meshrun.deploy.run.manifest import manifest_text, parse_manifest

RUN = "20260101-000000-abcd"
MIB = 1 << 20
LITERAL_RE = re.compile(rb"^Literal data: ([\d,]+) bytes")


def _host(address: str = "10.0.0.2", workdir: str = "~/meshrun") -> Host:
    return Host(name="gpu2", address=address, ssh_address=None, user="ubuntu", port=2222, identity=None,
                python="python3", workdir=workdir, network=Network.LAN, gpus=(), nproc=1, batch_size=None, env=())


def test_fetch_argv_gives_rsync_the_landed_tree_as_its_basis(tmp_path: Path) -> None:
    kh = tmp_path / "kh"
    kh.write_text("")
    staging, landed = Staging(tmp_path / "in"), tmp_path / "runs/r1/hosts/gpu2"
    head = ["rsync", "--protect-args", "--timeout=60", "--recursive", "--times", "--no-links", "--no-devices",
            "--no-specials", "--chmod=D755,F644", "--partial-dir=.rsync-partial", f"--temp-dir={tmp_path / 'in/tmp'}",
            "--info=progress2", "--no-inc-recursive"]
    assert fetch_argv(_host(), "r1", staging, tmp_path, kh, landed) == head + [
        "--modify-window=-1", f"--link-dest={landed}", "-e", shlex.join(ssh_argv(_host(), kh)),
        "10.0.0.2:meshrun/runs/r1/", f"{tmp_path / 'in/tree'}/"]
    local = _host("local", str(tmp_path / "wd"))
    assert fetch_argv(local, "r1", staging, tmp_path, None, landed) == head + [
        "--modify-window=-1", f"--link-dest={landed}", f"{tmp_path / 'wd/runs/r1'}/", f"{tmp_path / 'in/tree'}/"]
    assert fetch_argv(local, "r1", staging, tmp_path, None, None) == head + [
        f"{tmp_path / 'wd/runs/r1'}/", f"{tmp_path / 'in/tree'}/"]


def _tree(top: Path) -> Path:
    (top / "checkpoints").mkdir(parents=True)
    (top / "torchrun/attempt_0/0").mkdir(parents=True)
    (top / "checkpoints/ckpt-step000000100.pt").write_bytes(b"w")
    (top / "torchrun/attempt_0/0/stdout.log").write_text("x")
    (top / "train.log").write_text("x")
    return top


def test_the_basis_is_a_plain_tree_of_folders_and_regular_files_only(tmp_path: Path, monkeypatch) -> None:
    """A link anywhere in the tree (yours: a fetch never makes one) could lead rsync's reads out
    of it, a folder that cannot be listed could hide one: no basis then, every file comes whole."""
    assert fetch_basis(tmp_path / "missing") is None
    plain = _tree(tmp_path / "plain")
    assert fetch_basis(plain) == plain
    monkeypatch.chdir(tmp_path)
    assert fetch_basis(Path("plain")) == plain  # absolute: a relative --link-dest is read from the staging tree
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside/secret").write_text("s")
    cases = {"dir-link": lambda t: (t / "torchrun/attempt_0/x").symlink_to(tmp_path / "outside"),
             "file-link": lambda t: (t / "checkpoints/best.pt").symlink_to(tmp_path / "outside/secret"),
             "fifo": lambda t: os.mkfifo(t / "torchrun/pipe")}
    for name, plant in cases.items():
        plant(_tree(tmp_path / name))
        assert fetch_basis(tmp_path / name) is None, name
    (tmp_path / "linked-root").symlink_to(plain)
    assert fetch_basis(tmp_path / "linked-root") is None
    deep = _tree(tmp_path / "deep")
    (deep / "/".join(["d"] * (MAX_DEPTH + 1))).mkdir(parents=True)
    assert fetch_basis(deep) is None
    as_deep_as_walked = _tree(tmp_path / "as-deep")
    (as_deep_as_walked / "/".join(["d"] * MAX_DEPTH)).mkdir(parents=True)
    assert fetch_basis(as_deep_as_walked) == as_deep_as_walked


@dataclass
class Rsyncs:
    """Every fetch rsync, run with `--stats` (and `--no-whole-file`: between two machines rsync
    sends differences by default; between local folders it copies whole files unless told)."""

    argvs: list[list[str]] = field(default_factory=list)
    literal: list[int] = field(default_factory=list)  # bytes rsync sent as data, per run

    def fetch(self, k: int) -> tuple[list[list[str]], int]:
        """The k-th fetch's rsyncs (its first part, the host's small files, then its checkpoints
        and their retries) and the bytes they sent as data together."""
        starts = [i for i, argv in enumerate(self.argvs) if BUT_CHECKPOINTS[-1] in argv] + [len(self.argvs)]
        span = range(starts[k], starts[k + 1])
        return [self.argvs[i] for i in span], sum(self.literal[i] for i in span)

    def install(self, monkeypatch) -> None:
        real = fetch_module.run_rsync

        def counted(argv, **kwargs):
            argv = [argv[0], "--stats", "--no-whole-file", *argv[1:]]
            self.argvs.append(argv)
            inner = kwargs["on_line"]

            def on_line(line: bytes) -> None:
                found = LITERAL_RE.match(line)
                if found:
                    self.literal.append(int(found.group(1).replace(b",", b"")))
                inner(line)
            real(argv, **{**kwargs, "on_line": on_line})
        monkeypatch.setattr(fetch_module, "run_rsync", counted)


def _project(tmp_path: Path) -> Project:
    return local_h2_project(tmp_path, RUN)


def _save(run: Path, steps: list[int]) -> dict[str, str]:
    """The trainer's checkpoints: 1 MiB each, random (no compression helps), older ones pruned."""
    checkpoints = run / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    for old in checkpoints.glob("ckpt-*"):
        if int(old.name[9:18]) not in steps:
            old.unlink()
    for step in steps:
        path = checkpoints / f"ckpt-step{step:09d}.pt"
        if not path.exists():
            path.write_bytes(os.urandom(MIB))
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in checkpoints.glob("ckpt-*")}
    (checkpoints / "MANIFEST.sha256").write_text(manifest_text(digests))
    return digests


def _append(path: Path, size: int) -> None:
    with open(path, "ab") as handle:
        handle.write(os.urandom(size).hex()[:size].encode())


def test_a_second_fetch_sends_only_the_new_checkpoint_and_what_the_logs_grew_by(tmp_path: Path,
                                                                               monkeypatch) -> None:
    """A live run fetched at step 500, then at 600 after its logs grew by 10 KiB each: the second
    rsync sends the new step's 1 MiB and the appended bytes, not the 3 MiB already home (before
    the fix it sent all 4 MiB again: the emptied staging tree had nothing to compare with), and
    what lands is the host's, verified and listed, as before."""
    rsyncs = Rsyncs()
    rsyncs.install(monkeypatch)
    project = _project(tmp_path)
    run = tmp_path / "w2/runs" / RUN
    _save(run, [300, 400, 500])
    (run / "train.log").write_bytes(b"")
    _append(run / "train.log", MIB)
    _append(run / "metrics.rank0.jsonl", 64 << 10)
    assert main(RUN, None, False, project) == 0
    argvs, sent = rsyncs.fetch(0)
    assert sent > 4 * MIB and not any(a.startswith("--link-dest") for a in argvs[0])
    digests = _save(run, [400, 500, 600])
    _append(run / "train.log", 10 << 10)
    _append(run / "metrics.rank0.jsonl", 10 << 10)
    assert main(RUN, None, False, project) == 0
    home = project.runs / RUN
    argvs, sent = rsyncs.fetch(1)
    assert MIB <= sent < MIB + (64 << 10), rsyncs.literal
    assert all(f"--link-dest={home / 'hosts/h2'}" in argv for argv in argvs) and len(argvs) == 2
    for name in ("train.log", "metrics.rank0.jsonl", "checkpoints/ckpt-step000000600.pt",
                 "checkpoints/ckpt-step000000400.pt", "checkpoints/MANIFEST.sha256"):
        assert (home / "hosts/h2" / name).read_bytes() == (run / name).read_bytes(), name
    listed = parse_manifest((home / "checkpoints/MANIFEST.sha256").read_bytes()).digests()
    assert {name: listed[name] for name in digests} == digests
    assert not (home / ".incoming").exists()


def test_a_link_you_made_in_the_hosts_tree_means_no_basis_but_the_fetch_still_works(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    rsyncs = Rsyncs()
    rsyncs.install(monkeypatch)
    project = _project(tmp_path)
    run = tmp_path / "w2/runs" / RUN
    _save(run, [300])
    assert main(RUN, None, False, project) == 0
    (tmp_path / "elsewhere").mkdir()
    (project.runs / RUN / "hosts/h2/mine").symlink_to(tmp_path / "elsewhere")
    digests = _save(run, [300, 400])
    assert main(RUN, None, False, project) == 0
    argvs, sent = rsyncs.fetch(1)
    assert not any(a.startswith("--link-dest") for argv in argvs for a in argv)
    assert sent >= 2 * MIB  # everything again: the first fetch's behaviour
    assert parse_manifest((project.runs / RUN / "checkpoints/MANIFEST.sha256").read_bytes()).digests() == digests


def test_a_file_here_the_quick_check_takes_for_the_hosts_is_fetched_whole_on_the_retry(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    """The host rewrote best.pt with other bytes of the same size and the very same time as the
    copy home (planted here; in a run, a rewrite within the clock's granularity): rsync's quick
    check takes the copy home for the host's, which fails the host's manifest. The retry goes
    without the basis and brings the host's bytes: verified, placed, no false "damaged"."""
    rsyncs = Rsyncs()
    rsyncs.install(monkeypatch)
    project = _project(tmp_path)
    run = tmp_path / "w2/runs" / RUN
    _save(run, [300])
    best = run / "checkpoints/best.pt"
    best.write_bytes(b"A" * 4096)
    _write_manifest(run)
    assert main(RUN, None, False, project) == 0
    home = project.runs / RUN
    landed = home / "hosts/h2/checkpoints/best.pt"
    best.write_bytes(b"B" * 4096)
    os.utime(best, ns=(os.stat(landed).st_atime_ns, os.stat(landed).st_mtime_ns))
    _write_manifest(run)
    assert main(RUN, None, False, project) == 0
    # The second fetch: its small files and its checkpoints with the basis, then the retry without.
    assert [any(a.startswith("--link-dest") for a in argv) for argv in rsyncs.fetch(1)[0]] == [True, True, False]
    assert landed.read_bytes() == b"B" * 4096 and (home / "checkpoints/best.pt").read_bytes() == b"B" * 4096


def _write_manifest(run: Path) -> None:
    checkpoints = run / "checkpoints"
    (checkpoints / "MANIFEST.sha256").write_text(manifest_text(
        {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in checkpoints.iterdir() if p.suffix == ".pt"}))


RECORDING_SSH = """#!/bin/sh
# Records the words rsync gives its remote shell and what it writes first (rsync's protected
# arguments), then fails like an unreachable host.
printf '%s\\n' "$@" > "$(dirname "$0")/words"
timeout 2 cat > "$(dirname "$0")/sent"
exit 255
"""


def test_the_basis_path_never_reaches_the_host(tmp_path: Path) -> None:
    """rsync passes a basis option to its server only when the server receives; fetching, the
    host sends. The host's own path does go (the control), the controller's basis never."""
    fake = tmp_path / "ssh"
    fake.write_text(RECORDING_SSH)
    fake.chmod(stat.S_IRWXU)
    basis = _tree(tmp_path / "runs/r1/hosts/gpu2-basis")
    argv = fetch_argv(_host(), "r1", Staging(tmp_path / "in"), tmp_path, None, basis)
    argv[argv.index("-e") + 1] = str(fake)
    (tmp_path / "in/tmp").mkdir(parents=True)
    done = subprocess.run(argv, capture_output=True, timeout=30)
    assert done.returncode != 0
    sent = (tmp_path / "words").read_bytes() + (tmp_path / "sent").read_bytes()
    assert b"meshrun/runs/r1/" in sent
    assert b"gpu2-basis" not in sent and b"link-dest" not in sent and str(tmp_path).encode() not in sent
    assert b"modify-window" not in sent  # the receiver's alone: a host's older rsync never sees it


def test_force_fetches_without_a_basis_and_replaces_a_changed_file_with_the_hosts_size_and_time(
        tmp_path: Path, monkeypatch) -> None:
    """A review: home's train.log damaged (or edited with `touch -r`) keeps the host's size and
    time, so with the basis rsync took it for the host's, and even `--force` kept the bad bytes."""
    rsyncs = Rsyncs()
    rsyncs.install(monkeypatch)
    project = _project(tmp_path)
    run = tmp_path / "w2/runs" / RUN
    _save(run, [300])
    (run / "train.log").write_bytes(b"host line\n" * 100)
    assert main(RUN, None, False, project) == 0
    landed = project.runs / RUN / "hosts/h2/train.log"
    landed.write_bytes(b"damaged!!\n" * 100)
    os.utime(landed, ns=(os.stat(run / "train.log").st_atime_ns, os.stat(run / "train.log").st_mtime_ns))
    assert main(RUN, None, True, project) == 0
    assert not any(a.startswith("--link-dest") for argv in rsyncs.fetch(1)[0] for a in argv)
    assert landed.read_bytes() == b"host line\n" * 100


def test_a_trainer_run_sends_its_checkpoints_once_and_a_script_run_sends_all_it_wrote(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """The built-in trainer's run: the first transfer brings the logs and the manifest, no
    checkpoint (the hosts hold the same copy: only the newest holder's come, in the second).
    A `--script` run: the script's own files in its run directory's checkpoints/, listed in no
    manifest, come home in the one transfer (before the fix a script's checkpoints stayed on the
    hosts, if the two parts had applied to it)."""
    rsyncs = Rsyncs()
    rsyncs.install(monkeypatch)
    project = _project(tmp_path)
    run = tmp_path / "w2/runs" / RUN
    digests = _save(run, [300])
    (run / "train.log").write_bytes(b"line\n")
    assert main(RUN, None, False, project) == 0
    argvs, _ = rsyncs.fetch(0)
    assert len(argvs) == 2 and set(BUT_CHECKPOINTS) <= set(argvs[0]) and set(ONLY_CHECKPOINTS) <= set(argvs[1])
    home = project.runs / RUN
    assert parse_manifest((home / "checkpoints/MANIFEST.sha256").read_bytes()).digests() == digests
    assert (home / "hosts/h2/train.log").read_bytes() == b"line\n"

    scripted = RunRecord("20260101-000000-scri", str(tmp_path / "inventory/hosts.yaml"), ("h2",), 1.0, True,
                         "h2:29500", workload={"script": "train_mine.py", "config": None, "args": []})
    scripted.save(project.runs)
    mine = tmp_path / "w2/runs" / scripted.run_id / "checkpoints"
    mine.mkdir(parents=True)
    (mine / "model_epoch3.pt").write_bytes(b"the script's own")
    calls = len(rsyncs.argvs)
    assert main(scripted.run_id, None, False, project) == 0
    assert len(rsyncs.argvs) == calls + 1 and not any(a.startswith("--exclude") for a in rsyncs.argvs[-1])
    landed = project.runs / scripted.run_id / "hosts/h2/checkpoints/model_epoch3.pt"
    assert landed.read_bytes() == b"the script's own"
