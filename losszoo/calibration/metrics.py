"""Calibration metrics as plain functions on arrays (numpy).

Top-label ECE follows the paper's eq. 28 (spec section 6): ``M`` equal-width bins, right-closed
``((m-1)/M, m/M]``, weighted by bin size, empty bins contribute 0. Classwise ECE, adaptive
(equal-mass) ECE, NLL and the Brier score are our additions (the paper reports only ECE and
accuracy). ``probs`` is ``[N, K]``; ``labels`` are integer class ids ``[N]`` (or one-hot ``[N, K]``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["accuracy", "adaptive_ece", "brier_score", "classwise_ece", "ece", "nll"]


def _prep(probs, labels):
    probs = np.asarray(probs, np.float64)
    if probs.ndim != 2:
        raise ValueError(f"`probs` must be [N, K], got shape {probs.shape}.")
    labels = np.asarray(labels)
    if labels.ndim == 2 and labels.shape == probs.shape and probs.shape[1] > 1:
        labels = labels.argmax(-1)
    labels = labels.reshape(-1).astype(np.int64)
    if labels.shape[0] != probs.shape[0]:
        raise ValueError("`labels` and `probs` must have the same number of rows.")
    return probs, labels


def _bin_index(values, n_bins):
    """Right-closed equal-width bins ((m-1)/M, m/M]; 0 goes to the first bin."""
    edges = np.arange(1, n_bins) / n_bins
    return (values[:, None] > edges[None, :]).sum(-1)


def ece(probs, labels, n_bins: int = 15) -> float:
    """Top-label expected calibration error with ``n_bins`` equal-width bins (paper eq. 28)."""
    probs, labels = _prep(probs, labels)
    conf = probs.max(-1)
    correct = (probs.argmax(-1) == labels).astype(np.float64)
    idx = _bin_index(conf, n_bins)
    n = len(conf)
    total = 0.0
    for m in range(n_bins):
        sel = idx == m
        if sel.any():
            total += sel.sum() / n * abs(correct[sel].mean() - conf[sel].mean())
    return float(total)


def classwise_ece(probs, labels, n_bins: int = 15) -> float:
    """Classwise ECE: the mean over classes ``k`` of the binned calibration error of ``p_k``
    against ``[y = k]`` (Kull et al., 2019), equal-width right-closed bins."""
    probs, labels = _prep(probs, labels)
    n, k = probs.shape
    onehot = np.eye(k)[labels]
    total = 0.0
    for c in range(k):
        idx = _bin_index(probs[:, c], n_bins)
        for m in range(n_bins):
            sel = idx == m
            if sel.any():
                total += sel.sum() / n * abs(onehot[sel, c].mean() - probs[sel, c].mean())
    return float(total / k)


def adaptive_ece(probs, labels, n_bins: int = 15) -> float:
    """Top-label ECE with equal-mass bins: samples sorted by confidence, split into ``n_bins``
    groups of (nearly) equal size (``np.array_split``)."""
    probs, labels = _prep(probs, labels)
    conf = probs.max(-1)
    correct = (probs.argmax(-1) == labels).astype(np.float64)
    order = np.argsort(conf, kind="stable")
    n = len(conf)
    total = 0.0
    for chunk in np.array_split(order, n_bins):
        if len(chunk):
            total += len(chunk) / n * abs(correct[chunk].mean() - conf[chunk].mean())
    return float(total)


def nll(probs, labels, eps: float = 1e-12) -> float:
    """Mean negative log-likelihood ``-log p[y]`` (probabilities floored at ``eps``)."""
    probs, labels = _prep(probs, labels)
    return float(-np.log(np.maximum(probs[np.arange(len(labels)), labels], eps)).mean())


def brier_score(probs, labels) -> float:
    """Mean over samples of ``sum_k (p_k - [y = k])^2``."""
    probs, labels = _prep(probs, labels)
    onehot = np.eye(probs.shape[1])[labels]
    return float(((probs - onehot) ** 2).sum(-1).mean())


def accuracy(probs, labels) -> float:
    """Top-1 accuracy (argmax; ties go to the lowest index, as ``np.argmax``)."""
    probs, labels = _prep(probs, labels)
    return float((probs.argmax(-1) == labels).mean())
