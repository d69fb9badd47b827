"""The one place that turns errors into what users read: a line, an exit status, no traceback.

Every fab task is wrapped by `guarded`. A MeshrunError prints its one-line message and exits
with its status (2 bad input, 1 failure); anything else is a bug: with MESHRUN_DEBUG=1 or
`--debug` the traceback is shown, otherwise it goes to `runs/meshrun-debug.log`.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Callable, TypeVar

from invoke.exceptions import Exit

from meshrun.deploy.errors import MeshrunError

F = TypeVar("F", bound=Callable[..., object])
DEBUG_LOG = Path("runs/meshrun-debug.log")


def guarded(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> object:
        from meshrun.deploy.render.console import Renderer

        _paramiko_to_debug_log()
        try:
            return fn(*args, **kwargs)
        except MeshrunError as err:
            Renderer().error(str(err))
            raise Exit(code=err.exit_code) from None
        except Exit:
            raise
        except KeyboardInterrupt:
            Renderer().error("interrupted")
            raise Exit(code=130) from None
        except Exception as err:  # noqa: BLE001 - the single top-level handler
            if kwargs.get("debug") or os.environ.get("MESHRUN_DEBUG"):
                raise
            DEBUG_LOG.parent.mkdir(parents=True, exist_ok=True)
            with open(DEBUG_LOG, "a", encoding="utf-8") as log:
                traceback.print_exc(file=log)
            Renderer().error(f"internal error: {err.__class__.__name__}: {err}; traceback in {DEBUG_LOG} "
                             "(rerun with --debug to see it here)")
            raise Exit(code=1) from None

    return wrapper  # type: ignore[return-value]


def _paramiko_to_debug_log() -> None:
    """paramiko's transport thread logs a failed handshake (a garbage banner from a host, say)
    with a traceback; with no handler, Python prints that on stderr, a second raw report beside
    our one line, quoting what the host sent. Its log goes to the debug log instead."""
    logger = logging.getLogger("paramiko")
    if not logger.handlers:
        DEBUG_LOG.parent.mkdir(parents=True, exist_ok=True)
        logger.addHandler(logging.FileHandler(DEBUG_LOG, delay=True, encoding="utf-8"))
        logger.propagate = False


def remainder() -> tuple[str, ...]:
    """The arguments after the first `--` on the fab command line, exactly as the shell split them."""
    argv = sys.argv
    return tuple(argv[argv.index("--") + 1:]) if "--" in argv else ()
