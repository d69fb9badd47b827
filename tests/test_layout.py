"""The architecture of docs/architecture.md, checked on the code's own imports (read with `ast`,
nothing imported): where a module lives says where it runs and whether it is pure, and the
imports must agree. A rule broken by a new import fails here with the module and the import."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
# Installed name -> folder in this repository (pyproject's package-dir): meshrun -> common/, ...
FOLDERS = {name: REPO / folder for name, folder in SETUPTOOLS["package-dir"].items()}
MAX_LINES = 400

# Effectful or UI libraries that pure planning code must not import.
EFFECTS = {"subprocess", "socket", "threading", "select", "fabric", "invoke", "paramiko", "rich", "time",
           "signal", "shutil"}
PURE = ("meshrun.deploy.inventory", "meshrun.deploy.check", "meshrun.deploy.run")
CONTROLLER_ONLY = ("meshrun.deploy.edges", "meshrun.deploy.commands", "meshrun.deploy.render", "meshrun.deploy.tasks", "meshrun.deploy.cli")
# What host-side code may import beyond the standard library and the shared contract (common/): torch only in
# the probe that is a gloo all-reduce, in the facts probe, which tries it to report its version, and in meshrun's
# torchrun entry point, which starts torch.distributed.run (it imports torch only in main()).
HOST_TORCH = {"meshrun.deploy.host.allreduce", "meshrun.deploy.host.facts", "meshrun.deploy.host.torchrun"}


def module_name(package: str, folder: Path, path: Path) -> str:
    parts = path.relative_to(folder).with_suffix("").parts
    return ".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))


# Each folder's own files; meshrun's (common/) holds no other mapped folder, so nothing is counted twice.
MODULES = {module_name(pkg, folder, p): p for pkg, folder in FOLDERS.items() for p in sorted(folder.rglob("*.py"))}


def half(module: str) -> str:
    """Which side a meshrun module belongs to: deploy, train, or common (the shared root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ("deploy", "train") else "common"


def imports_of(name: str) -> set[str]:
    """Every module this one imports at any level (lazy imports inside functions included)."""
    tree = ast.parse(MODULES[name].read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names
                         if f"{node.module}.{alias.name}" in MODULES)
    return found


def top_level_imports(name: str) -> set[str]:
    """Imports executed when the module loads (the ones that can form a circle)."""
    tree = ast.parse(MODULES[name].read_text())
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in MODULES}


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def root_of(module: str) -> str:
    return module.split(".")[0]


def test_every_module_is_found() -> None:
    assert {"meshrun.deploy.host.agent", "meshrun.deploy.run.plan", "meshrun.deploy.inventory.load",
            "meshrun.layout", "meshrun.train.trainer"} <= set(MODULES)


def test_pyproject_installs_every_package() -> None:
    """A folder with an __init__.py that pyproject's `packages` misses would be left out of the
    wheel: the editable install here would still work, every host's would not."""
    found = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert found == set(SETUPTOOLS["packages"])


@pytest.mark.parametrize("name", sorted(MODULES))
def test_meshrun_imports_only_its_own_names(name: str) -> None:
    """`import train` would find a user project's train.py on a host: only `meshrun.*` is ours."""
    bare = {m for m in imports_of(name) if root_of(m) in ("deploy", "train", "common")}
    assert not bare, f"{name} imports {sorted(bare)}; meshrun's modules are imported as meshrun.*"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if under(n, ("meshrun.deploy.host",))))
def test_host_code_is_standard_library_only(name: str) -> None:
    allowed_torch = {"torch"} if name in HOST_TORCH else set()
    foreign = {m for m in imports_of(name)
               if root_of(m) not in sys.stdlib_module_names and not under(m, ("meshrun.deploy.host",))
               and not (m in MODULES and half(m) == "common") and root_of(m) not in allowed_torch}
    assert not foreign, f"{name} runs on hosts with only the standard library, but imports {sorted(foreign)}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if under(n, PURE)))
def test_planning_code_is_pure(name: str) -> None:
    bad = {m for m in imports_of(name) if root_of(m) in EFFECTS or under(m, CONTROLLER_ONLY + ("meshrun.deploy.host",))}
    assert not bad, f"{name} is planning code (pure) but imports {sorted(bad)}"


# The trainer has its own console (train/render.py), and never imports deploy.
@pytest.mark.parametrize("name", sorted(n for n in MODULES if not under(n, ("meshrun.deploy.render",))
                                        and half(n) != "train"))
def test_only_render_imports_rich(name: str) -> None:
    assert "rich" not in {root_of(m) for m in imports_of(name)}, f"{name} imports rich; render/ is the only UI"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_trainer_and_controller_share_only_common(name: str) -> None:
    halves = {half(m) for m in imports_of(name) if m in MODULES}
    forbidden = {"train": {"deploy"}, "deploy": {"train"}, "common": {"deploy", "train"}}[half(name)]
    assert not halves & forbidden, f"{name} imports from {sorted(halves & forbidden)}/; the halves share only common/"


def test_no_import_circles() -> None:
    graph = {name: top_level_imports(name) - {name} for name in MODULES}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_small(name: str) -> None:
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(REPO)} has {lines} lines; split it (limit {MAX_LINES})"
