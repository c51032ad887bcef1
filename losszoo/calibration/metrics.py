"""Calibration metrics as plain functions on arrays (numpy).

Top-label ECE follows the paper's eq. 28 (spec section 6): ``M`` equal-width bins, right-closed
``((m-1)/M, m/M]``, weighted by bin size, empty bins contribute 0. Classwise ECE, adaptive
(equal-mass) ECE, NLL and the Brier score are our additions (the paper reports only ECE and
accuracy). ``probs`` is ``[N, K]``; ``labels`` are integer class ids ``[N]`` (or one-hot
``[N, K]``).

Fail loud (README, "Bad input"): every function raises ``ValueError``/``TypeError`` naming the
argument for probabilities that are not on the simplex (NaN, Inf, negative, rows not summing to
1), labels outside ``[0, K)`` (``-1`` is an error, not the last class), fractional / NaN labels,
malformed one-hot rows and ``n_bins`` that is not a positive integer (the rules ``PROBABILITIES``,
``contract.CLASS_IDS`` and ``ONE_HOT`` of the streaming metrics). These are numpy functions: they
run eagerly only (on any Keras backend), so there is no XLA case.
"""

from __future__ import annotations

import numpy as np

from losszoo.contract import CLASS_IDS, ONE_HOT, PROBABILITIES, check_number, validation

__all__ = ["accuracy", "adaptive_ece", "brier_score", "classwise_ece", "ece", "nll"]


def _prep(probs, labels):
    """Validate and convert: probs ``[N, K]`` float64 on the simplex, labels int ``[N]``.

    Raises ``ValueError`` naming the argument for: probs not 2-D, empty, or breaking
    ``PROBABILITIES`` (NaN/inf, negative, rows not summing to 1 within
    ``contract.PROBABILITY_SUM_TOL``); labels as :func:`_class_ids` rejects them (one-hot rows
    allowed). Always checked (``losszoo.set_validation`` concerns per-step tensor checks;
    these functions are not on a training path).
    """
    try:
        probs = np.asarray(probs, np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"`probs` must be a real array [N, K]: {err}") from err
    if probs.ndim != 2:
        raise ValueError(f"`probs` must be [N, K], got shape {probs.shape}.")
    n, k = probs.shape
    if n == 0 or k == 0:
        raise ValueError(f"`probs` must have at least one row and one class, got {probs.shape}.")
    with validation(True):
        PROBABILITIES.check(probs, "probs")
    return probs, _class_ids(labels, "labels", n, k, one_hot=True)


def _class_ids(labels, name, n, k, one_hot=False):
    """``labels`` as ``n`` int64 class ids in ``[0, k)``, always checked (host data).

    Accepted: shape ``[n]`` or ``[n, 1]`` keeping ``contract.CLASS_IDS`` (negative ids are not
    read from the end; NaN and fractions are rejected) and, with ``one_hot``, rows ``[n, k]``
    (``k > 1``) keeping ``ONE_HOT`` (ambiguous rows are rejected rather than argmaxed).
    Anything else raises ``ValueError`` / ``TypeError`` naming ``name``.
    """
    raw = np.asarray(labels)
    if raw.dtype.kind not in "iuf":  # bool, complex, strings, objects
        raise TypeError(f"`{name}` must be integer class ids, got dtype {raw.dtype}.")
    with validation(True):
        if one_hot and raw.shape == (n, k) and k > 1:
            return ONE_HOT.check(raw, name).argmax(-1)
        if raw.ndim > 2 or (raw.ndim == 2 and raw.shape[1] != 1) or raw.size != n:
            forms = "[N], [N, 1] or one-hot [N, K]" if one_hot else "[N] or [N, 1]"
            raise ValueError(
                f"`{name}` must hold {n} class ids (one per example), of shape {forms}; "
                f"got shape {raw.shape}."
            )
        return CLASS_IDS.check(raw.reshape(-1), name, k).astype(np.int64)


def _bin_index(values, n_bins):
    """Right-closed equal-width bins ((m-1)/M, m/M]; 0 goes to the first bin."""
    edges = np.arange(1, n_bins) / n_bins
    return (values[:, None] > edges[None, :]).sum(-1)


def _top_label(probs, labels):
    """Each row's confidence (top probability) and whether its argmax is the label (0/1)."""
    return probs.max(-1), (probs.argmax(-1) == labels).astype(np.float64)


def _binned_gap(values, hits, n_bins):
    """``sum_m |B_m|/N |mean(hits in B_m) - mean(values in B_m)|`` over equal-width bins of
    ``values`` (empty bins contribute 0)."""
    gaps = np.bincount(_bin_index(values, n_bins), hits - values, minlength=n_bins)
    return np.abs(gaps).sum() / len(values)


def ece(probs, labels, n_bins: int = 15) -> float:
    """Top-label expected calibration error ``ECE = sum_m |B_m|/N |acc(B_m) - conf(B_m)|``.

    Paper eq. 28: the top-label confidences ``max_k p_k`` fall into ``M = n_bins`` equal-width
    right-closed bins ``B_m = ((m-1)/M, m/M]``; ``acc(B_m)`` is the fraction of the bin's rows
    whose argmax is the label, ``conf(B_m)`` their mean confidence; empty bins contribute 0.

    Args:
      probs: probabilities ``[N, K]``, each row on the simplex (``PROBABILITIES``: finite,
        non-negative, summing to 1 within ``contract.PROBABILITY_SUM_TOL``).
      labels: integer class ids ``[N]`` or ``[N, 1]`` in ``[0, K)`` (whole-number floats
        accepted), or one-hot rows ``[N, K]``.
      n_bins: number of bins ``M``, a positive integer (default 15, the paper's).

    Returns:
      The ECE as a Python float in ``[0, 1]``.

    Raises:
      ValueError / TypeError: naming ``probs`` or ``labels`` when they break the rules above,
        or ``n_bins`` when it is not a positive integer.

    Example:
      >>> probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.8, 0.2], [0.3, 0.7]])
      >>> round(losszoo.calibration.ece(probs, [0, 1, 0, 1]), 4)
      0.3
      >>> round(losszoo.calibration.ece(probs, [0, 1, 0, 1], n_bins=2), 4)  # one bin holds all
      0.0
    """
    n_bins = check_number(n_bins, "n_bins", low=1, integer=True)
    conf, correct = _top_label(*_prep(probs, labels))
    return float(_binned_gap(conf, correct, n_bins))


def classwise_ece(probs, labels, n_bins: int = 15) -> float:
    """Classwise ECE ``1/K sum_k sum_m |B_km|/N |mean_{B_km} [y = k] - mean_{B_km} p_k|``.

    The mean over classes ``k`` of the binned calibration error of ``p_k`` against ``[y = k]``
    (Kull et al., 2019): for each class, the ``N`` values ``p_k`` fall into ``M = n_bins``
    equal-width right-closed bins ``B_km``; empty bins contribute 0.

    Args:
      probs: probabilities ``[N, K]``, each row on the simplex (``PROBABILITIES``: finite,
        non-negative, summing to 1 within ``contract.PROBABILITY_SUM_TOL``).
      labels: integer class ids ``[N]`` or ``[N, 1]`` in ``[0, K)`` (whole-number floats
        accepted), or one-hot rows ``[N, K]``.
      n_bins: number of bins ``M``, a positive integer (default 15, the paper's).

    Returns:
      The classwise ECE as a Python float in ``[0, 1]``.

    Raises:
      ValueError / TypeError: naming ``probs`` or ``labels`` when they break the rules above,
        or ``n_bins`` when it is not a positive integer.

    Example:
      >>> probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.8, 0.2], [0.3, 0.7]])
      >>> round(losszoo.calibration.classwise_ece(probs, [0, 1, 0, 1], n_bins=2), 4)
      0.15
    """
    n_bins = check_number(n_bins, "n_bins", low=1, integer=True)
    probs, labels = _prep(probs, labels)
    onehot = np.eye(probs.shape[1])[labels]
    return float(np.mean([_binned_gap(p, y, n_bins) for p, y in zip(probs.T, onehot.T)]))


def adaptive_ece(probs, labels, n_bins: int = 15) -> float:
    """Top-label ECE with equal-mass bins, ``sum_m |B_m|/N |acc(B_m) - conf(B_m)|``.

    The rows, sorted by top-label confidence (stable sort), are split into ``M = n_bins``
    groups of (nearly) equal size (``np.array_split``; with ``n_bins > N`` the extra groups
    are empty and contribute 0); ``acc`` and ``conf`` as in :func:`ece`.

    Args:
      probs: probabilities ``[N, K]``, each row on the simplex (``PROBABILITIES``: finite,
        non-negative, summing to 1 within ``contract.PROBABILITY_SUM_TOL``).
      labels: integer class ids ``[N]`` or ``[N, 1]`` in ``[0, K)`` (whole-number floats
        accepted), or one-hot rows ``[N, K]``.
      n_bins: number of bins ``M``, a positive integer (default 15, the paper's).

    Returns:
      The adaptive ECE as a Python float in ``[0, 1]``.

    Raises:
      ValueError / TypeError: naming ``probs`` or ``labels`` when they break the rules above,
        or ``n_bins`` when it is not a positive integer.

    Example:
      >>> probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.8, 0.2], [0.3, 0.7]])
      >>> round(losszoo.calibration.adaptive_ece(probs, [0, 1, 0, 1], n_bins=2), 4)
      0.15
    """
    n_bins = check_number(n_bins, "n_bins", low=1, integer=True)
    conf, correct = _top_label(*_prep(probs, labels))
    gaps = correct - conf
    chunks = np.array_split(np.argsort(conf, kind="stable"), n_bins)
    return float(sum(abs(gaps[chunk].sum()) for chunk in chunks) / len(conf))


def nll(probs, labels, eps: float = 1e-12) -> float:
    """Mean negative log-likelihood ``1/N sum_i -log max(p_i[y_i], eps)``.

    Args:
      probs: probabilities ``[N, K]``, each row on the simplex (``PROBABILITIES``: finite,
        non-negative, summing to 1 within ``contract.PROBABILITY_SUM_TOL``).
      labels: integer class ids ``[N]`` or ``[N, 1]`` in ``[0, K)`` (whole-number floats
        accepted), or one-hot rows ``[N, K]``.
      eps: floor of the label's probability, in ``(0, 1]`` (default ``1e-12``): a zero
        probability gives ``-log(eps)``, not ``inf``.

    Returns:
      The NLL as a Python float (``>= 0``).

    Raises:
      ValueError / TypeError: naming ``probs`` or ``labels`` when they break the rules above,
        or ``eps`` outside ``(0, 1]``.

    Example:
      >>> probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.8, 0.2], [0.3, 0.7]])
      >>> round(losszoo.calibration.nll(probs, [0, 1, 0, 1]), 4)
      0.4004
    """
    eps = check_number(eps, "eps", low=0.0, high=1.0, low_open=True)
    probs, labels = _prep(probs, labels)
    return float(-np.log(np.maximum(probs[np.arange(len(labels)), labels], eps)).mean())


def brier_score(probs, labels) -> float:
    """Brier score ``1/N sum_i sum_k (p_ik - [y_i = k])^2``.

    Args:
      probs: probabilities ``[N, K]``, each row on the simplex (``PROBABILITIES``: finite,
        non-negative, summing to 1 within ``contract.PROBABILITY_SUM_TOL``).
      labels: integer class ids ``[N]`` or ``[N, 1]`` in ``[0, K)`` (whole-number floats
        accepted), or one-hot rows ``[N, K]``.

    Returns:
      The score as a Python float in ``[0, 2]``.

    Raises:
      ValueError / TypeError: naming ``probs`` or ``labels`` when they break the rules above.

    Example:
      >>> probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.8, 0.2], [0.3, 0.7]])
      >>> round(losszoo.calibration.brier_score(probs, [0, 1, 0, 1]), 4)
      0.25
    """
    probs, labels = _prep(probs, labels)
    onehot = np.eye(probs.shape[1])[labels]
    return float(((probs - onehot) ** 2).sum(-1).mean())


def accuracy(probs, labels) -> float:
    """Top-1 accuracy ``1/N sum_i [argmax_k p_ik = y_i]``.

    Ties go to the lowest index, as ``np.argmax``.

    Args:
      probs: probabilities ``[N, K]``, each row on the simplex (``PROBABILITIES``: finite,
        non-negative, summing to 1 within ``contract.PROBABILITY_SUM_TOL``).
      labels: integer class ids ``[N]`` or ``[N, 1]`` in ``[0, K)`` (whole-number floats
        accepted), or one-hot rows ``[N, K]``.

    Returns:
      The accuracy as a Python float in ``[0, 1]``.

    Raises:
      ValueError / TypeError: naming ``probs`` or ``labels`` when they break the rules above.

    Example:
      >>> probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.8, 0.2], [0.3, 0.7]])
      >>> losszoo.calibration.accuracy(probs, [0, 1, 0, 1])
      0.75
    """
    return float(_top_label(*_prep(probs, labels))[1].mean())
