"""The admissible set ``F(pi)`` (spec 1.3-1.4) and the antipignistic transform (spec 1.2).

In sorted coordinates (``pt = pi[sigma]`` non-increasing, ``pt_{K+1} = 0``)::

    F(pi) = { p in simplex :  sum_{k<=r} p_k >= b_r = 1 - pt_{r+1}        (dominance)
                              lo_r <= p_r - p_{r+1} <= up_r }              (shape)

with ``lo_r = eps``, ``up_r = min(1 - eps, nextafter(1, 0))`` on strict drops (gap-wide) and
``lo_r = up_r = 0`` on ties. Antipignistic: ``pdot_r = sum_{j>=r} (pt_j - pt_{j+1}) / j``.
Contract rules: ``SCALED_POSSIBILITY`` (antipignistic). Computed in float64 (on JAX with
``jax_enable_x64``). Derivation and notation: ``docs/design/possibilistic_solver.md``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from keras import ops

from losszoo import _backend
from losszoo._backend import cumsum, maximum, minimum, no_autograph
from losszoo.contract import SCALED_POSSIBILITY, check_number, nan_where, to_compute_dtype
from losszoo.ops.possibilistic._config import F64, ProjectionConfig, _0, _1
from losszoo.ops.possibilistic._inputs import flatten


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

    order: Any
    sorted_possibility: Any
    dominance_bound: Any
    gap_lower: Any
    gap_upper: Any
    active: Any
    strict: Any
    eps: Any
    num_support: Any
    valid: Any


def sanitize(pi):
    """Clip to [0, inf), divide by the max; invalid rows (NaN/Inf, max <= 0) become ones."""
    pi = ops.cast(pi, F64)
    finite = ops.all(ops.isfinite(pi), axis=-1)
    clipped = ops.where(ops.isfinite(pi), maximum(pi, _0), ops.zeros_like(pi))
    top = _backend.reduce_max(clipped, axis=-1)
    valid = finite & (top > 0.0)
    safe_top = ops.where(valid, top, ops.ones_like(top))
    pi = ops.where(valid[:, None], clipped / safe_top[:, None], ops.ones_like(pi))
    return minimum(pi, _1), valid


def constraints_2d(pi, cfg: ProjectionConfig):
    """:class:`PossibilityConstraints` of ``pi`` [B, K] float64 with the constraint options of
    ``cfg`` (``eps_cap``, ``tie_tol``, ``support_mode``, ``floor``, ``gap_policy``)."""
    pi, valid = sanitize(pi)
    if cfg.support_mode == "floor":
        pi = maximum(pi, ops.cast(cfg.floor, F64))
    k = pi.shape[-1]
    order = ops.cast(ops.argsort(-pi, axis=-1), "int32")
    pt = _backend.take_along_axis(pi, order)
    n_support = ops.sum(ops.cast(pt > 0.0, "int32"), axis=-1)
    r1 = ops.arange(1, max(k - 1, 0) + 1, dtype="int32")  # 1-indexed r
    diff = pt[:, :-1] - pt[:, 1:]
    g = diff / ops.cast(r1, F64)
    active = r1[None, :] < n_support[:, None]
    strict = active & (diff > cfg.tie_tol)
    g_min = ops.min(ops.where(strict, g, np.inf), axis=-1, initial=np.inf)
    g_max = ops.max(ops.where(strict, g, -np.inf), axis=-1, initial=-np.inf)
    any_strict = ops.any(strict, axis=-1)
    eps = minimum(ops.cast(cfg.eps_cap, F64), g_min)
    if cfg.gap_policy == "wide":
        eps = minimum(eps, 1.0 - g_max)
    eps = ops.where(any_strict, maximum(eps, _0), ops.zeros_like(eps))
    zeros = ops.zeros_like(diff)
    lower = ops.where(strict, eps[:, None], zeros)
    if cfg.gap_policy == "wide":
        upper = ops.where(strict, minimum(1.0 - eps, np.nextafter(1.0, 0.0))[:, None], zeros)
    else:
        upper = ops.where(strict, g, zeros)
    bound = 1.0 - pt[:, 1:]
    return PossibilityConstraints(
        order, pt, bound, lower, upper, active, strict, eps, n_support, valid
    )


@no_autograph
def possibility_constraints(
    possibility,
    eps_cap: float = 1e-9,
    tie_tol: float = 0.0,
    support_mode: str = "floor",
    floor: float = 1e-6,
    gap_policy: str = "wide",
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

    Returns:
      A :class:`PossibilityConstraints` of float64 tensors (no gradient flows to ``pi``).

    Raises:
      TypeError: an option of the wrong type (the message names it).
      ValueError: an option outside its range (the message names it).

    Example:
      >>> c = possibility_constraints([[1.0, 0.51, 0.5]])
      >>> keras.ops.convert_to_numpy(c.dominance_bound).round(6)
      array([[0.49, 0.5 ]])
    """
    cfg = ProjectionConfig(
        eps_cap=eps_cap,
        tie_tol=tie_tol,
        support_mode=support_mode,
        floor=floor,
        gap_policy=gap_policy,
    )
    _backend.require_float64("possibility_constraints")
    pi, _ = to_compute_dtype(possibility, "possibility")
    pi2, restore = flatten(ops.stop_gradient(pi), "possibility")
    c = constraints_2d(pi2, cfg)
    return PossibilityConstraints(*[restore(t) for t in c])


def _ranks(x):
    """``1..K`` (float64) for the last axis of ``x``, whose size may be unknown."""
    k = x.shape[-1] if x.shape[-1] is not None else ops.shape(x)[-1]
    return ops.arange(1, k + 1, dtype=F64)


def antipignistic_sorted(h):
    """``pdot_r = sum_{j>=r} (h_j - h_{j+1}) / j`` along the last axis (h_{K+1} = 0)."""
    nxt = ops.concatenate([h[:, 1:], ops.zeros_like(h[:, :1])], axis=-1)
    return ops.flip(cumsum(ops.flip((h - nxt) / _ranks(h), -1), -1), -1)


def unsort(x_sorted, order):
    """``x`` with ``x[b, order[b, i]] = x_sorted[b, i]`` (a scatter: cheaper than sorting
    ``order`` again to gather)."""
    rows = ops.arange(ops.shape(order)[0], dtype="int32")[:, None]
    rows = ops.broadcast_to(rows, ops.shape(order))
    return ops.scatter(ops.stack([rows, order], -1), x_sorted, ops.shape(x_sorted))


def _antipignistic_2d(floor_value):
    """pi [B, K] float64 (any scale) -> antipignistic [B, K] with its exact gradient; rows
    with NaN/Inf or no positive entry -> uniform (the public ops make them NaN)."""

    @_backend.custom_gradient
    def f(pi):
        clean = ops.where(ops.isfinite(pi), maximum(pi, _0), ops.zeros_like(pi))
        top = _backend.reduce_max(clean, axis=-1, keepdims=True)
        valid = ops.all(ops.isfinite(pi), -1, keepdims=True) & (top > 0.0)
        safe_top = ops.where(valid, top, ops.ones_like(top))
        unit = clean / safe_top
        h_in = ops.where(valid, maximum(unit, floor_value), ops.ones_like(pi))
        order = ops.cast(ops.argsort(-h_in, axis=-1), "int32")
        out = unsort(antipignistic_sorted(_backend.take_along_axis(h_in, order)), order)

        def grad(upstream):
            u = _backend.take_along_axis(ops.cast(upstream, F64), order)
            # d/d(gap_j) = sum_{r<=j} u_r; gap_j = (h_j - h_{j+1}) / j.
            big_g = cumsum(u, -1) / _ranks(u)
            prev = ops.concatenate([ops.zeros_like(big_g[:, :1]), big_g[:, :-1]], axis=-1)
            dh = unsort(big_g - prev, order)  # d/dh in original order
            # h = max(clean / top, floor): pass through where not floored, and the max.
            dh = ops.where(unit >= floor_value, dh, ops.zeros_like(dh))
            d_clean = dh / safe_top
            argmax = order[:, :1]  # the max is the first sorted class
            d_top = -ops.sum(dh * unit, axis=-1, keepdims=True) / safe_top
            cols = ops.arange(ops.shape(pi)[-1], dtype="int32")[None, :]
            d_clean += ops.where(ops.equal(cols, argmax), d_top, 0.0)
            d_pi = ops.where(ops.isfinite(pi) & (pi > 0.0), d_clean, ops.zeros_like(d_clean))
            return ops.where(valid, d_pi, ops.zeros_like(d_pi))

        return out, grad

    return f


@no_autograph
def antipignistic(possibility, floor: float = 0.0):
    """Antipignistic probability ``pdot`` of a possibility distribution (spec 1.2).

    ``pdot_sigma(r) = sum_{j=r}^{K} (pt_j - pt_{j+1}) / j`` with ``pt`` the normalised,
    sorted possibilities: the centre of gravity of the credal set, always admissible, and
    the fixed target of the paper's Model B. Computed in float64 (on JAX with
    ``jax_enable_x64``).

    Args:
      possibility: ``[..., K]`` possibility degrees, any positive scale (divided by the row
        maximum; ``K`` may be unknown at trace time). Rows must keep the rule
        ``contract.SCALED_POSSIBILITY`` (finite, non-negative, a positive maximum): others
        raise ``ValueError`` eagerly (an assertion in TensorFlow graphs), naming
        ``possibility``; traced under XLA / ``jax.jit`` their output row is NaN.
      floor: optional floor applied after normalising (``pi <- max(pi, floor)``) in
        ``[0, 1)``; 0 keeps zero-possibility classes at probability 0.

    Returns:
      ``[..., K]`` probabilities in ``possibility``'s floating dtype (float32 for integer
      input). The gradient with respect to ``possibility`` is the exact (piecewise-linear)
      one, hand-derived.

    Raises:
      RuntimeError: on JAX without ``jax_enable_x64``.

    Example:
      >>> keras.ops.convert_to_numpy(antipignistic([[1.0, 0.51, 0.5]])).round(6)
      array([[0.661667, 0.171667, 0.166667]], dtype=float32)
    """
    floor = check_number(floor, "floor", low=0.0, high=1.0, high_open=True)
    _backend.require_float64("antipignistic")
    pi, dtype = to_compute_dtype(possibility, "possibility")
    pi2, restore = flatten(pi, "possibility", static_k=False)
    pi2 = ops.cast(SCALED_POSSIBILITY.check(pi2, "possibility"), F64)
    out = _antipignistic_2d(ops.cast(floor, F64))(pi2)
    out = nan_where(SCALED_POSSIBILITY.invalid(pi2)[:, None], out)
    return ops.cast(restore(out), dtype)
