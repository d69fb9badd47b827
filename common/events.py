"""The bodies of notification events, standard library only and without effects: the controller
(`deploy/run/notify.py`) and a detached run's agent (`deploy/host/notify.py`) build the same JSON.

Every body is an object with `text` (one line for people: Slack-style and ntfy-style receivers
show it), `event`, `run_id` and `time`, plus the fields of its kind:

    started                    hosts, world_size
    finished|failed|stopped    status, duration_s, reason, failed_host
    host_lost|host_back|host_joined|host_left   host, world_size, detail
    rendezvous_moved           host (the new rendezvous host), world_size, detail
    idle                       host, idle_s, threshold, stopping (--idle-stop)
    checkpoint                 step, host (with --every-checkpoint: the newest step a host lists)

`world_size` is null where the sender does not know it (a detached run's agent).
"""

from __future__ import annotations

from typing import Any

# The key of the agent's stdin env block that carries a detached run's receivers ({"urls", "head",
# "hosts"} as JSON text); the agent takes it out before the env reaches any process.
NOTIFY_KEY = "MESHRUN_NOTIFY"
END_EVENTS = {"succeeded": "finished", "failed": "failed", "stopped": "stopped"}
HOST_WORDS = {"host_lost": "lost", "host_left": "left", "host_back": "is back", "host_joined": "joined",
              "rendezvous_moved": "now hosts the rendezvous"}


def body(event: str, run_id: str, time: float, text: str, **fields: Any) -> dict[str, Any]:
    return {"text": f"meshrun run {run_id}: {text}", "event": event, "run_id": run_id, "time": round(time, 3),
            **fields}


def started(run_id: str, time: float, hosts: list[str], world_size: int | None) -> dict[str, Any]:
    size = f", world size {world_size}" if world_size is not None else ""
    return body("started", run_id, time, f"started on {len(hosts)} host(s) ({', '.join(hosts)}){size}",
                hosts=hosts, world_size=world_size)


def ended(run_id: str, time: float, status: str, duration_s: float, reason: str | None,
          failed_host: str | None) -> dict[str, Any]:
    event = END_EVENTS.get(status, "failed")
    why = f": {reason}" if reason else ""
    return body(event, run_id, time, f"{event} after {duration_s:.0f} s{why}", status=status,
                duration_s=round(duration_s, 2), reason=reason, failed_host=failed_host)


def host_event(kind: str, run_id: str, time: float, host: str, world_size: int | None,
               detail: str | None) -> dict[str, Any]:
    size = f"; world size {world_size}" if world_size is not None else ""
    shown = f" ({detail})" if detail else ""
    return body(kind, run_id, time, f"host {host} {HOST_WORDS[kind]}{shown}{size}", host=host,
                world_size=world_size, detail=detail)


def idle(run_id: str, time: float, host: str, idle_s: float, threshold: float, stopping: bool) -> dict[str, Any]:
    """A host whose GPUs (or, on CPU hosts, the run's processes) stayed under `threshold` for `idle_s`."""
    then = "; stopping the run (--idle-stop)" if stopping else ""
    return body("idle", run_id, time, f"host {host} idle for {idle_s:.0f} s (under {threshold:.0%} utilisation){then}",
                host=host, idle_s=round(idle_s, 1), threshold=threshold, stopping=stopping)


def checkpoint(run_id: str, time: float, step: int, host: str) -> dict[str, Any]:
    return body("checkpoint", run_id, time, f"checkpoint at step {step} (on {host})", step=step, host=host)
