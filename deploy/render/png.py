"""`fab report`'s picture: loss and accuracy curves and per-rank throughput as a PNG (matplotlib,
headless). Pure rendering of a RunReport.

Labels come from hosts (a rank's host name, the run folder's name): they are drawn as plain text,
with mathtext and TeX off (`$x^2$` stays `$x^2$`, `$\\frac$` is no parse error), non-printing
characters escaped and the length cut (deploy/render/neutral.py).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from meshrun.deploy.render.neutral import one_line
from meshrun.deploy.run.report import RunReport

PLAIN_TEXT = {"text.parse_math": False, "text.usetex": False}
LABEL_MAX = 40  # characters of a host's label under its bar


def label(text: str, limit: int = LABEL_MAX) -> str:
    """A host's text as one plain line for the picture, at most about `limit` characters."""
    shown = one_line(text)
    return shown if len(shown) <= limit else shown[:limit] + "…"


def write_png(report: RunReport, path: Path) -> Path:
    """Loss curves, accuracy curves and per-host/rank throughput, side by side (the format
    follows the suffix of `path`: `.png` for `fab report`). Numbers come from hosts: a set that
    matplotlib cannot lay out (an axis range that overflows) gives a picture saying the plot was
    not drawn and why, in one line, never a failed report: the table is printed either way."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    # Around the drawing too: tick labels are made then. numpy's overflow warnings over a host's extreme
    # numbers would be raw lines on the console: what went wrong is said in the picture.
    with matplotlib.rc_context(PLAIN_TEXT), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
        try:
            _draw(fig, axes, report, path)
        except (ValueError, OverflowError) as err:
            fig.clear()
            fig.set_size_inches(8, 1.5)
            fig.text(0.02, 0.5, label(f"{report.root.name}: plot not drawn: {type(err).__name__}: {err}", 120),
                     va="center")
            fig.savefig(path, dpi=100)
        finally:
            plt.close(fig)
    return path


def _draw(fig: Any, axes: Any, report: RunReport, path: Path) -> None:
    loss_ax, acc_ax, thr_ax = axes
    xs = [e.epoch for e in report.epochs]
    loss_ax.plot(xs, [e.train_loss for e in report.epochs], marker="o", label="train")
    loss_ax.plot(xs, [e.test_loss for e in report.epochs], marker="o", label="test")
    loss_ax.set(title="loss", xlabel="epoch")
    acc_ax.plot(xs, [e.test_acc for e in report.epochs], marker="o", label="top-1")
    acc_ax.plot(xs, [e.test_acc5 for e in report.epochs], marker="o", label="top-5")
    acc_ax.set(title="test accuracy", xlabel="epoch", ylim=(0, 1.02))
    labels = [f"{label(r.host)}/r{r.rank}" for r in report.ranks]
    thr_ax.bar(labels, [r.samples_per_s for r in report.ranks], color="tab:green")
    thr_ax.set(title="throughput (median samples/s)", ylabel="samples/s")
    for ax in (loss_ax, acc_ax):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"{label(report.root.name)}: {len(report.epochs)} epochs, "
                 f"{report.total_samples_per_s:.0f} samples/s total")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
