"""meshrun. This package root is the repository's `common/` folder: the only code that both
halves import, the controller (`meshrun.deploy`, its host agent included) and the trainer
(`meshrun.train`): the run layout contract and crash-safe file helpers. Standard library only."""

def __getattr__(name: str) -> str:
    """`meshrun.__version__`, read from the install only when asked: importlib.metadata costs
    tens of milliseconds of CPU, and every agent verb a host runs (`status`, `stop`) imports this
    package — at 32 hosts that is the controller's `fab status` waiting on 32 of them at once."""
    if name != "__version__":
        raise AttributeError(f"module 'meshrun' has no attribute {name!r}")
    from importlib import metadata

    try:
        return metadata.version("meshrun")
    except metadata.PackageNotFoundError:  # imported from a checkout that was never installed
        return "0+unknown"
