"""An inventory's `env:` may not set what meshrun or torchrun set for each rank (the first-run review,
finding F5).

The inventory's env reaches torchrun last and wins: `CUDA_VISIBLE_DEVICES: "2,3"` beside `gpus: [0, 1]`
trained on GPU 2 under `--hosts gpu1:1`, while the pre-flight had checked GPU 1, and nothing was said.
Such names are refused at load, in one line naming the file, the line, the host and the field. Names
meshrun sets but documents as the user's to override (TQDM_MININTERVAL, NCCL_SOCKET_IFNAME) still pass.
Pure: real inventory files in a tmp dir, and the real `meshrun` command for the exit status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshrun.deploy.errors import InputError
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


def test_cuda_visible_devices_is_refused_naming_file_line_host_and_field(tmp_path: Path) -> None:
    path = inventory(tmp_path, 'CUDA_VISIBLE_DEVICES: "2,3"')
    assert refusal(path) == with_path("", path, ":5: host 'gpu1', field 'env.CUDA_VISIBLE_DEVICES': "
                                      "CUDA_VISIBLE_DEVICES is meshrun's to set from `gpus:`; remove it and list the "
                                      "GPUs in `gpus:`, here `gpus: [2, 3]`")
    path = inventory(tmp_path, 'CUDA_VISIBLE_DEVICES: "GPU-5c1d"', where="defaults")  # a UUID: no list to offer
    assert refusal(path) == with_path("", path, ":2: field 'env.CUDA_VISIBLE_DEVICES': CUDA_VISIBLE_DEVICES is "
                                      "meshrun's to set from `gpus:`; remove it and list the GPUs in `gpus:`")


@pytest.mark.parametrize("name, problem, fix", [
    ("CUDA_DEVICE_ORDER", "CUDA_DEVICE_ORDER is meshrun's to set with `gpus:` (PCI_BUS_ID: nvidia-smi's numbering, "
                          "the one `gpus:` uses)", "remove it and list the GPUs in `gpus:` by their nvidia-smi index"),
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
                   "GROUP_RANK", "TORCHELASTIC_RESTART_COUNT")],
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


def test_the_command_exits_2_with_the_line_and_no_traceback(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    path = inventory(tmp_path, 'CUDA_VISIBLE_DEVICES: "2,3"')
    env = {k: v for k, v in os.environ.items() if k != "MESHRUN_INVENTORY"} | {"MESHRUN_SSH_CONFIG": os.devnull}
    done = subprocess.run([MESHRUN, "check-network", "--inventory", str(path)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert "field 'env.CUDA_VISIBLE_DEVICES': CUDA_VISIBLE_DEVICES is meshrun's to set from `gpus:`" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
