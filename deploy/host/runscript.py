"""Run a user's script the way `python SCRIPT ARGS...` does, then leave with `os._exit`.

    torchrun ... -m meshrun.deploy.host.runscript SCRIPT ARGS...     (how `fab train --script` starts each rank)
    python -m meshrun.deploy.host.runscript SCRIPT ARGS...

Why: with torch 2.14.1 and gloo, a process that has finished, `destroy_process_group()` included,
sometimes dies in interpreter finalization with "terminate called without an active exception"
(SIGABRT): gloo's C++ threads still hold tensors when static destructors run at exit (upstream
discussion: pytorch PR 179291). torchrun reports that rank as failed, and meshrun a finished run
as failed. `python -m meshrun.train` already avoids it by leaving with `os._exit` (train/__main__.py); this
runner gives user scripts the same protection without touching them.

Kept from `python SCRIPT`: `sys.argv == [SCRIPT, *ARGS]`; `sys.path[0]` is the script's directory
(symlinks resolved), so `import models` next to the script works and the current directory is not
importable; the script's module is `sys.modules["__main__"]` (`__name__ == "__main__"`, absolute
`__file__`, `__spec__` None) and stays so until exit, so classes it defines pickle, also from atexit
handlers, and multiprocessing's spawn (DataLoader workers) re-runs the script by path as
`__mp_main__`. `runpy.run_path` is not used: it swaps its own module back in as `__main__` when the
script returns, and leaves `__file__` relative. A source file only, not a directory or zip.
Left different: the runner's few frames count towards the recursion limit, and on the rank that
records the start (below) `json` is imported before the script runs.

Added: each start of the worker group is counted on its host, for summary.json's `restarts`. torchrun's
`TORCHELASTIC_RESTART_COUNT` skips the restarts a change of membership makes, and a script has no
collective to agree on a count the way the trainer does (train/starts.py), so the process with
LOCAL_RANK 0 adds one to `<run dir>/starts.json` under `<launch's rendezvous id>@<MESHRUN_HOST>` before the
script runs (hosts that share one workdir, an NFS home, share the file: each counts under its own key, read
back by that host's name); the controller takes the largest count the hosts answer (deploy/commands/trainend.py). Only
under meshrun's torchrun (MESHRUN_RUN_ID and TORCHELASTIC_RUN_ID set); a failure to record is
silent, and nothing is fsynced: the count must never stop or slow the script.

Added, under WORLD_SIZE > 1: a rank that never calls `torch.distributed.init_process_group` trained alone (a script
for `mp.spawn` and `--dist-url`/`--rank` run without them) yet reads as succeeded; deploy/host/alonewatch.py watches
for that call (and for child processes that may make it) and the runner ends such a rank with its line on stderr,
the status unchanged. Without meshrun (this file shipped alone as check-network's probe) there is no watch.

Exit status, as the interpreter gives it: 0 when the script returns or calls `sys.exit()`/`sys.exit(0)`;
`sys.exit(n)` gives n (mod 256); `sys.exit("msg")` prints msg on stderr and gives 1; an uncaught
exception (a SyntaxError in the script too) goes to `sys.excepthook` with the runner's frames cut
off, so the traceback reads as under `python SCRIPT`, and gives 1.

Signals: the runner installs no handler. A signal with its default action (torchrun stops workers
with SIGTERM) kills the process just as it would kill `python SCRIPT`, so torchrun sees the worker
killed by that signal. An uncaught KeyboardInterrupt (SIGINT under Python's default handler) prints
its traceback, ends like any other exit, then re-raises SIGINT with its default action, as CPython
does (bpo-1054041), so the caller sees a death by SIGINT; 130 if the signal is blocked.

The end, in CPython's order (pythonrun.c, then Py_FinalizeEx): stderr and stdout are flushed as the
script ends (before a traceback), non-daemon threads are joined (`threading._shutdown`),
atexit handlers run (they include `logging.shutdown` and `weakref.finalize` objects), logging is
shut down, Python files still open for writing are flushed, stdout and stderr are flushed (120 if
that fails, as CPython), then `os._exit(status)`. Skipped, which is the point: the rest of
finalization, that is clearing modules (so `__del__` of objects still referenced does not run)
and the C-level exit (`atexit(3)` handlers, C++ static destructors), where the abort happens.

Standard library only: it runs on the hosts.
"""

from __future__ import annotations

import atexit
import builtins
import gc
import io
import os
import re
import signal
import stat
import sys
import traceback
from dataclasses import dataclass
from importlib.machinery import SourceFileLoader
from types import CodeType, ModuleType, TracebackType
from typing import Mapping, NoReturn

try:  # absent where this file runs alone, without meshrun (check-network's probe): no watch there
    from meshrun.deploy.host import alonewatch
except ImportError:
    alonewatch = None  # type: ignore[assignment]

USAGE = "usage: python -m meshrun.deploy.host.runscript SCRIPT [ARG ...]"
FLUSH_FAILED_STATUS = 120  # CPython's status when flushing stdout/stderr fails at exit
SIGINT_STATUS = 128 + signal.SIGINT  # a shell's status for a death by SIGINT
# Text layers first: flushing one pushes its bytes into the buffered layer flushed after it.
WRITABLE_FILE_TYPES: tuple[tuple[type, ...], ...] = ((io.TextIOWrapper,), (io.BufferedWriter, io.BufferedRandom))
# Copies of meshrun.layout's (RUNS_DIR, STARTS_FILE, ENV_RUN_ID, ENV_HOST, is_run_id, launch_rdzv_id): this file
# also travels alone, to hosts that may have no meshrun (the check's all-reduce, deploy/edges/check_probes.py);
# tests/test_script_restarts.py holds them equal.
RUNS_DIR = "runs"
STARTS_FILE = "starts.json"
ENV_RUN_ID = "MESHRUN_RUN_ID"
ENV_HOST = "MESHRUN_HOST"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", re.ASCII)
STARTS_READ_MAX = 64 << 10  # a starts.json past this is damaged: counted afresh


@dataclass(frozen=True)
class Outcome:
    """How the script ended: its exit status, and whether to leave by SIGINT instead."""

    status: int
    interrupted: bool = False


def main(argv: list[str]) -> NoReturn:
    """Run `argv[0]` with arguments `argv[1:]` as `__main__`, then leave with its status."""
    if not argv:
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    record_start(os.environ)  # first: a script that cannot even be opened was still a start
    if alonewatch is not None and alonewatch.world(os.environ) > 1:  # never imports torch: wraps as the script does
        alonewatch.watch()
    path = _absolute(argv[0])
    try:
        with io.open_code(path) as file:  # what the interpreter itself opens scripts with
            source = file.read()
    except OSError as exc:
        print(f"{sys.executable}: can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}", file=sys.stderr)
        sys.exit(2)
    module = _install_main(path)
    sys.argv[:] = argv
    if not sys.flags.safe_path:  # `python -P`/PYTHONSAFEPATH: the interpreter prepends nothing, nor do we
        sys.path[0] = os.path.dirname(os.path.realpath(path))  # replaces the cwd `-m` put there
    _finish(_execute(source, path, module))


def record_start(environ: Mapping[str, str]) -> None:
    """Count this start of the worker group on this host (module docstring), if this process is its
    host's LOCAL_RANK 0 under meshrun's torchrun; any failure is swallowed: the script runs regardless."""
    try:
        _record_start(environ)
    except Exception:  # a full disk, a read-only workdir, a damaged file: the run must not pay for the count
        pass


def _record_start(environ: Mapping[str, str]) -> None:
    run_id, rdzv_id = environ.get(ENV_RUN_ID, ""), environ.get("TORCHELASTIC_RUN_ID", "")
    if environ.get("LOCAL_RANK") != "0" or not rdzv_id or not (_RUN_ID.fullmatch(run_id) and ".." not in run_id):
        return
    import json  # here, not at the top: only the recording rank imports it before the script

    directory = os.path.join(RUNS_DIR, run_id)  # the trainer's run dir: the agent starts torchrun in the workdir
    path = os.path.join(directory, STARTS_FILE)
    try:
        recorded = json.loads(_read_bounded(path))
    except (OSError, ValueError, RecursionError):  # none yet, or damaged: this launch counts from here
        recorded = {}
    if not isinstance(recorded, dict):
        recorded = {}
    # Every succession generation (`<id>-g<n>`) is the same launch; the host's name keeps a shared workdir's
    # hosts from adding to one count (summary.starts_key, which the controller reads back).
    key = f"{launch_rdzv_id(rdzv_id)}@{environ.get(ENV_HOST, '')}"
    before = recorded.get(key)
    recorded[key] = (before if isinstance(before, int) and not isinstance(before, bool) and before > 0 else 0) + 1
    os.makedirs(directory, exist_ok=True)
    _replace(path, json.dumps(recorded, sort_keys=True).encode())


def _read_bounded(path: str) -> bytes:
    """The file's bytes, at most STARTS_READ_MAX; never through a symlink, nor from a FIFO or device
    (which could block the start for ever)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = os.read(fd, STARTS_READ_MAX + 1)
    finally:
        os.close(fd)
    if len(data) > STARTS_READ_MAX:
        raise ValueError("too large")
    return data


def _replace(path: str, data: bytes) -> None:
    """Write `data` to a temp file beside `path` and rename it over `path`: readers see the old count or the
    new, never half. The temp's name is meshrun.fsutil's (`.tmp-<target>.<pid>.<8 hex>`)."""
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".tmp-{name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def launch_rdzv_id(rdzv_id: str) -> str:
    """The launch's own rendezvous id, from any succession generation's (meshrun.layout's, copied)."""
    base, sep, gen = rdzv_id.rpartition("-g")
    return base if sep and gen.isdigit() and gen.isascii() else rdzv_id


def _absolute(path: str) -> str:
    """The interpreter's absolute script path: joined to the cwd, not normalized (`/cwd/../x.py`)."""
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def _install_main(path: str) -> ModuleType:
    """A fresh `__main__` module for the script, with the attributes `python SCRIPT` gives it."""
    module = ModuleType("__main__")
    module.__file__ = path
    module.__cached__ = None
    module.__loader__ = SourceFileLoader("__main__", path)
    module.__builtins__ = builtins
    # __spec__ stays None, as for `python SCRIPT`: spawn-started children then re-run the file by path.
    sys.modules["__main__"] = module
    return module


def _execute(source: bytes, path: str, module: ModuleType) -> Outcome:
    """Compile and run the script; an exception ends it as it would end the interpreter."""
    try:
        # dont_inherit: this module's `from __future__` imports must not leak into the script.
        code: CodeType = compile(source, path, "exec", dont_inherit=True)
        exec(code, module.__dict__)
    except SystemExit as exc:
        _flush_io()
        return Outcome(_system_exit_status(exc.code))
    except BaseException as exc:  # the interpreter's own top-level boundary, reproduced
        _flush_io()
        _report(exc)
        return Outcome(1, interrupted=isinstance(exc, KeyboardInterrupt))
    _flush_io()
    return Outcome(0)


def _flush_io() -> None:
    """CPython flushes stderr then stdout as soon as the script ends, errors ignored: what the
    script printed precedes its traceback, and the atexit handlers' output, in a merged log."""
    for stream in (sys.stderr, sys.stdout):
        try:
            stream.flush()
        except Exception:  # the final flush reports failures; this one never does
            pass


def _system_exit_status(code: object) -> int:
    """CPython's rule for SystemExit.code; the mask is what the OS keeps of any int status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _report(exc: BaseException) -> None:
    """Hand the exception to sys.excepthook, as the interpreter does, without the runner's frames."""
    tb = _script_frames(exc.__traceback__)
    exc.with_traceback(tb)
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    try:
        sys.excepthook(type(exc), exc, tb)
    except BaseException as hook_error:  # a broken hook: CPython prints both and goes on
        print("Error in sys.excepthook:", file=sys.stderr)
        traceback.print_exception(hook_error)
        print("\nOriginal exception was:", file=sys.stderr)
        traceback.print_exception(type(exc), exc, tb)


def _script_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the script's first frame on (None for a SyntaxError at compile time)."""
    while tb is not None and tb.tb_frame.f_globals is globals():
        tb = tb.tb_next
    return tb


def _finish(outcome: Outcome) -> NoReturn:
    """What the interpreter does at exit, up to the point where the abort happens; then leave."""
    _join_threads()
    atexit._run_exitfuncs()
    logging = sys.modules.get("logging")
    if logging is not None:  # usually run by atexit already; a second call is harmless
        logging.shutdown()
    _flush_open_files()
    status = outcome.status if _flush_std() else FLUSH_FAILED_STATUS
    if alonewatch is not None and (alone := alonewatch.alone_line(os.environ, outcome == Outcome(0))) is not None:
        _say(alone + "\n")  # last, once the status is set
    if outcome.interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.raise_signal(signal.SIGINT)  # the calling thread, so it is delivered before this returns
        status = SIGINT_STATUS  # only reached when SIGINT is blocked
    os._exit(status)


def _join_threads() -> None:
    """Wait for non-daemon threads, as interpreter shutdown does (only if threading was imported)."""
    threading = sys.modules.get("threading")
    if threading is None:
        return
    try:
        threading._shutdown()
    except BaseException as exc:  # e.g. Ctrl-C while waiting: CPython reports it and goes on exiting
        _report_ignored(threading, traceback.format_exception(exc))


def _flush_open_files() -> None:
    """Flush Python files the script left open: finalization would have, when it closed them."""
    objects = gc.get_objects()
    for kinds in WRITABLE_FILE_TYPES:
        for obj in objects:
            if issubclass(type(obj), kinds):  # not isinstance: that reads __class__, which some objects warn on
                try:
                    if not obj.closed:
                        obj.flush()
                except Exception:  # detached, broken or odd: nothing to save, and the exit must go on
                    pass


def _flush_std() -> bool:
    """Flush sys.stdout and sys.stderr; False when one fails, as CPython counts it."""
    ok = True
    for stream in (sys.stdout, sys.stderr):
        if stream is None or getattr(stream, "closed", False) is True:  # CPython skips those silently
            continue
        try:
            stream.flush()
        except Exception as exc:  # any error, as CPython: e.g. the reader of a piped stdout has gone
            ok = False
            _report_ignored(stream, traceback.format_exception_only(exc))
    return ok


def _report_ignored(where: object, lines: list[str]) -> None:
    """An error at exit that cannot be raised, in CPython's words (sys.unraisablehook's format)."""
    _say(f"Exception ignored in: {where!r}\n" + "".join(lines))


def _say(text: str) -> None:
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except Exception:  # stderr is gone or broken itself
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
