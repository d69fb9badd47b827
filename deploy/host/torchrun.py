"""torchrun as meshrun starts it: `torch.distributed.run`, with the rendezvous state read as data.

    python -m meshrun.deploy.host.torchrun [--meshrun-rdzv-host NAME] TORCHRUN_ARGS...

Why: torch's c10d rendezvous keeps its state (who is in, the ranks, everyone's heartbeats) under
`torch.rendezvous.<rdzv-id>` in the rendezvous host's TCPStore, as a pickle, and every agent reads
it back with `pickle.loads` on each poll and keep-alive
(`dynamic_rendezvous._BackendRendezvousStateHolder.sync`). The store has no authentication and
every member reaches it, so one compromised member could write a pickle there and run code in
every other host's torchrun, which holds that host's secrets.

What changes: before `torch.distributed.run.main` runs, the rendezvous module's `pickle` is
replaced by `StateCodec`, which writes the state as JSON and reads it back as JSON only, checked
field by field (types, sizes, UTC times) and built into torch's own `_RendezvousState` and
`_NodeDesc`. Nothing read from the store reaches an unpickler. A whitelisting unpickler would not
do: a state made of nothing but nested tuples (no class at all) crashes the reader when it hashes
them (a segfault at about 100 000 levels, measured with python 3.11). Every torchrun of a meshrun
run is started through this module (deploy/run/plan.py), so all of them speak the same format.

A state that does not read (a pickle, another format, a wrong field) is refused: torch raises
its `RendezvousStateError`, torchrun stops its workers, and this module keeps the store up for
`REFUSAL_LINGER_S` (so every member refuses the same state rather than finding the store gone),
then ends with one line naming the rendezvous host and `STATE_REFUSED_EXIT`, which tells the agent
not to move the run to the next rendezvous host (deploy/host/agent.py) and the controller not to
record a succession. Everything else torchrun does is untouched.

Also: torchrun's `--tee` (how each rank's lines reach the agent with their `[host:rank]` prefix)
reads every rank's log file in a thread of its own that looks for new lines every 0.1 s, two threads
a rank (stdout, stderr). Idle, that polling costs a host about 2.5 ms of CPU a second (measured: a
torchrun with a sleeping worker, 0.1 s against 0.5 s), as much as the rest of torchrun's watching;
with many hosts on one machine (the test bed) or many ranks on one host, it adds up. `slow_tails`
makes it every `TAIL_EVERY_S`: a line reaches `fab logs` at most that much later. And torch's tail
writes the unfinished end of a rank's output with a prefix of its own (every tqdm bar came out as
`[gpu1:0]  25%|##  | 25/100[gpu1:0] `): `whole_line_tails` puts deploy/host/linetail.py's in its place,
which writes whole lines only (where this file runs alone, without meshrun, torch's stays).

Also: when this host's workers have succeeded, torchrun waits in its exit barrier until every
other host's have ended. torch gives up after 300 s (its default, not an option of torchrun), logs
it and exits 0 as if every peer had arrived: a peer whose rank 0 still evaluates or saves then
looked finished, and the controller, taking the first status 0 for the end of training, stopped it
30 s later (docs/elastic.md). `mark_exit_barrier` raises that timeout to `EXIT_TIMEOUT_ENV`'s
seconds (24 h, set by an attached run's agent), so status 0 means every peer arrived (or a peer was
reported gone: the agent then ends torchrun there, deploy/host/exitbarrier.py, as the mark file
named by `EXIT_MARK_ENV` tells it the barrier started): the long wait lasts only while a peer still
works (or hangs, in sight of `fab status` and `fab stop`). Workers inherit neither variable.

Also: torch starts each worker in a session of its own, so a torchrun killed outright (SIGKILL by
hand, the OOM killer) leaves its workers running, holding their GPUs, with nobody to stop them.
`workers_die_with_torchrun` gives each worker a parent-death signal (SIGKILL) before it execs: a
torchrun gone however it went takes its workers with it. A torchrun that ends normally has
stopped them already. And should torch's own shutdown hang once the process that started it is
gone (the agent killed: the kernel's TERM, the agent's parent-death signal, starts that shutdown),
`end_when_orphaned` ends torchrun `ORPHAN_GRACE_S` later, its workers with it.

Also: torch's rendezvous names every event it could record with `inspect.stack()`, even when
nobody records events, on every pass of its state loop (~1.4 ms of CPU a pass beside torch's
modules), and the members of an N-node rendezvous contend for the store's one state, so the
passes grow with N. `quick_event_names` names them from the frame: 32 torchruns in one rendezvous
on one machine used 26 % less CPU (bench/rdzv_names.py); a 32-host rendezvous on the test bed,
whose main threads py-spy found in `inspect.stack`, had timed out after 600 s.

Standard library and torch only, and self-contained: `fab check-network` ships this file to hosts
that may not have meshrun yet (deploy/edges/check_probes.py), so `HOST_FLAG`,
`STATE_REFUSED_EXIT` and `EXIT_MARK_ENV` are copies of common/layout.py's names (tests/test_rdzv_state.py holds them equal).
Only `whole_line_tails` looks for meshrun (its own module), and goes without where there is none.
"""

from __future__ import annotations

import ctypes
import dataclasses
import inspect
import json
import os
import pickle
import signal
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable

HOST_FLAG = "--meshrun-rdzv-host"  # this module's own option, first on its argv; the rest is torchrun's
STATE_REFUSED_EXIT = 65  # sysexits' EX_DATAERR: the store held a state nobody of this run wrote
EXIT_MARK_ENV = "MESHRUN_EXIT_BARRIER_MARK"  # the file to create when this host's workers succeeded
EXIT_TIMEOUT_ENV = "MESHRUN_EXIT_BARRIER_TIMEOUT_S"  # that barrier's bound; absent (a detached run): torch's
EXIT_BARRIER_TIMEOUT_ATTR = "_exit_barrier_timeout"  # what torch's `_exit_barrier` reads (torch 1.9 to 2.14)
REFUSAL_LINGER_S = 5.0  # members read the state every second or two (torch's cache, keep-alives every 2 s)
TAIL_EVERY_S = 0.5  # torch's --tee reads the ranks' log files every 0.1 s; a human reading logs needs no less
PR_SET_PDEATHSIG = 1  # prctl(2)
ORPHAN_GRACE_S = 45.0  # torch's shutdown after a TERM waits up to 30 s for the workers, then kills them
MAX_STATE_BYTES = 1 << 20  # a node takes about 200 bytes of state: thousands of nodes fit
MAX_ADDR_CHARS = 1024
MAX_NUMBER = 1 << 63
NODE_FIELDS = ("addr", "pid", "local_id")
# How each field of torch's `_RendezvousState` travels; a torch whose state has another field is
# refused at start (see `StateCodec.__init__`), never guessed at.
FIELD_KINDS = {"round": "count", "complete": "flag", "deadline": "moment", "closed": "flag",
               "participants": "ranks", "wait_list": "nodes", "redundancy_list": "nodes",
               "last_heartbeats": "beats"}


class StateRefused(Exception):
    """The bytes under the rendezvous key are not a state this codec wrote."""


class StateCodec:
    """Stands in for the `pickle` module inside torch's `dynamic_rendezvous` (which uses only its
    `dumps`, `loads` and `PickleError`)."""

    PickleError = StateRefused  # torch turns it into RendezvousStateError

    def __init__(self, rendezvous: Any) -> None:
        self._state_class, self._node_class = rendezvous._RendezvousState, rendezvous._NodeDesc
        self.fields = tuple(vars(self._state_class()))
        unknown = sorted(set(self.fields) - set(FIELD_KINDS))
        node_fields = tuple(f.name for f in dataclasses.fields(self._node_class))
        if unknown or node_fields != NODE_FIELDS:
            raise StateRefused(f"this torch's rendezvous state has fields meshrun does not know "
                               f"({', '.join(unknown) or 'node: ' + ', '.join(node_fields)})")
        self._kinds: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
            "count": (lambda v: v, _count), "flag": (lambda v: v, _flag),
            "moment": (lambda v: None if v is None else v.isoformat(), lambda v: None if v is None else _moment(v)),
            "ranks": (lambda v: [[_node_json(n), r] for n, r in v.items()], lambda v: self._pairs(v, _count)),
            "nodes": (lambda v: [_node_json(n) for n in sorted(v)], lambda v: set(self._nodes(v))),
            "beats": (lambda v: [[_node_json(n), t.isoformat()] for n, t in v.items()],
                      lambda v: self._pairs(v, _moment)),
        }

    def dumps(self, state: Any) -> bytes:
        data = {name: self._kinds[FIELD_KINDS[name]][0](getattr(state, name)) for name in self.fields}
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    def loads(self, bits: bytes) -> Any:
        if not isinstance(bits, bytes) or len(bits) > MAX_STATE_BYTES:
            raise StateRefused("not JSON of at most 1 MiB")
        try:
            data = json.loads(bits)
        except (ValueError, RecursionError):  # UnicodeDecodeError and int digit limits are ValueErrors
            raise StateRefused("not JSON") from None
        if not isinstance(data, dict) or sorted(data) != sorted(self.fields):
            raise StateRefused("not the fields of this torch's rendezvous state")
        state = self._state_class()
        for name in self.fields:
            try:
                setattr(state, name, self._kinds[FIELD_KINDS[name]][1](data[name]))
            except (TypeError, ValueError, OverflowError) as err:
                raise StateRefused(f"field {name!r}: {err}") from None
        return state

    def _node(self, item: Any) -> Any:
        if type(item) is not list or len(item) != 3 or type(item[0]) is not str or len(item[0]) > MAX_ADDR_CHARS:
            raise TypeError("a node is not [address, pid, local id]")
        return self._node_class(item[0], _count(item[1]), _count(item[2]))

    def _nodes(self, items: Any) -> list[Any]:
        if type(items) is not list:
            raise TypeError("not a list")
        return [self._node(item) for item in items]

    def _pairs(self, items: Any, value: Callable[[Any], Any]) -> dict[Any, Any]:
        if type(items) is not list or not all(type(i) is list and len(i) == 2 for i in items):
            raise TypeError("not a list of [node, value] pairs")
        pairs = {self._node(node): value(v) for node, v in items}
        if len(pairs) != len(items):
            raise ValueError("a node is listed twice")
        return pairs


def _node_json(node: Any) -> list[Any]:
    return [node.addr, node.pid, node.local_id]


def _count(value: Any) -> int:
    if type(value) is not int or not 0 <= value < MAX_NUMBER:
        raise TypeError("not a whole number")
    return value


def _flag(value: Any) -> bool:
    if type(value) is not bool:
        raise TypeError("not true or false")
    return value


def _moment(value: Any) -> datetime:
    if type(value) is not str or len(value) > 64:
        raise TypeError("not a time")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("not an ISO time") from None
    if moment.utcoffset() is None:
        raise ValueError("a time without its zone")
    return moment.astimezone(timezone.utc)


def install(rendezvous: Any) -> StateCodec:
    """Put the codec in place of `pickle` in torch's `dynamic_rendezvous` module."""
    current = getattr(rendezvous, "pickle", None)
    if isinstance(current, StateCodec):
        return current
    if current is not pickle:  # a torch that reads its state some other way: refuse to guess
        raise StateRefused("this torch's rendezvous does not read its state with pickle")
    codec = StateCodec(rendezvous)
    rendezvous.pickle = codec
    return codec


def slow_tails(api: Any) -> bool:
    """torchrun's `--tee` tails (`TailLog`, built by torch's multiprocessing `api` module with the
    default interval) look for new lines every `TAIL_EVERY_S`. A torch whose TailLog has no
    `interval_sec` is left as it is (False)."""
    shipped = api.TailLog
    if getattr(shipped, "meshrun_tail", False):
        return True
    names = list(inspect.signature(shipped.__init__).parameters)[1:]  # after self
    if "interval_sec" not in names:
        return False
    position = names.index("interval_sec")

    class Tail(shipped):  # type: ignore[misc, valid-type]
        meshrun_tail = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if len(args) <= position:  # torch's own call gives no interval: ours
                kwargs.setdefault("interval_sec", TAIL_EVERY_S)
            super().__init__(*args, **kwargs)

    api.TailLog = Tail
    return True


def whole_line_tails(tail_log: Any) -> bool:
    """torch's `--tee` tail replaced by one that writes each line once, with one prefix (why and how:
    deploy/host/linetail.py). False: this file alone (`fab check-network` ships it to hosts that may
    have no meshrun yet), or a torch whose tail takes other arguments: torch's tail, as it is."""
    try:
        from meshrun.deploy.host import linetail
    except ImportError:
        return False
    return linetail.install(tail_log)


def mark_exit_barrier(server_api: Any, path: str, timeout_s: float | None = None) -> bool:
    """Create `path` when torch's elastic agent enters its exit barrier (its workers succeeded; it
    waits for the other hosts), and give that barrier `timeout_s` (None: torch's 300 s). A torch
    without `SimpleElasticAgent._exit_barrier` is left as it is (False): its hosts wait out the
    barrier as before; one whose agent keeps no `EXIT_BARRIER_TIMEOUT_ATTR` keeps its own timeout."""
    agent_class = getattr(server_api, "SimpleElasticAgent", None)
    shipped = getattr(agent_class, "_exit_barrier", None)
    if shipped is None:
        return False
    if getattr(shipped, "meshrun_mark", False):
        return True

    def exit_barrier(self: Any) -> Any:
        try:
            with open(path, "ab"):
                pass
        except OSError:
            pass  # no mark: this host waits out the barrier, as torch does
        if timeout_s is not None and hasattr(self, EXIT_BARRIER_TIMEOUT_ATTR):  # torch's barrier reads it
            setattr(self, EXIT_BARRIER_TIMEOUT_ATTR, timeout_s)
        return shipped(self)

    exit_barrier.meshrun_mark = True  # type: ignore[attr-defined]
    agent_class._exit_barrier = exit_barrier  # type: ignore[union-attr]
    return True


def workers_die_with_torchrun(handler_module: Any) -> bool:
    """Every worker that torch's `SubprocessHandler` starts (through its module's `Popen`) gets
    SIGKILL from the kernel when this torchrun dies. The signal follows the thread that forked the
    worker: torch starts workers on its main thread, which lives as long as torchrun. False: a
    torch that starts its workers some other way, left as it is."""
    shipped = getattr(handler_module, "Popen", None)
    if shipped is None:
        return False
    if getattr(shipped, "meshrun_lifeline", False):
        return True
    torchrun = os.getpid()
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here: a threaded parent's child imports nothing before exec

    def in_child() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != torchrun:  # torchrun died before the prctl took effect
            os._exit(1)

    def popen(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("preexec_fn") is None:
            kwargs["preexec_fn"] = in_child
        return shipped(*args, **kwargs)

    popen.meshrun_lifeline = True  # type: ignore[attr-defined]
    handler_module.Popen = popen
    return True


def quick_event_names(rendezvous: Any) -> bool:
    """torch's `dynamic_rendezvous.get_method_name` (two `inspect.stack()` walks, why: the module
    docstring) replaced by the same name read from the frame. False: a torch without it, left as
    it is."""
    shipped = getattr(rendezvous, "get_method_name", None)
    if shipped is None:
        return False
    if getattr(shipped, "meshrun_quick", False):
        return True

    def get_method_name(depth: int = 2) -> str:
        try:  # frame 0 is this function's, as inspect.stack()[0] is torch's
            return sys._getframe(depth).f_code.co_name
        except ValueError:  # the stack is not that deep
            return "no_method_name"

    get_method_name.meshrun_quick = True  # type: ignore[attr-defined]
    rendezvous.get_method_name = get_method_name
    return True


def end_when_orphaned(grace_s: float = ORPHAN_GRACE_S, every_s: float = 1.0) -> threading.Thread:
    """A daemon thread: once the process that started this one is gone, wait `grace_s` for torch's
    own shutdown, then SIGKILL this process (it cannot be caught: a hung shutdown ends too)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        time.sleep(grace_s)
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="meshrun-orphan-watch", daemon=True)
    thread.start()
    return thread


def refusal(exc: BaseException | None) -> StateRefused | None:
    """The StateRefused behind what torchrun raised (torch wraps it in RendezvousStateError)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, StateRefused):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _endpoint(argv: list[str]) -> str:
    for i, arg in enumerate(argv):
        if arg in ("--rdzv-endpoint", "--rdzv_endpoint") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(("--rdzv-endpoint=", "--rdzv_endpoint=")):
            return arg.split("=", 1)[1]
    return "local"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    end_when_orphaned()
    head = "this host"
    if args[:1] == [HOST_FLAG] and len(args) > 1:
        head, args = f"host {args[1]!r}", args[2:]
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing import api, tail_log
    from torch.distributed.elastic.agent.server import api as server_api
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    slow_tails(api)
    whole_line_tails(tail_log)
    workers_die_with_torchrun(subprocess_handler)
    mark, bound = os.environ.pop(EXIT_MARK_ENV, ""), os.environ.pop(EXIT_TIMEOUT_ENV, "")  # workers inherit the rest
    if mark:
        mark_exit_barrier(server_api, mark, float(bound) if bound.isdigit() else None)

    quick_event_names(dynamic_rendezvous)
    try:
        install(dynamic_rendezvous)
    except StateRefused as err:
        print(f"meshrun: refusing to start torchrun: {err}", file=sys.stderr, flush=True)
        return 1
    try:
        run.main(args)
    except Exception as exc:
        refused = refusal(exc)
        if refused is None:
            raise
        # The rendezvous host's store lives in this process (held by the traceback): kept up a while,
        # every member reads the same state and refuses it, rather than finding the store gone, which
        # would look like a lost rendezvous host and move the run to the next one.
        time.sleep(REFUSAL_LINGER_S)
        print(f"meshrun: the rendezvous store on {head} ({_endpoint(args)}) holds a rendezvous state that no "
              f"torchrun of this run wrote ({refused}): refused; a member of the run may be compromised",
              file=sys.stderr, flush=True)
        return STATE_REFUSED_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
