"""Whether a host's login shell lets meshrun's commands through, pure. sshd runs every command
through the user's login shell as one string (deploy/run/shell.py writes it for a POSIX shell):
- scripts that print on stdout (~/.bashrc under sshd, ~/.zshenv, a cluster's /etc/bashrc) put their
  text before every answer, which garbles the probes' answers and rsync's protocol alike;
- a shell that is not POSIX refuses the command or changes it: tcsh and csh refuse a newline inside
  quotes (every multi-line `python -c`), fish unescapes `\\` inside them.
Either is the one cause of whatever else fails on that host, so the check says it alone.
"""

from __future__ import annotations

import re

from meshrun.deploy.check.findings import Finding, fail

# What a shell that is not POSIX says to `cd … && exec python -c '<several lines>'`, the most telling
# first: tcsh runs bits of the probe before it gives up, so its stderr opens on their complaints.
NON_POSIX_SIGNS = (("tcsh/csh", re.compile(r"Unmatched '.'\.")), ("fish", re.compile(r"(^|: )fish: \S")),
                   ("tcsh/csh", re.compile(r"Badly placed \(|: Command not found\.$")))
NOISE_SHOWN = 60  # characters of the login scripts' text quoted in the finding


def non_posix_shell(text: str) -> str | None:
    """The shell whose complaint `text` (a line of a command's stderr) is, when it is not POSIX."""
    return next((shell for shell, sign in NON_POSIX_SIGNS if sign.search(text)), None)


def non_posix_line(stderr: str) -> str | None:
    """The line of `stderr` that best shows a login shell that is not POSIX (fish's last line is a
    caret, tcsh's first the complaint of a piece it ran), else None."""
    lines = [line.strip() for line in stderr.splitlines()]
    return next((line for _, sign in NON_POSIX_SIGNS for line in lines if sign.search(line)), None)


def login_noise(stdout: str) -> str | None:
    """What a command that prints nothing (`true`) printed: the login scripts' text, its first
    NOISE_SHOWN printable characters with each run of blanks as one space; None when there was none."""
    text = " ".join("".join(c if c.isprintable() else " " for c in stdout).split())
    return text[:NOISE_SHOWN] if text else None


def shell_findings(host: str, login: str | None, noise: str | None, python_error: str | None) -> list[Finding]:
    """A FAIL when the login shell of `login` (user@host) prints `noise` on stdout or is not POSIX
    (`python_error`, why the facts probe's python did not run, shows it); else nothing."""
    who = login or host
    if noise is not None:
        return [fail(host, f"the login scripts of {who} print to stdout ({noise!r}) before every command's output: "
                           "rsync and meshrun need a quiet non-interactive shell; put `[[ $- == *i* ]] || return` "
                           "in ~/.bashrc before anything that prints (likewise in ~/.zshenv for zsh), or send that "
                           "text to stderr")]
    shell = non_posix_shell(python_error or "")
    if shell is None:
        return []
    user = who.split("@")[0]
    return [fail(host, f"the login shell of {who} is not POSIX (it answers as {shell} does: {python_error}); meshrun "
                       f"runs every command through it and needs sh, bash or zsh: `chsh -s /bin/bash {user}` there")]
