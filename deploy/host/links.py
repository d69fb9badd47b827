"""Host-side link probes for `fab check-network`; stdlib only, run as `python -c <this file> MODE ...`.

`listen ADDRESS [RDZV_PORT] LIFETIME [bind]`: listen on an ephemeral port of the training address
(and, on the rendezvous host, on the rendezvous port of that address only: the probe must not
itself expose the host); print `{"port": N, "rendezvous": "listening" | why not, "lifetime": S}`
and serve until stdin closes or LIFETIME seconds pass (at most MAX_LIFETIME_S), so nothing
outlives a lost controller. With `bind` (an elastic run's successors, which host the store only
after a failover) the rendezvous port is bound, never listened on, and let go at once: the answer
says `"free"` or why not, and nothing holds the port while the check goes on. At most
MAX_CONNECTIONS connections are served at once; more are closed as soon as they are accepted. A
connection that sends `b` is a bulk transfer: the listener reads until EOF and answers the steady
rate it counted.

`connect SPEC_JSON`: TCP connect to every target at once (connect time = one round trip) and a
don't-fragment ping of the target's `df_size` (sized by the controller for its address's family)
to each address, read as the path MTU's only when a small ping passes (`_df_ping`); prints a JSON
list with one result per target. With `"bulk_only": true` only a timed transfer to each, one after
another, and why one could not be timed (the controller asks for them once every host's handshakes
are done, so no handshake waits in a queue behind another host's transfer). The sender times its
own transfer: the far end's answer only ends it and can lower the figure, never raise it; one the
far end acknowledges none of has stalled (`_bulk`).
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import select
import socket
import struct
import subprocess
import sys
import termios
import threading
import time

CHUNK = b"\0" * 65536
MAX_CONNECTIONS = 16  # the check's own peers need one each; a flood must not cost a thread apiece
MAX_LIFETIME_S = 180.0  # whatever the controller asks: a probe never listens for long
HANDSHAKES = 3  # per link: its RTT is the quickest
ANSWER_MAX = 64  # bytes of a listener's answer to a transfer read, at most
STALL_S = 2.0  # nothing acknowledged for this long: stalled (a round trip, even a relayed one, is far less)
WRITE_TIMEOUT_S = 5.0  # a write of a transfer that moves: far longer, the far end may drain slowly
# deploy/check/linkverdicts.py reads this text as a stall (a FAIL, not a figure missing)
STALLED = "the transfer stalled: the far end acknowledged none of it"
SMALL_PING = 56  # ping's own default payload: a packet no path needs to fragment
PING_MISSING = "`ping` is not installed on this host (apt-get install iputils-ping)"


def _serve_one(conn: socket.socket) -> None:
    """Receive a bulk transfer; answer with the steady rate in bytes/s, measured over the second
    half of it: TCP's slow start takes several round trips, which on a 40-150 ms path is a good part
    of a short transfer, and would read as a slower link than training will see."""
    with conn:
        conn.settimeout(10)
        try:
            if conn.recv(1) != b"b":
                return
            arrivals: list[tuple[float, int]] = []
            total = 0
            while data := conn.recv(1 << 20):
                total += len(data)
                arrivals.append((time.monotonic(), total))
            conn.sendall(f"{_steady_rate(arrivals):.1f}\n".encode())
        except OSError:
            pass


def _steady_rate(arrivals: list[tuple[float, int]]) -> float:
    """Bytes/s from the last sample at or before the middle of the transfer to its end, from (time,
    cumulative bytes). At or before: the sender's samples stop while the buffers drain, and a drain
    longer than the writes must not leave it no sample to start from."""
    if len(arrivals) < 2:
        return 0.0
    start, end = arrivals[0][0], arrivals[-1][0]
    middle = start + (end - start) / 2
    at_middle = [(t, n) for t, n in arrivals[:-1] if t <= middle][-1]
    span = end - at_middle[0]
    return (arrivals[-1][1] - at_middle[1]) / span if span > 0 else 0.0


def _open_rendezvous(address: str, port: int, serve: bool = True) -> tuple[socket.socket | None, str]:
    """The rendezvous port on `address`, listening, and "listening"; or (None, why not). Without
    `serve` it is bound and closed at once, never listened on, and the state is "free": a successor's
    check must leave the port to whatever opens it next (a bound socket that does not listen, with
    SO_REUSEADDR, keeps no TCPStore from binding and listening, and nothing can connect to it)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # like TCPStore: TIME_WAIT is no conflict
    try:
        # torch's store binds every address: the port must be free on all of them, so bind the
        # wildcard first, without listening (nothing can connect), then listen on `address` only.
        with socket.socket(family, socket.SOCK_STREAM) as wildcard:
            wildcard.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            wildcard.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
        sock.bind((address, port))
        if not serve:
            sock.close()
            return None, "free"
        sock.listen(64)
        return sock, "listening"
    except OSError as err:
        sock.close()
        return None, f"in use ({err.strerror})" if err.errno == errno.EADDRINUSE else str(err)


def _serve_capped(conn: socket.socket, slots: threading.BoundedSemaphore) -> None:
    try:
        _serve_one(conn)
    finally:
        slots.release()


def listen(address: str, rdzv_port: int | None, lifetime: float, serve_rdzv: bool = True) -> None:
    try:
        ephemeral = socket.create_server((address, 0), backlog=64)
    except OSError as err:  # most often: the address is not one of this host's
        print(json.dumps({"error": os.strerror(err.errno) if err.errno else str(err)}), flush=True)
        return
    sockets = [ephemeral]
    state = "not asked"
    if rdzv_port is not None:
        rdzv, state = _open_rendezvous(address, rdzv_port, serve_rdzv)
        sockets += [rdzv] if rdzv is not None else []
    lifetime = min(lifetime, MAX_LIFETIME_S)
    print(json.dumps({"port": ephemeral.getsockname()[1], "rendezvous": state, "lifetime": lifetime}), flush=True)
    closed = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.buffer.read(), closed.set()), daemon=True).start()
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
    deadline = time.monotonic() + lifetime
    while not closed.is_set() and time.monotonic() < deadline:
        ready, _, _ = select.select(sockets, [], [], 0.2)
        for sock in ready:
            conn, _ = sock.accept()
            if not slots.acquire(blocking=False):
                conn.close()  # over the cap: refuse at once rather than queue a thread
                continue
            threading.Thread(target=_serve_capped, args=(conn, slots), daemon=True).start()
    for sock in sockets:
        sock.close()


def _everywhere(port: int) -> socket.socket:
    """A listener on every address, IPv6 too where the host has it: torch's store binds `::`
    dual-stack, so an IPv4-only bait would read an exposed IPv6 address as closed."""
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=64)
    return socket.create_server(("", port), backlog=64)


def own_addresses() -> list[list[str]]:
    """[interface, address] for each of the host's addresses (`ip -j addr`); none without iproute2.
    The controller picks the public ones off the overlay to connect to."""
    try:
        done = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, timeout=5)
        links = json.loads(done.stdout) if done.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return []
    return [[str(link.get("ifname")), str(a.get("local"))] for link in links if isinstance(link, dict)
            for a in link.get("addr_info", []) if isinstance(a, dict) and a.get("local")]


def canary(rdzv_port: int | None, lifetime: float) -> None:
    """The exposure check's bait: listen on EVERY address, as torch's store and an elastic run's
    extra store do, on an ephemeral port (and the rendezvous port if free); print
    `{"ports": {"ephemeral": N, "rendezvous": N|null}, "addresses": [[ifname, address], ...]}`;
    accept and close at once (no thread, no data), until stdin closes or `lifetime` (at most
    MAX_LIFETIME_S) passes. Whoever connects from outside the training path shows the host's
    firewall lets the real ones in too."""
    sockets = [_everywhere(0)]
    ports: dict[str, int | None] = {"ephemeral": sockets[0].getsockname()[1], "rendezvous": None}
    if rdzv_port is not None:
        try:
            sockets.append(_everywhere(rdzv_port))
            ports["rendezvous"] = rdzv_port
        except OSError:
            pass  # in use (a run?): the ephemeral bait still tells, and the controller says so
    print(json.dumps({"ports": ports, "addresses": own_addresses()}), flush=True)
    closed = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.buffer.read(), closed.set()), daemon=True).start()
    deadline = time.monotonic() + min(lifetime, MAX_LIFETIME_S)
    while not closed.is_set() and time.monotonic() < deadline:
        for sock in select.select(sockets, [], [], 0.2)[0]:
            sock.accept()[0].close()
    for sock in sockets:
        sock.close()


def _connect(address: str, port: int, timeout: float) -> dict[str, object]:
    """The first handshake says whether the port answers; the RTT is the quickest of HANDSHAKES:
    one handshake's time also holds this thread's wait for a core after the answer came, which on
    a loaded host is milliseconds (a LAN pair read as 10 ms hides where places end)."""
    quickest: float | None = None
    for _ in range(HANDSHAKES):
        start = time.monotonic()
        try:
            with socket.create_connection((address, port), timeout=timeout):
                took = time.monotonic() - start
        except OSError as err:
            if quickest is not None:
                break  # it answered before: open, at its quickest
            return _refusal(err, timeout)
        quickest = took if quickest is None else min(quickest, took)
    return {"state": "open", "connect_ms": round((quickest or 0.0) * 1000, 3), "detail": ""}


def _refusal(err: OSError, timeout: float) -> dict[str, object]:
    if isinstance(err, ConnectionRefusedError):
        return {"state": "refused", "detail": "connection refused"}
    if isinstance(err, socket.timeout):
        return {"state": "timeout", "detail": f"no answer within {timeout:g} s"}
    unreachable = err.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH)
    return {"state": "unreachable" if unreachable else "error", "detail": err.strerror or str(err)}


def _ping(address: str, size: int, wait_s: int) -> subprocess.CompletedProcess:
    """One don't-fragment ping of `size` payload bytes, its reply awaited `wait_s` seconds."""
    argv = ["ping", "-n", "-q", "-M", "do", "-s", str(size), "-c", "1", "-W", str(wait_s), address]
    return subprocess.run(argv, capture_output=True, text=True, timeout=wait_s + 3)


def _df_ping(address: str, size: int) -> tuple[bool | None, str]:
    """(True, ""): the full-size don't-fragment ping came back. (False, ""): it was lost and a small
    one came back, so the path drops what the interface's MTU lets out. (None, why the path MTU was
    not tested) otherwise: a lost ping alone says nothing of the MTU (ICMP filtered, clouds' default;
    a ping without CAP_NET_RAW; busybox's, which has no -M, loses every one). The small ping is the
    same command but its size and has a shorter deadline, and runs only after a loss: a sound path
    costs one ping."""
    try:
        if _ping(address, size, 2).returncode == 0:
            return True, ""
        small = _ping(address, SMALL_PING, 1)
    except FileNotFoundError:
        return None, PING_MISSING
    except subprocess.TimeoutExpired as err:
        return None, f"ping did not finish in {err.timeout:g} s"
    except OSError as err:
        return None, f"ping could not run ({err.strerror or err})"
    if small.returncode == 0:
        return False, ""
    why = next((line.strip() for line in small.stderr.splitlines() if line.strip()), "") or "no reply"
    return None, f"a {SMALL_PING}-byte ping got no answer either ({why[:120]}): ICMP is filtered or ping cannot run"


def _unacked(sock: socket.socket) -> int:
    """Bytes written to `sock` that the far end's kernel has not acknowledged (Linux's SIOCOUTQ, which
    is TIOCOUTQ); 0 where the host cannot say, and what was written then counts as delivered: at most
    a send buffer too early, never more than this host itself pushed."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
    except (OSError, AttributeError):  # AttributeError: a platform without TIOCOUTQ
        return 0


class _Sent:
    """A transfer's bytes written (1: the `b` that opened it) and, after each write, (time, bytes the
    far end's kernel acknowledged)."""

    def __init__(self) -> None:
        self.written, self.acked = 1, []

    def sample(self, sock: socket.socket) -> int:
        acked = self.written - min(_unacked(sock), self.written)
        self.acked.append((time.monotonic(), acked))
        return acked


def _transfer(sock: socket.socket, seconds: float, sent: _Sent) -> bytes:
    """Write for `seconds`, then the far end's answer, which comes once it has read the last byte.
    `send`, not `sendall`: each write counts what went, so a stall knows what went before it."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        sent.written += sock.send(CHUNK)
        if sent.sample(sock) > 1:  # it moves: a slow path's write may wait longer than a stall's
            sock.settimeout(WRITE_TIMEOUT_S)
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(seconds + 10)
    answer = sock.makefile("rb").readline(ANSWER_MAX)  # bounded: the far end is another host, a number is short
    sent.sample(sock)
    return answer


def _bulk(address: str, port: int, seconds: float) -> tuple[float | None, str]:
    """The steady Mbit/s of a transfer of about `seconds` (its second half), timed here, or None and
    why not. A write that waits STALL_S while the far end has acknowledged nothing past the opening
    byte is STALLED: the handshake and that byte are small packets, the writes full-size ones, so a
    path that passes only the former (a path-MTU black hole) is told from a far end that stopped
    reading (its kernel acknowledged its buffer's worth: "did not answer the transfer in time")."""
    sent = _Sent()
    try:
        with socket.create_connection((address, port), timeout=5) as sock:
            sock.sendall(b"b")
            sock.settimeout(STALL_S)
            try:
                answer = _transfer(sock, seconds, sent)
            except socket.timeout:
                if sent.sample(sock) <= 1:
                    return None, STALLED
                raise
    except OSError as err:
        return None, _said(err)
    return _reported(_steady_rate(sent.acked), answer)


def _reported(own: float, answer: bytes) -> tuple[float | None, str]:
    """Mbit/s from this host's own figure (bytes/s), lowered to the far end's if it counted less. The
    far end's number is only its word: taken as the rate, a host answering `inf` or 1e12 would set
    the speed of a link that starts at another host, and `--comm auto`'s slowest node with it."""
    try:
        theirs = float(answer)
    except ValueError:  # not a number, or no answer at all
        theirs = math.nan
    if not (math.isfinite(theirs) and theirs >= 0):
        return None, "the far end answered no usable rate"
    if theirs == 0:
        return None, "the far end counted no steady transfer"
    if own <= 0:
        return None, "the transfer was too short to time"
    return round(min(own, theirs) * 8 / 1e6, 1), ""


def _said(err: Exception) -> str:
    if isinstance(err, socket.timeout):
        return "the far end did not answer the transfer in time"
    return getattr(err, "strerror", None) or str(err) or type(err).__name__


def connect(spec: dict) -> None:
    targets = spec["targets"]
    if spec.get("bulk_only"):
        timed = []
        for target in targets:
            rate, why = _bulk(target["address"], target["port"], spec["bandwidth_s"])
            timed.append({"state": "open" if rate is not None else "error", "mbit_s": rate, "detail": why})
        print(json.dumps(timed))
        return
    results: list[dict[str, object]] = [{} for _ in targets]

    def probe(i: int, target: dict) -> None:
        results[i] = _connect(target["address"], target["port"], spec["timeout"])
        size = target.get("df_size", spec.get("df_size"))  # the controller sizes each by its address's family
        if size and not target.get("rendezvous"):
            results[i]["df_ok"], results[i]["df_detail"] = _df_ping(target["address"], size)

    threads = [threading.Thread(target=probe, args=(i, t)) for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(results))


def main(argv: list[str]) -> None:
    if argv[0] == "listen":
        listen(argv[1], int(argv[2]) if argv[2] != "-" else None, float(argv[3]), argv[4:] != ["bind"])
        # The stdin reader is still blocked in read() when the lifetime ends: a normal interpreter
        # exit would abort on its lock (SIGABRT), so leave at once, output flushed.
        sys.stdout.flush()
        os._exit(0)
    elif argv[0] == "canary":
        canary(int(argv[1]) if argv[1] != "-" else None, float(argv[2]))
        sys.stdout.flush()
        os._exit(0)  # as for listen: the stdin reader still holds its lock
    elif argv[0] == "connect":
        connect(json.loads(argv[1]))
    else:
        raise SystemExit(f"usage: probe_net listen ADDRESS RDZV_PORT|- LIFETIME [bind] | canary RDZV_PORT|- LIFETIME | "
                         f"connect SPEC_JSON, not {argv}")


if __name__ == "__main__":
    main(sys.argv[1:])
