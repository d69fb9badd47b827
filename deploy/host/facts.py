"""Host-side fact probe for `fab check-network`; stdlib only, run as `python -c <this file>`.

Prints one JSON object: the interpreter, torch / torch.version.cuda / NCCL (read from torch's files,
imported only where they do not tell; or why torch is missing), the meshrun this interpreter
imports (version and build, `meshrun_identity`), free disk in the working directory (the host's workdir), and where the tools the check runs next live.
Last, read as late as it can be, the host's wall clock (`clock`, time.time()) and how long the probe had run by
then (`clock_after_s`, by the monotonic clock): the controller places the reading in its round trip
(deploy/check/clocks.py), since an elastic run's rendezvous drops hosts whose clocks are seconds apart.
With the argument `light` (a run's provenance, `deploy/edges/provenance.py`) torch is not imported:
its versions are read from its installed files. Extra places are searched for `zerotier-cli` because a non-root SSH login has no
/usr/sbin on PATH, and because a user who needs `sudo zerotier-cli` puts a wrapper in ~/bin.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import time
from typing import Iterator

STARTED = time.monotonic()  # as the probe's own code begins: what ran before it is in the controller's window

EXTRA_PATH = ("~/bin", "/usr/sbin", "/usr/local/sbin", "/sbin")
TOOLS = ("nvidia-smi", "zerotier-cli", "wg", "ping", "rsync", "ip")  # ip: iproute2, for `ip -j route get`
NOT_INSTALLED = "torch is not installed"


def torch_facts() -> dict[str, object]:
    """torch's versions as its installed files say (`torch_files_facts`): importing torch costs
    seconds of CPU per host, and check-network's all-reduce imports it anyway (a torch that is
    installed but does not import fails there, naming the host). Imported only where the files do
    not tell: no literal version, or a CUDA build whose NCCL is no package of its own (linked in)."""
    found = torch_files_facts()
    if found["torch"] is None and found["error"] == NOT_INSTALLED:
        return {**found, "error": "ModuleNotFoundError: No module named 'torch'"}
    if found["torch"] is not None and not (found["cuda"] and found["nccl"] is None):
        return found
    return imported_torch_facts()


def imported_torch_facts() -> dict[str, object]:
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - any import failure is the fact we report
        return {"torch": None, "error": f"{err.__class__.__name__}: {err}"}
    nccl = None
    try:
        nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001 - CPU builds have no NCCL
        pass
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl, "error": None}


# The packages a meshrun wheel holds at its top. Installed from a wheel they nest in one folder;
# installed editable from a clone each is its own folder (common/, deploy/, train/).
MESHRUN_PACKAGES = ("meshrun", "meshrun.deploy", "meshrun.train")
SHIPPED_SUFFIXES = (".py", ".yaml")  # modules and the trainer's configs: what the wheel carries


def meshrun_folders() -> dict[str, str] | None:
    """Where this interpreter finds each of meshrun's top packages; None without meshrun."""
    from importlib import util

    try:
        specs = {name: util.find_spec(name) for name in MESHRUN_PACKAGES}
    except (ImportError, ValueError):
        return None
    if any(s is None or not s.submodule_search_locations for s in specs.values()):
        return None
    return {name: list(spec.submodule_search_locations)[0] for name, spec in specs.items()}  # type: ignore[union-attr]


def package_files(folders: dict[str, str]) -> Iterator[tuple[str, str]]:
    """(name in the wheel, file) for every shipped file, the same list however meshrun was installed:
    a folder that is another package's (meshrun/deploy inside meshrun/) is walked as that package."""
    for name, folder in folders.items():
        prefix = name.replace(".", "/")
        for current, dirs, files in os.walk(folder):
            rel = os.path.relpath(current, folder)
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not (rel == "." and f"{name}.{d}" in folders))
            for file in sorted(files):
                if file.endswith(SHIPPED_SUFFIXES):
                    arcname = prefix if rel == "." else f"{prefix}/{rel.replace(os.sep, '/')}"
                    yield f"{arcname}/{file}", os.path.join(current, file)


def meshrun_identity() -> dict[str, str] | None:
    """{"version", "build"}: the installed version and a digest of the shipped files, so two
    copies of 0.1.0 with different code tell apart; None when meshrun does not import here."""
    folders = meshrun_folders()
    if folders is None:
        return None
    version = installed_versions(("meshrun",)).get("meshrun") or "unknown"
    digest = hashlib.sha256()
    for arcname, path in sorted(package_files(folders)):
        with open(path, "rb") as f:
            digest.update(arcname.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return {"version": version, "build": digest.hexdigest()[:12]}


NCCL_PACKAGES = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
VERSION_FILE_NAMES = {"__version__": "torch", "cuda": "cuda"}


def torch_files_facts() -> dict[str, object]:
    """torch's version and CUDA build as its installed files say, without importing it (seconds of CPU
    a run's provenance should not cost): `torch/version.py` holds `__version__` and `cuda` as literals,
    and NCCL is the version of the `nvidia-nccl-*` package torch loads (null when none is installed)."""
    import ast
    from importlib import util

    found: dict[str, object] = {"torch": None, "cuda": None, "nccl": None, "error": None}
    try:
        spec = util.find_spec("torch")
        folder = list(spec.submodule_search_locations or [])[0] if spec else None
        if folder is None:
            return {**found, "error": NOT_INSTALLED}
        with open(os.path.join(folder, "version.py"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, ValueError, SyntaxError, ImportError, IndexError) as err:
        return {**found, "error": f"{err.__class__.__name__}: {err}"}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        key = VERSION_FILE_NAMES.get(getattr(target, "id", ""))
        value = getattr(node, "value", None)
        if key and isinstance(value, ast.Constant) and isinstance(value.value, (str, type(None))):
            found[key] = value.value
    versions = installed_versions(NCCL_PACKAGES)
    found["nccl"] = next((versions[p] for p in NCCL_PACKAGES if p in versions), None)
    return found


def _dist_key(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def installed_versions(projects: tuple[str, ...]) -> dict[str, str]:
    """The installed version of each of `projects` that is installed, as importlib.metadata.version
    says (the first distribution on sys.path), read from the name of its `NAME-VERSION.dist-info`
    folder (how installers name it, PEP 491/627); importlib.metadata only for one that has no such
    folder (an egg-info): importing it alone costs ~25 ms of CPU, on every host at every launch."""
    wanted, found = {_dist_key(p): p for p in projects}, {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            stem, dot, kind = name.rpartition(".")
            project, dash, version = stem.partition("-")  # "name-1.0", or an egg-info's "name-1.0-py3.11"
            key = _dist_key(project)
            if dot and kind in ("dist-info", "egg-info") and key in wanted and wanted[key] not in found:
                found[wanted[key]] = version if dash and kind == "dist-info" else ""
    for project in [p for p, v in found.items() if not v]:
        from importlib import metadata

        try:
            found[project] = metadata.version(project)
        except metadata.PackageNotFoundError:
            del found[project]
    return found


def tool_paths() -> dict[str, str | None]:
    search = os.pathsep.join([os.environ.get("PATH", ""), *(os.path.expanduser(p) for p in EXTRA_PATH)])
    return {tool: shutil.which(tool, path=search) for tool in TOOLS}


def machine_facts() -> dict[str, object]:
    """Which machine this is (a digest of the kernel's boot id: containers, and the test bed's
    namespaces, share it with their machine) and how many CPUs this process may use: hosts on one
    machine import torch on the same CPUs when a run or the check's all-reduce starts."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read(64).strip()
    except (OSError, ValueError):
        boot = ""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count()
    return {"machine": hashlib.sha256(boot.encode()).hexdigest()[:16] if boot else None, "cpus": cpus}


def main() -> None:
    """`facts`: what the check needs (torch imported only where its files do not tell);
    `facts light`: a run's provenance (never imports torch)."""
    usage = shutil.disk_usage(".")
    versions = torch_files_facts() if sys.argv[1:] == ["light"] else torch_facts()
    facts = {"python": platform.python_version(), "executable": sys.executable, "cwd": os.getcwd(),
             "disk_free": usage.free, **versions, "meshrun": meshrun_identity(), "tools": tool_paths(),
             **machine_facts()}
    facts["clock_after_s"] = time.monotonic() - STARTED
    facts["clock"] = time.time()  # just before the answer leaves: the rest of the window is its way back
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
