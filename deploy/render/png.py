"""`fab report`'s picture: loss and accuracy curves and per-rank throughput as a PNG (matplotlib,
headless). Pure rendering of a RunReport."""

from __future__ import annotations

from pathlib import Path

from meshrun.deploy.run.report import RunReport


def write_png(report: RunReport, path: Path) -> Path:
    """Loss curves, accuracy curves and per-host/rank throughput, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, acc_ax, thr_ax) = plt.subplots(1, 3, figsize=(15, 4.2))
    xs = [e.epoch for e in report.epochs]
    loss_ax.plot(xs, [e.train_loss for e in report.epochs], marker="o", label="train")
    loss_ax.plot(xs, [e.test_loss for e in report.epochs], marker="o", label="test")
    loss_ax.set(title="loss", xlabel="epoch")
    acc_ax.plot(xs, [e.test_acc for e in report.epochs], marker="o", label="top-1")
    acc_ax.plot(xs, [e.test_acc5 for e in report.epochs], marker="o", label="top-5")
    acc_ax.set(title="test accuracy", xlabel="epoch", ylim=(0, 1.02))
    labels = [f"{r.host}/r{r.rank}" for r in report.ranks]
    thr_ax.bar(labels, [r.samples_per_s for r in report.ranks], color="tab:green")
    thr_ax.set(title="throughput (median samples/s)", ylabel="samples/s")
    for ax in (loss_ax, acc_ax):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"{report.root.name}: {len(report.epochs)} epochs, "
                 f"{report.total_samples_per_s:.0f} samples/s total")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
