"""Launch planning, pure: selected hosts + options → the exact argv and environment per host.

Nothing here touches the network or the filesystem, so tests compare plans by equality.
The plan encodes what `docs/architecture.md` and the field notes require: addresses (never
hostnames) in the rendezvous endpoint, `is_host=1` on the rendezvous host and `--local-addr`
everywhere (overlay rendezvous fails without them), one unique rdzv id per run, and the
interface that routes to the rendezvous host for NCCL and gloo.
"""

from __future__ import annotations

import dataclasses

import json
from dataclasses import dataclass, field
from typing import Mapping

from meshrun.layout import (AGENT_MODULE, DEFAULT_PG_TIMEOUT_S, ENV_BATCH_SIZE, ENV_HOST, ENV_RUN_ID, ENV_SITE,
                           HEARTBEAT_TIMEOUT_S, SCRIPT_RUNNER_MODULE, STOP_GRACE_S, TORCHRUN_LOGS, TORCHRUN_MODULE,
                           TORCHRUN_RDZV_HOST_FLAG, TRAINER_MODULE, generation_rdzv_id, host_dir)
from meshrun.deploy.errors import InputError
from meshrun.idlerule import IdlePolicy, policy_json
from meshrun.deploy.inventory import reservedenv
from meshrun.deploy.inventory.model import ElasticBounds, Host
from meshrun.deploy.inventory.selection import Selection

ELASTIC_MAX_RESTARTS = 10  # headroom for spurious membership restarts (lab NOTES §7)
# keep_alive 2 s x 3: a dead node leaves the rendezvous state after 6 s instead of torch's 15 s,
# which every re-rendezvous after a loss waits for.
ELASTIC_RDZV_CONF = ("join_timeout=120", "last_call_timeout=5", "close_timeout=10", "keep_alive_interval=2",
                     "keep_alive_max_attempt=3")


@dataclass(frozen=True)
class Workload:
    """What each rank runs: the built-in trainer, or a user's torchrun-compatible script."""

    script: str | None = None  # path inside the synced project; None runs `python -m meshrun.train`
    config: str | None = None  # trainer config file (built-in trainer only)
    args: tuple[str, ...] = ()  # trainer `key=value` overrides, or the script's own arguments
    # How a script is started: the runner module (docs/scripts.md), or a path to a copy of it for
    # hosts that may not have meshrun yet (the check's all-reduce probe).
    runner: tuple[str, ...] = ("-m", SCRIPT_RUNNER_MODULE)


@dataclass(frozen=True)
class LaunchOptions:
    run_id: str
    workload: Workload = Workload()
    pg_timeout_s: int = DEFAULT_PG_TIMEOUT_S
    elastic: ElasticBounds | None = None
    max_restarts: int | None = None  # None: 0, or ELASTIC_MAX_RESTARTS when elastic
    heartbeat_timeout_s: int = HEARTBEAT_TIMEOUT_S
    detach: bool = False
    rdzv_id: str | None = None  # None: the run id; a resumed run needs a fresh one
    # How torchrun is started: meshrun's entry point, which reads the rendezvous state as data
    # (deploy/host/torchrun.py), or a path to a copy of it (the check's all-reduce probe).
    launcher: tuple[str, ...] = ("-m", TORCHRUN_MODULE)
    idle: IdlePolicy | None = None  # a detached run's agents apply it to their own host
    usage_every_s: float | None = None  # an attached run's agents send their host's usage this often

    @property
    def rendezvous_id(self) -> str:
        return self.rdzv_id or self.run_id


@dataclass(frozen=True)
class Generation:
    """One rendezvous of an elastic run's succession: generation 0 on the rendezvous host, then,
    each time the current one is lost, the next host of the order fixed at launch."""

    head: str
    endpoint: str  # "address:port" of that host's c10d store
    torchrun: tuple[str, ...]  # this host's torchrun argv for it

    def as_json(self) -> dict[str, object]:
        return {"head": self.head, "endpoint": self.endpoint, "torchrun": list(self.torchrun)}


@dataclass(frozen=True)
class HostLaunch:
    """What runs on one host: the agent argv, which starts torchrun with `env` set."""

    host: Host
    is_rendezvous_host: bool
    env: tuple[tuple[str, str], ...]
    torchrun: tuple[str, ...]
    agent: tuple[str, ...] = field(default=())
    generations: tuple[Generation, ...] = ()  # elastic multi-host runs: the succession, from generation 0


@dataclass(frozen=True)
class LaunchPlan:
    run_id: str
    rdzv_endpoint: str  # "address:port", or "standalone" for one local host
    hosts: tuple[HostLaunch, ...]
    elastic: ElasticBounds | None = None

    @property
    def world_size(self) -> int:
        return sum(h.host.nproc_per_node for h in self.hosts)


def at_generation(launch: HostLaunch, generation: int) -> HostLaunch:
    """The same launch, its agent starting at `generation` of the succession: a host that joins
    or comes back after the rendezvous moved must go where the others are, not to generation 0."""
    if generation <= 0 or not launch.generations:
        return launch
    # A detached join learns the generation from the members' agents (host input): keep it in range.
    generation = min(generation, len(launch.generations) - 1)
    argv = list(launch.agent)
    at = argv.index("--")
    return dataclasses.replace(launch, agent=(*argv[:at], "--generation", str(generation), *argv[at:]))


def python_of(host: Host, local_python: str) -> str:
    return host.python or local_python


def plan_launch(
    selection: Selection,
    options: LaunchOptions,
    interfaces: Mapping[str, str],
    local_python: str,
) -> LaunchPlan:
    """The launch plan. `interfaces` maps host name → the interface routing to the rendezvous host."""
    hosts, head = selection.hosts, selection.head
    standalone = len(hosts) == 1 and head.is_local and options.elastic is None
    _check_hosts(hosts, standalone)
    endpoint = "standalone" if standalone else f"{head.address}:{selection.rendezvous.port}"
    order = succession_order(selection)
    launches = []
    for host in hosts:
        env = host_env(host, options, interfaces.get(host.name))
        torchrun = torchrun_argv(host, head, endpoint, len(hosts), options, local_python)
        generations = () if standalone or options.elastic is None else tuple(
            Generation(h.name, f"{h.address}:{selection.rendezvous.port}",
                       torchrun_argv(host, h, f"{h.address}:{selection.rendezvous.port}", len(hosts), options,
                                     local_python, generation_rdzv_id(options.rendezvous_id, g)))
            for g, h in enumerate(order))
        peers = peer_endpoints(host, hosts) if generations and options.detach else {}
        agent = agent_argv(host, options, env, torchrun, local_python, generations, peers)
        launches.append(HostLaunch(host, host.name == head.name, env, torchrun, agent, generations))
    return LaunchPlan(options.run_id, endpoint, tuple(launches), options.elastic)


def _check_hosts(hosts: tuple[Host, ...], standalone: bool) -> None:
    for host in hosts:
        if host.is_local and not standalone:
            raise InputError(
                f"host '{host.name}' has `address: local`, which other hosts cannot reach; "
                "give it its LAN or overlay address to use it in a multi-host run"
            )
    refuse_gpu_env(hosts)


def refuse_gpu_env(hosts: tuple[Host, ...]) -> None:
    """One line for a host whose `env:` sets a name meshrun sets from its `gpus:`. After the selection,
    not at load: `--hosts NAME:0,1` gives a host `gpus` too (selection.py); `fab train` asks before any
    host is contacted, and the plan again."""
    for host in hosts:
        if (conflict := reservedenv.gpus_conflict(host.name, host.gpus, host.env)) is not None:
            name, problem, fix = conflict
            raise InputError(f"host '{host.name}', field 'env.{name}': {problem}; {fix}")


def peer_endpoints(host: Host, hosts: tuple[Host, ...]) -> dict[str, str]:
    """Where `host`'s agent probes the others in a detached elastic run: each one's sshd on its
    training address (its inventory port when SSH goes to that same address, else 22). A guess
    the agent only trusts once it has answered (deploy/host/succession.py::PeerWatcher)."""
    def port(h: Host) -> int:
        return (h.port or 22) if h.ssh_address in (None, h.address) else 22
    return {h.name: f"{h.address}:{port(h)}" for h in hosts if h.name != host.name}


def succession_order(selection: Selection) -> tuple[Host, ...]:
    """Who hosts the rendezvous, in turn: the rendezvous host, then the others in selection order.
    Fixed at launch, so every survivor agrees on the next one without talking to the others."""
    return (selection.head, *(h for h in selection.hosts if h.name != selection.head.name))


TQDM_INTERVAL_ENV, TQDM_INTERVAL_S = "TQDM_MININTERVAL", "10"  # seconds between a script's progress bar lines


def host_env(host: Host, options: LaunchOptions, interface: str | None) -> tuple[tuple[str, str], ...]:
    """Environment for torchrun on `host`; the inventory's `env` comes last and wins."""
    env: list[tuple[str, str]] = [
        (ENV_RUN_ID, options.run_id),
        (ENV_HOST, host.name),
        ("PYTHONUNBUFFERED", "1"),  # logs must stream live, not in 8 KiB blocks
    ]
    if host.gpus is not None:
        # `gpus:` holds nvidia-smi's indices (PCI bus order); CUDA numbers the fastest card first unless
        # told, so `gpus: [1]` for a 4090 beside a display card at bus 01 would train on the display card.
        # Only with `gpus:`: without it, CUDA's own order puts rank 0 on the fastest card.
        env += [("CUDA_VISIBLE_DEVICES", ",".join(str(g) for g in host.gpus)), ("CUDA_DEVICE_ORDER", "PCI_BUS_ID")]
    if interface:
        env += [("NCCL_SOCKET_IFNAME", f"={interface}"), ("GLOO_SOCKET_IFNAME", interface)]
    if host.network.is_overlay_or_public:
        env.append(("NCCL_IB_DISABLE", "1"))
    if options.elastic is not None:
        # torch 2.14.1: scale-up hangs then crashes with the shared rendezvous store (lab NOTES §7b).
        env.append(("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"))
    if isinstance(host.batch_size, int):
        env.append((ENV_BATCH_SIZE, str(host.batch_size)))
    elif host.batch_size == "auto":
        env.append((ENV_BATCH_SIZE, "auto"))
    if host.site is not None:
        env.append((ENV_SITE, host.site))  # the trainer's sites (comm.hook=hier, docs/sites.md)
    if options.workload.script is not None:
        # A tqdm bar redraws 10 times a second, and each redraw is a line of the teed logs (a carriage
        # return ends one there): tqdm >= 4.66 reads its defaults from TQDM_* (docs/scripts.md).
        env.append((TQDM_INTERVAL_ENV, TQDM_INTERVAL_S))
    overridden = {k for k, _ in host.env}
    return tuple((k, v) for k, v in env if k not in overridden) + host.env


def torchrun_argv(host: Host, head: Host, endpoint: str, node_count: int, options: LaunchOptions,
                  local_python: str, rdzv_id: str | None = None) -> tuple[str, ...]:
    argv = [python_of(host, local_python), *options.launcher]
    if endpoint == "standalone":
        argv += ["--standalone", "--nnodes", "1"]
    else:
        nnodes = f"{options.elastic.min}:{options.elastic.max}" if options.elastic else str(node_count)
        argv += [TORCHRUN_RDZV_HOST_FLAG, head.name, "--nnodes", nnodes, "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id or options.rendezvous_id]
        conf = (["is_host=1"] if host.name == head.name else []) + (list(ELASTIC_RDZV_CONF) if options.elastic else [])
        if conf:
            argv += ["--rdzv-conf", ",".join(conf)]
        argv += ["--local-addr", host.address]
    restarts = options.max_restarts
    if restarts is None:
        restarts = ELASTIC_MAX_RESTARTS if options.elastic else 0
    argv += [
        "--nproc-per-node", str(host.nproc_per_node),
        "--max-restarts", str(restarts),
        "--log-dir", f"{host_dir(options.run_id, host.name)}/{TORCHRUN_LOGS}",
        "--tee", "3",
        "--log-line-prefix-template", f"[{host.name}:${{rank}}] ",
    ]
    return tuple(argv + _workload_argv(options))


def _workload_argv(options: LaunchOptions) -> list[str]:
    work = options.workload
    if work.script is not None:
        # The runner ends a finished script with os._exit: torch 2.14.1's gloo teardown abort
        # would otherwise fail a run that did all its work (docs/scripts.md).
        return [*work.runner, work.script, *work.args]
    return ["-m", TRAINER_MODULE, *trainer_args(work, options.pg_timeout_s)]  # its run dir comes from MESHRUN_RUN_ID


def trainer_args(work: Workload, pg_timeout_s: int) -> list[str]:
    """The built-in trainer's arguments: its config, the process-group timeout, the user's overrides
    (the controller checks the same ones first: deploy/edges/trainercheck.py)."""
    config = ["--config", work.config] if work.config is not None else []
    return [*config, f"dist.timeout={pg_timeout_s}", *work.args]


SCRIPT_OUTPUT = "output"  # a --script run's own folder, on a host whose workdir is the project (script_run_dir)


def script_run_dir(run_id: str, host: str) -> str:
    """A --script run's `$MESHRUN_RUN_DIR` on a host whose workdir is the project itself, relative to it.
    There `runs/<id>/` is the controller's record (launch.json, summary.json, metrics.jsonl, events.jsonl)
    and `runs/<id>/hosts/<host>/` the agent's (train.log, exit.json, events.jsonl): a script's files
    named as those would replace them, or pass for them. Elsewhere it is `runs/<id>` (fetch brings it home)."""
    return f"{host_dir(run_id, host)}/{SCRIPT_OUTPUT}"


def agent_argv(host: Host, options: LaunchOptions, env: tuple[tuple[str, str], ...],
               torchrun: tuple[str, ...], local_python: str, generations: tuple[Generation, ...] = (),
               peers: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The host-side supervisor: own process group, pidfile, log tee, controller watchdog."""
    argv = [python_of(host, local_python), "-m", AGENT_MODULE, "run",
            "--run-id", options.run_id, "--host", host.name,
            "--heartbeat-timeout", "0" if options.detach else str(options.heartbeat_timeout_s)]
    if options.detach:
        argv.append("--detach")
    if options.workload.script is not None and host.workdir_is_project:
        argv += ["--run-dir", script_run_dir(options.run_id, host.name)]
    # The inventory's `env` may hold tokens: never on argv (`ps` shows it to every user of the
    # host). It reaches the agent as the first line of its stdin (`env_block`).
    secret = {k for k, _ in host.env}
    for key, value in env:
        if key not in secret:
            argv += ["--env", f"{key}={value}"]
    argv.append("--env-stdin")
    if generations:
        argv += ["--succession", json.dumps([g.as_json() for g in generations], separators=(",", ":"))]
    if peers:
        argv += ["--peers", json.dumps(dict(peers), separators=(",", ":"))]
    if options.detach and options.idle is not None:
        argv += ["--idle", policy_json(options.idle)]
    elif not options.detach and options.usage_every_s:  # the controller applies the rule (deploy/edges/idle.py)
        argv += ["--usage-every", f"{options.usage_every_s:g}"]
    return tuple(argv + ["--", *torchrun])


def env_block(host: Host) -> bytes:
    """The first line the controller writes to the agent's stdin: the inventory's `env` as one
    JSON object (JSON escapes newlines, so any value fits on one line)."""
    return json.dumps(dict(host.env), separators=(",", ":")).encode() + b"\n"


def agent_verb_argv(host: Host, verb: str, run_id: str | None, local_python: str,
                    grace_s: float = STOP_GRACE_S) -> list[str]:
    """`python -m meshrun.deploy.host.agent stop|status` for one host (status of all its runs when run_id is None)."""
    argv = [python_of(host, local_python), "-m", AGENT_MODULE, verb, "--host", host.name]
    if run_id is not None:
        argv += ["--run-id", run_id]
    if verb == "stop":
        argv += ["--grace", str(grace_s)]
    return argv
