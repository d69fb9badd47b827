"""`fab setup`: on each host a Python environment that runs this controller's meshrun and the
project (the host side is deploy/host/setup.py; the wheel, deploy/edges/wheel.py)."""

from __future__ import annotations

import dataclasses
import posixpath
from dataclasses import dataclass
from pathlib import Path

from meshrun.layout import AGENT_LOCKS
from meshrun.deploy.check.answers import BUILD_RE, VERSION_CLIP, VERSION_RE, host_path
from meshrun.deploy.commands.sync import sync_code
from meshrun.deploy.edges.check_probes import probe_argv
from meshrun.deploy.edges.fanout import on_each
from meshrun.deploy.edges.rsyncrun import run_rsync
from meshrun.deploy.edges.sessions import sessions_to
from meshrun.deploy.edges.sync import busy_test_argv, push_dir_argv
from meshrun.deploy.edges.transport import CommandResult, Session
from meshrun.deploy.edges.wheel import Identity, controller_identity, controller_wheel
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.load import inventory_path, load_inventory
from meshrun.deploy.inventory.model import Host, Inventory
from meshrun.deploy.inventory.selection import select_hosts
from meshrun.deploy.inventory.shown import shown
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.answers import MISSING, Answer, network_hint, said
from meshrun.deploy.run.requirements import Requirements, project_requirements
from meshrun.deploy.edges import host_queries as probes

SETUP_TIMEOUT_S = 3600  # a first install downloads torch
WHEEL_PUSH_TIMEOUT_S = 600  # meshrun's wheel is a few hundred kB
CHECK_TIMEOUT_S = 120  # the base interpreter's start and a glob of the runs' agent locks (an NFS home)
WHEELS = ".venv/meshrun-wheels"  # in the host's workdir, beside the venv that installs them
PATH_CLIP = 1000  # characters of the venv interpreter's path a host reports: it is run there as argv[0]


@dataclass(frozen=True)
class SetupResult:
    host: str
    actions: tuple[str, ...]
    python: str
    torch: str | None
    # The host's home and workdir as it reported them (untrusted: only for the `python:` warning); None: not said.
    home: str | None = None
    workdir: str | None = None


@dataclass(frozen=True)
class SetupRequest:
    base: str  # the host interpreter that creates the venv
    reuse_site: str | None
    wheel: Path  # this controller's, on this machine
    identity: Identity
    requirements: Requirements


def setup_argv(request: SetupRequest, force: bool = False) -> list[str]:
    wheel = f"{WHEELS}/{request.identity.build}/{request.wheel.name}"
    reqs = request.requirements
    return probe_argv(request.base, "setup", "--wheel", wheel, "--build", request.identity.build,
                      *(["--reuse-site", request.reuse_site] if request.reuse_site else []),
                      *(["--requirements", reqs.file] if reqs.file else []),
                      *[arg for line in reqs.lines for arg in ("--requirement", line)],
                      *(["--install-project"] if reqs.install_project else []),
                      *(["--force"] if force else []), "--agent-locks", AGENT_LOCKS)


def check_argv(request: SetupRequest) -> list[str]:
    """The host side's test alone: whether a run's agent holds its lock in the workdir."""
    return busy_test_argv(request.base)


def refuse_if_running(host: Host, session: Session, request: SetupRequest) -> None:
    """Raise the host side's own one line when a run is running from `host`'s workdir. Asked before
    the sync and the wheel push: they would already change the files that run executes from.
    create_workdir: a first setup's workdir is made by the sync that comes next."""
    data = _answer(host, session.run(check_argv(request), timeout=CHECK_TIMEOUT_S, create_workdir=True), request)
    if data.get("busy", MISSING) is not False:
        raise Answer(host.name, "the setup script").bad("busy", data.get("busy", MISSING), "false")


def setup_host(host: Host, session: Session, request: SetupRequest, root: Path, inventory: Inventory) -> SetupResult:
    """Push the wheel, run the host side, then check that the venv imports this controller's build."""
    push = push_dir_argv(host, request.wheel.parent, f"{WHEELS}/{request.identity.build}", root, inventory.known_hosts)
    run_rsync(push, host=host.name, what="pushing meshrun's wheel", timeout=WHEEL_PUSH_TIMEOUT_S,
              hint=network_hint(host.name))
    result = _run_setup(host, session, request, force=False)
    seen = installed_identity(session, result.python)
    if seen != request.identity:  # the stamp said done, but the venv holds something else: once more
        result = _run_setup(host, session, request, force=True)
        seen = installed_identity(session, result.python)
    if seen != request.identity:
        raise MeshrunError(f"host '{host.name}': after setup {result.python} imports meshrun {seen or 'nothing'}, "
                           f"not this controller's {request.identity}; is something on its PYTHONPATH?")
    return result


def _run_setup(host: Host, session: Session, request: SetupRequest, force: bool) -> SetupResult:
    data = _answer(host, session.run(setup_argv(request, force), timeout=SETUP_TIMEOUT_S), request)
    reader = Answer(host.name, "the setup script")
    python = host_path(reader, data.get("python", MISSING), "python", PATH_CLIP)  # run there next: printable
    if not python:
        raise reader.bad("python", python, "the venv's interpreter")
    return SetupResult(host.name, reader.texts(data.get("actions", MISSING), "actions"), python,
                       reader.text(data.get("torch", MISSING), "torch", optional=True, limit=VERSION_CLIP),
                       reader.text(data.get("home", MISSING), "home", optional=True, limit=PATH_CLIP),
                       reader.text(data.get("workdir", MISSING), "workdir", optional=True, limit=PATH_CLIP))


def _answer(host: Host, result: CommandResult, request: SetupRequest) -> dict:
    """The host script's JSON object, or its error as one line naming the host."""
    data = probes.parse_json_object(result.stdout) if result.stdout else None
    if data is None:
        data = {"error": result.stderr.strip()[-300:] or f"exit status {result.rc}"}
    if "error" in data:
        why = said(data["error"]) if isinstance(data["error"], str) else shown(data["error"])
        # The host's venv and pip errors and a busy host's carry their own advice; others get the usual question.
        hint = ("" if " -m venv failed: " in why or data.get("busy") is True
                else "; check the project's requirements and that the host reaches its package index"
                if why.startswith("pip could not install ")
                else f"; is `{request.base}` a Python >= 3.10 with venv? (--base PYTHON)")
        raise MeshrunError(f"host '{host.name}': setup failed: {why}{hint}")
    return data


def same_interpreter(configured: str | None, reported: str, home: str | None, workdir: str | None) -> bool:
    """Whether the inventory's `python:` runs the interpreter setup reported, as the host's shell runs it after
    `cd WORKDIR` (deploy/run/shell.py): a leading `~/` is the home, a path with a `/` that is not absolute is in
    the workdir, a bare name is looked up on PATH (never the same). Unknown home or workdir: the text as it is."""
    if configured is None:
        return False
    tilde = configured == "~" or configured.startswith("~/")
    if tilde and home:
        path = posixpath.join(home, configured[2:])
    elif not tilde and not configured.startswith("/") and "/" in configured and workdir:
        path = posixpath.join(workdir, configured)
    else:
        path = configured
    return posixpath.normpath(path) == posixpath.normpath(reported)


def installed_identity(session: Session, python: str) -> Identity | None:
    """The meshrun `python` imports on the host (the check-network facts probe)."""
    result = session.run(probe_argv(python, "facts"), timeout=120)
    facts = probes.parse_json_object(result.stdout) if result.ok else None
    found = (facts or {}).get("meshrun")
    if not isinstance(found, dict):
        return None
    version, build = str(found.get("version")), str(found.get("build"))  # never echoed unless plain
    plain = VERSION_RE.fullmatch(version) and BUILD_RE.fullmatch(build)
    return Identity(version, build) if plain else Identity("unreadable", "unknown")


def setup_hosts(hosts: tuple[Host, ...], inventory: Inventory, project: Project, renderer: Renderer,
                request: SetupRequest) -> dict[str, SetupResult]:
    root = project.root
    with sessions_to(hosts, inventory, root) as sessions:
        # Every host first: a refusal after another host's sync would have changed that host's files.
        on_each(hosts, lambda h: refuse_if_running(h, sessions[h.name], request),
                timeout=CHECK_TIMEOUT_S + 5).require_all()
        sync_code(hosts, inventory, project, renderer)
        results = on_each(hosts, lambda h: setup_host(h, sessions[h.name], request, root, inventory),
                          timeout=WHEEL_PUSH_TIMEOUT_S + SETUP_TIMEOUT_S + 60)
    return results.require_all()


def main(inventory_arg: str | None, hosts_arg: str | None, base: str, reuse_site: str | None, project: Project,
         install_project: bool = True) -> None:
    """`fab setup`: set up each selected remote host, then say what to put in the inventory. Without
    `install_project` (--no-install-project), the project itself is not pip-installed even when it is a package."""
    root = project.root
    inv = load_inventory(inventory_path(inventory_arg, root), root)
    selected = select_hosts(inv, hosts_arg).hosts
    renderer = Renderer()
    for host in (h for h in selected if h.is_local):
        renderer.info(f"{host.name}: local, runs with this controller's Python and meshrun; nothing to set up")
    remote = tuple(h for h in selected if not h.is_local)
    if not remote:
        return
    requirements = project_requirements(root)
    if not install_project:
        requirements = dataclasses.replace(requirements, install_project=False)
    request = SetupRequest(base, reuse_site, controller_wheel(), controller_identity(), requirements)
    results = setup_hosts(remote, inv, project, renderer, request)
    for host in remote:
        result = results[host.name]
        done = "; ".join(result.actions) or "already set up, nothing to do"
        renderer.info(f"{host.name}: {done}; meshrun {request.identity}, python {result.python} "
                      f"(torch {result.torch or 'NOT importable'})")
        if not same_interpreter(host.python, result.python, result.home, result.workdir):
            renderer.warn(f"{host.name}: the inventory's `python` is {host.python or 'unset'}; set "
                          f"`python: {result.python}` for it in {inv.path} to train with this environment")
