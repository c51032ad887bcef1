"""Reliability diagram (matplotlib, imported lazily)."""

from __future__ import annotations

import numpy as np

from losszoo.calibration.metrics import _bin_index, _prep, ece


def reliability_curve(probs, labels, n_bins: int = 15):
    """Per-bin ``(mean confidence, accuracy, count)`` arrays of the top-label prediction over
    ``n_bins`` right-closed equal-width bins (NaN for empty bins)."""
    probs, labels = _prep(probs, labels)
    conf = probs.max(-1)
    correct = (probs.argmax(-1) == labels).astype(np.float64)
    idx = _bin_index(conf, n_bins)
    count = np.bincount(idx, minlength=n_bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(idx, conf, n_bins) / count
        acc = np.bincount(idx, correct, n_bins) / count
    return mean_conf, acc, count


def reliability_diagram(results, labels=None, n_bins: int = 15, path=None, title=None):
    """Plot reliability diagrams, one panel per method.

    Args:
      results: ``{name: probs}`` (probs ``[N, K]``), or a single probs array.
      labels: integer labels ``[N]``.
      n_bins: equal-width bins.
      path: if given, the figure is saved there (PNG) and closed.
      title: optional figure title.

    Returns:
      The matplotlib figure (None if saved to ``path``).
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if not isinstance(results, dict):
        results = {"model": results}
    n = len(results)
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n, 3.4), squeeze=False)
    centers = (np.arange(n_bins) + 0.5) / n_bins
    for ax, (name, probs) in zip(axes[0], results.items()):
        mean_conf, acc, count = reliability_curve(probs, labels, n_bins)
        ax.bar(centers, np.nan_to_num(acc), width=1 / n_bins, edgecolor="k", alpha=0.7,
               label="accuracy")
        ax.bar(centers, np.nan_to_num(mean_conf - acc), bottom=np.nan_to_num(acc),
               width=1 / n_bins, color="tab:red", alpha=0.3, label="gap")
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("confidence")
        ax.set_title(f"{name}\nECE={ece(probs, labels, n_bins):.4f}", fontsize=9)
    axes[0][0].set_ylabel("accuracy")
    axes[0][0].legend(loc="upper left", fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return None
    return fig
