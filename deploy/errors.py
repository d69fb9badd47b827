"""The one domain error. Raised anywhere, caught once in `deploy.cli`, shown as one line. And the
interrupt a SIGTERM or SIGHUP becomes there, with the exit status every signal that ends a command gives."""

from __future__ import annotations

import signal


class MeshrunError(Exception):
    """A failure the user can act on. `str(err)` is the whole message, one line.

    exit_code 2 means bad input (inventory, flags); 1 means the job or a host failed.
    """

    exit_code: int = 1

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InputError(MeshrunError):
    """Bad input: a malformed inventory, an unknown host, a wrong flag. Exit status 2."""

    exit_code = 2


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP taken as a Ctrl-C (deploy/cli.py): the same path, and this signal's exit status."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def interrupted_status(signum: int) -> int:
    """The exit status of a command a SIGTERM or SIGHUP ended, whichever part of meshrun caught it,
    or a Ctrl-C that reached `deploy/cli.guarded`: the shell's 128 + its number (143, 129, 130)."""
    return 128 + signum


def interrupted_by(signum: int) -> str:
    """How the line a signal ended a command with names it."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
