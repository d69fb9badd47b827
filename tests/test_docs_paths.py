"""Every file and function the docs name exists: README.md and docs/*.md point readers at code
(`deploy/run/plan.py`, `deploy/run/plan.host_env`, `deploy/run/commplan.py::hook_floor`,
`common.layout.host_dir`, `meshrun.deploy.host.agent`), and a name left behind by a rename or a
move sends them nowhere. The other way round, every module of deploy/, common/ and train/ is on
the map (docs/architecture.md, or docs/trainer.md's module list): a new module no doc names leaves
a reader who meets it in a traceback nowhere to look. Pure: the files are read with `ast`, nothing
is imported."""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
# Installed name -> folder (pyproject's package-dir): meshrun -> common/, meshrun.deploy -> deploy/, ...
PACKAGES = {name: folder for name, folder in
            tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].items()}
# Folders of meshrun's own code: a dotted name under one of them (`deploy/cli.guarded`) is a module's.
CODE_ROOTS = ("deploy", "common", "train", "tests", "bench")
# Paths the docs name that are not in this repository (torch's own files).
FOREIGN = {"torch/version.py"}

# `a/b/c.py`, `a/b/c.py::name`, `a/b/c.py.name` or `a/b/c.name.more`; not inside `~/x/y.py`, `<dir>/y.py`
# or a longer path (the look-behind).
SLASHED = re.compile(r"(?<![\w./~<>-])((?:[A-Za-z_][\w.-]*/)+)([A-Za-z_]\w*)((?:(?:\.|::)[A-Za-z_]\w*)*)")
# `meshrun.deploy.host.agent`, `common.layout.host_dir`: a module by its installed name.
DOTTED = re.compile(r"(?<![\w./-])((?:meshrun|common)(?:\.[A-Za-z_]\w*)+)")
# A `pkg/` row of docs/architecture.md's map: its bare `name.py` files are that folder's (or the
# repository's own: `fabfile.py`).
MAP_ROW = re.compile(r"^\| `([\w/]+/)`?")
BARE = re.compile(r"(?<![\w/.-])`([A-Za-z_]\w*\.py)`")


@dataclass(frozen=True)
class Ref:
    doc: str
    line: int
    text: str  # as the doc writes it
    path: str  # the file, relative to the repository
    names: tuple[str, ...]  # attribute chain in it (`SshSession`, `start`); empty for the file alone
    prefix: bool = False  # `tests/x.py::test_f`: a test whose name starts `test_f_` (the docs' shorthand)


def slashed_refs(doc: Path, number: int, line: str) -> list[Ref]:
    found = []
    for m in SLASHED.finditer(line):
        folders, stem, rest = m.groups()
        base, ours = folders + stem, folders.split("/")[0] in CODE_ROOTS
        if re.match(r"\.py\b", rest):
            rest = rest[3:]
        elif not (ours and rest) or (REPO / (base + rest)).exists():
            continue  # a folder, a data file (`train/configs/digits.yaml`), or not meshrun's code
        # else a module's name (`deploy/cli.guarded`): its file must exist
        path = f"{base}.py"
        if path in FOREIGN:
            continue
        if not (REPO / path).exists() and (doc.parent / path).exists():
            path = str((doc.parent / path).relative_to(REPO))  # a Markdown link, relative to its doc
        names = tuple(n for n in re.split(r"\.|::", rest) if n)
        shorthand = rest.startswith("::") and path.startswith("tests/")
        found.append(Ref(doc.name, number, m.group(0), path, names, prefix=shorthand))
    return found


def dotted_refs(doc: Path, number: int, line: str) -> list[Ref]:
    found = []
    for m in DOTTED.finditer(line):
        parts = m.group(1).split(".")
        if parts[0] == "common":  # the docs' way to say meshrun's own folder
            parts[0] = "meshrun"
        cut = max(k for k in range(1, len(parts) + 1) if ".".join(parts[:k]) in PACKAGES)
        folder = REPO / PACKAGES[".".join(parts[:cut])]
        names = parts[cut:]
        while names and (folder / names[0]).is_dir():
            folder, names = folder / names[0], names[1:]
        if names and (folder / f"{names[0]}.py").is_file():
            path, names = folder / f"{names[0]}.py", names[1:]
        else:
            path = folder / "__init__.py"
        found.append(Ref(doc.name, number, m.group(1), str(path.relative_to(REPO)), tuple(names)))
    return found


def map_refs(doc: Path, number: int, line: str) -> list[Ref]:
    """docs/architecture.md's map: each bare `name.py` in a package's row is in that package (the
    one-line `fabfile.py` at the repository's root)."""
    row = MAP_ROW.match(line) if doc.name == "architecture.md" else None
    if row is None:
        return []
    folder = row.group(1)
    return [Ref(doc.name, number, m.group(1), (folder if not (REPO / m.group(1)).is_file() else "") + m.group(1), ())
            for m in BARE.finditer(line)]


def refs(doc: Path, text: str) -> list[Ref]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        found += slashed_refs(doc, number, line) + dotted_refs(doc, number, line) + map_refs(doc, number, line)
    return found


def defined(body: list[ast.stmt]) -> dict[str, ast.AST | None]:
    """Names a module or class body binds, at its own level (inside `if`/`try` too): defs and
    classes map to their node, anything else (assignments, imports, fields) to None."""
    names: dict[str, ast.AST | None] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update((n.id, None) for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(((a.asname or a.name).split(".")[0], None) for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody", "handlers"):
                for inner in getattr(node, block, []):
                    names.update(defined(inner.body if isinstance(inner, ast.ExceptHandler) else [inner]))
    return names


def problem(ref: Ref) -> str | None:
    """Why `ref` points nowhere, or None when it holds."""
    where = f"{ref.doc}:{ref.line}: {ref.text}"
    file = REPO / ref.path
    if not file.is_file():
        return f"{where}: no file {ref.path}"
    scope: ast.AST | None = ast.parse(file.read_text(), str(file))
    if ref.path.endswith("__init__.py") and ref.names and (file.parent / ref.names[0]).exists():
        return None  # a subpackage's folder (`meshrun.deploy.host` written as far as a folder)
    for i, name in enumerate(ref.names):
        if scope is None:
            return None  # a value (an assignment, an import): what it holds is not read here
        names = defined(scope.body)  # type: ignore[attr-defined]
        last = i == len(ref.names) - 1
        if ref.prefix and last and name not in names:
            stem = name.rstrip("_") + "_"
            return None if any(n.startswith(stem) for n in names) else f"{where}: no {name}… in {ref.path}"
        if name not in names:
            return f"{where}: {ref.path} defines no {'.'.join(ref.names[:i + 1])}"
        scope = names[name] if isinstance(names[name], ast.ClassDef) else None
    return None


def doc_refs() -> list[Ref]:
    return [ref for doc in DOCS for ref in refs(doc, doc.read_text(encoding="utf-8"))]


def test_every_file_and_function_the_docs_name_exists() -> None:
    assert [p for p in map(problem, doc_refs()) if p] == []


def test_the_docs_are_read_for_every_form() -> None:
    """The rules see the forms the docs use (an empty match would pass anything)."""
    texts = {(r.path, r.names) for r in doc_refs()}
    assert {("deploy/run/plan.py", ()), ("deploy/run/plan.py", ("host_env",)),
            ("deploy/run/commplan.py", ("hook_floor",)), ("tests/test_elastic.py", ("test_f",)),
            ("common/layout.py", ("host_dir",)), ("deploy/cli.py", ("guarded",)),
            ("deploy/host/agent.py", ()), ("deploy/edges/transport.py", ("SshSession", "start")),
            ("deploy/inventory/model.py", ()), ("docs/examples/seed000_main.py", ())} <= texts


def check(text: str) -> list[str | None]:
    return [problem(r) for r in refs(REPO / "docs" / "architecture.md", text)]


def test_a_name_that_is_gone_is_named() -> None:
    assert check("`deploy/run/plan.py`, `deploy/run/plan.host_env`, deploy/cli.guarded, "
                 "`deploy/host/succession.py::PeerWatcher`, `tests/test_elastic.py::test_f`, "
                 "`common.layout.host_dir`, `meshrun.deploy.host.agent`, `train/configs/digits.yaml`, "
                 "`deploy/edges/transport.SshSession.start`, `torch/version.py`, `~/x/gone.py`") == [None] * 8
    assert check("`deploy/run/gone.py` and `deploy/run/plan.gone` and `deploy/run/gone.host_env`") == [
        "architecture.md:1: deploy/run/gone.py: no file deploy/run/gone.py",
        "architecture.md:1: deploy/run/plan.gone: deploy/run/plan.py defines no gone",
        "architecture.md:1: deploy/run/gone.host_env: no file deploy/run/gone.py"]
    # slashed names first, then dotted ones, as a line is read
    assert check("`deploy/host/succession.py::Gone`, `tests/test_elastic.py::test_z`, "
                 "`common.layout.gone`, `meshrun.deploy.host.gone`, `deploy/edges/transport.SshSession.gone`, "
                 "`deploy/run/commplan.py::hook`") == [
        "architecture.md:1: deploy/host/succession.py::Gone: deploy/host/succession.py defines no Gone",
        "architecture.md:1: tests/test_elastic.py::test_z: no test_z… in tests/test_elastic.py",
        "architecture.md:1: deploy/edges/transport.SshSession.gone: deploy/edges/transport.py defines no "
        "SshSession.gone",
        "architecture.md:1: deploy/run/commplan.py::hook: deploy/run/commplan.py defines no hook",
        "architecture.md:1: common.layout.gone: common/layout.py defines no gone",
        "architecture.md:1: meshrun.deploy.host.gone: deploy/host/__init__.py defines no gone"]
    assert check("| `deploy/run/` | the plan (`plan.py`), (`gone.py`) | controller | yes |") == [
        None, "architecture.md:1: gone.py: no file deploy/run/gone.py"]


# The map: every module of these folders is named in these docs, by its path or, in
# architecture.md, as a bare `name.py` in its package's row. A package's __init__.py and a
# __main__.py are named by their package.
MAPPED = ("deploy", "common", "train")
MAP_DOCS = (REPO / "docs" / "architecture.md", REPO / "docs" / "trainer.md")


def modules() -> list[str]:
    return sorted(str(p.relative_to(REPO)) for root in MAPPED for p in (REPO / root).rglob("*.py")
                  if p.name not in ("__init__.py", "__main__.py"))


def unnamed(docs: dict[Path, str]) -> list[str]:
    """The modules none of `docs` names (each doc's text given)."""
    named = {r.path for doc, text in docs.items() for r in refs(doc, text)}
    return [m for m in modules() if m not in named]


def test_every_module_is_on_the_map() -> None:
    assert unnamed({doc: doc.read_text(encoding="utf-8") for doc in MAP_DOCS}) == []


def test_a_module_counts_as_named_by_its_path_or_in_its_own_row() -> None:
    arch, trainer = MAP_DOCS
    everything = unnamed({})
    assert {"deploy/check/zerotier.py", "common/layout.py", "train/starts.py", "train/data/cifar.py"} <= set(everything)
    # a path anywhere, or a bare name in its own package's row of the map
    assert unnamed({arch: "| `deploy/check/` | parsing (`zerotier.py`) |", trainer: "`train/starts.py`"}) == [
        m for m in everything if m not in ("deploy/check/zerotier.py", "train/starts.py")]
    # a bare name in another package's row, or outside the map, names nothing
    assert unnamed({arch: "| `deploy/run/` | (`zerotier.py`) |\n`starts.py`", trainer: "`cifar.py`"}) == everything
