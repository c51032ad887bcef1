"""Reliability diagram (matplotlib, imported lazily)."""

from __future__ import annotations

import numpy as np

from losszoo.calibration.metrics import _bin_index, _prep, _top_label, ece
from losszoo.contract import check_number

_ACCURACY = "accuracy (up to the mean confidence)"
#: the bars from accuracy up to the mean confidence, and from the mean confidence up to accuracy
_OVERCONFIDENT = {
    "color": "tab:red",
    "alpha": 0.35,
    "hatch": "//",
    "edgecolor": "tab:red",
    "label": "overconfident: confidence above accuracy",
}
_UNDERCONFIDENT = {
    "color": "tab:green",
    "alpha": 0.8,
    "edgecolor": "k",
    "label": "underconfident: accuracy above confidence",
}


def reliability_curve(probs, labels, n_bins: int = 15):
    """Per-bin ``(mean confidence, accuracy, count)`` arrays of the top-label prediction over
    ``n_bins`` right-closed equal-width bins (NaN for empty bins).

    Bin ``B_m = ((m-1)/M, m/M]`` of the confidences ``max_k p_k`` gives ``conf(B_m)`` (their
    mean), ``acc(B_m)`` (the fraction whose argmax is the label) and ``|B_m|``, the terms of
    :func:`losszoo.calibration.ece`.

    Args:
      probs: probabilities ``[N, K]``, rows on the simplex (as :func:`losszoo.calibration.ece`).
      labels: integer class ids ``[N]`` or ``[N, 1]``, or one-hot rows ``[N, K]``.
      n_bins: number of bins ``M``, a positive integer (default 15).

    Returns:
      ``(mean_confidence, accuracy, count)``: three float64 arrays ``[n_bins]``.

    Raises:
      ValueError / TypeError: naming ``n_bins`` when it is not a positive integer, or naming
        ``probs`` / ``labels`` as :func:`losszoo.calibration.ece` does.

    Example:
      >>> probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.8, 0.2], [0.3, 0.7]])
      >>> conf, acc, count = losszoo.calibration.reliability_curve(probs, [0, 1, 0, 1], 2)
      >>> count
      array([0., 4.])
      >>> print(conf[1].round(3), acc[1])
      0.75 0.75
    """
    n_bins = check_number(n_bins, "n_bins", low=1, integer=True)
    conf, correct = _top_label(*_prep(probs, labels))
    idx = _bin_index(conf, n_bins)
    count = np.bincount(idx, minlength=n_bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(idx, conf, n_bins) / count
        acc = np.bincount(idx, correct, n_bins) / count
    return mean_conf, acc, count


def reliability_diagram(
    results, labels=None, n_bins: int = 15, path=None, title=None, max_cols: int = 3
):
    """Plot reliability diagrams, one panel per method (at most ``max_cols`` per row).

    Each bin's bar reaches its accuracy: blue up to the smaller of accuracy and mean
    confidence, then red (hatched) from accuracy up to the mean confidence where the model is
    overconfident, or green from the mean confidence up to the accuracy where it is
    underconfident. A perfectly calibrated model's bars end on the dashed diagonal. Each
    panel's title gives the method and its ECE; empty bins have no bar.

    Args:
      results: ``{name: probs}`` (probs ``[N, K]``), or a single probs array.
      labels: integer labels ``[N]``.
      n_bins: equal-width bins.
      path: if given, the figure is saved there (PNG) and closed.
      title: optional figure title.
      max_cols: panels per row.

    Returns:
      The matplotlib figure (None if saved to ``path``).

    Raises:
      ImportError: matplotlib is not installed (``pip install 'losszoo[examples]'``).
      ValueError / TypeError: as :func:`reliability_curve` (``n_bins``, ``probs``, ``labels``).

    Example:
      >>> probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.8, 0.2], [0.3, 0.7]])
      >>> fig = losszoo.calibration.reliability_diagram({"model": probs}, [0, 1, 0, 1])
      >>> fig.axes[0].get_title()
      'model: ECE 0.3000'
    """
    n_bins = check_number(n_bins, "n_bins", low=1, integer=True)
    try:
        import matplotlib
    except ImportError as err:  # ModuleNotFoundError included
        raise ImportError(
            "reliability_diagram needs matplotlib: pip install 'losszoo[examples]' "
            "(or pip install matplotlib)"
        ) from err

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if not isinstance(results, dict):
        results = {"model": results}
    n = len(results)
    cols = max(1, min(n, max_cols))
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.4 * rows + 0.6), squeeze=False)
    centers = (np.arange(n_bins) + 0.5) / n_bins
    width = 1 / n_bins
    for ax, (name, probs) in zip(axes.flat, results.items()):
        mean_conf, acc, count = reliability_curve(probs, labels, n_bins)
        full = count > 0
        c, a, x = mean_conf[full], acc[full], centers[full]
        low = np.minimum(a, c)
        ax.bar(x, low, width, color="tab:blue", edgecolor="k", lw=0.5, label=_ACCURACY)
        for part, style in ((c > a, _OVERCONFIDENT), (a > c, _UNDERCONFIDENT)):
            ax.bar(x[part], np.abs(c - a)[part], width, bottom=low[part], lw=0.5, **style)
        ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence (top-label probability)")
        ax.set_ylabel("accuracy")
        ax.set_title(f"{name}: ECE {ece(probs, labels, n_bins):.4f}", fontsize=10)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(
        handles, names, loc="lower center", ncol=min(4, len(names)), fontsize=8, frameon=False
    )
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.6 / (3.4 * rows + 0.6), 1, 1))
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return None
    return fig
