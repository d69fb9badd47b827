"""Ingress delay (and optional random loss) for one simulated host: an NFQUEUE verdict loop.

The lab kernel has no netem (NOTES.md §5), so latency is added in user space:
iptables sends the host's incoming packets to NFQUEUE and this program gives
each one its verdict (accept) a fixed time after it arrived. tests/testbed/latency.py
starts one per host, inside the host's namespace, as a script (stdlib and
`netfilterqueue` only: it must not import the test bed package):

    python delayer.py --queue 1:20 --queue 2:40 [--loss 0.01] [--seed 7] [--max-seconds 3600]

* ``--queue NUM:MS`` binds NFQUEUE NUM; every packet in it is released MS ms
  after it was read. A queue has one constant delay, so release order is arrival
  order (FIFO): TCP sees latency, never reordering.
* ``--loss P`` drops each packet (all queues) with probability P, on arrival.
* One thread: poll() on the queues' netlink sockets with a timeout up to the next
  due packet, then read everything waiting and release everything due. No
  locks, no thread switches per packet (the GIL makes those the main cost).
* Payloads are not copied to user space (COPY_META): a verdict needs only the id.
* Bounded: exits after ``--max-seconds``. On exit (that, SIGTERM or SIGINT) every
  held packet is accepted first, so stopping the delayer loses nothing; later
  packets pass undelayed (the rules use ``--queue-bypass``) until the rules go.
* Runs at nice -10, so that the machine's load does not add latency.
* Prints ``ready`` once every queue is bound, and counts at exit.
"""

from __future__ import annotations

import argparse
import os
import random
import select
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
# Packets held in the kernel awaiting our verdict count against the queue's
# length: at 50 Mbit/s and 75 ms that is ~300 packets; far more at LAN rates.
KERNEL_QUEUE_LEN = 65536
NICE = -10


@dataclass(frozen=True)
class QueueSpec:
    number: int
    delay_s: float


def parse_queue(text: str) -> QueueSpec:
    """'1:20' -> QueueSpec(1, 0.02): NFQUEUE number, delay in milliseconds."""
    number, sep, ms = text.partition(":")
    if not sep or not number.isdigit():
        raise argparse.ArgumentTypeError(f"expected NUM:MS, got {text!r}")
    delay_ms = float(ms)
    if not 0 <= delay_ms <= 10_000:
        raise argparse.ArgumentTypeError(f"delay must be 0..10000 ms, got {text!r}")
    return QueueSpec(int(number), delay_ms / 1000)


class DelayLine(Generic[T]):
    """FIFO of items, each due `delay_s` after it was pushed."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self._items: deque[tuple[float, T]] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def push(self, item: T, now: float) -> None:
        self._items.append((now + self.delay_s, item))

    def next_due(self) -> float | None:
        return self._items[0][0] if self._items else None

    def pop_due(self, now: float) -> list[T]:
        """Items due at `now`, oldest first (constant delay: due times only grow)."""
        due = []
        while self._items and self._items[0][0] <= now:
            due.append(self._items.popleft()[1])
        return due

    def drain(self) -> list[T]:
        items = [item for _, item in self._items]
        self._items.clear()
        return items


@dataclass
class Counts:
    accepted: int = 0
    dropped: int = 0


def poll_timeout_ms(lines: list[DelayLine[Any]], now: float, deadline: float) -> float:
    """How long poll() may sleep: until the earliest due packet or the deadline."""
    wake = min([deadline, *(d for line in lines if (d := line.next_due()) is not None)])
    return max(0.0, (wake - now) * 1000)


class Stopped(Exception):
    """SIGTERM/SIGINT: unwinds poll() (Python would retry it after a handler that returns)."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped


def _loop(poller: Any, by_fd: dict[int, Any], lines: list[DelayLine[Any]], counts: Counts,
          max_seconds: float) -> None:
    deadline = time.monotonic() + max_seconds
    while (now := time.monotonic()) < deadline:
        for fd, _ in poller.poll(poll_timeout_ms(lines, now, deadline)):
            by_fd[fd].run(block=False)  # reads every waiting packet, then returns
        now = time.monotonic()
        for line in lines:
            for packet in line.pop_due(now):
                packet.accept()
                counts.accepted += 1


def serve(specs: list[QueueSpec], loss: float, rng: random.Random, max_seconds: float) -> Counts:
    from netfilterqueue import COPY_META, NetfilterQueue

    counts = Counts()
    queues: list[tuple[Any, DelayLine[Any]]] = []
    poller = select.poll()
    by_fd: dict[int, Any] = {}

    def receiver(line: DelayLine[Any]) -> Any:
        def on_packet(packet: Any) -> None:
            if loss and rng.random() < loss:
                packet.drop()
                counts.dropped += 1
            else:
                line.push(packet, time.monotonic())
        return on_packet

    try:
        for spec in specs:
            nfq, line = NetfilterQueue(), DelayLine[Any](spec.delay_s)
            queues.append((nfq, line))
            nfq.bind(spec.number, receiver(line), max_len=KERNEL_QUEUE_LEN, mode=COPY_META)
            by_fd[nfq.get_fd()] = nfq
            poller.register(nfq.get_fd(), select.POLLIN)
        print("ready", flush=True)
        _loop(poller, by_fd, [line for _, line in queues], counts, max_seconds)
    except Stopped:
        pass
    finally:
        for nfq, line in queues:
            for packet in line.drain():
                packet.accept()
                counts.accepted += 1
            nfq.unbind()
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", type=parse_queue, action="append", required=True)
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    args = parser.parse_args(argv)
    if not 0 <= args.loss < 1:
        parser.error(f"--loss must be in [0, 1), got {args.loss}")
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    # A real link's latency does not grow with the hosts' CPU load: on a busy
    # 2-core machine (torch tests beside us) run ahead of them. Costs ~4 % of a core.
    os.setpriority(os.PRIO_PROCESS, 0, NICE)
    start = time.process_time()
    counts = serve(args.queue, args.loss, random.Random(args.seed), args.max_seconds)
    print(f"accepted {counts.accepted} dropped {counts.dropped} "
          f"cpu {time.process_time() - start:.2f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
