"""Webhook delivery, standard library only: the controller of an attached run and the agent of a
detached one both send through a `Sender`.

A receiver is an HTTP(S) URL the user gave (`fab train --notify URL`, the inventory's `notify:`);
each event is one POST of a JSON object with a `text` line (what Slack-style and ntfy-style
receivers show) and structured fields. Delivery never holds up what sent it: `send` puts the event
on a bounded queue and returns; one background thread posts it to each receiver with a 5 s timeout
and a few tries, and an event that finds the queue full is dropped (and counted). A URL is a secret
(it often carries a token): it is never printed, logged or put in an error; receivers are named by
their position, `receiver #1`.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from typing import Callable

from meshrun import events
from meshrun.layout import NOTIFY_CLOSE_S

POST_TIMEOUT_S = 5.0
TRIES = 3
RETRY_PAUSE_S = 1.0  # then twice that
QUEUE_BOUND = 64
USER_AGENT = "meshrun-notify"
SPEC_KEY = events.NOTIFY_KEY
MAX_URLS, MAX_HOSTS = 8, 1024

Report = Callable[[str], None]  # a one-line account of an event that was not delivered


# urllib and http.client are imported where an event is posted, not here: every agent imports this
# module, most runs send nothing, and those imports cost a host ~30 ms of CPU at each launch.


def _why(err: BaseException) -> str:
    """What went wrong, without the URL: an HTTP status, or the error's class and errno/reason kind."""
    import urllib.error

    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP {err.code}"
    if isinstance(err, urllib.error.URLError):
        reason = err.reason
        return f"{reason.__class__.__name__}" + (f" errno {reason.errno}" if getattr(reason, "errno", None) else "")
    return err.__class__.__name__


def _retryable(err: BaseException) -> bool:
    import urllib.error

    return not isinstance(err, urllib.error.HTTPError) or err.code >= 500 or err.code == 429


def post(url: str, body: dict, timeout: float = POST_TIMEOUT_S) -> None:
    """One POST of `body` as JSON; raises what urllib raises (the caller names no URL)."""
    import urllib.request

    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": USER_AGENT})
    with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 - http(s) only, checked on entry
        answer.read(4096)


class Sender:
    """Posts events to every receiver from one daemon thread; `send` never blocks."""

    def __init__(self, urls: tuple[str, ...], report: Report | None = None, tries: int = TRIES,
                 pause_s: float = RETRY_PAUSE_S) -> None:
        self.urls, self.report, self.tries, self.pause_s = urls, report, tries, pause_s
        self.queue: queue.Queue[dict | None] = queue.Queue(QUEUE_BOUND)
        self.dropped = 0
        self.thread = threading.Thread(target=self._deliver, name="meshrun-notify", daemon=True)
        if urls:
            self.thread.start()

    def send(self, body: dict) -> None:
        if not self.urls:
            return
        try:
            self.queue.put_nowait(body)
        except queue.Full:
            self.dropped += 1

    def close(self, wait_s: float) -> None:
        """Let what is queued go out for at most `wait_s` seconds, then leave the thread behind."""
        if not self.urls:
            return
        try:
            self.queue.put(None, timeout=wait_s)
        except queue.Full:
            return
        self.thread.join(wait_s)

    def _deliver(self) -> None:
        while (body := self.queue.get()) is not None:
            for number, url in enumerate(self.urls, 1):
                self._post(number, url, body)

    def _post(self, number: int, url: str, body: dict) -> None:
        import http.client

        for attempt in range(self.tries):
            try:
                post(url, body)
                return
            except (OSError, ValueError, http.client.HTTPException) as err:  # URLError, HTTPError: OSErrors
                if attempt + 1 == self.tries or not _retryable(err):
                    if self.report is not None:
                        self.report(f"notify: '{body.get('event')}' not delivered to receiver #{number} ({_why(err)})")
                    return
                time.sleep(self.pause_s * (attempt + 1))


class AgentNotices:
    """A detached run's events, sent by one agent only: the one on the rendezvous host of the current
    generation (`spec`, from the controller on stdin: {"urls": [...], "head": first rendezvous host,
    "hosts": [...], "every_checkpoint": bool}). Every agent makes one; only that agent's calls post
    anything, so each event goes out once, whichever host sees it. A spec of the wrong shape sends
    nothing. Checkpoints: every host holds a copy of each one (train/checkpoint.py), so the
    rendezvous host's own manifest is the run's; every agent follows it, so a new rendezvous host
    does not announce an old step again."""

    def __init__(self, spec: str | None, run_id: str, host: str, report: Report | None = None) -> None:
        found = _spec(spec)
        self.urls, self.head, self.hosts, self.every_checkpoint = found if found else ((), "", [], False)
        self.run_id, self.host = run_id, host
        self.sender = Sender(self.urls, report) if self.urls else None
        self.started_at = time.time()
        self.newest_checkpoint = -1

    def _send(self, head: str, body: dict) -> None:
        if self.sender is not None and (head or self.head) == self.host:
            self.sender.send(body)

    def started(self, head: str) -> None:
        self._send(head, events.started(self.run_id, time.time(), self.hosts, None))

    def lost(self, peers: list[str], head: str) -> None:
        for peer in peers:
            self._send(head, events.host_event("host_lost", self.run_id, time.time(), peer, None, "stopped answering"))

    def back(self, peers: list[str], head: str) -> None:
        for peer in peers:
            self._send(head, events.host_event("host_back", self.run_id, time.time(), peer, None, "answers again"))

    def checkpoint(self, step: int | None, head: str) -> None:
        """The newest step this host's manifest lists; a newer one than any seen is an event (opt-in)."""
        if step is None or step <= self.newest_checkpoint:
            return
        self.newest_checkpoint = step
        if self.every_checkpoint:
            self._send(head, events.checkpoint(self.run_id, time.time(), step, head or self.head))

    def idle(self, idle_s: float, threshold: float, stopping: bool) -> None:
        """This host's own idle spell: its agent alone knows of it, so it sends it, head or not."""
        if self.sender is not None:
            self.sender.send(events.idle(self.run_id, time.time(), self.host, idle_s, threshold, stopping))

    def moved(self, old: str, head: str) -> None:
        self._send(head, events.host_event("rendezvous_moved", self.run_id, time.time(), head, None, f"{old} lost"))

    def ended(self, rc: int, stop_reason: str | None, head: str) -> None:
        status = "stopped" if stop_reason else "succeeded" if rc == 0 else "failed"
        reason = stop_reason or (None if rc == 0 else f"{self.host}: exit status {rc}")
        now = time.time()
        self._send(head, events.ended(self.run_id, now, status, now - self.started_at, reason,
                                      None if rc == 0 or stop_reason else self.host))
        if self.sender is not None:
            self.sender.close(NOTIFY_CLOSE_S)


def _spec(text: str | None) -> tuple[tuple[str, ...], str, list[str], bool] | None:
    try:
        spec = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(spec, dict):
        return None
    urls, head, hosts = spec.get("urls"), spec.get("head"), spec.get("hosts")
    every_checkpoint = spec.get("every_checkpoint", False)
    if not (isinstance(urls, list) and all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls)
            and isinstance(head, str) and isinstance(hosts, list) and all(isinstance(h, str) for h in hosts)
            and isinstance(every_checkpoint, bool)):
        return None
    return tuple(urls[:MAX_URLS]), head, hosts[:MAX_HOSTS], every_checkpoint
