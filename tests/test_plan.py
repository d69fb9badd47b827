"""Launch planning is pure: exact argv and env per host, including hostile inventory values."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from meshrun.idlerule import IdlePolicy, parse_policy, policy_json
from meshrun.layout import generation_rdzv_id, launch_rdzv_id
from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.model import ElasticBounds, Host, Network, Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.run.plan import LaunchOptions, Workload, at_generation, env_block, plan_launch
from meshrun.deploy.run.shell import remote_command, shell_path

PY = "/venv/bin/python"


def host(name: str, address: str, **kw: object) -> Host:
    base = dict(ssh_address=None, user="root", port=22, identity=None, python=PY, workdir="~/meshrun",
                network=Network.WIREGUARD, gpus=None, nproc=None, batch_size=None, env=())
    base.update(kw)
    return Host(name, address, **base)  # type: ignore[arg-type]


HOSTILE = ["a b", "it's", 'say "hi"', "$(touch /tmp/pwned)", "`id`", "x; rm -rf /", "line1\nline2", "$HOME", "*", "\\"]


def test_two_gpu_hosts_exact_plan() -> None:
    hosts = (host("gpu1", "10.147.17.11", gpus=(0, 1)), host("gpu2", "10.147.17.12", gpus=(1,), batch_size=32,
                                                          env=(("OMP_NUM_THREADS", "1"),)))
    plan = plan_launch(Selection(hosts, Rendezvous("gpu1", 29400)), LaunchOptions("r1", Workload(args=("epochs=3",))),
                       {"gpu1": "ztabc", "gpu2": "ztabc"}, "/local/python")
    assert plan.rdzv_endpoint == "10.147.17.11:29400" and plan.world_size == 3
    gpu1, gpu2 = plan.hosts
    assert gpu1.is_rendezvous_host and not gpu2.is_rendezvous_host
    assert gpu1.env == (
        ("MESHRUN_RUN_ID", "r1"), ("MESHRUN_HOST", "gpu1"), ("PYTHONUNBUFFERED", "1"),
        ("CUDA_VISIBLE_DEVICES", "0,1"), ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"), ("NCCL_SOCKET_IFNAME", "=ztabc"),
        ("GLOO_SOCKET_IFNAME", "ztabc"), ("NCCL_IB_DISABLE", "1"),
    )
    assert gpu2.env == (
        ("MESHRUN_RUN_ID", "r1"), ("MESHRUN_HOST", "gpu2"), ("PYTHONUNBUFFERED", "1"),
        ("CUDA_VISIBLE_DEVICES", "1"), ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"), ("NCCL_SOCKET_IFNAME", "=ztabc"),
        ("GLOO_SOCKET_IFNAME", "ztabc"), ("NCCL_IB_DISABLE", "1"), ("MESHRUN_BATCH_SIZE", "32"),
        ("OMP_NUM_THREADS", "1"),
    )
    assert gpu1.torchrun == (
        PY, "-m", "meshrun.deploy.host.torchrun", "--meshrun-rdzv-host", "gpu1", "--nnodes", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.147.17.11:29400", "--rdzv-id", "r1", "--rdzv-conf", "is_host=1",
        "--local-addr", "10.147.17.11", "--nproc-per-node", "2", "--max-restarts", "0",
        "--log-dir", "runs/r1/hosts/gpu1/torchrun", "--tee", "3", "--log-line-prefix-template", "[gpu1:${rank}] ",
        "-m", "meshrun.train", "dist.timeout=60", "epochs=3",
    )
    assert gpu2.torchrun == (
        PY, "-m", "meshrun.deploy.host.torchrun", "--meshrun-rdzv-host", "gpu1", "--nnodes", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.147.17.11:29400", "--rdzv-id", "r1",
        "--local-addr", "10.147.17.12", "--nproc-per-node", "1", "--max-restarts", "0",
        "--log-dir", "runs/r1/hosts/gpu2/torchrun", "--tee", "3", "--log-line-prefix-template", "[gpu2:${rank}] ",
        "-m", "meshrun.train", "dist.timeout=60", "epochs=3",
    )
    # The inventory's env (OMP_NUM_THREADS here) is not on argv: it goes on stdin (env_block).
    env_flags = [a for pair in gpu2.env if pair[0] != "OMP_NUM_THREADS" for a in ("--env", f"{pair[0]}={pair[1]}")]
    assert gpu2.agent == (PY, "-m", "meshrun.deploy.host.agent", "run", "--run-id", "r1", "--host", "gpu2",
                          "--heartbeat-timeout", "30", *env_flags, "--env-stdin", "--", *gpu2.torchrun)
    assert env_block(gpu2.host) == b'{"OMP_NUM_THREADS":"1"}\n'


def test_local_default_is_standalone_with_controller_python() -> None:
    local = host("local", "local", python=None, nproc=2, network=Network.LAN, workdir=".")
    plan = plan_launch(Selection((local,), Rendezvous(None)), LaunchOptions("r2"), {}, "/local/python")
    (only,) = plan.hosts
    assert plan.rdzv_endpoint == "standalone"
    assert only.torchrun == (
        "/local/python", "-m", "meshrun.deploy.host.torchrun", "--standalone", "--nnodes", "1",
        "--nproc-per-node", "2", "--max-restarts", "0", "--log-dir", "runs/r2/hosts/local/torchrun", "--tee", "3",
        "--log-line-prefix-template", "[local:${rank}] ", "-m", "meshrun.train", "dist.timeout=60",
    )
    assert ("NCCL_IB_DISABLE", "1") not in only.env and ("GLOO_SOCKET_IFNAME", "lo") not in only.env


def test_elastic_and_script_workload() -> None:
    hosts = (host("a", "10.0.0.1", network=Network.LAN), host("b", "10.0.0.2", network=Network.LAN))
    options = LaunchOptions("r3", Workload(script="examples/seed_main.py", args=("--epochs", "2")), pg_timeout_s=30,
                            elastic=ElasticBounds(1, 2))
    plan = plan_launch(Selection(hosts, Rendezvous(None, 29500)), options, {"a": "eth0", "b": "eth0"}, "/p")
    a, b = plan.hosts
    assert a.torchrun[1:5] == ("-m", "meshrun.deploy.host.torchrun", "--meshrun-rdzv-host", "a")
    assert a.torchrun[5:17] == ("--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29500",
                                "--rdzv-id", "r3", "--rdzv-conf",
                                "is_host=1,join_timeout=120,last_call_timeout=5,close_timeout=10,keep_alive_interval=2,"
                                "keep_alive_max_attempt=3", "--local-addr",
                                "10.0.0.1")
    assert "--rdzv-conf" in b.torchrun and "is_host=1" not in " ".join(b.torchrun)
    assert a.torchrun[a.torchrun.index("--max-restarts") + 1] == "10"
    assert a.torchrun[-5:] == ("-m", "meshrun.deploy.host.runscript", "examples/seed_main.py", "--epochs", "2")
    probe = plan_launch(Selection(hosts, Rendezvous(None, 29500)),
                        LaunchOptions("r4", Workload(script="runs/r4/probe.py", args=("30",),
                                                     runner=("runs/r4/runscript.py",)),
                                      launcher=("runs/r4/meshrun_torchrun.py",)), {}, "/p")
    assert probe.hosts[0].torchrun[-3:] == ("runs/r4/runscript.py", "runs/r4/probe.py", "30")
    assert probe.hosts[1].torchrun[1:4] == ("runs/r4/meshrun_torchrun.py", "--meshrun-rdzv-host", "a")
    assert ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1") in a.env
    assert not any(k == "MESHRUN_PG_TIMEOUT" for k, _ in a.env)  # the timeout reaches the trainer in argv only
    assert ("NCCL_IB_DISABLE", "1") not in a.env  # a LAN may have InfiniBand


def test_local_host_cannot_join_multi_host_run() -> None:
    hosts = (host("a", "10.0.0.1"), host("me", "local"))
    with pytest.raises(InputError, match="host 'me' has `address: local`"):
        plan_launch(Selection(hosts, Rendezvous(None)), LaunchOptions("r"), {}, "/p")


def test_rendezvous_host_must_be_selected() -> None:
    with pytest.raises(InputError) as info:
        plan_launch(Selection((host("a", "10.0.0.1"),), Rendezvous("b")), LaunchOptions("r"), {}, "/p")
    assert str(info.value) == ("rendezvous host 'b' is not among the selected hosts (a); "
                               "add it to --hosts or change `rendezvous.host`")


def test_hostile_values_stay_literal_in_plan() -> None:
    evil_env = tuple((f"V{i}", v) for i, v in enumerate(HOSTILE))
    h = host("a", "10.0.0.1", env=evil_env, python="/opt/my env/python")
    plan = plan_launch(Selection((h, host("b", "10.0.0.2")), Rendezvous(None)), LaunchOptions("r", Workload(args=tuple(HOSTILE))),
                       {}, "/p")
    launch = plan.hosts[0]
    assert launch.torchrun[-len(HOSTILE):] == tuple(HOSTILE)
    # Inventory env values (tokens) never reach argv; they round-trip through the stdin line.
    head = launch.agent[:launch.agent.index("--")]
    assert "--env-stdin" in head and not [a for a in head if a.startswith("V") and "=" in a]
    assert json.loads(env_block(h)) == dict(evil_env) and env_block(h).count(b"\n") == 1


@pytest.mark.parametrize("workdir", ["~/meshrun", "/tmp/x y", "~"])
def test_remote_command_round_trips_hostile_argv_through_a_real_shell(tmp_path: Path, workdir: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The SSH string is run by `sh -c`, as sshd does; the program must see the exact argv."""
    home = tmp_path / "home"
    (home / "meshrun").mkdir(parents=True)
    if workdir.startswith("/"):
        Path(workdir).mkdir(parents=True, exist_ok=True)
    marker = tmp_path / "pwned"
    hostile = [*HOSTILE, f"$(touch {marker})", f"; touch {marker}"]
    argv = [sys.executable, "-c", "import json, os, sys; print(json.dumps([os.getcwd(), *sys.argv[1:]]))", *hostile]
    out = subprocess.run(["sh", "-c", remote_command(workdir, argv)], env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout
    cwd, *seen = json.loads(out)
    assert seen == hostile
    assert not marker.exists()
    expected = {"~/meshrun": home / "meshrun", "~": home}.get(workdir, Path(workdir))
    assert Path(cwd) == expected


def test_shell_path() -> None:
    assert shell_path("~/a b") == "\"$HOME\"/'a b'"
    assert shell_path("~") == '"$HOME"'
    assert shell_path("/x/$(y)") == "'/x/$(y)'"
    assert remote_command("~/w", ["~/v/bin/python", "-m", "x"], create_workdir=True) == (
        "mkdir -p \"$HOME\"/w && cd \"$HOME\"/w && exec \"$HOME\"/v/bin/python -m x")


def test_gpu_override_replaces_nproc() -> None:
    h = dataclasses.replace(host("a", "local", nproc=4, network=Network.LAN), gpus=(2, 3), nproc=None)
    plan = plan_launch(Selection((h,), Rendezvous(None)), LaunchOptions("r"), {}, "/p")
    assert ("CUDA_VISIBLE_DEVICES", "2,3") in plan.hosts[0].env and plan.world_size == 2


def test_elastic_plan_carries_the_rendezvous_succession() -> None:
    """Every host gets the same order (rendezvous host first, then selection order) and, per
    generation, its torchrun for that host's store with a fresh rendezvous id."""
    hosts = (host("a", "10.0.0.1", network=Network.LAN), host("b", "10.0.0.2", network=Network.LAN),
             host("c", "10.0.0.3", network=Network.LAN))
    options = LaunchOptions("r5", elastic=ElasticBounds(2, 3))
    plan = plan_launch(Selection(hosts, Rendezvous("b", 29400)), options, {}, "/p")
    c = plan.hosts[2]
    assert [(g.head, g.endpoint) for g in c.generations] == [("b", "10.0.0.2:29400"), ("a", "10.0.0.1:29400"),
                                                             ("c", "10.0.0.3:29400")]
    assert c.generations[0].torchrun == c.torchrun
    gen2 = c.generations[2].torchrun
    assert gen2[gen2.index("--rdzv-endpoint") + 1] == "10.0.0.3:29400"
    assert gen2[gen2.index("--rdzv-id") + 1] == "r5-g2"
    assert gen2[gen2.index("--rdzv-conf") + 1].startswith("is_host=1,")  # c hosts generation 2
    assert gen2[3:5] == ("--meshrun-rdzv-host", "c")  # named in a refused state's message
    assert not c.generations[1].torchrun[c.generations[1].torchrun.index("--rdzv-conf") + 1].startswith("is_host")
    succession = json.loads(c.agent[c.agent.index("--succession") + 1])
    assert succession == [g.as_json() for g in c.generations]
    assert c.agent[c.agent.index("--") + 1:] == c.torchrun
    fixed = plan_launch(Selection(hosts, Rendezvous("b", 29400)), LaunchOptions("r6"), {}, "/p")
    assert all(h.generations == () and "--succession" not in h.agent for h in fixed.hosts)


def test_a_joiner_starts_at_the_current_generation() -> None:
    """`fab join` and a host coming back after a succession: the agent starts where the others are,
    with the same succession and torchrun; generation 0 and fixed-size runs are left as planned."""
    hosts = (host("a", "10.0.0.1", network=Network.LAN), host("b", "10.0.0.2", network=Network.LAN))
    plan = plan_launch(Selection(hosts, Rendezvous("a", 29400)), LaunchOptions("r7", elastic=ElasticBounds(1, 2)),
                       {}, "/p")
    b = plan.hosts[1]
    moved = at_generation(b, 1)
    at = b.agent.index("--")
    assert moved.agent == (*b.agent[:at], "--generation", "1", *b.agent[at:])
    assert dataclasses.replace(moved, agent=b.agent) == b
    assert at_generation(b, 0) == b
    assert at_generation(b, 10**9) == moved  # a member's agent cannot send the joiner past the last host
    fixed = plan_launch(Selection(hosts, Rendezvous("a", 29400)), LaunchOptions("r8"), {}, "/p").hosts[1]
    assert at_generation(fixed, 2) == fixed


def test_detached_elastic_agents_get_their_peers_sshd_on_the_training_address() -> None:
    """Detached elastic runs only (attached ones have the controller's probe): every other host,
    at its inventory port when SSH goes to the training address, else 22."""
    hosts = (host("a", "10.0.0.1", network=Network.LAN, port=2222),
             host("b", "10.0.0.2", network=Network.LAN, ssh_address="203.0.113.9", port=2200),
             host("c", "10.0.0.3", network=Network.LAN, ssh_address="10.0.0.3", port=None))
    selection = Selection(hosts, Rendezvous("a", 29400))
    detached = plan_launch(selection, LaunchOptions("r9", elastic=ElasticBounds(2, 3), detach=True), {}, "/p")
    a = detached.hosts[0].agent
    assert json.loads(a[a.index("--peers") + 1]) == {"b": "10.0.0.2:22", "c": "10.0.0.3:22"}
    c = detached.hosts[2].agent
    assert json.loads(c[c.index("--peers") + 1]) == {"a": "10.0.0.1:2222", "b": "10.0.0.2:22"}
    attached = plan_launch(selection, LaunchOptions("r9", elastic=ElasticBounds(2, 3)), {}, "/p")
    fixed = plan_launch(selection, LaunchOptions("r9", detach=True), {}, "/p")
    assert all("--peers" not in h.agent for h in (*attached.hosts, *fixed.hosts))


def test_generation_rendezvous_ids_round_trip() -> None:
    assert generation_rdzv_id("run-1", 0) == "run-1"
    assert generation_rdzv_id("run-1", 3) == "run-1-g3"
    assert launch_rdzv_id("run-1-g3") == "run-1"
    assert launch_rdzv_id("run-1") == "run-1"
    assert launch_rdzv_id("20261130-120000-ab12-gx") == "20261130-120000-ab12-gx"
    assert launch_rdzv_id("r-g١") == "r-g١"  # a non-ASCII digit is not a generation


def test_detached_agents_get_the_idle_rule_and_attached_ones_do_not() -> None:
    """A detached run's agents apply the idle policy to their own host (deploy/host/idle.py); an
    attached run's controller does, so its agents get none: they send their host's usage."""
    selection = Selection((host("a", "10.0.0.1", network=Network.LAN),), Rendezvous("a", 29400))
    policy = IdlePolicy(0.25, 180.0, 600.0)
    detached = plan_launch(selection, LaunchOptions("r9", detach=True, idle=policy), {}, "/p").hosts[0].agent
    given = detached[detached.index("--idle") + 1]
    assert given == '{"threshold":0.25,"warn_s":180.0,"stop_s":600.0}' and parse_policy(given) == policy
    assert parse_policy(policy_json(IdlePolicy())) == IdlePolicy()  # stop_s None survives
    attached = plan_launch(selection, LaunchOptions("r9", idle=policy), {}, "/p").hosts[0].agent
    assert "--idle" not in attached and detached.index("--idle") < detached.index("--")
    # Attached: the agents only sample, every policy.sample_s, and send it (deploy/host/idle.py UsageFeed).
    assert policy.sample_s == 10.0 and "--usage-every" not in attached + detached
    feeding = plan_launch(selection, LaunchOptions("r9", usage_every_s=policy.sample_s), {}, "/p").hosts[0].agent
    assert feeding[feeding.index("--usage-every") + 1] == "10" and feeding.index("--usage-every") < feeding.index("--")
    assert "--usage-every" not in plan_launch(selection, LaunchOptions("r9", detach=True, usage_every_s=10.0),
                                              {}, "/p").hosts[0].agent
