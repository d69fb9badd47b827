"""The one place that turns errors into what users read: a line, an exit status, no traceback.

Every fab task is wrapped by `guarded`. A MeshrunError prints its message as one line (a newline in
it, from a host's text, is shown as `\\n`) and exits with its status (2 bad input, 1 failure; a bad
input's line never passes 300 characters); anything else is a bug: with MESHRUN_DEBUG=1 or `--debug`
the traceback is shown, otherwise it goes to `~/.cache/meshrun/debug.log` (a per-user file: the
error may come before meshrun knows the project, and must not land in the current folder).

SIGTERM (`timeout`, systemd, `kill`) and SIGHUP (a closed terminal, a dropped SSH session, a killed
tmux) are taken as a Ctrl-C: their default action ended the process where it stood, and no cleanup
ran (a `--firewall` run's chain stayed up on every host). A command a signal ended exits 128 + its
number (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP: `deploy/errors.interrupted_status`).

Every task also starts with the soft limit on open files raised (`raise_open_files_limit`): a fan-out
over many hosts needs more than macOS gives by default.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Callable, NoReturn, TypeVar

from invoke.exceptions import Exit

from meshrun.deploy.errors import InputError, MeshrunError, interrupted_by, interrupted_status
from meshrun.deploy.stopsignals import StopSignals
from meshrun.deploy.inventory.shown import one_line

F = TypeVar("F", bound=Callable[..., object])
# A fan-out holds per host an SSH socket, its log file and, while it syncs, rsync's 2 to 3 pipes: about
# 60 hosts reach macOS's default soft limit of 256 open files (Linux's is 1024). Each task asks for this.
OPEN_FILES_WANTED = 4096


def debug_log() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "meshrun" / "debug.log"


def guarded(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> object:
        from meshrun.deploy.render.console import repeat_in_hints

        _paramiko_to_debug_log()
        raise_open_files_limit()
        repeat_in_hints(kwargs)  # `fab setup --hosts gpu2` from a run with --inventory lab.yaml says so
        signals = StopSignals()
        try:
            result = _one_line_errors(fn, args, kwargs)
        except KeyboardInterrupt as err:
            _interrupted(signals.caught or getattr(err, "signum", signal.SIGINT))
        except Exit:
            if signals.caught is None:
                raise
            _interrupted(signals.caught)
        finally:
            signals.restore()
        # A SIGTERM or SIGHUP the command took as its Ctrl-C and ended by (`fab logs -f`, `status
        # --watch`; an attached run's launcher stops the run): its exit status, whatever path it took.
        if signals.caught is not None:
            _interrupted(signals.caught)
        return result

    return wrapper  # type: ignore[return-value]


def _one_line_errors(fn: Callable[..., object], args: tuple, kwargs: dict) -> object:
    from meshrun.deploy.render.console import Renderer

    try:
        return fn(*args, **kwargs)
    except MeshrunError as err:
        # One line, whatever formed the message: a host's text in it (its answer, a pre-flight finding about
        # it) must not start lines that read as meshrun's own. Bad input is also cut at 300 characters (the
        # inventory's own messages already fit: a long path loses its middle, deploy.inventory.shown.with_path);
        # a failure is not, its hosts' reasons all said. No MeshrunError is multi-line on purpose.
        Renderer().error(one_line(str(err)) if isinstance(err, InputError) else one_line(str(err), sys.maxsize))
        raise Exit(code=err.exit_code) from None
    except Exit:
        raise
    except Exception as err:  # noqa: BLE001 - the single top-level handler
        if kwargs.get("debug") or os.environ.get("MESHRUN_DEBUG"):
            raise
        Renderer().error(one_line(f"{internal_error(err)} (rerun with --debug to see it here)", sys.maxsize))
        raise Exit(code=1) from None


def internal_error(err: Exception) -> str:
    """A bug, in one line: `internal error: KeyError: 'gpu1'; traceback in <the debug log>`, its
    traceback appended there (the top-level handler's, and an attached run's answer to a join that
    hit one). A log that cannot be written is not named, and costs nothing else."""
    said = f"internal error: {err.__class__.__name__}: {err}"
    log_path = debug_log()
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a", encoding="utf-8") as log:
            traceback.print_exception(type(err), err, err.__traceback__, file=log)
    except OSError:
        return said
    return f"{said}; traceback in {log_path}"


def _interrupted(signum: int) -> NoReturn:
    from meshrun.deploy.render.console import Renderer

    Renderer().error("interrupted" if signum == signal.SIGINT else f"interrupted by {interrupted_by(signum)}")
    raise Exit(code=interrupted_status(signum)) from None


def raise_open_files_limit(wanted: int = OPEN_FILES_WANTED) -> None:
    """The soft limit on open files raised to `wanted`, or to the hard limit if that is lower; never
    lowered. Where it cannot be (no `resource` off Unix, a refusal), it stays: a local tool that then
    cannot start says "too many open files" (deploy/edges/rsyncrun.py)."""
    try:
        import resource
    except ImportError:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
    if soft == resource.RLIM_INFINITY or soft >= target:  # RLIM_INFINITY is -1 on Linux: never compared
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        pass


def _paramiko_to_debug_log() -> None:
    """paramiko's transport thread logs a failed handshake (a garbage banner from a host, say)
    with a traceback; with no handler, Python prints that on stderr, a second raw report beside
    our one line, quoting what the host sent. Its log goes to the debug log instead."""
    logger = logging.getLogger("paramiko")
    if not logger.handlers:
        log_path = debug_log()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        logger.addHandler(logging.FileHandler(log_path, delay=True, encoding="utf-8"))
        logger.propagate = False


def remainder() -> tuple[str, ...]:
    """The arguments after the first `--` on the fab command line, exactly as the shell split them."""
    argv = sys.argv
    return tuple(argv[argv.index("--") + 1:]) if "--" in argv else ()
