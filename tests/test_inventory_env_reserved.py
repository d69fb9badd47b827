"""An inventory's `env:` may not set what meshrun or torchrun set for each rank (the first-run review,
finding F5; stop51 finding 1).

The inventory's env reaches torchrun last and wins: `CUDA_VISIBLE_DEVICES: "2,3"` beside `gpus: [0, 1]`
trained on GPU 2 under `--hosts gpu1:1`, while the pre-flight had checked GPU 1, and nothing was said.
meshrun's and torchrun's own names are refused at load, in one line naming the file, the line, the host
and the field; CUDA_VISIBLE_DEVICES only beside `gpus:` (or a `--hosts` GPU list), by the
plan: without it they are the only way to name a MIG slice, a GPU UUID or none. Names meshrun sets but
documents as the user's to override (TQDM_MININTERVAL, NCCL_SOCKET_IFNAME), and torchrun's agent
settings, still pass. Pure: real inventory files in a tmp dir, and the real `meshrun` command for the
exit status."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory import reservedenv
from meshrun.deploy.inventory.selection import select_hosts
from meshrun.deploy.run.plan import LaunchOptions, plan_launch
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.shown import with_path

MESHRUN = str(Path(sys.executable).parent / "meshrun")


def inventory(tmp_path: Path, env: str, where: str = "host") -> Path:
    path = tmp_path / "hosts.yaml"
    if where == "host":
        path.write_text(f"hosts:\n  gpu1:\n    address: 10.147.17.11\n    gpus: [0, 1]\n    env: {{{env}}}\n")
    else:
        path.write_text(f"defaults:\n  env: {{{env}}}\nhosts:\n  gpu1: {{address: 10.147.17.11, gpus: [0, 1]}}\n")
    return path


def refusal(path: Path) -> str:
    with pytest.raises(InputError) as info:
        load_inventory(path)
    return str(info.value)


def plan_error(path: Path, hosts: str | None = None) -> str:
    selection = select_hosts(load_inventory(path), hosts)
    with pytest.raises(InputError) as info:
        plan_launch(selection, LaunchOptions("r1"), {}, "python3")
    return str(info.value)


def test_cuda_visible_devices_beside_gpus_is_refused_naming_host_and_field(tmp_path: Path) -> None:
    path = inventory(tmp_path, 'CUDA_VISIBLE_DEVICES: "2,3"')
    assert plan_error(path) == ("host 'gpu1', field 'env.CUDA_VISIBLE_DEVICES': `env:` sets CUDA_VISIBLE_DEVICES, "
                                "and `gpus:` (or `--hosts gpu1:...`) selects GPUs 0, 1, from which meshrun sets it; "
                                "list the GPUs in `gpus:` only, here `gpus: [2, 3]`; or remove `gpus:` (and the "
                                "--hosts GPU list) to keep the env value")
    # CUDA_DEVICE_ORDER beside gpus: stays the user's override, as tests/test_gpu_order.py holds.
    path = inventory(tmp_path, 'CUDA_DEVICE_ORDER: "FASTEST_FIRST"', where="defaults")
    plan = plan_launch(select_hosts(load_inventory(path), None), LaunchOptions("r1"), {}, "python3")
    assert dict(plan.hosts[0].env)["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


MIG = "MIG-4b1a2c3d-0000-5555-aaaa-0123456789ab"


def test_without_gpus_the_env_names_the_gpus_meshrun_cannot(tmp_path: Path) -> None:
    """A MIG slice or a GPU UUID (`gpus:` takes indices only), `""` to keep a GPU host on CPU: meshrun
    sets neither name without `gpus:`, so the inventory's value is what the ranks get."""
    path = tmp_path / "hosts.yaml"
    path.write_text(f"defaults:\n  env: {{CUDA_VISIBLE_DEVICES: \"{MIG}\"}}\nhosts:\n"
                    "  gpu1: {address: 10.147.17.11}\n"
                    "  old: {address: 10.147.17.12, nproc: 2, env: {CUDA_VISIBLE_DEVICES: \"\"}}\n")
    plan = plan_launch(select_hosts(load_inventory(path), None), LaunchOptions("r1"), {}, "python3")
    assert [dict(h.env)["CUDA_VISIBLE_DEVICES"] for h in plan.hosts] == [MIG, ""]
    assert all("CUDA_DEVICE_ORDER" not in dict(h.env) for h in plan.hosts)
    # A GPU list on the command line selects GPUs too: the env value would beat it, so it is refused.
    assert plan_error(path, "gpu1:1").startswith("host 'gpu1', field 'env.CUDA_VISIBLE_DEVICES': `env:` sets "
                                                  "CUDA_VISIBLE_DEVICES, and `gpus:` (or `--hosts gpu1:...`) selects "
                                                  "GPU 1, from which meshrun sets it; keep `gpus:` and remove")


@pytest.mark.parametrize("name, problem, fix", [
    ("MESHRUN_BATCH_SIZE", "MESHRUN_BATCH_SIZE is meshrun's to set from `batch_size:`",
     "remove it and set `batch_size:`"),
    ("MESHRUN_SITE", "MESHRUN_SITE is meshrun's to set from `site:`", "remove it and set `site:`"),
    ("MESHRUN_NOTIFY", "MESHRUN_NOTIFY is meshrun's to set from `notify:`", "remove it and set `notify:`"),
    ("MESHRUN_RUN_DIR", "MESHRUN_RUN_DIR is meshrun's to set",
     "remove it (docs/scripts.md lists what each rank is given)"),
    ("MESHRUN_RUN_ID", "MESHRUN_RUN_ID is meshrun's to set",
     "remove it (docs/scripts.md lists what each rank is given)"),
    *[(name, f"{name} is torchrun's to set for each worker, over any value given",
       "remove it: the hosts, `gpus:`/`nproc:` and `rendezvous:` decide the world")
      for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                   "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE",
                   "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                   "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE")],
])
def test_each_name_meshrun_or_torchrun_sets_is_refused_in_one_line(tmp_path: Path, name: str, problem: str,
                                                                   fix: str) -> None:
    path = inventory(tmp_path, f'OMP_NUM_THREADS: "1", {name}: "4"')
    assert refusal(path) == with_path("", path, f":5: host 'gpu1', field 'env.{name}': {problem}; {fix}")


def test_the_users_own_and_overridable_names_still_pass(tmp_path: Path) -> None:
    env = 'OMP_NUM_THREADS: "1", NCCL_SOCKET_IFNAME: "=eth1", TQDM_MININTERVAL: "1", rank: "x", MY_RANK: "0"'
    host = load_inventory(inventory(tmp_path, env)).host("gpu1")
    assert host.env == (("OMP_NUM_THREADS", "1"), ("NCCL_SOCKET_IFNAME", "=eth1"), ("TQDM_MININTERVAL", "1"),
                        ("rank", "x"), ("MY_RANK", "0"))


ELASTIC = Path(importlib.util.find_spec("torch").origin).parent / "distributed/elastic"  # read, never imported
AGENT_SETTINGS = ("TORCHELASTIC_ENABLE_FILE_TIMER", "TORCHELASTIC_TIMER_FILE", "TORCHELASTIC_HEALTH_CHECK_PORT",
                  "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT")


def test_torchruns_agent_settings_pass_to_torchrun(tmp_path: Path) -> None:
    """torchrun's agent reads these from its own environment (the one `env:` gives) and sets none for its
    workers (torch/distributed/elastic/agent/server/local_elastic_agent.py): they are the user's."""
    env = ", ".join(f'{name}: "1"' for name in AGENT_SETTINGS)
    host = load_inventory(inventory(tmp_path, env)).host("gpu1")
    assert host.env == tuple((name, "1") for name in AGENT_SETTINGS)
    torchrun_sets = set()  # what torch's agent writes into each worker's environment, read from its source
    for name in ("agent/server/local_elastic_agent.py", "multiprocessing/api.py"):
        source = (ELASTIC / name).read_text()
        torchrun_sets |= set(re.findall(r'(?:"|\[")(TORCHELASTIC_[A-Z_]+)"\]? ?[:=]', source))
    assert torchrun_sets and torchrun_sets <= reservedenv.TORCHRUN_NAMES
    assert not set(AGENT_SETTINGS) & reservedenv.TORCHRUN_NAMES


def test_the_command_exits_2_with_the_line_and_no_traceback(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    path = inventory(tmp_path, 'MESHRUN_SITE: "office"')
    env = {k: v for k, v in os.environ.items() if k != "MESHRUN_INVENTORY"} | {"MESHRUN_SSH_CONFIG": os.devnull}
    done = subprocess.run([MESHRUN, "check-network", "--inventory", str(path)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert "field 'env.MESHRUN_SITE': MESHRUN_SITE is meshrun's to set from `site:`" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_fab_train_refuses_the_gpu_conflict_before_any_host_is_contacted(tmp_path: Path) -> None:
    """gpu1's address is TEST-NET's: had train connected first, it would spend the connect timeout and
    name the host unreachable. The conflict is the one line, at once."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    path = tmp_path / "hosts.yaml"
    path.write_text('hosts:\n  gpu1:\n    address: 192.0.2.11\n    gpus: [0, 1]\n    env: {CUDA_VISIBLE_DEVICES: "2,3"}\n')
    env = {k: v for k, v in os.environ.items() if k != "MESHRUN_INVENTORY"} | {"MESHRUN_SSH_CONFIG": os.devnull}
    done = subprocess.run([MESHRUN, "train", "--inventory", str(path), "--hosts", "gpu1", "--skip-checks"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: host 'gpu1', field 'env.CUDA_VISIBLE_DEVICES': `env:` sets CUDA_VISIBLE_DEVICES, and `gpus:` (or "
        "`--hosts gpu1:...`) selects GPUs 0, 1, from which meshrun sets it; list the GPUs in `gpus:` only, here "
        "`gpus: [2, 3]`; or remove `gpus:` (and the --hosts GPU list) to keep the env value"], done.stderr
