"""Pure rules of fetching from a host that may be hostile (issue 12, holes 1, 2 and 9): which
checkpoint names and manifest lines are accepted, how refusals read, and the exact rsync argv
of every transfer (arguments through rsync's protocol, IPv6 in brackets, no links from a host).
Exact equality throughout; one test runs the real rsync against a recording stand-in for ssh,
because the simulated cluster has no IPv6 sshd."""

from __future__ import annotations

import shlex
import stat
import subprocess
from pathlib import Path

import pytest

from meshrun.layout import checkpoint_name, checkpoint_step, is_checkpoint_name
from meshrun.deploy.edges.datasync import DataSpec, rsync_data_argv
from meshrun.deploy.edges.fetch import REPORTED_SKIPS, Skips, Staging, fetch_argv, skip_lines
from meshrun.deploy.edges.sync import push_dir_argv, remote_spec, rsync_argv, ssh_argv
from meshrun.deploy.inventory.model import Host, Network
from meshrun.deploy.run.manifest import (MANIFEST_MAX_BYTES, Manifest, ManifestEntry, RefusedLine, manifest_text,
                                 parse_manifest, refusal_lines, shown)

HASH = "0123456789abcdef" * 4
NOT_A_LINE = "not a '<sha256>  <file name>' line"
NOT_A_NAME = "not a checkpoint name the trainer writes (ckpt-step<9 digits>.pt, best.pt)"

HOSTILE_NAMES = ["../x", "/etc/passwd", "ckpt-step000000001.pt/../../x", "ckpt-stepXX.pt", "best.pt\n",
                 "ckpt-step00000001.pt", "ckpt-step0000000001.pt", "ckpt-step٠٠٠٠٠٠٠٠١.pt",
                 "ckpt-step０００００００００１.pt", "best.pt\x00", "\x00best.pt", "ckpt-step000000001.pt\n",
                 " best.pt", "best.pt ", "BEST.PT", "./best.pt", "checkpoints/best.pt", "ckpt-step000000001.pt.tmp",
                 "ckpt-step-00000001.pt", "ckpt-step+00000001.pt", "", ".", ".."]


def test_checkpoint_names_are_only_the_trainers() -> None:
    assert [is_checkpoint_name(n) for n in HOSTILE_NAMES] == [False] * len(HOSTILE_NAMES)
    assert [checkpoint_step(n) for n in HOSTILE_NAMES] == [None] * len(HOSTILE_NAMES)
    assert [is_checkpoint_name(n) for n in ("best.pt", "ckpt-step000000001.pt", "ckpt-step999999999.pt")] \
        == [True, True, True]
    assert [checkpoint_step(n) for n in ("best.pt", "ckpt-step000000000.pt", "ckpt-step000012345.pt")] \
        == [None, 0, 12345]
    assert checkpoint_name(12345) == "ckpt-step000012345.pt"


def test_manifest_lines_are_accepted_only_in_the_trainers_form() -> None:
    lines = [f"{HASH}  ckpt-step000000002.pt", f"{HASH}  best.pt", f"{HASH}  ../x", f"{HASH}  /etc/passwd",
             f"{HASH}  ckpt-step000000001.pt/../../x", f"{HASH}  ckpt-stepXX.pt", f"{HASH}  ckpt-step00000001.pt",
             f"{HASH}  ckpt-step٠٠٠٠٠٠٠٠١.pt", f"{HASH}  best.pt\x00x", f"{HASH}  best.pt\r", f"{HASH} best.pt",
             f"{HASH.upper()}  best.pt", f"{HASH[:-1]}  best.pt", f"{HASH}  best.pt", f"{HASH} *best.pt",
             "", "\x1b[2J\x1b[31mred", "A" * 300, f"{HASH}\tbest.pt\u2028"]
    data = "\n".join(lines).encode() + b"\n"
    parsed = parse_manifest(data)
    assert parsed == Manifest(
        (ManifestEntry("ckpt-step000000002.pt", HASH), ManifestEntry("best.pt", HASH)),
        (RefusedLine(3, f"{HASH}  ../x", NOT_A_NAME),
         RefusedLine(4, f"{HASH}  /etc/passwd", NOT_A_NAME),
         RefusedLine(5, f"{HASH}  ckpt-step000000001.pt/../../x", NOT_A_NAME),
         RefusedLine(6, f"{HASH}  ckpt-stepXX.pt", NOT_A_NAME),
         RefusedLine(7, f"{HASH}  ckpt-step00000001.pt", NOT_A_NAME),
         RefusedLine(8, f"{HASH}  ckpt-step٠٠٠٠٠٠٠٠١.pt", NOT_A_NAME),
         RefusedLine(9, f"{HASH}  best.pt\\x00x", NOT_A_NAME),
         RefusedLine(10, f"{HASH}  best.pt\\r", NOT_A_NAME),
         RefusedLine(11, f"{HASH} best.pt", NOT_A_LINE),
         RefusedLine(12, f"{HASH.upper()}  best.pt", NOT_A_LINE),
         RefusedLine(13, f"{HASH[:-1]}  best.pt", NOT_A_LINE),
         RefusedLine(14, f"{HASH}  best.pt", "lists a file a second time"),
         RefusedLine(15, f"{HASH} *best.pt", NOT_A_LINE),
         RefusedLine(16, "", NOT_A_LINE),
         RefusedLine(17, "\\x1b[2J\\x1b[31mred", NOT_A_LINE),
         RefusedLine(18, "A" * 120 + "...", NOT_A_LINE),
         RefusedLine(19, f"{HASH}\\tbest.pt\\u2028", NOT_A_LINE)))
    assert parsed.digests() == {"ckpt-step000000002.pt": HASH, "best.pt": HASH}


def test_manifest_edges_of_size_and_line_ends() -> None:
    assert parse_manifest(b"") == Manifest((), ())
    assert parse_manifest(f"{HASH}  best.pt".encode()) == Manifest((ManifestEntry("best.pt", HASH),), ())
    assert parse_manifest(b"\xff\xfe\n") == Manifest((), (RefusedLine(1, "\\xff\\xfe", NOT_A_LINE),))
    line = f"{HASH}  best.pt\n".encode()
    padded = line + b"#" * (MANIFEST_MAX_BYTES - len(line))
    assert parse_manifest(padded).entries == (ManifestEntry("best.pt", HASH),)
    assert parse_manifest(padded + b"#") == Manifest((), (), too_big=True)


def test_refusals_read_one_line_each_and_stop_at_twenty() -> None:
    parsed = parse_manifest(b"../x\n" * 23)
    lines = refusal_lines("h2", parsed, "checkpoints/MANIFEST.sha256")
    assert lines == [f"host 'h2': checkpoints/MANIFEST.sha256 line {n} ignored ({NOT_A_LINE}): ../x"
                     for n in range(1, 21)] + ["host 'h2': checkpoints/MANIFEST.sha256: 3 more lines ignored"]
    assert refusal_lines("h2", Manifest((), (), too_big=True), "m") == [
        f"host 'h2': m is larger than {MANIFEST_MAX_BYTES} bytes; ignored, no checkpoint of this host is verified"]
    assert skip_lines("h1", Skips(["logs", "a\\nb"], 23)) == [
        "host 'h1': logs is not a regular file (a link, device or pipe); not brought home",
        "host 'h1': a\\nb is not a regular file (a link, device or pipe); not brought home",
        "host 'h1': 21 more non-regular files not brought home"]
    skips = Skips()
    for n in range(REPORTED_SKIPS + 5):
        skips.add(f"p{n}")
    assert (skips.names, skips.total) == ([f"p{n}" for n in range(REPORTED_SKIPS)], REPORTED_SKIPS + 5)


def test_shown_text_cannot_drive_a_terminal() -> None:
    assert [shown(t) for t in ("ckpt é 漢", "a\nb", "\x1b]0;pwned\x07", "x\u202eexe.pdf", "a" * 121)] == \
        ["ckpt é 漢", "a\\nb", "\\x1b]0;pwned\\x07", "x\\u202eexe.pdf", "a" * 120 + "..."]
    assert manifest_text({"best.pt": HASH, "ckpt-step000000002.pt": HASH}) == \
        f"{HASH}  best.pt\n{HASH}  ckpt-step000000002.pt\n"


def host(address: str = "10.0.0.2", workdir: str = "~/meshrun") -> Host:
    return Host(name="gpu2", address=address, ssh_address=None, user="ubuntu", port=2222, identity=None,
                python="python3", workdir=workdir, network=Network.LAN, gpus=(), nproc=1, batch_size=None, env=())


def test_every_rsync_protects_its_arguments_and_brackets_ipv6(tmp_path: Path) -> None:
    kh = tmp_path / "kh"
    kh.write_text("")
    root = tmp_path / "proj"
    v6 = host("fd00::2", "/srv/mesh run $(x)")
    ssh = shlex.join(ssh_argv(v6, kh))  # how ssh is called is sshargv's own subject
    assert rsync_argv(v6, root, kh) == [
        "rsync", "--protect-args", "--timeout=60", "--archive", "--compress", "--mkpath", "--files-from=-", "--from0",
        "--info=progress2", "--no-inc-recursive", "--rsync-path", "mkdir -p '/srv/mesh run $(x)' && rsync",
        "-e", ssh, f"{root}/", "[fd00::2]:/srv/mesh run $(x)/"]
    assert push_dir_argv(host(), tmp_path / "ck", "runs/r1/checkpoints", root, kh) == [
        "rsync", "--protect-args", "--timeout=60", "--archive", "--no-links", "--no-devices", "--no-specials",
        "--mkpath", "--ignore-existing", "-e", shlex.join(ssh_argv(host(), kh)), f"{tmp_path / 'ck'}/", "10.0.0.2:meshrun/runs/r1/checkpoints/"]
    assert rsync_data_argv(v6, DataSpec(tmp_path / "data", "data/c10"), root, kh, checksum=True, files=["a"]) == [
        "rsync", "--protect-args", "--timeout=60", "--archive", "--copy-unsafe-links", "--mkpath", "--itemize-changes",
        "--partial-dir=.meshrun-partial", "--exclude",
        ".meshrun-hash-cache.json", "--checksum", "--files-from=-", "--from0", "-e", ssh, f"{tmp_path / 'data'}/",
        "[fd00::2]:/srv/mesh run $(x)/data/c10/"]
    staging = Staging(tmp_path / "in")
    assert fetch_argv(host("fe80::1%eth0"), "r1", staging, root, kh) == [
        "rsync", "--protect-args", "--timeout=60", "--recursive", "--times", "--no-links", "--no-devices",
        "--no-specials", "--chmod=D755,F644", "--partial-dir=.rsync-partial", f"--temp-dir={tmp_path / 'in/tmp'}",
        "--info=progress2", "--no-inc-recursive", "-e", shlex.join(ssh_argv(host("fe80::1%eth0"), kh)),
        "[fe80::1%eth0]:meshrun/runs/r1/",
        f"{tmp_path / 'in/tree'}/"]
    assert [remote_spec(a, "p") for a in ("gpu2", "10.0.0.2", "::1", "[::1]", "2001:db8::7")] == \
        ["gpu2:p", "10.0.0.2:p", "[::1]:p", "[::1]:p", "[2001:db8::7]:p"]


def test_local_hosts_get_the_same_flags(tmp_path: Path) -> None:
    local = host("local", str(tmp_path / "wd"))
    argv = fetch_argv(local, "r1", Staging(tmp_path / "in"), tmp_path, None)
    assert argv[:13] == ["rsync", "--protect-args", "--timeout=60", "--recursive", "--times", "--no-links",
                         "--no-devices", "--no-specials", "--chmod=D755,F644", "--partial-dir=.rsync-partial",
                         f"--temp-dir={tmp_path / 'in/tmp'}", "--info=progress2", "--no-inc-recursive"]
    assert argv[13:] == [f"{tmp_path / 'wd/runs/r1'}/", f"{tmp_path / 'in/tree'}/"]


FAKE_SSH = """#!/bin/sh
# Records the words rsync gives its remote shell, then fails like an unreachable host.
printf '%s\\n' "$@" > "$(dirname "$0")/words"
exit 255
"""


@pytest.mark.parametrize("address", ["fd00::2", "fe80::1%eth0"])
def test_real_rsync_reaches_a_bracketed_ipv6_host_with_no_path_on_its_command_line(tmp_path: Path,
                                                                                    address: str) -> None:
    """The real rsync parses the argv; ssh is a recording stand-in (no IPv6 sshd here). Unbracketed,
    rsync would ssh to `fd00` and start `rsync --daemon` there."""
    fake = tmp_path / "ssh"
    fake.write_text(FAKE_SSH)
    fake.chmod(stat.S_IRWXU)
    argv = fetch_argv(host(address, "/srv/x $(y)"), "r1", Staging(tmp_path / "in"), tmp_path, None)
    argv[argv.index("-e") + 1] = str(fake)
    (tmp_path / "in/tmp").mkdir(parents=True)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    words = (tmp_path / "words").read_text().splitlines()
    assert words[0] == address and words[1:3] == ["rsync", "--server"]
    assert "--daemon" not in words and not [w for w in words if "/srv" in w or "r1" in w]


def test_a_manifest_is_parsed_in_one_pass_over_one_set_of_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """A security review: the set of accepted names was rebuilt for every line, so a hostile host's
    1 MiB manifest (5 900 good lines, then 524 000 empty ones) cost minutes of controller CPU at every
    fetch, resume and run end. Now one set grows as lines are accepted: every line is checked
    against the same set object (no timing asserted here; the complexity is the property), and a
    name given twice is still refused."""
    from meshrun.deploy.run import manifest

    sets: set[int] = set()
    real = manifest._refusal

    def spy(line: bytes, seen: set[str]) -> str:
        sets.add(id(seen))
        return real(line, seen)

    monkeypatch.setattr(manifest, "_refusal", spy)
    digest = "ab" * 32
    lines = [f"{digest}  ckpt-step{n:09d}.pt" for n in range(50)] + [f"{digest}  ckpt-step000000007.pt", ""] * 3
    parsed = manifest.parse_manifest("\n".join(lines).encode())  # it ends with the last empty line's newline
    assert len(sets) == 1
    assert len(parsed.entries) == 50
    assert [(r.number, r.why) for r in parsed.refused] == [(51, "lists a file a second time"),
                                                            (52, "not a '<sha256>  <file name>' line"),
                                                            (53, "lists a file a second time"),
                                                            (54, "not a '<sha256>  <file name>' line"),
                                                            (55, "lists a file a second time")]


def test_the_code_sync_keeps_a_cut_file_to_resume_from(tmp_path: Path) -> None:
    """A large file of the code (a pretrained.pt not ignored) cut by the sync's deadline over a slow link
    started from byte 0 on every sync; the code sync's rsync now keeps what arrived, as the data sync's does.
    Its list comes from `/` (`sent_list`), its prune after it (PRUNE_SH)."""
    argv = rsync_argv(host(), tmp_path / "proj", None, recorded=True)
    assert argv[:11] == ["rsync", "--protect-args", "--timeout=60", "--archive", "--compress", "--mkpath",
                         "--files-from=-", "--from0", "--info=progress2", "--no-inc-recursive",
                         "--partial-dir=.meshrun-partial"]
    assert argv[-2:] == ["/", "10.0.0.2:meshrun/"]
    assert "--partial-dir=.meshrun-partial" not in rsync_argv(host(), tmp_path / "proj", None)  # other pushes
