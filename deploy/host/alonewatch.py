"""Whether a rank of a --script run set up distributed training at all, for deploy/host/runscript.py.

Under WORLD_SIZE > 1 a rank whose script never calls `torch.distributed.init_process_group` trains
alone (a script written for `mp.spawn` and `--dist-url`/`--rank`, run without those flags), and
reads as succeeded. `watch` wraps that function, and `mp.spawn`'s `start_processes`, as the script
imports torch (a post-import hook), or at once where torch came first (a `sitecustomize`), and notes
every child process the script starts other than a DataLoader's workers: ranks started with
`torch.multiprocessing.Process` or a `Pool` may join in the children, so they are not judged.
`alone_line` is then ALONE_LINE for a rank that exited 0 having done none of that: where torch was
imported and its function could not be wrapped, nothing is said (not knowing is not "alone").

Standard library and meshrun.layout only, and optional: the runner goes without it where it runs
alone, without meshrun (`fab check-network` ships runscript.py as a file).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Mapping

from meshrun.layout import ALONE_LINE

WATCHED = {"torch.distributed": "init_process_group", "torch.multiprocessing": "start_processes"}  # 2nd: mp.spawn's
CALLED: set[str] = set()  # the WATCHED functions the script called, and "a child process" it started
WRAPPED: set[str] = set()  # the WATCHED functions found and wrapped
DATALOADER_WORKER = ("torch.utils.data._utils.worker", "_worker_loop")  # a child that is no rank


def world(environ: Mapping[str, str]) -> int:
    size = environ.get("WORLD_SIZE", "")
    return int(size) if size.isdigit() and size.isascii() else 0


def watch() -> None:
    """Watch from here on: the import hook, what torch has already imported, the child processes."""
    sys.meta_path.insert(0, AfterImport())
    for package in WATCHED:
        if package in sys.modules:
            _wrap(package)
    _note_children()


def alone_line(environ: Mapping[str, str], succeeded: bool) -> str | None:
    """ALONE_LINE for a rank of a world > 1 that `succeeded` (exit status 0) without joining, else None: a
    failed rank's own error is what to read, and one that failed before it could init trained not at all."""
    name = WATCHED["torch.distributed"]
    unknown = "torch.distributed" in sys.modules and name not in WRAPPED
    if world(environ) <= 1 or not succeeded or CALLED or unknown:
        return None
    return ALONE_LINE.format(rank=environ.get("RANK", "?"), world=environ["WORLD_SIZE"])


class AfterImport:
    """A meta path finder that wraps a WATCHED function once its module has run: it asks the finders after it, then
    wraps that loader's exec_module for one call; module, spec and loader stay what the import system gives."""

    def find_spec(self, fullname: str, path: object, target: object = None) -> object:
        for finder in [f for f in sys.meta_path if f is not self] if fullname in WATCHED else ():
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                _wrap_after_exec(spec.loader, fullname)
                return spec
        return None


def _wrap_after_exec(loader: object, package: str) -> None:
    held, exec_module = getattr(loader, "__dict__", None), getattr(loader, "exec_module", None)
    if not isinstance(held, dict) or "exec_module" in held or exec_module is None:
        return  # no room for a wrapper of this loader's own: left unwatched

    def exec_then_wrap(module: ModuleType) -> None:
        try:
            exec_module(module)
        finally:
            held.pop("exec_module", None)  # the loader's own method again
        _wrap(package)

    held["exec_module"] = exec_then_wrap


def _wrap(package: str) -> None:
    """Wrap `WATCHED[package]` wherever a loaded torch module holds it: torch's own modules bind it by name as they
    import (device_mesh's init_device_mesh calls init_process_group so)."""
    try:
        import functools  # torch imported it already
        name = WATCHED[package]
        original = vars(sys.modules[package])[name]  # absent from a torch.distributed whose is_available() is False
        if getattr(original, "meshrun_watched", False):
            return

        def noted(*args: object, **kwargs: object) -> object:
            CALLED.add(name)
            return original(*args, **kwargs)

        functools.update_wrapper(noted, original)
        noted.meshrun_watched = True  # type: ignore[attr-defined]
        for module in [m for n, m in list(sys.modules.items()) if n.split(".")[0] == "torch"]:
            if getattr(module, "__dict__", {}).get(name) is original:
                setattr(module, name, noted)
        WRAPPED.add(name)
    except Exception:  # the script's import must never fail for the runner's sake: left unwatched
        pass


def _note_children() -> None:
    """Every process the script starts through multiprocessing (torch.multiprocessing's Process and Pool
    are its subclasses) is noted, a DataLoader's worker aside."""
    from multiprocessing import process

    start = process.BaseProcess.start
    if getattr(start, "meshrun_watched", False):
        return

    def noted_start(self: process.BaseProcess) -> None:
        target = getattr(self, "_target", None)
        if (getattr(target, "__module__", None), getattr(target, "__name__", None)) != DATALOADER_WORKER:
            CALLED.add("a child process")
        start(self)

    noted_start.meshrun_watched = True  # type: ignore[attr-defined]
    process.BaseProcess.start = noted_start  # type: ignore[method-assign]
