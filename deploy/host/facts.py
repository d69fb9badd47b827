"""Host-side fact probe for `fab check-network`; stdlib only, run as `python -c <this file>`.

Prints one JSON object: the interpreter, torch / torch.version.cuda / NCCL (or why torch does not
import), free disk in the working directory (the host's workdir), and where the tools the check
runs next live. Extra places are searched for `zerotier-cli` because a non-root SSH login has no
/usr/sbin on PATH, and because a user who needs `sudo zerotier-cli` puts a wrapper in ~/bin.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys

EXTRA_PATH = ("~/bin", "/usr/sbin", "/usr/local/sbin", "/sbin")
TOOLS = ("nvidia-smi", "zerotier-cli", "wg", "ping")


def torch_facts() -> dict[str, object]:
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


def tool_paths() -> dict[str, str | None]:
    search = os.pathsep.join([os.environ.get("PATH", ""), *(os.path.expanduser(p) for p in EXTRA_PATH)])
    return {tool: shutil.which(tool, path=search) for tool in TOOLS}


def main() -> None:
    usage = shutil.disk_usage(".")
    facts = {"python": platform.python_version(), "executable": sys.executable, "cwd": os.getcwd(),
             "disk_free": usage.free, **torch_facts(), "tools": tool_paths()}
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
