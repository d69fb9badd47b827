"""One call run beside the caller's own work: the code sync while the sessions open and the
pre-flight runs, the hosts' versions while the agents start (`fab train`). Over a 150 ms link each
remote step costs about half a second; steps that do not need each other's answer need not wait
for each other.

The call runs on a daemon thread: a host that never answers must not keep the controller alive,
and Ctrl-C ends the program without waiting for it (the processes it started are stopped by
deploy/edges/localproc.py's exit handler). Whatever it raises is raised again where its result is
taken, in the caller's thread, so the one place that prints errors prints it.
"""

from __future__ import annotations

import threading
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Beside(Generic[T]):
    """`Beside(fn, *args)` starts fn(*args); `result()` waits for it and returns or raises what it did."""

    def __init__(self, fn: Callable[..., T], *args: object) -> None:
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        name = getattr(fn, "__name__", "call")
        threading.Thread(target=self._run, args=(fn, args), daemon=True, name=f"beside-{name}").start()

    def _run(self, fn: Callable[..., T], args: tuple[object, ...]) -> None:
        try:
            self._value = fn(*args)
        except BaseException as err:  # raised again in the caller's thread by result()
            self._error = err
        finally:
            self._done.set()

    def result(self) -> T:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    @property
    def error(self) -> BaseException | None:
        """What the call raised, once it has ended (None: it returned, or runs on)."""
        return self._error if self._done.is_set() else None

    def settle(self) -> None:
        """Wait for the call to end, its outcome unused: the caller is already failing for
        another reason, and what this one started (a sync) should end whole, not be cut off."""
        self._done.wait()
