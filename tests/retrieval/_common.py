"""Shared by the retrieval tests: tiny problems and a numpy softmax cross-entropy."""

from __future__ import annotations

import numpy as np


def softmax_ce(logits, labels, weights=None):
    """Summed softmax cross-entropy of ``logits`` [B, n] with positive columns ``labels``."""
    z = np.asarray(logits, np.float64)
    finite_max = np.max(np.where(np.isfinite(z), z, -np.inf), axis=1, keepdims=True)
    log_norm = finite_max[:, 0] + np.log(np.sum(np.exp(z - finite_max), axis=1))
    per_row = log_norm - z[np.arange(len(z)), labels]
    return float(np.sum(per_row if weights is None else per_row * weights))


def towers(b=4, c=6, d=3, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(b, d)).astype(np.float32)
    v = rng.normal(size=(c, d)).astype(np.float32)
    return q, v
