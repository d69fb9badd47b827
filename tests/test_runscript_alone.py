"""deploy/host/runscript.py under WORLD_SIZE > 1: a rank whose script never called
`torch.distributed.init_process_group` (nor `mp.spawn`, whose children may) ends with one line on
stderr saying it trained alone, and its exit status stays the script's.

Real runner processes, started as torchrun starts them (tests/runscript_harness.py), with torchrun's
RANK/WORLD_SIZE set by hand. Most scripts import a stand-in `torch` package written next to them
(`sys.path[0]` is the script's folder), which holds the shapes the runner's wrappers meet in the real one:
the function re-exported by the package, and bound by name in a module the package imports (as
`torch.distributed.device_mesh` does). One test imports the real torch and initializes a process group.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.runscript_harness import REPO, argv, env, write

ALONE = ('meshrun: rank 1 of 2 never called torch.distributed.init_process_group: it trained alone '
         '(docs/scripts.md, "Scripts written for mp.spawn")\n')

FAKE_TORCH = {
    "torch/__init__.py": "from torch import distributed, multiprocessing  # the real torch imports both\n",
    "torch/distributed/__init__.py": """\
        from torch.distributed.c10d import init_process_group
        from torch.distributed import mesh  # binds init_process_group by name while this package imports
    """,
    "torch/distributed/c10d.py": """\
        def init_process_group(backend=None, **kwargs):
            '''The stand-in's docstring.'''
            return ("joined", backend, kwargs)
    """,
    "torch/distributed/mesh.py": """\
        from torch.distributed.c10d import init_process_group

        def init_mesh():
            return init_process_group("mesh")
    """,
    "torch/multiprocessing/__init__.py": "from torch.multiprocessing.spawn import spawn, start_processes\n",
    "torch/multiprocessing/spawn.py": """\
        def start_processes(fn, args=(), nprocs=1):
            for i in range(nprocs):  # in this process: the stand-in only has to be called
                fn(i, *args)

        def spawn(fn, args=(), nprocs=1):
            return start_processes(fn, args, nprocs)
    """,
}


def ranks_env(world: str | None) -> dict[str, str]:
    """The harness's environment as one rank of `world` sees it; never a recorded start (no LOCAL_RANK 0)."""
    base = {k: v for k, v in env().items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MESHRUN_RUN_ID",
                                                        "TORCHELASTIC_RUN_ID")}
    return base | ({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": world} if world is not None else {})


def run_rank(script: Path, world: str | None = "2") -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv(script, runner=True), cwd=REPO, env=ranks_env(world), capture_output=True,
                          text=True, timeout=120)


def with_fake_torch(folder: Path, source: str) -> Path:
    for name, text in FAKE_TORCH.items():
        write(folder / name, text)
    return write(folder / "main.py", source)


def test_a_rank_that_never_inits_says_it_trained_alone_and_keeps_status_0(tmp_path: Path) -> None:
    script = write(tmp_path / "alone.py", """\
        import os
        print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "trains alone")
    """)
    done = run_rank(script)
    assert (done.returncode, done.stdout, done.stderr) == (0, "rank 1 of 2 trains alone\n", ALONE)


@pytest.mark.parametrize("world", [None, "1"])
def test_a_world_of_one_says_nothing(tmp_path: Path, world: str | None) -> None:
    script = write(tmp_path / "alone.py", "print('alone, as asked')\n")
    done = run_rank(script, world)
    assert (done.returncode, done.stdout, done.stderr) == (0, "alone, as asked\n", "")


@pytest.mark.parametrize(("source", "status", "stderr"), [
    ("import sys; sys.exit(3)\n", 3, ""),
    ("import sys; sys.exit('bad --data')\n", 1, "bad --data\n"),
])
def test_a_rank_that_failed_is_not_said_to_have_trained(tmp_path: Path, source: str, status: int,
                                                        stderr: str) -> None:
    done = run_rank(write(tmp_path / "fails.py", source))
    assert (done.returncode, done.stderr) == (status, stderr)


def test_a_script_importing_torch_without_joining_is_named(tmp_path: Path) -> None:
    done = run_rank(with_fake_torch(tmp_path, "import torch\nimport torch.distributed as dist\nprint('alone')\n"))
    assert (done.returncode, done.stdout, done.stderr) == (0, "alone\n", ALONE)


@pytest.mark.parametrize("call", [
    "print(dist.init_process_group('gloo', timeout=5))",
    "from torch.distributed import init_process_group\nprint(init_process_group('gloo', timeout=5))",
    "import torch.distributed.mesh as mesh\nprint(mesh.init_mesh())",  # bound before the package finished
    "import torch.multiprocessing as mp\nmp.spawn(print, nprocs=1)",  # its children would join
])
def test_a_script_that_joins_or_spawns_says_nothing_and_gets_what_torch_returns(tmp_path: Path, call: str) -> None:
    source = f"import torch.distributed as dist\n{call}\n"
    done = run_rank(with_fake_torch(tmp_path, source))
    plain = subprocess.run(argv(tmp_path / "main.py", runner=False), cwd=REPO, env=ranks_env("2"),
                           capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == plain.stdout != ""


def test_the_wrapped_module_keeps_its_loader_and_the_function_its_name(tmp_path: Path) -> None:
    done = run_rank(with_fake_torch(tmp_path, """\
        import torch.distributed as dist
        loader = dist.__spec__.loader
        print(type(loader).__name__, loader is dist.__loader__, "exec_module" in vars(loader))
        f = dist.init_process_group
        print(f.__name__, f.__doc__, f is dist.c10d.init_process_group is dist.mesh.init_process_group)
    """))
    assert (done.returncode, done.stderr) == (0, ALONE)
    assert done.stdout == "SourceFileLoader True False\ninit_process_group The stand-in's docstring. True\n"


def test_a_real_torch_script_that_inits_a_group_says_nothing(tmp_path: Path) -> None:
    script = write(tmp_path / "joins.py", """\
        import torch.distributed as dist

        # A group of one from an in-memory store: no rendezvous, whatever WORLD_SIZE says.
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        dist.destroy_process_group()  # the end sees no live group: only the wrapper can tell
        print("joined")
    """)
    done = run_rank(script)
    assert (done.returncode, done.stdout) == (0, "joined\n")
    assert "meshrun:" not in done.stderr, done.stderr


@pytest.mark.parametrize("start", [
    "multiprocessing.Process(target=rank, args=(0,))",  # the ranks started by the script: they may join
    "multiprocessing.get_context('spawn').Process(target=rank, args=(0,))",
])
def test_a_script_that_starts_its_ranks_as_processes_is_not_judged(tmp_path: Path, start: str) -> None:
    """A rank that starts processes (torch.multiprocessing.Process or a Pool, PyTorch's tutorial way) may
    have them join: its own calls say nothing of theirs (deploy/host/alonewatch.py)."""
    done = run_rank(write(tmp_path / "starts.py", f"""\
        import multiprocessing

        def rank(i):
            print("child", i, flush=True)

        if __name__ == "__main__":
            child = {start}
            child.start()
            child.join()
    """))
    assert (done.returncode, done.stdout, done.stderr) == (0, "child 0\n", "")


def test_a_dataloaders_workers_are_no_ranks(tmp_path: Path) -> None:
    """A process whose target is torch's DataLoader worker loop is no rank: the script still trained alone."""
    write(tmp_path / "torch/utils/data/_utils/worker.py", "def _worker_loop(i):\n    print('worker', i, flush=True)\n")
    for package in ("torch/utils", "torch/utils/data", "torch/utils/data/_utils"):
        write(tmp_path / package / "__init__.py", "")
    done = run_rank(with_fake_torch(tmp_path, """\
        import multiprocessing
        from torch.utils.data._utils.worker import _worker_loop

        if __name__ == "__main__":
            worker = multiprocessing.Process(target=_worker_loop, args=(0,))
            worker.start()
            worker.join()
    """))
    assert (done.returncode, done.stdout, done.stderr) == (0, "worker 0\n", ALONE)


def test_torch_imported_before_the_runner_is_watched_all_the_same(tmp_path: Path) -> None:
    """A sitecustomize that imports torch runs before the runner: its init_process_group is wrapped at
    the runner's start, so a script that calls it is not said to have trained alone."""
    write(tmp_path / "site/sitecustomize.py", "import torch.distributed\n")
    script = with_fake_torch(tmp_path, "import torch.distributed as dist\nprint(dist.init_process_group('gloo'))\n")
    environ = ranks_env("2") | {"PYTHONPATH": f"{tmp_path / 'site'}:{tmp_path}:{REPO}"}
    done = subprocess.run(argv(script, runner=True), cwd=REPO, env=environ, capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout == "('joined', 'gloo', {})\n"
