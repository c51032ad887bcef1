"""The admissible set ``F(pi)`` (spec 1.3-1.4) and the antipignistic transform (spec 1.2).

In sorted coordinates (``pt = pi[sigma]`` non-increasing, ``pt_{K+1} = 0``)::

    F(pi) = { p in simplex :  sum_{k<=r} p_k >= b_r = 1 - pt_{r+1}        (dominance)
                              lo_r <= p_r - p_{r+1} <= up_r }              (shape)

with ``lo_r = eps``, ``up_r = min(1 - eps, nextafter(1, 0))`` on strict drops (gap-wide) and
``lo_r = up_r = 0`` on ties. Antipignistic: ``pdot_r = sum_{j>=r} (pt_j - pt_{j+1}) / j``.
Contract rule: possibility rows (:mod:`._inputs`). Derivation and notation:
``docs/design/possibilistic_solver.md``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from losszoo.contract import nan_where
from losszoo.ops.possibilistic._config import _F64, _check_constraint_options
from losszoo.ops.possibilistic._inputs import (
    _as_float,
    _flatten,
    _possibility_invalid,
    _validate_possibility,
)


class PossibilityConstraints(NamedTuple):
    """Sorted constraint data of :func:`possibility_constraints` (leading dims ``[...]``).

    Attributes:
      order: int32 ``[..., K]``, the stable non-increasing sort ``sigma`` of ``pi``.
      sorted_possibility: ``[..., K]`` sanitised, normalised ``pt = pi[sigma]``.
      dominance_bound: ``[..., K-1]`` ``b_r = 1 - pt_{r+1}`` (prefix mass lower bound).
      gap_lower: ``[..., K-1]`` ``lo_r`` (lower bound on ``p_r - p_{r+1}``, sorted).
      gap_upper: ``[..., K-1]`` ``up_r`` (upper bound on ``p_r - p_{r+1}``, sorted).
      active: bool ``[..., K-1]``, constraint ``r`` exists (both classes in the support).
      strict: bool ``[..., K-1]``, ``pt_r - pt_{r+1} > tie_tol`` on an active pair.
      eps: ``[...]`` the per-example margin ``eps``.
      num_support: int32 ``[...]``, ``n = #{pi > 0}`` after sanitising.
      valid: bool ``[...]``, False for NaN/Inf or all-non-positive rows.
    """

    order: tf.Tensor
    sorted_possibility: tf.Tensor
    dominance_bound: tf.Tensor
    gap_lower: tf.Tensor
    gap_upper: tf.Tensor
    active: tf.Tensor
    strict: tf.Tensor
    eps: tf.Tensor
    num_support: tf.Tensor
    valid: tf.Tensor


def _sanitize(pi):
    """Clip to [0, inf), divide by the max; invalid rows (NaN/Inf, max <= 0) become ones."""
    pi = tf.cast(pi, _F64)
    finite = tf.reduce_all(tf.math.is_finite(pi), axis=-1)
    clipped = tf.where(tf.math.is_finite(pi), tf.maximum(pi, 0.0), tf.zeros_like(pi))
    top = tf.reduce_max(clipped, axis=-1)
    valid = finite & (top > 0.0)
    safe_top = tf.where(valid, top, tf.ones_like(top))
    pi = tf.where(valid[:, None], clipped / safe_top[:, None], tf.ones_like(pi))
    return tf.minimum(pi, 1.0), valid


def _constraints_2d(pi, eps_cap, tie_tol, support_mode, floor, gap_policy):
    pi, valid = _sanitize(pi)
    if support_mode == "floor":
        pi = tf.maximum(pi, tf.constant(floor, _F64))
    k = pi.shape[-1]
    order = tf.argsort(-pi, axis=-1, stable=True)
    pt = tf.gather(pi, order, batch_dims=1)
    n_support = tf.reduce_sum(tf.cast(pt > 0.0, tf.int32), axis=-1)
    m1 = max(k - 1, 0)
    r1 = tf.range(1, m1 + 1)  # 1-indexed r
    diff = pt[:, :-1] - pt[:, 1:]
    g = diff / tf.cast(r1, _F64)
    active = r1[None, :] < n_support[:, None]
    strict = active & (diff > tie_tol)
    big = tf.constant(np.inf, _F64)
    g_min = tf.reduce_min(tf.where(strict, g, big), axis=-1)
    g_max = tf.reduce_max(tf.where(strict, g, -big), axis=-1)
    any_strict = tf.reduce_any(strict, axis=-1)
    if gap_policy == "wide":
        eps = tf.minimum(tf.minimum(tf.constant(eps_cap, _F64), g_min), 1.0 - g_max)
    else:
        eps = tf.minimum(tf.constant(eps_cap, _F64), g_min)
    eps = tf.where(any_strict, tf.maximum(eps, 0.0), tf.zeros_like(eps))
    zeros = tf.zeros_like(diff)
    lower = tf.where(strict, tf.broadcast_to(eps[:, None], tf.shape(diff)), zeros)
    if gap_policy == "wide":
        one_minus = tf.minimum(1.0 - eps, np.nextafter(1.0, 0.0))
        upper = tf.where(strict, tf.broadcast_to(one_minus[:, None], tf.shape(diff)), zeros)
    else:
        upper = tf.where(strict, g, zeros)
    bound = 1.0 - pt[:, 1:]
    return PossibilityConstraints(
        order, pt, bound, lower, upper, active, strict, eps, n_support, valid
    )


def possibility_constraints(
    possibility,
    eps_cap: float = 1e-9,
    tie_tol: float = 0.0,
    support_mode: str = "floor",
    floor: float = 1e-6,
    gap_policy: str = "wide",
    name: str | None = None,
) -> PossibilityConstraints:
    """Sorted constraint data of the admissible set ``F(pi)`` for a batch (spec 1.3-1.4).

    In sorted coordinates the constraint matrix is the same for every example; only the
    bounds differ. See the module docstring for the formulas.

    Args:
      possibility: ``[..., K]`` possibility degrees (any non-negative scale; divided by the
        row maximum; negatives clipped to 0; NaN/Inf or all-zero rows are marked invalid;
        no validation: use ``valid``).
      eps_cap: cap on the strict-gap margin ``eps``, in ``[0, 0.5)`` (1e-9 synthetic, 0.05
        for 3-class votes).
      tie_tol: sorted neighbours closer than this are tied (forced equal); in ``[0, 1)``.
      support_mode: ``"floor"`` (``pi <- max(pi, floor)``) or ``"restrict"`` (zero-``pi``
        classes are excluded; their constraints are inactive).
      floor: the floor ``rho`` of ``"floor"`` mode, in ``(0, 1)``.
      gap_policy: ``"wide"`` (``up = 1 - eps``, the paper's experiments) or
        ``"antipignistic_tight"`` (``up_r = g_r``).
      name: optional name scope.

    Returns:
      A :class:`PossibilityConstraints` of float64 tensors (no gradient flows to ``pi``).

    Raises:
      TypeError: an option of the wrong type (the message names it).
      ValueError: an option outside its range (the message names it).

    Example:
      >>> c = possibility_constraints([[1.0, 0.51, 0.5]])
      >>> c.dominance_bound.numpy().round(6)
      array([[0.49, 0.5 ]])
    """
    _check_constraint_options(eps_cap, tie_tol, support_mode, floor, gap_policy)
    with tf.name_scope(name or "possibility_constraints"):
        pi = tf.stop_gradient(_as_float(possibility, "possibility"))
        pi2, restore = _flatten(pi, "possibility")
        c = _constraints_2d(pi2, eps_cap, tie_tol, support_mode, floor, gap_policy)
        return PossibilityConstraints(*[restore(t) for t in c])


def _ranks(x):
    """``1..K`` (float64) for the last axis of ``x``, whose size may be unknown."""
    k = x.shape[-1] if x.shape[-1] is not None else tf.shape(x)[-1]
    return tf.range(1, k + 1, dtype=_F64)


def _antipignistic_sorted(h):
    """``pdot_r = sum_{j>=r} (h_j - h_{j+1}) / j`` along the last axis (h_{K+1} = 0)."""
    nxt = tf.concat([h[:, 1:], tf.zeros_like(h[:, :1])], axis=-1)
    return tf.cumsum((h - nxt) / _ranks(h), axis=-1, reverse=True)


def _unsort(x_sorted, order):
    """``x`` with ``x[b, order[b, i]] = x_sorted[b, i]`` (a scatter: cheaper than sorting
    ``order`` again to gather)."""
    rows = tf.broadcast_to(tf.range(tf.shape(order)[0])[:, None], tf.shape(order))
    return tf.scatter_nd(tf.stack([rows, order], -1), x_sorted, tf.shape(x_sorted))


@tf.custom_gradient
def _antipignistic_2d(pi, floor_value):
    """pi [B, K] float64 (any scale) -> antipignistic [B, K]; rows with NaN/Inf or no
    positive entry -> uniform (the public ops make them NaN or reject them)."""
    clean = tf.where(tf.math.is_finite(pi), tf.maximum(pi, 0.0), tf.zeros_like(pi))
    top = tf.reduce_max(clean, axis=-1, keepdims=True)
    valid = tf.reduce_all(tf.math.is_finite(pi), -1, keepdims=True) & (top > 0.0)
    safe_top = tf.where(valid, top, tf.ones_like(top))
    unit = clean / safe_top
    floored = tf.maximum(unit, floor_value)
    h_in = tf.where(valid, floored, tf.ones_like(pi))
    order = tf.argsort(-h_in, axis=-1, stable=True)
    h = tf.gather(h_in, order, batch_dims=1)
    out = _unsort(_antipignistic_sorted(h), order)

    def grad(upstream):
        u = tf.gather(tf.cast(upstream, _F64), order, batch_dims=1)
        # d/d(gap_j) = sum_{r<=j} u_r; gap_j = (h_j - h_{j+1}) / j.
        big_g = tf.cumsum(u, axis=-1) / _ranks(u)
        prev = tf.concat([tf.zeros_like(big_g[:, :1]), big_g[:, :-1]], axis=-1)
        dh = _unsort(big_g - prev, order)  # d/dh in original order
        # h = max(clean / top, floor): pass through where not floored, and the max.
        dh = tf.where(unit >= floor_value, dh, tf.zeros_like(dh))
        d_clean = dh / safe_top
        argmax = tf.gather(order, 0, axis=-1)  # the max is the first sorted class
        d_top = -tf.reduce_sum(dh * unit, axis=-1) / safe_top[:, 0]
        d_clean += tf.one_hot(argmax, tf.shape(pi)[-1], dtype=_F64) * d_top[:, None]
        d_pi = tf.where(tf.math.is_finite(pi) & (pi > 0.0), d_clean, tf.zeros_like(d_clean))
        d_pi = tf.where(valid, d_pi, tf.zeros_like(d_pi))
        return d_pi, tf.zeros_like(floor_value)

    return out, grad


def antipignistic(possibility, floor: float = 0.0, name: str | None = None) -> tf.Tensor:
    """Antipignistic probability ``pdot`` of a possibility distribution (spec 1.2).

    ``pdot_sigma(r) = sum_{j=r}^{K} (pt_j - pt_{j+1}) / j`` with ``pt`` the normalised,
    sorted possibilities: the centre of gravity of the credal set, always admissible, and
    the fixed target of the paper's Model B.

    Args:
      possibility: ``[..., K]`` possibility degrees, any positive scale (divided by the row
        maximum; ``K`` may be unknown at trace time). A row with NaN/Inf, a negative entry
        or no positive entry is rejected: ``ValueError`` eagerly, an assertion in graphs,
        both naming ``possibility``; under XLA its output row is NaN.
      floor: optional floor applied after normalising (``pi <- max(pi, floor)``); 0 keeps
        zero-possibility classes at probability 0.
      name: optional name scope.

    Returns:
      ``[..., K]`` probabilities in ``possibility``'s floating dtype (float32 for integer
      input). The gradient with respect to ``possibility`` is the exact (piecewise-linear)
      one, hand-derived.

    Example:
      >>> antipignistic([[1.0, 0.51, 0.5]]).numpy().round(6)
      array([[0.661667, 0.171667, 0.166667]], dtype=float32)
    """
    if not 0.0 <= floor < 1.0:
        raise ValueError(f"`floor` must be in [0, 1), got {floor!r}.")
    with tf.name_scope(name or "antipignistic"):
        pi = _as_float(possibility, "possibility")
        dtype = pi.dtype if pi.dtype.is_floating else tf.float32
        pi2, restore = _flatten(pi, "possibility", static_k=False)
        pi2 = tf.cast(_validate_possibility(pi2, "possibility", normalised=False), _F64)
        out = _antipignistic_2d(pi2, tf.constant(floor, _F64))
        out = nan_where(_possibility_invalid(pi2, normalised=False)[:, None], out)
        return tf.cast(restore(out), dtype)
