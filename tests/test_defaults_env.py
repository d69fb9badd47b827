"""An inventory's `defaults: env:` reaches every host, also one with an `env:` of its own (bad-input
finding 6).

docs/security.md puts tokens in `env` "per host, or under `defaults` for every host". A host that added
`env: {NCCL_DEBUG: INFO}` to debug it lost the defaults' WANDB_API_KEY with no message: the host's map
replaced the defaults' whole. `env` is now layered key by key, the host's keys winning; every other
field a host sets still replaces the defaults' value whole, and the names meshrun or torchrun set are
refused wherever they are written. Pure: real inventory files in a tmp dir, the real loader and plan.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.selection import select_hosts
from meshrun.deploy.inventory.shown import with_path
from meshrun.deploy.run.plan import LaunchOptions, plan_launch

ENVDEF = """\
defaults:
  env: {WANDB_API_KEY: "k-123", WANDB_MODE: online}
hosts:
  gpu1: {address: 10.0.0.1}
  gpu2: {address: 10.0.0.2, env: {NCCL_DEBUG: INFO}}
  gpu3: {address: 10.0.0.3, env: {WANDB_MODE: offline, OMP_NUM_THREADS: "1"}}
  gpu4: {address: 10.0.0.4, env: {}}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return path


def test_a_hosts_env_adds_to_the_defaults_and_its_keys_win(tmp_path: Path) -> None:
    hosts = {h.name: h.env for h in load_inventory(write(tmp_path, ENVDEF)).hosts}
    assert hosts == {
        "gpu1": (("WANDB_API_KEY", "k-123"), ("WANDB_MODE", "online")),
        "gpu2": (("WANDB_API_KEY", "k-123"), ("WANDB_MODE", "online"), ("NCCL_DEBUG", "INFO")),  # was NCCL_DEBUG only
        "gpu3": (("WANDB_API_KEY", "k-123"), ("WANDB_MODE", "offline"), ("OMP_NUM_THREADS", "1")),
        "gpu4": (("WANDB_API_KEY", "k-123"), ("WANDB_MODE", "online")),
    }


def test_the_merged_env_reaches_the_launch_plan(tmp_path: Path) -> None:
    plan = plan_launch(select_hosts(load_inventory(write(tmp_path, ENVDEF)), "gpu2"), LaunchOptions("r1"), {},
                       "python3")
    env = dict(plan.hosts[0].env)
    assert (env["WANDB_API_KEY"], env["WANDB_MODE"], env["NCCL_DEBUG"]) == ("k-123", "online", "INFO")


def test_every_other_field_a_host_sets_still_replaces_the_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "defaults: {user: alice, port: 2222, gpus: [0, 1], workdir: /srv/a, site: office,\n"
                           "           env: {A: \"1\"}}\n"
                           "hosts:\n"
                           "  h1: {address: 10.0.0.1, user: bob, gpus: [3], workdir: /srv/b, site: home, env: {B: \"2\"}}\n"
                           "  h2: {address: 10.0.0.2, nproc: 4}\n")
    h1, h2 = load_inventory(path).hosts
    assert (h1.user, h1.port, h1.gpus, h1.workdir, h1.site, h1.env) == ("bob", 2222, (3,), "/srv/b", "home",
                                                                         (("A", "1"), ("B", "2")))
    assert (h2.user, h2.gpus, h2.nproc, h2.env) == ("alice", None, 4, (("A", "1"),))


def test_a_group_site_still_sits_between_the_host_and_the_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "defaults: {site: dc, env: {A: \"1\"}}\n"
                           "hosts:\n  h1: {address: 10.0.0.1, env: {B: \"2\"}}\n  h2: {address: 10.0.0.2, site: home}\n"
                           "  h3: {address: 10.0.0.3}\n"
                           "groups:\n  office: {hosts: [h1, h2], site: office}\n")
    assert [(h.name, h.site, h.env) for h in load_inventory(path).hosts] == [
        ("h1", "office", (("A", "1"), ("B", "2"))), ("h2", "home", (("A", "1"),)), ("h3", "dc", (("A", "1"),))]


def test_the_reserved_names_are_refused_in_either_map(tmp_path: Path) -> None:
    for where, line in (("defaults:\n  env: {A: \"1\", MESHRUN_SITE: x}\nhosts:\n  h1: {address: 10.0.0.1, env: {B: \"2\"}}\n", 2),
                        ("defaults:\n  env: {A: \"1\"}\nhosts:\n  h1: {address: 10.0.0.1, env: {RANK: \"0\"}}\n", 4)):
        path = write(tmp_path, where)
        with pytest.raises(InputError) as info:
            load_inventory(path)
        assert str(info.value).startswith(with_path("", path, f":{line}: ")) and info.value.exit_code == 2


def test_a_defaults_gpu_variable_now_meets_a_hosts_gpus_on_every_host(tmp_path: Path) -> None:
    """The defaults' CUDA_VISIBLE_DEVICES beside a host's `gpus:` was dropped, unsaid, only when that host had an
    `env:` of its own; it now reaches that host too, so the plan's refusal (reservedenv.gpus_conflict) applies."""
    path = write(tmp_path, "defaults:\n  env: {CUDA_VISIBLE_DEVICES: \"2,3\"}\n"
                           "hosts:\n  gpu1: {address: 10.0.0.1, gpus: [0, 1], env: {NCCL_DEBUG: INFO}}\n")
    with pytest.raises(InputError) as info:
        plan_launch(select_hosts(load_inventory(path), None), LaunchOptions("r1"), {}, "python3")
    assert str(info.value).startswith("host 'gpu1', field 'env.CUDA_VISIBLE_DEVICES': `env:` sets "
                                      "CUDA_VISIBLE_DEVICES, and `gpus:`")
