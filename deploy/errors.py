"""The one domain error. Raised anywhere, caught once in `deploy.cli`, shown as one line."""

from __future__ import annotations


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
