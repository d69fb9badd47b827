"""meshrun. This package root is the repository's `common/` folder: the only code that both
halves import, the controller (`meshrun.deploy`, its host agent included) and the trainer
(`meshrun.train`): the run layout contract and crash-safe file helpers. Standard library only."""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("meshrun")
except _metadata.PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "0+unknown"
