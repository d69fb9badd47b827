"""The check's probe answers (deploy/host/facts.py, links.py), shape-checked, pure. What a host
prints is data: a wrong shape is a one-line MeshrunError naming the host (deploy/run/answers.py),
never a crash, and no text of it reaches a table unclipped."""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from meshrun.deploy.check.clocks import Clock, NoClock, reading
from meshrun.deploy.check.verdicts import Fingerprint, LinkResult, PortState
from meshrun.deploy.inventory.shown import shown
from meshrun.deploy.run.answers import MISSING, Answer, is_int, is_real
from meshrun.deploy.run.commplan import MAX_MBIT_S

VERSION_RE = re.compile(r"[A-Za-z0-9.+!_-]{1,40}")
BUILD_RE = re.compile(r"[0-9a-f]{12}")
# What a connect can end in on the host; `skipped` is the controller's own.
HOST_STATES = tuple(s.value for s in PortState if s is not PortState.SKIPPED)
VERSION_CLIP = 80  # a version string, e.g. torch's "2.4.1+cu121"; python's is shorter
TOOL_CLIP = 1000  # a tool's path on the host: it is run there as argv[0]


def host_path(reader: Answer, value: object, field: str, limit: int, optional: bool = False) -> str | None:
    """A path the host names, which the controller runs there as argv[0]: printable text only. A lone
    surrogate (JSON's valid `"\\ud800"`) cannot be sent as SSH's UTF-8, a NUL or newline cuts the
    command: each is the host's bad answer, said as such, never a crash of the command using it."""
    path = reader.text(value, field, optional=optional, limit=limit)
    if path is not None and not path.isprintable():
        raise reader.bad(field, path, "a path of printable characters" + (" or null" if optional else ""))
    return path


def meshrun_of(answer: object) -> str | None:
    """The host's meshrun as `version (build digest)`, or None without one. The host writes this:
    anything that is not a plain version and digest is shown as unreadable, never echoed."""
    if not isinstance(answer, dict):
        return None
    version, build = answer.get("version"), answer.get("build")
    if not (isinstance(version, str) and VERSION_RE.fullmatch(version) and isinstance(build, str)
            and BUILD_RE.fullmatch(build)):
        return "unreadable (build unknown)"
    return f"{version} (build {build})"


def facts_of(host: str, facts: dict) -> tuple[Fingerprint, int | None, dict[str, str]]:
    """The facts probe's object → (fingerprint, free bytes in the workdir, tool → path on the host)."""
    reader = Answer(host, "the facts probe")
    versions = {k: reader.text(facts.get(k), k, optional=True, limit=VERSION_CLIP)
                for k in ("python", "torch", "cuda", "nccl")}
    error = reader.text(facts.get("error"), "error", optional=True)
    disk_free = facts.get("disk_free")
    if not (disk_free is None or is_int(disk_free) and disk_free >= 0):
        raise reader.bad("disk_free", disk_free, "a number of bytes or null")
    tools = facts.get("tools") or {}
    reader.mapping(tools, "tools")
    paths = {str(k): host_path(reader, v, f"tools.{k}", TOOL_CLIP, optional=True) for k, v in tools.items()}
    return (Fingerprint(versions["python"], versions["torch"], versions["cuda"], versions["nccl"], error,
                        meshrun_of(facts.get("meshrun"))),
            disk_free, {k: v for k, v in paths.items() if v})


MACHINE_RE = re.compile(r"[0-9a-f]{16}")
MAX_CPUS = 4096


def machine_of(host: str, facts: dict) -> tuple[str | None, int | None]:
    """The facts probe's `machine` (16 hex digits) and `cpus` (1..4096); absent (an older probe): None."""
    reader = Answer(host, "the facts probe")
    machine, cpus = facts.get("machine"), facts.get("cpus")
    if not (machine is None or isinstance(machine, str) and MACHINE_RE.fullmatch(machine)):
        raise reader.bad("machine", machine, "16 hex digits or null")
    if not (cpus is None or is_int(cpus) and 1 <= cpus <= MAX_CPUS):
        raise reader.bad("cpus", cpus, f"a count of 1 to {MAX_CPUS} or null")
    return machine, cpus


# Seconds since 1970 a clock may read: up to 2100-01-01. One before it is still a clock (a host whose
# clock was reset reads 1970, and is said to be that far behind); past it, or not a number, is no time.
LAST_CLOCK = 4102444800


def clock_of(host: str, facts: dict, sent_at: float, answered_at: float) -> Clock | NoClock:
    """The facts probe's `clock` (its time.time()) and `clock_after_s` (how long it had run by then),
    asked at `sent_at` and answered at `answered_at` (this machine's wall clock) → its offset. Never
    raises: the rest of the answer stands, and a clock that is no time is a NoClock, said as a WARN."""
    clock, ran = facts.get("clock", MISSING), facts.get("clock_after_s", MISSING)
    if not (is_real(clock) and 0 <= clock <= LAST_CLOCK):
        return NoClock(f"the facts probe's clock is {_said(clock)}; expected seconds since 1970, up to {LAST_CLOCK}")
    if not (is_real(ran) and ran >= 0):
        return NoClock(f"the facts probe's clock_after_s is {_said(ran)}; expected a number of seconds >= 0")
    return reading(sent_at, answered_at, float(clock), float(ran))


def _said(value: object) -> str:
    return "missing" if value is MISSING else shown(value, 40)


def canary_ports(host: str, answer: dict, rdzv_port: int | None) -> tuple[int, int | None]:
    """The exposure bait's `{"ports": {"ephemeral": N, "rendezvous": N|null}}` → (ephemeral, rendezvous).
    The rendezvous bait is the port asked for or none: any other port is not the bait's."""
    reader = Answer(host, "the exposure probe")
    ports = reader.mapping(answer.get("ports", MISSING), "ports")
    ephemeral = reader.port(ports.get("ephemeral", MISSING), "ports.ephemeral")
    rendezvous = ports.get("rendezvous")
    if rendezvous is not None and not (is_int(rendezvous) and rendezvous == rdzv_port):
        raise reader.bad("ports.rendezvous", rendezvous, "null" + (f" or {rdzv_port}" if rdzv_port is not None else ""))
    return ephemeral, rendezvous


MAX_ADDRESSES_READ = 256  # of the bait's address list: a host has a handful


def canary_addresses(host: str, answer: dict) -> tuple[tuple[str, str], ...]:
    """The bait's `"addresses": [[ifname, address], ...]` (absent from an older bait: none)."""
    reader = Answer(host, "the exposure probe")
    listed = reader.array(answer.get("addresses", []), "addresses")[:MAX_ADDRESSES_READ]
    pairs = []
    for i, item in enumerate(listed):
        if not (isinstance(item, list) and len(item) == 2):
            raise reader.bad(f"addresses[{i}]", item, "an [interface, address] pair")
        pairs.append((reader.text(item[0], f"addresses[{i}][0]", limit=64) or "",
                      reader.text(item[1], f"addresses[{i}][1]", limit=64) or ""))
    return tuple(pairs)


def listener_of(host: str, answer: dict) -> tuple[int, str]:
    """A link listener's `{"port": N, "rendezvous": "listening" | why not}` → (port, rendezvous)."""
    reader = Answer(host, "the link listener")
    port = reader.port(answer.get("port", MISSING), "port")
    return port, reader.text(answer.get("rendezvous", MISSING), "rendezvous") or ""


def link_results(host: str, targets: Sequence[Mapping[str, Any]], answers: object,
                 df_size: int | None) -> tuple[LinkResult, ...]:
    """The link probe's JSON list, one result per target in order → LinkResults from `host`. A
    target's own `df_size` (linkverdicts.df_targets) is its probe's size; `df_size`, the others'."""
    reader = Answer(host, "the link probe")
    if len(reader.array(answers)) != len(targets):
        raise reader.error(f"{len(answers)} result(s) for {len(targets)} target(s)")
    return tuple(_link(reader, host, i, t, a, df_size) for i, (t, a) in enumerate(zip(targets, answers)))


def _link(reader: Answer, host: str, i: int, target: Mapping[str, Any], answer: object,
          df_size: int | None) -> LinkResult:
    a = reader.mapping(answer, f"[{i}]")
    state = reader.choice(a.get("state", MISSING), f"[{i}].state", HOST_STATES)
    detail = reader.text(a.get("detail", ""), f"[{i}].detail")
    df_ok = reader.flag(a.get("df_ok", MISSING), f"[{i}].df_ok")
    df_detail = reader.text(a.get("df_detail", ""), f"[{i}].df_detail")  # why df_ok is null, if probed
    mbit_s, unusable = _rate(reader, a.get("mbit_s", MISSING), f"[{i}].mbit_s")
    return LinkResult(source=host, target=target["name"], address=target["address"], port=target["port"],
                      state=PortState(state), rendezvous=bool(target.get("rendezvous")),
                      connect_ms=reader.number(a.get("connect_ms", MISSING), f"[{i}].connect_ms"),
                      detail=unusable or detail or "", df_ok=df_ok, mbit_s=mbit_s, df_detail=df_detail or "",
                      df_size=None if "df_ok" not in a else target.get("df_size", df_size))


def _rate(reader: Answer, value: object, field: str) -> tuple[float | None, str]:
    """A link's Mbit/s and "", or None and why it is no rate. A number no link gives (NaN, infinite,
    negative, past MAX_MBIT_S) voids that one link's figure, not the host's answer: the host's other
    links, to honest peers, still count, and no peer's answer can make it look broken as a whole."""
    number = isinstance(value, float) or is_int(value)  # another type is a wrong answer, said as such
    if number and not (is_real(value) and 0 <= value <= MAX_MBIT_S):  # type: ignore[operator]
        return None, f"the probe reported {shown(value)} Mbit/s, no usable rate"
    return reader.number(value, field), ""
