"""KL projection onto the credal set of a possibility distribution (Baaj & Marquis, 2026).

Spec: ``shared/specs/possibilistic_projection.md`` (sections cited as "spec 1.4" etc.).

Notation (spec 1). Classes ``1..K``; supervision ``pi`` in ``[0, 1]^K`` with ``max pi = 1``.
``sigma`` sorts ``pi`` non-increasingly (stable, ties in index order), ``pt_r = pi_sigma(r)``,
``pt_{K+1} = 0``. In sorted coordinates the admissible set is (spec 1.4)::

    F(pi) = { p in simplex :  sum_{k<=r} p_k >= b_r = 1 - pt_{r+1}        (dominance)
                              lo_r <= p_r - p_{r+1} <= up_r }              (shape)

for ``r = 1..n-1`` (``n`` = support size), i.e. ``m = 3(n-1)`` half-spaces ``<a_h, p> >= b_h``
visited in the fixed order pref(1..n-1), low(1..n-1), up(1..n-1). Bounds (spec 1.3,
"gap-wide"): ``lo_r = eps, up_r = min(1 - eps, nextafter(1, 0))`` where
``pt_r - pt_{r+1} > tie_tol`` (strict), ``lo_r = up_r = 0`` on ties, with
``eps = min(eps_cap, min_strict g_r, 1 - max_strict g_r)`` and ``g_r = (pt_r - pt_{r+1})/r``.

Antipignistic reference (spec 1.2): ``pdot_r = sum_{j>=r} (pt_j - pt_{j+1}) / j``.

Default solver (``method="interior_point"``, certified rule): ties are pooled into blocks
(exact), two-block rows (one-hot labels) are solved in closed form, the others by a
Mehrotra predictor-corrector interior point on the tail masses of the block chain (one
cyclic-reduction factorisation of a pentadiagonal matrix per iteration: O(K) work in
O(log K) stages, about 15 iterations whatever K). Every row is certified on the original
constraints by the exact duality gap ``KL(p||q) - g(lam)``; the dual point
``softmax(log q + A^T lam)`` is returned when it certifies, else the (feasible) primal
iterate; a row neither certifies is finished by warm-started Dykstra. Derivation in
``docs/design/possibilistic_solver.md``. ``method="dykstra"`` is the solver below.

Fail-loud contract: ``possibility`` rows must be finite, in ``[0, 1]`` with maximum 1, and
logits must hold no NaN or +inf and no row of only -inf (a -inf logit masks its class);
otherwise an error names the argument (eagerly and in graphs). Under XLA: assertions vanish,
so invalid rows give NaN projections and NaN losses instead; a NaN never becomes a finite
value. Batch sizes may be unknown at trace time (``None``); ``K`` must be static for the
projection (its solvers unroll over it), not for :func:`antipignistic` and the fixed-target
losses.

Dykstra (``method="dykstra"``, and the only solver of the ``"paper"`` / ``"fixed"`` rules),
spec 2: ``p* = argmin_{p in F} KL(p || q)`` by Dykstra's algorithm with Bregman (KL)
projections in its scalar dual form (spec 2.4), i.e. cyclic dual coordinate
ascent on ``g(lam) = lam.b - log sum_k q_k exp((A^T lam)_k)``, ``lam >= 0``, with iterate
``p = softmax(log q + A^T lam)``. One step for constraint ``h`` removes its old
multiplier, and sets the new one to 0 if the constraint holds, else to the closed form of
the single-set projection (spec 2.2):

* dominance ``r``, with prefix mass ``P``, tail mass ``T`` (unnormalised):
  violated iff ``T > pt_{r+1} (P + T)``; then ``exp(lam) = b_r T / (pt_{r+1} P)``.
* gap ``x_i - x_j >= delta`` with others' mass ``u``: ``E = exp(lam)`` is the positive root of
  ``z_i (1 - delta) E^2 - u delta E - z_j (1 + delta) = 0``, computed without cancellation:
  ``E = (u delta + sqrt(D)) / (2 z_i (1 - delta))`` for ``delta > 0``,
  ``E = 2 z_j (1 + delta) / (sqrt(D) - u delta)`` for ``delta < 0``, ``E = sqrt(z_j / z_i)``
  for ``delta = 0``, with ``D = u^2 delta^2 + 4 z_i z_j (1 - delta^2)``.

Because the projections are scale invariant, one sweep (pref, low or up) keeps only a few
running scalars per example (prefix mass, head mass, carried coordinate; spec 2.5 "running
sums") so each step costs O(1) per example, a cycle O(n). At every sweep start the iterate
is rebuilt exactly from ``lam`` (``x = log q + A^T lam``), so there is no drift.

Stopping (spec 2.6), after each full cycle, with ``V = max_h (b_h - <a_h, p>)_+`` and the
duality gap ``gap = KL(p||q) - g(lam) = sum_h lam_h (<a_h, p> - b_h)``:

* ``"paper"``: stop when ``V <= tol`` (the paper's rule; feasible but not certified optimal);
* ``"certified"`` (default): stop when ``V <= tol`` and ``|gap| <= gap_tol``; with ``V = 0``,
  ``||p - p*||_1 <= sqrt(2 gap)``;
* ``"fixed"``: run exactly ``max_cycles`` cycles.

Each example stops on its own (its state is frozen, spec 3.5); the batch loop runs to the
slowest member or ``max_cycles``.

Loss and gradient (spec 4): ``l(z) = min_{p in F} KL(p || softmax(z)) = KL(p* || q)``; by
Danskin's theorem ``dl/dz = softmax(z) - p*`` exactly (``p*`` held fixed), which is the
custom gradient of :func:`possibilistic_projection_loss`. The fixed-target baselines
``KL(t || softmax(z))`` have gradient ``sum(t) softmax(z) - t``.

Bad inputs (spec 5) and edge cases: possibility rows that break the rule above are rejected
(NaN projection and loss under XLA, ``valid=False``); the kernels compute on a sanitised
copy (negatives clipped to 0, divided by the row maximum, rows with NaN/Inf or no positive
entry replaced by ones) whose result for those rows is discarded.
:func:`possibility_constraints` (no validation: ``valid`` flags such rows) and
:func:`antipignistic` (any positive scale) divide ``pi`` by its row maximum too. Zeros
in ``pi``: ``support_mode="floor"`` replaces ``pi`` by ``max(pi, floor)``;
``support_mode="restrict"`` projects on the support only (zero probability and zero
gradient elsewhere). No strict drop in ``pi`` on the support (e.g. all ones) short-circuits
to the uniform distribution on the support; support size <= 1 (incl. K = 1) returns q
renormalised on the support. ``log q`` is clamped at ``log(q_clip)`` and renormalised before
projecting. Everything runs in float64 (``compute_dtype="float32"`` is allowed only with
``tol >= 1e-5`` and ``eps_cap >= 1e-5``); outputs are cast back to the input dtype.

Implementation (Dykstra): the projection loop is ``tf.while_loop`` over cycles with rolled
inner loops over constraints. For ``K <= unroll_max_k`` a separate kernel unrolls
every step on Python lists of ``[B]`` vectors (no cumsum/concat/slicing, so XLA fuses a
whole cycle into a few elementwise loops; same iterates and cycle counts), all inside
one cached ``tf.function(jit_compile=True)`` per configuration; every loop output is behind
``tf.stop_gradient`` (spec 3.8).
"""

from __future__ import annotations

import functools
import warnings
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from losszoo.ops._common import (
    check_number,
    check_static_rank,
    nan_where,
    row_has_nan,
    static_value,
    validation_enabled,
)

_STOPPING = ("certified", "paper", "fixed")
_STOPPING_CODE = {"paper": 0, "certified": 1, "fixed": 2}
_SUPPORT = ("floor", "restrict")
_GAP_POLICY = ("wide", "antipignistic_tight")
_F64 = tf.float64
# Small-K kernel: full cycles per while-loop iteration (each still tested and frozen).
_SMALL_K_CYCLES_PER_ITER = 1


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


# --------------------------------------------------------------------------------------
# Argument handling
# --------------------------------------------------------------------------------------


def _check_choice(value, choices, name):
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {choices}, got {value!r}.")


def _check_constraint_options(eps_cap, tie_tol, support_mode, floor, gap_policy):
    """Validate the options of :func:`possibility_constraints`; returns ``eps_cap``."""
    _check_choice(support_mode, _SUPPORT, "support_mode")
    _check_choice(gap_policy, _GAP_POLICY, "gap_policy")
    check_number(floor, "floor", low=0.0, low_open=True, high=1.0, high_open=True)
    check_number(tie_tol, "tie_tol", low=0.0, high=1.0, high_open=True)
    return check_number(eps_cap, "eps_cap", low=0.0, high=0.5, high_open=True)


def _check_config(
    tol,
    gap_tol,
    max_cycles,
    stopping,
    support_mode,
    floor,
    eps_cap,
    tie_tol,
    gap_policy,
    q_clip,
    compute_dtype,
    method=None,
):
    """Validate the hyper-parameters (Python numbers); raise naming the argument."""
    _check_choice(stopping, _STOPPING, "stopping")
    _check_choice(compute_dtype, ("float64", "float32"), "compute_dtype")
    tol = check_number(tol, "tol", low=0.0, low_open=True, high=1.0, high_open=True)
    check_number(gap_tol, "gap_tol", low=0.0, low_open=True, high=1.0, high_open=True)
    check_number(q_clip, "q_clip", low=0.0, low_open=True, high=1.0, high_open=True)
    check_number(max_cycles, "max_cycles", low=1, integer=True)
    eps_cap = _check_constraint_options(eps_cap, tie_tol, support_mode, floor, gap_policy)
    if compute_dtype == "float32" and (tol < 1e-5 or eps_cap < 1e-5):
        raise ValueError(
            "compute_dtype='float32' needs `tol` >= 1e-5 and `eps_cap` >= 1e-5 (eps=1e-9 and "
            f"tol=1e-8 are below float32 resolution); got tol={tol!r}, eps_cap={eps_cap!r}. "
            "Use the default compute_dtype='float64'."
        )
    _resolve_method(method, stopping)


_POSSIBILITY_RULE = (
    "must hold finite possibility degrees in [0, 1] with row maximum 1 "
    "(a normalised possibility distribution)"
)
_SCALED_POSSIBILITY_RULE = (
    "must hold finite, non-negative possibility degrees with a positive row maximum"
)
_MAX_ONE_TOL = 1e-6


def _possibility_invalid(pi2, normalised=True):
    """Rows of ``pi2`` [B, K] that break the possibility rule (bool [B]).

    ``normalised``: entries in [0, 1] with row maximum 1 (:data:`_POSSIBILITY_RULE`); else
    any scale: finite, non-negative entries with a positive maximum.
    """
    pi2 = tf.cast(pi2, _F64)
    ok = tf.math.is_finite(pi2) & (pi2 >= 0.0)
    if normalised:
        ok &= pi2 <= 1.0
    top = tf.reduce_max(tf.where(tf.math.is_finite(pi2), pi2, 0.0), axis=-1)
    low_top = top < 1.0 - _MAX_ONE_TOL if normalised else top <= 0.0
    return ~tf.reduce_all(ok, axis=-1) | low_top


def _validate_possibility(pi, name, normalised=True):
    """Eager ValueError / graph assertion naming ``name`` for rows that
    :func:`_possibility_invalid` flags."""
    if not validation_enabled():
        return pi
    rule = _POSSIBILITY_RULE if normalised else _SCALED_POSSIBILITY_RULE
    message = f"`{name}` {rule}."
    value = static_value(pi)
    if value is not None:
        v = np.asarray(value, np.float64)
        if v.size == 0:
            return pi
        v2 = v.reshape(-1, v.shape[-1])
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(v2) & (v2 >= 0)
            if normalised:
                ok &= v2 <= 1
            top = np.max(np.where(np.isfinite(v2), v2, 0.0), axis=-1)
            bad = ~np.all(ok, axis=-1) | (top < 1.0 - _MAX_ONE_TOL if normalised else top <= 0)
        if bad.any():
            rows = np.flatnonzero(bad)[:5].tolist()
            raise ValueError(f"{message[:-1]}; rows {rows} are not.")
        return pi
    pi2 = tf.reshape(pi, [-1, tf.shape(pi)[-1]])
    check = tf.debugging.Assert(~tf.reduce_any(_possibility_invalid(pi2, normalised)), [message])
    with tf.control_dependencies([check]):
        return tf.identity(pi)


_LOGITS_RULE = "must not hold NaN or +inf, nor rows that are all -inf (-inf masks a class)"


def _logits_invalid(z2):
    """Rows of ``z2`` [B, K] with NaN, +inf or no class above -inf (bool [B])."""
    inf = tf.constant(np.inf, z2.dtype)
    return row_has_nan(z2) | tf.reduce_any(tf.equal(z2, inf), -1) | tf.reduce_all(z2 <= -inf, -1)


def _validate_logits(z, name):
    """Eager ValueError / graph assertion naming ``name`` for the rows that
    :func:`_logits_invalid` flags (a -inf logit alone means the class is masked)."""
    if not validation_enabled():
        return z
    message = f"`{name}` {_LOGITS_RULE}."
    value = static_value(z)
    if value is not None:
        v = np.asarray(value, np.float64)
        v2 = v.reshape(-1, v.shape[-1]) if v.size else v
        if v.size and (np.isnan(v).any() or np.isposinf(v).any() or np.isneginf(v2).all(-1).any()):
            raise ValueError(message)
        return z
    check = tf.debugging.Assert(~tf.reduce_any(_logits_invalid(z)), [message])
    with tf.control_dependencies([check]):
        return tf.identity(z)


def _warn_uncertified(info):
    """Eager RuntimeWarning when a valid row's projection was not certified."""
    if not tf.executing_eagerly():
        return
    bad = info["valid"] & ~info["converged"]
    if bool(tf.reduce_any(bad)):
        n = int(tf.reduce_sum(tf.cast(bad, tf.int32)))
        worst = float(tf.reduce_max(tf.where(bad, info["residual"], 0.0)))
        warnings.warn(
            f"possibilistic projection: {n} row(s) not certified (worst residual {worst:.3g}); "
            "see info['converged'] / info['residual'] (raise `max_cycles`).",
            RuntimeWarning,
            stacklevel=3,
        )


_METHODS = ("interior_point", "dykstra")


def _resolve_method(method, stopping):
    """``None`` -> interior point for the certified rule, Dykstra for "paper" / "fixed"."""
    if method is None:
        return "interior_point" if stopping == "certified" else "dykstra"
    _check_choice(method, _METHODS, "method")
    if method == "interior_point" and stopping != "certified":
        raise ValueError(
            f"`method`='interior_point' only supports stopping='certified' (the 'paper' and "
            f"'fixed' rules count Dykstra cycles); got `stopping`={stopping!r}. Use "
            "method='dykstra'."
        )
    return method


def _as_float(x, name):
    x = tf.convert_to_tensor(x)
    if not (x.dtype.is_floating or x.dtype.is_integer or x.dtype == tf.bool):
        raise TypeError(f"`{name}` must be a real tensor, got dtype {x.dtype.name}.")
    return x


def _flatten(x, name, k=None, static_k=True):
    """Reshape ``[..., K]`` to ``[B, K]``; returns (x2d, restore_fn for [B, ...] tensors).

    ``k`` overrides the class count (static); without it an unknown ``K`` raises, unless
    ``static_k=False`` (ops whose kernels read ``K`` at run time).
    """
    check_static_rank(x, 1, name)
    k = x.shape[-1] if k is None else k
    if k is None:
        if static_k:
            raise ValueError(f"The class axis (last) of `{name}` must have a static size.")
        k = tf.shape(x)[-1]
    lead = tf.shape(x)[:-1]
    lead_static = x.shape[:-1]

    def restore(y):
        tail = y.shape[1:]
        out = tf.reshape(y, tf.concat([lead, tf.shape(y)[1:]], 0))
        return tf.ensure_shape(out, lead_static.concatenate(tail))

    return tf.reshape(x, [-1, k]), restore


def _check_same_shape(a, b, name_a, name_b):
    if a.shape.rank is not None and b.shape.rank is not None:
        if not a.shape.is_compatible_with(b.shape):
            raise ValueError(
                f"`{name_b}` must have the shape of `{name_a}` {list(a.shape)}, got "
                f"{list(b.shape)}."
            )


# --------------------------------------------------------------------------------------
# Constraint data (spec 1.3, 1.4, 3.1, 5)
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Antipignistic transform (spec 1.2), with a hand-derived gradient
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Dykstra / dual coordinate ascent kernel (spec 2.3, 2.4, 3), time-major [K, B]
# --------------------------------------------------------------------------------------


def _rcumsum(x, exclusive=False):
    """Reverse cumulative sum along axis 0 by log-step doubling (Hillis-Steele).

    XLA lowers ``tf.cumsum`` to an O(K^2) reduce-window on CPU; this is O(K log K) with
    a few fused shifted adds (same sums up to rounding).
    """
    n = x.shape[0]
    shift = 1
    while shift < n:
        x = x + tf.concat([x[shift:], tf.zeros_like(x[:shift])], axis=0)
        shift *= 2
    if exclusive:
        x = tf.concat([x[1:], tf.zeros_like(x[:1])], axis=0)
    return x


def _at_lambda(lp, ll, lu):
    """``A^T lam`` in sorted coordinates, time-major: lam parts [m1, B] -> [K, B]."""
    zero = tf.zeros_like(lp[:1])
    pref = tf.concat([_rcumsum(lp), zero], axis=0)
    g = ll - lu  # lower: +e_r - e_{r+1}; upper: -e_r + e_{r+1}
    return pref + tf.concat([g, zero], 0) - tf.concat([zero, g], 0)


def _normalize_log(x):
    m = tf.reduce_max(x, axis=0, keepdims=True)
    return x - (m + tf.math.log(tf.reduce_sum(tf.exp(x - m), axis=0, keepdims=True)))


def _check(x, lp, ll, lu, cst, lq=None):
    """Max violation V and duality gap of the normalised iterate (spec 2.6). [B] each.

    For the dual point ``x = log q + A^T lam`` the gap is ``sum_h lam_h slack_h``. With
    ``lq`` (log q) given, ``x`` may be any point (e.g. a primal iterate) and the gap is the
    exact ``KL(p||q) - g(lam) = KL(p || p(lam)) + sum_h lam_h slack_h(p)``, ``p(lam)`` the
    dual point: both terms are >= 0 when ``p`` is feasible, and it is 0 only at the optimum.
    """
    xn = _normalize_log(x)
    p = tf.exp(xn)
    tail = _rcumsum(p, exclusive=True)[:-1]  # sum_{k>r} p_k
    d = p[:-1] - p[1:]
    act = cst["act"]
    zero = tf.zeros_like(d)
    slack_pref = cst["pt_next"] - tail  # <a,p> - b for prefix r
    slack_low = d - cst["lo"]
    slack_up = cst["up"] - d
    viol = tf.maximum(tf.maximum(-slack_pref, -slack_low), -slack_up)
    v = tf.maximum(tf.reduce_max(tf.where(act, viol, zero), axis=0), 0.0)
    gap = tf.reduce_sum(
        tf.where(act, lp * slack_pref + ll * slack_low + lu * slack_up, zero), axis=0
    )
    if lq is not None:
        x_dual = _normalize_log(lq + _at_lambda(lp, ll, lu))
        gap += _kl_rows(p, xn, x_dual)
    return v, gap


def _kl_rows(p, log_p, log_r):
    """``KL(p || r)`` per column of time-major ``[K, B]`` (0 log 0 = 0)."""
    return tf.reduce_sum(tf.where(p > 0.0, p * (log_p - log_r), 0.0), axis=0)


def _sweep(kind, x, lam_old, cst, unroll):
    """One sweep over the m1 constraints of one family; returns the new multipliers.

    ``unroll=True`` unrolls the steps in Python (small K); otherwise a rolled while loop.
    """
    if isinstance(x, list):  # small K: lists of [B] vectors, everything elementwise
        m1 = len(lam_old)
        top = x[0]
        for xk in x[1:]:
            top = tf.maximum(top, xk)
        z = [tf.exp(xk - top) for xk in x]
        suffix = _suffix_sums(z, exclusive=True)
    else:
        m1 = lam_old.shape[0]
        z = tf.exp(x - tf.reduce_max(x, axis=0, keepdims=True))  # [K, B]; 0 outside support
        suffix = _rcumsum(z, exclusive=True)  # sum_{k>r} z_k
    one = tf.ones_like(z[0])
    arrays = {"z": z[:-1], "z_next": z[1:], "lam_old": lam_old, "act": cst["act"]}

    if kind == "pref":
        arrays.update(tails=suffix[:-1], pt_next=cst["pt_next"], ratio=cst["ratio"])

        def step_at(arr, r, carry):
            (prefix,) = carry
            prefix = (prefix + arr["z"][r]) * tf.exp(-arr["lam_old"][r])  # remove old
            t = arr["tails"][r]
            viol = arr["act"][r] & (t > arr["pt_next"][r] * (prefix + t))
            factor = tf.where(viol, arr["ratio"][r] * t / tf.where(viol, prefix, one), one)
            return tf.math.log(factor), (prefix * factor,)

        init = (tf.zeros_like(one),)
    else:
        low = kind == "low"
        sign = 1.0 if low else -1.0
        arrays.update(tails=suffix[1:], delta=cst["lo"] if low else cst["neg_up"])

        def step_at(arr, r, carry):
            a, head = carry
            c = arr["z_next"][r]
            f = tf.exp(sign * arr["lam_old"][r])
            a, c = a / f, c * f  # remove the old correction
            zi, zj = (a, c) if low else (c, a)
            u = head + arr["tails"][r]
            dl = arr["delta"][r]
            viol = arr["act"][r] & (zi - zj < dl * (u + a + c))
            zi_s = tf.where(viol, zi, one)
            zj_s = tf.where(viol, zj, one)
            ud = u * dl
            one_m, one_p = 1.0 - dl, 1.0 + dl
            root = tf.sqrt(ud * ud + 4.0 * zi_s * zj_s * one_m * one_p)
            e_zero = tf.sqrt(zj_s / zi_s)
            # delta = lo >= 0 in the low sweep and -up <= 0 in the up sweep, so only one
            # of the two non-tie branches can occur (same values as testing both).
            if low:
                e = tf.where(dl > 0.0, (ud + root) / (2.0 * zi_s * one_m), e_zero)
            else:
                e = tf.where(dl < 0.0, 2.0 * zj_s * one_p / (root - ud), e_zero)
            e = tf.where(viol, e, one)
            zi, zj = zi * e, zj / e
            a, c = (zi, zj) if low else (zj, zi)
            return tf.math.log(e), (c, head + a)

        init = (z[0], tf.zeros_like(one))

    if unroll:
        carry, out = init, []
        for r in range(m1):
            lam, carry = step_at(arrays, r, carry)
            out.append(lam)
        return out if isinstance(x, list) else tf.stack(out, axis=0)

    def body(r, ta, *carry):
        lam, carry = step_at(arrays, r, carry)
        return (r + 1, ta.write(r, lam)) + tuple(carry)

    ta = tf.TensorArray(_F64, size=m1, element_shape=one.shape)
    res = tf.while_loop(lambda r, *_: r < m1, body, (tf.constant(0), ta) + tuple(init))
    return res[1].stack()


def _suffix_sums(v, exclusive):
    """Python-list reverse cumulative sums of [B] vectors (``sum_{j>k}`` if exclusive)."""
    out, acc = [None] * len(v), None
    for k in reversed(range(len(v))):
        if exclusive:
            out[k] = tf.zeros_like(v[k]) if acc is None else acc
        acc = v[k] if acc is None else acc + v[k]
        if not exclusive:
            out[k] = acc
    return out


def _at_lambda_list(lq, lp, ll, lu):
    """``log q + A^T lam`` for lists of [B] vectors (same sums as :func:`_at_lambda`)."""
    m1 = len(lp)
    pref = _suffix_sums(lp, exclusive=False)
    g = [ll[r] - lu[r] for r in range(m1)]
    out = []
    for j in range(m1 + 1):
        t = pref[j] + g[j] if j < m1 else tf.zeros_like(lq[j])
        if j >= 1:
            t = t - g[j - 1]
        out.append(lq[j] + t)
    return out


def _check_list(x, lp, ll, lu, cst):
    """:func:`_check` for lists of [B] vectors: V and the duality gap, [B] each."""
    m1 = len(lp)
    top = x[0]
    for xk in x[1:]:
        top = tf.maximum(top, xk)
    total = tf.add_n([tf.exp(xk - top) for xk in x])
    lse = top + tf.math.log(total)
    p = [tf.exp(xk - lse) for xk in x]
    tail = _suffix_sums(p, exclusive=True)
    v = gap = None
    for r in range(m1):
        d = p[r] - p[r + 1]
        act = cst["act"][r]
        slack_pref = cst["pt_next"][r] - tail[r]
        slack_low = d - cst["lo"][r]
        slack_up = cst["up"][r] - d
        viol = tf.maximum(tf.maximum(-slack_pref, -slack_low), -slack_up)
        viol = tf.where(act, viol, tf.zeros_like(viol))
        term = tf.where(
            act, lp[r] * slack_pref + ll[r] * slack_low + lu[r] * slack_up, tf.zeros_like(viol)
        )
        v = viol if v is None else tf.maximum(v, viol)
        gap = term if gap is None else gap + term
    return tf.maximum(v, 0.0), gap


def _project_core_small(
    lq,
    pt_next,
    ratio,
    lo,
    up,
    act,
    active,
    tol,
    gap_tol,
    max_cycles,
    stopping,
    cycles_per_iter=_SMALL_K_CYCLES_PER_ITER,
    lam_init=None,
):
    """:func:`_project_core` for small K: every step unrolled on lists of [B] vectors.

    One while-loop iteration runs ``cycles_per_iter`` full cycles, each followed by the
    stopping test and the per-example freeze, so the result (iterates and cycle counts) is
    the same as one cycle per iteration; only the loop overhead is paid less often.
    """
    lq_l = tf.unstack(lq)
    cst = {
        "pt_next": tf.unstack(pt_next),
        "ratio": tf.unstack(ratio),
        "lo": tf.unstack(lo),
        "up": tf.unstack(up),
        "neg_up": tf.unstack(-up),
        "act": tf.unstack(act),
    }

    def body(k, lp, ll, lu, active, cycles, v, gap):
        lp, ll, lu = tf.unstack(lp), tf.unstack(ll), tf.unstack(lu)
        for j in range(cycles_per_iter):
            nlp = _sweep("pref", _at_lambda_list(lq_l, lp, ll, lu), lp, cst, True)
            nll = _sweep("low", _at_lambda_list(lq_l, nlp, ll, lu), ll, cst, True)
            nlu = _sweep("up", _at_lambda_list(lq_l, nlp, nll, lu), lu, cst, True)
            nv, ngap = _check_list(_at_lambda_list(lq_l, nlp, nll, nlu), nlp, nll, nlu, cst)
            feasible = nv <= tol
            done = tf.where(
                tf.equal(stopping, 0),
                feasible,
                feasible & (tf.abs(ngap) <= gap_tol) & tf.equal(stopping, 1),
            )
            run = active & (k + j < max_cycles)
            lp = [tf.where(run, a, b) for a, b in zip(nlp, lp)]
            ll = [tf.where(run, a, b) for a, b in zip(nll, ll)]
            lu = [tf.where(run, a, b) for a, b in zip(nlu, lu)]
            v = tf.where(run, nv, v)
            gap = tf.where(run, ngap, gap)
            cycles = cycles + tf.cast(run, tf.int32)
            active = active & ~(run & done)
        return (
            k + cycles_per_iter,
            tf.stack(lp),
            tf.stack(ll),
            tf.stack(lu),
            active,
            cycles,
            v,
            gap,
        )

    zeros = tf.zeros_like(pt_next)
    lam0 = (zeros, zeros, zeros) if lam_init is None else tuple(lam_init)
    batch = tf.shape(active)[0]
    init = (
        tf.constant(0),
        *lam0,
        active,
        tf.zeros([batch], tf.int32),
        tf.zeros([batch], _F64),
        tf.zeros([batch], _F64),
    )

    def cond(k, lp, ll, lu, active, *_):
        return (k < max_cycles) & (tf.reduce_any(active) | tf.equal(stopping, 2))

    _, lp, ll, lu, _, cycles, _, _ = tf.while_loop(cond, body, init)
    x = _normalize_log(lq + _at_lambda(lp, ll, lu))
    v, gap = _check(x, lp, ll, lu, _cst_stacked(pt_next, ratio, lo, up, act))
    return x, tf.stack([lp, ll, lu], axis=0), cycles, v, gap


def _cst_stacked(pt_next, ratio, lo, up, act):
    return {"pt_next": pt_next, "ratio": ratio, "lo": lo, "up": up, "act": act}


def _project_core(
    lq,
    pt_next,
    ratio,
    lo,
    up,
    act,
    active,
    tol,
    gap_tol,
    max_cycles,
    stopping,
    *,
    unroll,
    lam_init=None,
    compact=True,
):
    """Dual-form Dykstra in sorted, time-major coordinates.

    Args: lq [K, B] sorted log q (normalised, -inf outside the support); pt_next, ratio,
    lo, up [m1, B] float; act [m1, B] bool; active [B] bool (rows to iterate).
    tol, gap_tol (float64), max_cycles and stopping (int32: 0 paper, 1 certified, 2 fixed)
    are tensors, so changing them does not recompile. ``compact``: straggler compaction of
    the rolled kernel (off for the interior point's finish, whose few rows gain little
    from it, while its second compiled cycle adds seconds to the first step's compile).
    Returns: x [K, B] (log projection, normalised), lam [3, m1, B], cycles [B] int32,
    V [B], gap [B].
    """
    if unroll:
        return _project_core_small(
            lq,
            pt_next,
            ratio,
            lo,
            up,
            act,
            active,
            tol,
            gap_tol,
            max_cycles,
            stopping,
            lam_init=lam_init,
        )
    cst = {"pt_next": pt_next, "ratio": ratio, "lo": lo, "up": up, "neg_up": -up, "act": act}
    zeros = tf.zeros_like(pt_next)
    body = functools.partial(_rolled_body, tol=tol, gap_tol=gap_tol, stopping=stopping)
    batch = tf.shape(active)[0]
    lam0 = (zeros, zeros, zeros) if lam_init is None else tuple(lam_init)
    init = (
        tf.constant(0),
        *lam0,
        active,
        tf.zeros([batch], tf.int32),
        tf.zeros([batch], _F64),
        tf.zeros([batch], _F64),
    )
    sizes = _stage_sizes(active, _COMPACT_MIN_BATCH, _COMPACT_FACTOR) if compact else [None]
    _, lp, ll, lu, _, cycles, _, _ = _run_stages(lq, cst, init, sizes, body, max_cycles, stopping)
    x = _normalize_log(lq + _at_lambda(lp, ll, lu))
    v, gap = _check(x, lp, ll, lu, cst)
    return x, tf.stack([lp, ll, lu], axis=0), cycles, v, gap


def _rolled_body(lq, cst, *, tol, gap_tol, stopping):
    """While-loop body of one cycle of the rolled kernel on ``lq`` [K, b], ``cst`` [m1, b]."""

    def cycle(lp, ll, lu):
        lp = _sweep("pref", lq + _at_lambda(lp, ll, lu), lp, cst, False)
        ll = _sweep("low", lq + _at_lambda(lp, ll, lu), ll, cst, False)
        lu = _sweep("up", lq + _at_lambda(lp, ll, lu), lu, cst, False)
        return lp, ll, lu

    def body(k, lp, ll, lu, active, cycles, v, gap):
        nlp, nll, nlu = cycle(lp, ll, lu)
        nv, ngap = _check(lq + _at_lambda(nlp, nll, nlu), nlp, nll, nlu, cst)
        feasible = nv <= tol
        done = tf.where(
            tf.equal(stopping, 0),
            feasible,
            feasible & (tf.abs(ngap) <= gap_tol) & tf.equal(stopping, 1),
        )
        sel = active[None, :]
        lp = tf.where(sel, nlp, lp)
        ll = tf.where(sel, nll, ll)
        lu = tf.where(sel, nlu, lu)
        v = tf.where(active, nv, v)
        gap = tf.where(active, ngap, gap)
        cycles = cycles + tf.cast(active, tf.int32)
        return k + 1, lp, ll, lu, active & ~done, cycles, v, gap

    return body


# Straggler compaction (rolled kernel): once at most ``size`` examples are still active,
# the loop continues on a gathered subset of ``size`` examples (the active ones first,
# padded with frozen ones), whose state is scattered back at the end. Per-example
# arithmetic is unchanged, so iterates and cycle counts are the same as without it. Each
# stage compiles another copy of the cycle body (~5 s of XLA compile at K = 100), so only
# one compacted stage is used: B -> B // 8 (e.g. 100 -> 12).
_COMPACT_MIN_BATCH = 16
_COMPACT_FACTOR = 8


def _stage_sizes(active, min_batch, factor):
    """Batch sizes of the loop stages: ``[B]``, or ``[B, max(1, B // factor)]`` (straggler
    compaction) when ``B >= min_batch``.

    With ``B`` unknown at trace time (``None``: a Keras dataset with a partial last batch)
    both sizes are scalar tensors and the compacted stage is always used (results are the
    same either way; under XLA, which compiles per batch size, they are constants).
    """
    batch = active.shape[0]
    if batch is None:
        batch = tf.shape(active)[0]
        return [batch, tf.maximum(batch // factor, 1)]
    return [batch] if batch < min_batch else [batch, max(1, batch // factor)]


def _run_stages(lq, cst, state, sizes, body, max_cycles, stopping):
    """Run ``body`` on the batch until <= sizes[1] are active, then recurse on a subset."""
    nxt = sizes[1] if len(sizes) > 1 else 0

    def cond(k, lp, ll, lu, active, *_):
        count = tf.reduce_sum(tf.cast(active, tf.int32))
        return (k < max_cycles) & ((count > nxt) | tf.equal(stopping, 2))

    state = tf.while_loop(cond, body(lq, cst), state)
    if len(sizes) == 1:
        return state
    k, lp, ll, lu, active, cycles, v, gap = state
    # Indices of the (<= nxt) still-active examples first, stable in index order.
    _, idx = tf.math.top_k(tf.cast(active, tf.int32), k=nxt, sorted=True)

    def take(t, axis):
        return tf.gather(t, idx, axis=axis)

    sub_cst = {key: take(val, 1) for key, val in cst.items()}
    sub = (
        k,
        take(lp, 1),
        take(ll, 1),
        take(lu, 1),
        take(active, 0),
        take(cycles, 0),
        take(v, 0),
        take(gap, 0),
    )
    k, slp, sll, slu, sactive, scycles, sv, sgap = _run_stages(
        take(lq, 1), sub_cst, sub, sizes[1:], body, max_cycles, stopping
    )
    ids = idx[:, None]

    def put(full, part, axis):
        if axis == 0:
            return tf.tensor_scatter_nd_update(full, ids, part)
        return tf.transpose(
            tf.tensor_scatter_nd_update(tf.transpose(full), ids, tf.transpose(part))
        )

    return (
        k,
        put(lp, slp, 1),
        put(ll, sll, 1),
        put(lu, slu, 1),
        put(active, sactive, 0),
        put(cycles, scycles, 0),
        put(v, sv, 0),
        put(gap, sgap, 0),
    )


# --------------------------------------------------------------------------------------
# Interior-point solver on the tie-reduced chain (default; docs/design/possibilistic_solver.md)
# --------------------------------------------------------------------------------------

_IPM_STEP = 0.99  # fraction to the boundary
_IPM_MASS_STEP = 0.9  # masses shrink at most 10x per iteration
_IPM_SIGMA_FLOOR = 0.01  # mu falls at most 100x per iteration
_IPM_MAX_ITER = 60
# The primal aims this factor below the certificate (gap 1e-10 only bounds |p - p*|_1 by
# 1.4e-5); Mehrotra's steps converge superlinearly at the end: a few iterations.
_IPM_SHARPEN = 1e-5


def _prev(x):
    return tf.concat([tf.zeros_like(x[:1]), x[:-1]], axis=0)


def _next(x):
    return tf.concat([x[1:], tf.zeros_like(x[:1])], axis=0)


def _cumsum_rows(x):
    """Inclusive cumulative sum along axis 1 of ``[B, K]`` (doubling scan; XLA-friendly)."""
    return tf.transpose(tf.reverse(_rcumsum(tf.reverse(tf.transpose(x), [0])), [0]))


# Newton systems: the matrix is pentadiagonal, i.e. block tridiagonal in 2x2 blocks
# (X_k = (x_2k, x_2k+1)). Cyclic reduction eliminates the odd blocks level after level:
# log2(K) stages of batched 2x2 arithmetic instead of K sequential steps. It is the block
# Cholesky factorisation of the matrix in odd-even order (backward stable like any
# symmetric ordering of Cholesky: the updates are Gram matrices of triangular solves, never
# explicit inverses). Blocks carry their entries on a leading axis of [entries, n, B]
# tensors, so that XLA writes one array per quantity and level: general
# [p, q, r, s] = [[p, q], [r, s]], symmetric [a, b, c] = [[a, b], [b, c]], lower
# triangular [l00, l10, l11], vectors [v0, v1].


def _shift_down(x):  # x[:, i - 1] along the block axis (0 first)
    return tf.pad(x[:, :-1], [[0, 0], [1, 0], [0, 0]])


def _shift_up(x):  # x[:, i + 1] along the block axis (0 last)
    return tf.pad(x[:, 1:], [[0, 0], [0, 1], [0, 0]])


def _chol2(d, tiny):
    """``L`` of ``D = L L^T`` as ``[1/l00, l10, 1/l11]``: the solves then only multiply,
    which XLA may recompute inside each consumer (a divide it materialises).

    A pivot at or below ``tiny`` (per row: 1e-30 of the largest diagonal entry) is rounding
    noise of a nearly singular Newton matrix at the end of the interior point; it is
    dropped (``1/l = 0``: that component of the step is 0), as in the modified Cholesky
    of interior-point codes, instead of blowing up to inf / NaN in the next level. A NaN
    pivot is dropped too.
    """
    a, b, c = tf.unstack(d)
    il00 = tf.where(a > tiny, tf.math.rsqrt(tf.maximum(a, tiny)), 0.0)
    l10 = b * il00
    schur = c - l10 * l10
    il11 = tf.where(schur > tiny, tf.math.rsqrt(tf.maximum(schur, tiny)), 0.0)
    return tf.stack([il00, l10, il11])


def _lsolve(chol, v0, v1):  # L^{-1} (v0, v1)
    il00, l10, il11 = tf.unstack(chol)
    y0 = v0 * il00
    return y0, (v1 - l10 * y0) * il11


def _ltsolve(chol, v):  # L^{-T} v, stacked
    il00, l10, il11 = tf.unstack(chol)
    x1 = v[1] * il11
    return tf.stack([(v[0] - l10 * x1) * il00, x1])


def _mv(g, v):  # g v, stacked
    p, q, r, s = tf.unstack(g)
    return tf.stack([p * v[0] + q * v[1], r * v[0] + s * v[1]])


def _mtv(g, v):  # g^T v, stacked
    p, q, r, s = tf.unstack(g)
    return tf.stack([p * v[0] + r * v[1], q * v[0] + s * v[1]])


def _penta_factor(d0, d1, d2):
    """Cyclic-reduction factorisation of an SPD pentadiagonal ``H`` (time-major ``[n, B]``).

    ``d0[i] = H[i, i]``, ``d1[i] = H[i, i+1]``, ``d2[i] = H[i, i+2]``; entries that would
    reach past row ``n - 1`` must be 0. The system is padded with identity rows to ``2N``
    (``N`` a power of two) and read as ``N`` block rows
    ``C_{k-1}^T X_{k-1} + D_k X_k + C_k X_{k+1} = R_k``. One level factors the odd blocks,
    ``D_2i+1 = L L^T``, and keeps the even ones with ``E_i = C_2i L^{-T}``,
    ``F_i = L^{-1} C_2i+1``: ``D'_i = D_2i - E_i E_i^T - F_i-1^T F_i-1`` and
    ``C'_i = -E_i F_i``. Returns the factors (the levels' ``(L, [E, F])`` and the last
    block's ``L``, in the form of :func:`_chol2`) and, per row, whether a pivot was dropped.
    """
    n = d0.shape[0]
    half = 1 << (max(1, -(-n // 2)) - 1).bit_length()

    def padded(x, fill):
        return tf.pad(x, [[0, 2 * half - n], [0, 0]], constant_values=fill)

    tiny = 1e-30 * tf.reduce_max(tf.abs(d0), axis=0)
    d0, d1, d2 = padded(d0, 1.0), padded(d1, 0.0), padded(d2, 0.0)
    dd = tf.stack([d0[0::2], d1[0::2], d0[1::2]])
    cc = tf.stack([d2[0::2], tf.zeros_like(d2[0::2]), d1[1::2], d2[1::2]])
    levels = []
    while dd.shape[1] > 1:
        chol = _chol2(dd[:, 1::2], tiny)
        p, q, r, s = tf.unstack(cc[:, 0::2])
        e00, e01 = _lsolve(chol, p, q)  # rows of C_even L^{-T}
        e10, e11 = _lsolve(chol, r, s)
        p, q, r, s = tf.unstack(cc[:, 1::2])
        f00, f10 = _lsolve(chol, p, r)  # columns of L^{-1} C_odd
        f01, f11 = _lsolve(chol, q, s)
        ef = tf.stack([e00, e01, e10, e11, f00, f01, f10, f11])  # kept for the solves
        # The products below read the stored E, F (XLA would otherwise recompute them).
        e00, e01, e10, e11, f00, f01, f10, f11 = tf.unstack(ef)
        ee = tf.stack([e00 * e00 + e01 * e01, e00 * e10 + e01 * e11, e10 * e10 + e11 * e11])
        ff = tf.stack([f00 * f00 + f10 * f10, f00 * f01 + f10 * f11, f01 * f01 + f11 * f11])
        dd = dd[:, 0::2] - ee - _shift_down(ff)
        cc = -tf.stack(
            [
                e00 * f00 + e01 * f10,
                e00 * f01 + e01 * f11,
                e10 * f00 + e11 * f10,
                e10 * f01 + e11 * f11,
            ]
        )
        levels.append((chol, ef))
    root = _chol2(dd, tiny)
    # A dropped pivot is a stored 0 (a kept one has a positive reciprocal square root).
    # Read from the stored factors: testing the pivots themselves, XLA recomputed the
    # whole factorisation inside the reduction (10% of a training step at K = 64).
    pivots = [chol[::2] for chol, _ in levels] + [root[::2]]
    pivots = tf.concat([tf.reshape(x, [-1, tf.shape(x)[-1]]) for x in pivots], axis=0)
    return (levels, root), tf.reduce_any(pivots <= 0.0, axis=0)


def _interleave(even, odd):  # [C, M, B] x 2 -> [C, 2M, B], even rows first (B may be None)
    c, m, _ = even.shape
    return tf.reshape(tf.stack([even, odd], axis=2), [c, 2 * m, -1])


def _penta_solve(factors, rhs):
    """``H x = rhs`` with the factorisation of :func:`_penta_factor` (``rhs`` ``[n, B]``)."""
    levels, root = factors
    n = rhs.shape[0]
    rhs = tf.pad(rhs, [[0, 2 ** (len(levels) + 1) - n], [0, 0]])
    r = tf.stack([rhs[0::2], rhs[1::2]])
    ys = []
    for chol, ef in levels:
        odd = r[:, 1::2]
        y = tf.stack(_lsolve(chol, odd[0], odd[1]))
        r = r[:, 0::2] - _mv(ef[:4], y) - _shift_down(_mtv(ef[4:], y))
        ys.append(y)
    x = _ltsolve(root, tf.stack(_lsolve(root, r[0], r[1])))
    for (chol, ef), y in zip(reversed(levels), reversed(ys)):
        t = y - _mtv(ef[:4], x) - _mv(ef[4:], _shift_up(x))
        x = _interleave(x, _ltsolve(chol, t))
    return tf.reshape(tf.transpose(x, [1, 0, 2]), [2 * x.shape[1], -1])[:n]


def _block_starts(strict, in_support):
    """``[B, K]`` bool: the sorted class opens a block (a strict drop before it)."""
    return tf.concat([tf.ones_like(strict[:, :1]), strict], axis=1) & in_support


def _reduce_ties(lq, pt, strict, lo, up, in_support, pdot, size):
    """Pool tied classes into blocks (batch-major [B, K] sorted inputs).

    ``size`` (static, >= the largest block count of the batch) is the length of the block
    axis. Returns time-major block data: ``w`` block sizes [size, B] (1 on padding), ``g``
    log of the block reference mass ``w * geomean(q)`` [size, B], ``c`` ceiling
    (possibility of the next block) [size-1, B], ``lo``/``up`` shape bounds between
    consecutive blocks [size-1, B], ``real`` [size, B] / ``var`` [size-1, B] masks, ``bid``
    [B, K] block id of each sorted class.
    """
    batch = tf.shape(pt)[0]
    start = _block_starts(strict, in_support)
    bid = _cumsum_rows(tf.cast(start, tf.int32)) - 1
    bid = tf.where(in_support, bid, size)  # classes outside the support: a dropped segment
    n_blocks = tf.reduce_sum(tf.cast(start, tf.int32), axis=1)
    ids = bid + tf.range(batch)[:, None] * (size + 1)
    ends = tf.concat([strict, tf.zeros_like(strict[:, :1])], axis=1)  # pair (r, r+1) strict
    pad0 = tf.zeros_like(pt[:, :1])
    # All block sums in one scatter (XLA:CPU scatters update by update): sizes, sums of
    # log q, the block's possibility, the shape bounds at its end, its antipignistic mass.
    columns = [
        tf.cast(in_support, _F64),
        tf.where(in_support, lq, 0.0),
        tf.where(start, pt, 0.0),
        tf.where(ends, tf.concat([lo, pad0], 1), 0.0),
        tf.where(ends, tf.concat([up, pad0], 1), 0.0),
        tf.where(in_support, pdot, 0.0),
    ]
    sums = tf.math.unsorted_segment_sum(
        tf.reshape(tf.stack(columns, -1), [-1, len(columns)]),
        tf.reshape(ids, [-1]),
        batch * (size + 1),
    )
    w, slq, pblock, lob, upb, mdot = tf.unstack(
        tf.reshape(sums, [batch, size + 1, len(columns)])[:, :size], axis=-1
    )
    jj = tf.range(size)[None, :]
    real = jj < n_blocks[:, None]
    w_safe = tf.where(real, w, 1.0)
    g = tf.where(real, slq / w_safe + tf.math.log(w_safe), 0.0)
    lob, upb = lob[:, :-1], upb[:, :-1]
    var = jj[:, :-1] < (n_blocks - 1)[:, None]
    c = pblock[:, 1:]
    tm = tf.transpose
    return {
        "mdot": tm(mdot),
        "w": tm(w_safe),
        "g": tm(g),
        "c": tm(c),
        "lo": tm(lob),
        "up": tm(upb),
        "real": tm(real),
        "var": tm(var),
        "bid": tf.minimum(bid, size - 1),
        "n_blocks": n_blocks,
    }


def _ipm_dual_point(red, lam1, lam2, lam3):
    """Block log-masses of the dual point ``softmax(G + A^T lam)`` (normalised), [K, B]."""
    big_lam = tf.concat([_rcumsum(lam1), tf.zeros_like(lam1[:1])], 0)
    nu = tf.concat([lam2 - lam3, tf.zeros_like(lam2[:1])], 0)
    x = red["g"] + big_lam + (nu - _prev(nu)) / red["w"]
    x = tf.where(red["real"], x, tf.constant(-np.inf, _F64))
    return _normalize_log(x)


def _fold(op, x):
    """Combine the slices of the leading (family) axis elementwise: XLA fuses this, while
    a reduction over [families, chain] becomes unfused reduce-window passes on CPU."""
    out = x[0]
    for i in range(1, x.shape[0]):
        out = op(out, x[i])
    return out


def _ipm_dual_certificate(red, xm, lams):
    """:func:`_ipm_certificate` of the dual point itself (log block masses ``xm``)."""
    m = tf.where(red["real"], tf.exp(xm), 0.0)
    tail = _rcumsum(m, exclusive=True)[:-1]
    v = m / red["w"]
    sh = v[:-1] - v[1:]
    slacks = tf.stack([red["c"] - tail, sh - red["lo"], red["up"] - sh])
    return _ipm_certificate(red, m, slacks, xm, lams)


def _ipm_certificate(red, m, slacks, xm, lams):
    """Max violation and exact duality gap of the primal block masses ``m`` [K, B].

    ``slacks`` [3, K-1, B] are the constraint values at ``m`` (ceiling, lower, upper; >= 0
    when feasible), ``xm`` the log block masses of the dual point of ``lams`` [3, K-1, B].
    The gap ``KL(m || m(lam)) + sum_h lam_h slack_h(m)`` is the primal objective minus the
    dual function, so it certifies ``m`` whatever produced ``lam`` (see ``_check``).
    """
    var = red["var"][None]
    big_v = tf.maximum(tf.reduce_max(_fold(tf.maximum, tf.where(var, -slacks, 0.0)), 0), 0.0)
    comp = tf.reduce_sum(_fold(tf.add, tf.where(var, lams * slacks, 0.0)), axis=0)
    safe = tf.where(m > 0.0, m, 1.0)
    return big_v, comp + _kl_rows(m, tf.math.log(safe), xm)


# The certificate is evaluated only once some row's complementarity n_con * mu is within
# this factor of gap_tol: before that the gap, which is at least about n_con * mu on a
# feasible iterate, cannot pass (skipping it only delays a stop, never changes a result).
_IPM_CERTIFY_FROM = 1e3


def _ipm_body(red, tol, gap_tol):
    """One Mehrotra predictor-corrector iteration on the tail masses ``U`` of the chain.

    Time-major, batch last: ``red`` holds the block chain (see :func:`_reduce_ties`),
    ``tol`` / ``gap_tol`` the certificate's tolerances. The three constraint families
    (ceiling, lower and upper shape bounds) are stacked on a leading axis: slacks ``s`` and
    multipliers ``lam`` are [3, J-1, B]. Returns the ``tf.while_loop`` body over the state
    ``(it, u, s, lam, active, iters, best_score, best_u, best_lam)`` and ``start(m0)``,
    the starting ``(u, s, lam)`` from block masses ``m0`` [J, B] (> 0 on real blocks).
    """
    var = red["var"]
    var3 = var[None]
    real = red["real"]
    w = red["w"]
    iw = 1.0 / w
    kk = tf.range(var.shape[0])[:, None]
    zero = tf.zeros_like(red["c"])
    var_next = _next(var)
    a_c = tf.where(var & (kk >= 1), iw[:-1], 0.0)  # coefficient of shape j on U_{j-1}
    b_c = tf.where(var, -(iw[:-1] + iw[1:]), 0.0)  # on U_j
    g_c = tf.where(var & var_next, iw[1:], 0.0)  # on U_{j+1}
    n_con = tf.maximum(3.0 * tf.reduce_sum(tf.cast(var, _F64), axis=0), 1.0)
    cert_mu = _IPM_CERTIFY_FROM * gap_tol / n_con
    inf = tf.constant(np.inf, _F64)
    one = tf.constant(1.0, _F64)

    def shape_of(du):  # S du
        return a_c * _prev(du) + b_c * du + g_c * _next(du)

    def shape_t(z):  # S^T z
        return _next(a_c * z) + b_c * z + _prev(g_c * z)

    def masses(u):
        ext_prev = tf.concat([tf.ones_like(u[:1]), u], 0)
        ext_cur = tf.concat([u, tf.zeros_like(u[:1])], 0)
        return tf.where(real, ext_prev - ext_cur, 0.0)

    def constraints(u):
        """Block masses and the stacked constraint values (slacks at ``u``)."""
        m = masses(u)
        v = m / w
        sh = v[:-1] - v[1:]
        return m, tf.stack([red["c"] - u, sh - red["lo"], red["up"] - sh])

    def max_step(mask, *pairs):
        """Longest step along each ``dx`` keeping each ``x > 0`` (per row), over pairs."""
        ratio = None
        for x, dx in pairs:
            r = tf.where(mask & (dx < 0.0), -x / tf.where(dx < 0.0, dx, -1.0), inf)
            ratio = r if ratio is None else tf.minimum(ratio, r)
        return tf.reduce_min(ratio if ratio.shape.rank == 2 else _fold(tf.minimum, ratio), 0)

    def mean_comp(s, lam):
        return tf.reduce_sum(_fold(tf.add, tf.where(var3, s * lam, 0.0)), axis=0) / n_con

    def start(m0):
        u0 = tf.where(var, _rcumsum(m0, exclusive=True)[:-1], 0.0)
        s0 = tf.where(var3, tf.maximum(constraints(u0)[1], 1e-2), 1.0)
        return u0, s0, tf.where(var3, tf.ones_like(s0), 0.0)

    def body(it, u, s, lam, active, iters, best_score, best_u, best_lam):
        m, y = constraints(u)
        mu = mean_comp(s, lam)
        # The masses carry a barrier -t log m (t = mu / 10): entropy alone lets a Newton
        # step drive a small mass 100x down per iteration, after which it recovers by only
        # a factor ~|log m| per iteration.
        t_mass = 0.1 * mu
        safe_m = tf.where(real & (m > 0.0), m, 1.0)
        ell = tf.where(real, tf.math.log(safe_m) - red["g"] - t_mass / safe_m, 0.0)
        grad = tf.where(var, ell[1:] - ell[:-1], 0.0)
        r_d = tf.where(var, grad + lam[0] - shape_t(lam[1] - lam[2]), 0.0)
        rp = tf.where(var3, y - s, 0.0)
        wl = lam / s  # 0 off the chain (s = 1, lam = 0 there)
        w1, w2 = wl[0], wl[1] + wl[2]
        im = tf.where(real & (m > 0.0), (1.0 + t_mass / safe_m) / safe_m, 0.0)
        d0 = im[:-1] + im[1:] + w1 + _next(w2 * a_c * a_c) + w2 * b_c * b_c + _prev(w2 * g_c * g_c)
        d1 = -im[1:] + _next(w2 * a_c * b_c) + w2 * b_c * g_c
        d2 = _next(w2 * a_c * g_c)
        d0 = tf.where(var, d0, 1.0)
        d1 = tf.where(var & var_next, d1, 0.0)
        d2 = tf.where(var & _next(var_next), d2, 0.0)
        factors, dropped = _penta_factor(d0, d1, d2)

        def direction(rc):
            """Newton step for the stacked complementarity residuals ``rc``."""
            psi = tf.where(var3, (rc + lam * rp) / s, 0.0)
            rhs = tf.where(var, -r_d + psi[0] - shape_t(psi[1] - psi[2]), 0.0)
            du = tf.where(var, _penta_solve(factors, rhs), 0.0)
            dsh = shape_of(du)
            ds = tf.where(var3, tf.stack([-du, dsh, -dsh]) + rp, 0.0)
            dl = tf.where(var3, -(rc + lam * ds) / s, 0.0)
            return du, ds, dl

        # Mehrotra predictor-corrector: the affine step (no centring) measures how far the
        # complementarity can fall; sigma = (mu_aff / mu)^3 centres only as much as needed,
        # and the corrector adds the second-order term ds_aff * dl_aff. Same factors.
        _, ds_a, dl_a = direction(lam * s)
        a_aff = tf.minimum(one, max_step(var3, (s, ds_a), (lam, dl_a)))
        mu_aff = mean_comp(s + a_aff * ds_a, lam + a_aff * dl_a)
        sigma = tf.clip_by_value((mu_aff / tf.where(mu > 0.0, mu, 1.0)) ** 3, _IPM_SIGMA_FLOOR, 1.0)
        du, ds, dl = direction(lam * s + ds_a * dl_a - sigma * mu)
        du_ext = tf.concat([du, zero[:1]], 0)  # dU_{J-1} = 0
        dm = tf.where(real, _prev(du_ext) - du_ext, 0.0)  # dm_j = dU_{j-1} - dU_j
        alpha = tf.minimum(
            one,
            tf.minimum(
                _IPM_STEP * max_step(var3, (s, ds), (lam, dl)),
                _IPM_MASS_STEP * max_step(real, (m, dm)),
            ),
        )
        nu_ = u + alpha * du
        ns, nl = s + alpha * ds, lam + alpha * dl
        # Rows whose step is not finite (exhausted float64 near the solution) stop here.
        ok = tf.math.is_finite(ns) & tf.math.is_finite(nl) & (((ns > 0.0) & (nl > 0.0)) | ~var3)
        fin = tf.reduce_all(tf.math.is_finite(nu_) & _fold(tf.logical_and, ok), axis=0)
        # A dropped pivot means float64 is exhausted in the Newton matrix: a row already
        # certified stops there (its best iterate stands), others go on with that
        # component of the step set to 0.
        run = active & fin & ~(dropped & (best_score <= 1.0))
        u = tf.where(run, nu_, u)
        s, lam = tf.where(run, ns, s), tf.where(run, nl, lam)

        def certify():
            m, y = constraints(u)
            xm = _ipm_dual_point(red, *tf.unstack(lam))
            big_v, gap = _ipm_certificate(red, m, y, xm, lam)
            score = tf.maximum(big_v / tol, tf.abs(gap) / gap_tol)

            def dual_certified():
                v_d, gap_d = _ipm_dual_certificate(red, xm, lam)
                return (v_d <= tol) & (tf.abs(gap_d) <= gap_tol)

            dual_ok = tf.cond(
                tf.reduce_any(run & (score <= _IPM_SHARPEN)),
                dual_certified,
                lambda: tf.zeros_like(run),
            )
            return score, dual_ok

        score, dual_ok = tf.cond(
            tf.reduce_any(run & (mean_comp(s, lam) <= cert_mu)),
            certify,
            lambda: (tf.fill(tf.shape(run), inf), tf.zeros_like(run)),
        )
        # The certificate bounds the error only like sqrt(gap) (KL is quadratic near p*),
        # so once certified the iteration goes on to the float64 floor: it stops when the
        # primal is _IPM_SHARPEN below the tolerances and the dual point (returned when it
        # certifies) is certified too, or when the score stops halving 100x below them
        # (the margin covers the rounding between this reduced-chain certificate and the
        # caller's one on the original constraints). Until a row has a finite score its
        # best iterate is its latest.
        stalled = score >= 0.5 * best_score
        done = (dual_ok & (score <= _IPM_SHARPEN)) | (stalled & (score <= 0.01))
        better = run & ((score < best_score) | done | (best_score == inf))
        best_u = tf.where(better, u, best_u)
        best_lam = tf.where(better, lam, best_lam)
        best_score = tf.where(better, score, best_score)
        iters = iters + tf.cast(run, tf.int32)
        return it + 1, u, s, lam, run & ~done, iters, best_score, best_u, best_lam

    return body, start


_IPM_CHAIN = ("w", "g", "c", "lo", "up", "real", "var")
# Rows finish after 10 to 20 iterations and an iteration costs about in proportion to the
# batch: once at most a quarter of the rows are active, they go on in a batch a quarter as
# wide (one more compiled copy of the iteration).
_IPM_COMPACT_MIN_BATCH = 32
_IPM_COMPACT_FACTOR = 4


def _ipm_core(red, m0, active, tol, gap_tol, max_iter):
    """The interior point from block masses ``m0`` [J, B] for the ``active`` rows [B].

    Returns the best iterate by the certificate score: ``U`` [J-1, B],
    ``(lam1, lam2, lam3)`` [J-1, B] (ceiling, lower and upper shape multipliers), and the
    iteration count [B].
    """
    chain = {key: red[key] for key in _IPM_CHAIN}
    body, start = _ipm_body(chain, tol, gap_tol)
    u0, s0, l0 = start(m0)
    sizes = _stage_sizes(active, _IPM_COMPACT_MIN_BATCH, _IPM_COMPACT_FACTOR)
    state = (
        tf.constant(0),
        u0,
        s0,
        l0,
        active,
        tf.zeros_like(active, tf.int32),
        tf.fill(tf.shape(active), tf.constant(np.inf, _F64)),
        u0,
        tf.zeros_like(s0),
    )
    state = _ipm_stages(chain, state, sizes, tol, gap_tol, max_iter, body)
    return state[7], tuple(tf.unstack(state[8])), state[5]


def _ipm_stages(chain, state, sizes, tol, gap_tol, max_iter, body=None):
    """Iterate until at most ``sizes[1]`` rows are active, then go on with those rows only
    (gathered to a batch of ``sizes[1]``, scattered back after)."""
    if body is None:
        body, _ = _ipm_body(chain, tol, gap_tol)
    nxt = sizes[1] if len(sizes) > 1 else 0

    def cond(it, u, s, lam, active, *_):
        return (it < max_iter) & (tf.reduce_sum(tf.cast(active, tf.int32)) > nxt)

    state = tf.while_loop(cond, body, state)
    if len(sizes) == 1:
        return state
    _, idx = tf.math.top_k(tf.cast(state[4], tf.int32), k=nxt, sorted=True)

    def take(t):
        return tf.gather(t, idx, axis=t.shape.rank - 1)

    def put(full, part):
        rank = full.shape.rank
        perm = [rank - 1, *range(rank - 1)]
        out = tf.tensor_scatter_nd_update(
            tf.transpose(full, perm), idx[:, None], tf.transpose(part, perm)
        )
        return tf.transpose(out, [*range(1, rank), 0])

    sub_chain = {key: take(val) for key, val in chain.items()}
    sub = _ipm_stages(
        sub_chain, (state[0], *map(take, state[1:])), sizes[1:], tol, gap_tol, max_iter
    )
    return (sub[0], *(put(full, part) for full, part in zip(state[1:], sub[1:])))


def _two_block(red):
    """Closed form for rows with two blocks (one-hot possibility, for instance).

    With ``m_1 + m_2 = 1`` every constraint bounds the lower block's mass ``m_2``: the
    ceiling ``m_2 <= c_1`` and the shape ``lo <= m_1/w_1 - m_2/w_2 <= up``, i.e.
    ``(1/w_1 - up)/h <= m_2 <= (1/w_1 - lo)/h`` with ``h = 1/w_1 + 1/w_2``. The 1-D convex
    problem ``min m log(m/Q)`` is solved by clipping the free optimum ``Q_2/(Q_1 + Q_2)``
    to that interval. The multiplier of the binding bound is the log-odds shift
    ``t = log(m_1/m_2) - log(Q_1/Q_2)`` (``t / h`` for the shape bounds, which move the two
    blocks' log masses by ``+-nu/w``). Returns ``u`` (``U_0 = m_2``) and the multipliers,
    time-major like :func:`_ipm_core` (only index 0 is non-zero).
    """
    w1, w2 = red["w"][0], red["w"][1]
    g1, g2 = red["g"][0], red["g"][1]
    c, lo, up = red["c"][0], red["lo"][0], red["up"][0]
    h = 1.0 / w1 + 1.0 / w2
    shape_top = (1.0 / w1 - lo) / h
    top = tf.minimum(c, shape_top)
    bottom = tf.maximum((1.0 / w1 - up) / h, 0.0)
    free = tf.math.sigmoid(g2 - g1)
    m2 = tf.clip_by_value(free, bottom, top)
    t = tf.math.log1p(-m2) - tf.math.log(m2) - (g1 - g2)
    above, below = free > top, free < bottom
    zero = tf.zeros_like(t)
    l1 = tf.where(above & (c <= shape_top), t, zero)
    l2 = tf.where(above & (c > shape_top), t / h, zero)
    l3 = tf.where(below, -t / h, zero)
    first = (tf.range(red["c"].shape[0]) == 0)[:, None]
    return tf.where(first, m2, 0.0), [tf.where(first, v, 0.0) for v in (l1, l2, l3)]


_IPM_SMALL_CHAIN = 128


def _ipm_solve(lq, pt, strict, lo, up, in_support, run, tol, gap_tol, max_iter):
    """Interior-point projection in sorted coordinates (batch-major ``[B, K]`` inputs).

    Returns ``x_primal``, ``x_dual`` ([K, B] normalised log projections: the primal
    iterate and the dual point of ``lam``, for the caller to certify), ``lam`` [3, m1, B]
    multipliers in the original constraint indexing (inner tie pairs carry the signed
    multiplier that makes the tied coordinates equal), iterations [B].

    The interior point's sequential sweeps run over blocks, not classes: a batch whose rows
    all have at most ``_IPM_SMALL_CHAIN`` distinct possibility levels (graded labels, ratings)
    is solved on a chain of that length whatever K is (``tf.cond``, both compiled).
    """
    args = (lq, pt, strict, lo, up, in_support, run, tol, gap_tol, max_iter)
    k = pt.shape[-1]
    if k <= _IPM_SMALL_CHAIN:
        return _ipm_solve_blocks(*args, size=k)
    n_blocks = tf.reduce_sum(tf.cast(_block_starts(strict, in_support), tf.int32), axis=1)
    return tf.cond(
        tf.reduce_max(n_blocks) <= _IPM_SMALL_CHAIN,
        lambda: _ipm_solve_blocks(*args, size=_IPM_SMALL_CHAIN),
        lambda: _ipm_solve_blocks(*args, size=k),
    )


def _ipm_solve_blocks(lq, pt, strict, lo, up, in_support, run, tol, gap_tol, max_iter, size):
    """:func:`_ipm_solve` on a block axis of static length ``size``."""
    pdot = _antipignistic_sorted(pt)
    red = _reduce_ties(lq, pt, strict, lo, up, in_support, pdot, size)
    qm = tf.exp(_normalize_log(tf.where(red["real"], red["g"], -np.inf)))
    mdot = red["mdot"] / tf.reduce_sum(red["mdot"], axis=0, keepdims=True)
    m0 = tf.where(red["real"], 0.5 * qm + 0.5 * mdot, 0.0)
    two = red["n_blocks"] == 2
    u, (lam1, lam2, lam3), iters = _ipm_core(red, m0, run & ~two, tol, gap_tol, max_iter)
    u2, lams2 = _two_block(red)
    sel = two[None, :]
    u = tf.where(sel, u2, u)
    lam1, lam2, lam3 = [tf.where(sel, a, b) for a, b in zip(lams2, (lam1, lam2, lam3))]
    # Two candidates, both certified by the caller on the original constraints: the
    # primal iterate (feasible; the exact duality gap against lam) and the dual point.
    ext = tf.concat([tf.ones_like(u[:1]), u, tf.zeros_like(u[:1])], 0)
    xm_primal = tf.math.log(tf.where(red["real"], ext[:-1] - ext[1:], 1.0))
    xm_dual = _ipm_dual_point(red, lam1, lam2, lam3)

    # Back to classes with one gather of a [B, blocks, 10] table (XLA:CPU gathers index by
    # index). Multipliers in the original indexing: boundary r of block j carries block j's
    # values; inside a tie block, nu_r = mu_r (lower minus upper) solves the stationarity
    # of the tied coordinates:
    # mu_i - mu_{i-1} = (block mean of log q) - log q_i + (nu_j - nu_{j-1})/w_j.
    def batch_major(x):  # [size or size-1, B] -> [B, size]
        x = tf.transpose(x)
        return tf.concat([x, tf.zeros_like(pt[:, : size - x.shape[1]])], 1)

    log_w = tf.math.log(red["w"])
    w_b = tf.transpose(red["w"])
    nu_b = batch_major(lam2 - lam3)
    table = [batch_major(t) for t in (xm_primal - log_w, xm_dual - log_w, red["w"])]
    table.append(batch_major(red["g"] - log_w))  # block mean of log q
    table += [nu_b, tf.concat([tf.zeros_like(nu_b[:, :1]), nu_b[:, :-1]], 1)]
    table.append(_cumsum_rows(w_b) - w_b)  # first sorted class of the block
    table += [batch_major(t) for t in (lam1, lam2, lam3)]
    per_cls = tf.gather(tf.stack(table, -1), red["bid"], batch_dims=1)
    x_primal, x_dual, w_cls, mean_lq, nu, nu_prev, first, l1c, l2c, l3c = tf.unstack(
        per_cls, axis=-1
    )
    step = tf.where(
        in_support, mean_lq - tf.where(in_support, lq, 0.0) + (nu - nu_prev) / w_cls, 0.0
    )
    csum = _cumsum_rows(step)
    base = tf.gather(csum - step, tf.cast(first, tf.int32), batch_dims=1)  # before the block
    mu = tf.where(strict, nu[:, :-1], (nu_prev + csum - base)[:, :-1])
    mu = tf.where(in_support[:, 1:], mu, 0.0)
    lp = tf.where(strict, l1c[:, :-1], 0.0)
    ll = tf.where(strict, l2c[:, :-1], tf.maximum(mu, 0.0))
    lu = tf.where(strict, l3c[:, :-1], tf.maximum(-mu, 0.0))
    lam = tf.stack([tf.transpose(lp), tf.transpose(ll), tf.transpose(lu)], 0)

    def per_class(x):
        return tf.transpose(tf.where(in_support, x, tf.constant(-np.inf, _F64)))

    return per_class(x_primal), per_class(x_dual), lam, iters


_IPM_JIT = tf.function(_ipm_solve, jit_compile=True, autograph=False)

_CORE_JIT = tf.function(_project_core, jit_compile=True, autograph=False)


def _run_core(*args, jit=True, **kwargs):
    fn = _CORE_JIT if jit else _project_core
    return fn(*args, **kwargs)


def _project_2d(
    lq_full,
    cons: PossibilityConstraints,
    support_mode,
    tol,
    gap_tol,
    max_cycles,
    stopping,
    q_clip,
    unroll_max_k,
    jit,
    method="dykstra",
):
    """lq_full [B, K] float64 log q (normalised on the support). Returns p [B, K], info."""
    k = lq_full.shape[-1]
    m1 = k - 1
    batch = tf.shape(lq_full)[0]
    valid = cons.valid
    if m1 == 0:
        p = tf.exp(lq_full)
        zeros = tf.zeros([batch], _F64)
        info = {
            "iterations": tf.zeros([batch], tf.int32),
            "cycles": tf.zeros([batch], tf.int32),
            "residual": zeros,
            "max_violation": zeros,
            "duality_gap": zeros,
            "converged": valid,
            "valid": valid,
            "lambda": tf.zeros([batch, 3, 0], _F64),
        }
        return p, info
    order = cons.order
    pt = cons.sorted_possibility
    in_support = pt > 0.0
    lq = tf.gather(lq_full, order, batch_dims=1)
    neg_inf = tf.constant(-np.inf, _F64)
    lq = tf.where(in_support, tf.maximum(lq, np.log(q_clip)), neg_inf)
    m = tf.reduce_max(lq, axis=-1, keepdims=True)
    lq = lq - (m + tf.math.log(tf.reduce_sum(tf.exp(lq - m), axis=-1, keepdims=True)))
    n = cons.num_support
    has_strict = tf.reduce_any(cons.strict, axis=-1)
    run = valid & (n >= 2) & has_strict
    pt_next = pt[:, 1:]
    ratio = tf.where(
        cons.active,
        cons.dominance_bound / tf.where(cons.active, pt_next, 1.0),
        tf.ones_like(pt_next),
    )

    def tm(t):
        return tf.transpose(t)

    cst = {
        "pt_next": tm(pt_next),
        "lo": tm(cons.gap_lower),
        "up": tm(cons.gap_upper),
        "act": tm(cons.active),
    }

    def dykstra(rows, stopping_code, lam_init=None, compact=True):
        """Certified / paper / fixed Dykstra on ``rows``: ``(x, lam, cycles)``."""
        x, lam, cycles, _, _ = _run_core(
            tm(lq),
            tm(pt_next),
            tm(ratio),
            tm(cons.gap_lower),
            tm(cons.gap_upper),
            tm(cons.active),
            rows,
            tf.constant(tol, _F64),
            tf.constant(gap_tol, _F64),
            tf.constant(max_cycles, tf.int32),
            tf.constant(stopping_code, tf.int32),
            unroll=bool(k <= unroll_max_k),
            jit=jit,
            lam_init=lam_init,
            compact=compact,
        )
        return x, lam, cycles

    if method == "interior_point":
        fn = _IPM_JIT if jit else _ipm_solve
        x_primal, x_dual, lam, iterations = fn(
            lq,
            pt,
            cons.strict,
            cons.gap_lower,
            cons.gap_upper,
            in_support,
            run,
            tf.constant(tol, _F64),
            tf.constant(gap_tol, _F64),
            tf.constant(_IPM_MAX_ITER, tf.int32),
        )
        # The dual point when it certifies (exact on degenerate rows, where the primal
        # converges like sqrt(mu)), else the primal iterate when it does.
        certified = []
        for cand in (x_dual, x_primal):
            v0, gap0 = _check(cand, lam[0], lam[1], lam[2], cst, lq=tm(lq))
            certified.append((v0 <= tol) & (tf.abs(gap0) <= gap_tol))
        x = tf.where(certified[0][None, :], x_dual, x_primal)
        # Rows neither certifies (float64 exhausted near the solution) are finished by
        # certified Dykstra warm-started from the interior-point multipliers.
        finish = run & ~(certified[0] | certified[1])

        def dykstra_finish():
            x2, lam2, cycles = dykstra(finish, 1, tuple(tf.unstack(lam)), compact=False)
            return (
                tf.where(finish[None, :], x2, x),
                tf.where(finish[None, None, :], lam2, lam),
                cycles,
            )

        x, lam, cycles = tf.cond(
            tf.reduce_any(finish), dykstra_finish, lambda: (x, lam, tf.zeros([batch], tf.int32))
        )
    else:
        x, lam, cycles = dykstra(run, _STOPPING_CODE[stopping])
        iterations = cycles
    x = tf.transpose(x)
    # Short-circuits: no strict drop -> uniform on the support; n <= 1 or invalid -> q.
    uniform = tf.where(in_support, 1.0 / tf.cast(tf.maximum(n, 1), _F64)[:, None], 0.0)
    p_sorted = tf.where(run[:, None], tf.exp(x), tf.exp(lq))
    p_sorted = tf.where((valid & (n >= 2) & ~has_strict)[:, None], uniform, p_sorted)
    lam = tf.where(run[None, None, :], lam, tf.zeros_like(lam))  # [3, m1, B]
    # Diagnostics of the returned point (uniform / q rows included: they are exact by
    # construction, so only the projected rows get the KL(p || p(lam)) term of the gap).
    v, gap = _check(
        tf.transpose(tf.math.log(p_sorted)),
        lam[0],
        lam[1],
        lam[2],
        cst,
        lq=tf.where(run[None, :], tm(lq), tf.math.log(tm(p_sorted))),
    )
    if stopping == "paper":
        converged = v <= tol
    else:
        converged = (v <= tol) & (tf.abs(gap) <= gap_tol)
    p = _unsort(p_sorted, order)
    info = {
        "iterations": tf.stop_gradient(iterations),
        "cycles": tf.stop_gradient(cycles),
        "residual": tf.stop_gradient(tf.maximum(v, tf.abs(gap))),
        "max_violation": tf.stop_gradient(v),
        "duality_gap": tf.stop_gradient(gap),
        "converged": tf.stop_gradient(converged & valid),
        "valid": valid,
        "lambda": tf.stop_gradient(tf.transpose(lam, [2, 0, 1])),
    }
    return tf.stop_gradient(p), info


def _log_q(z, support=None):
    """log softmax of float64 logits, optionally restricted to ``support`` (bool)."""
    if support is not None:
        z = tf.where(support, z, tf.constant(-np.inf, _F64))
    return tf.nn.log_softmax(z, axis=-1), z


def _support_of(possibility2d, support_mode):
    if support_mode != "restrict":
        return None
    pi, valid = _sanitize(possibility2d)
    return (pi > 0.0) | ~valid[:, None]


def _prepare(logits, possibility, cfg):
    _check_config(**cfg["check"])
    z = _as_float(logits, "logits")
    pi = tf.stop_gradient(_as_float(possibility, "possibility"))
    _check_same_shape(z, pi, "logits", "possibility")
    z2, restore = _flatten(z, "logits")
    pi2, _ = _flatten(pi, "possibility", k=z2.shape[-1])
    z2 = _validate_logits(z2, "logits")
    pi2 = _validate_possibility(pi2, "possibility")
    return z, z2, tf.cast(pi2, _F64), restore


def _config(
    tol,
    gap_tol,
    max_cycles,
    stopping,
    support_mode,
    floor,
    eps_cap,
    tie_tol,
    gap_policy,
    q_clip,
    compute_dtype,
    method=None,
):
    return {
        "check": dict(
            tol=tol,
            gap_tol=gap_tol,
            max_cycles=max_cycles,
            stopping=stopping,
            support_mode=support_mode,
            floor=floor,
            eps_cap=eps_cap,
            tie_tol=tie_tol,
            gap_policy=gap_policy,
            q_clip=q_clip,
            compute_dtype=compute_dtype,
            method=method,
        )
    }


def _projection_from_z(
    z2,
    pi2,
    *,
    tol,
    gap_tol,
    max_cycles,
    stopping,
    support_mode,
    floor,
    eps_cap,
    tie_tol,
    gap_policy,
    q_clip,
    unroll_max_k,
    jit,
    method="interior_point",
):
    """z2 [B, K] float64 logits (may carry a tape) -> (p*, info, masked z, log q)."""
    support = _support_of(pi2, support_mode)
    lq, zm = _log_q(z2, support)
    cons = _constraints_2d(pi2, eps_cap, tie_tol, support_mode, floor, gap_policy)
    p, info = _project_2d(
        tf.stop_gradient(lq),
        cons,
        support_mode,
        tol,
        gap_tol,
        max_cycles,
        stopping,
        q_clip,
        unroll_max_k,
        jit,
        method=method,
    )
    return p, info, zm, lq


def possibilistic_projection(
    logits_or_log_probs,
    possibility,
    tol: float = 1e-8,
    max_cycles: int = 2000,
    stopping: str = "certified",
    support_mode: str = "floor",
    gap_tol: float = 1e-10,
    floor: float = 1e-6,
    eps_cap: float = 1e-9,
    tie_tol: float = 0.0,
    gap_policy: str = "wide",
    q_clip: float = 1e-15,
    compute_dtype: str = "float64",
    unroll_max_k: int = 8,
    jit: bool = True,
    method: str | None = None,
    name: str | None = None,
):
    """KL projection ``p* = argmin_{p in F(pi)} KL(p || q)``, ``q = softmax(logits)``.

    Solved in float64 and batched over examples with different ``pi``: by default
    (``stopping="certified"``) with the interior-point solver on the tie-reduced chain (a
    closed form for two-block rows such as one-hot labels), each row certified on the
    original constraints by the exact duality gap and finished by warm-started Dykstra only
    where the interior point cannot certify it (``docs/design/possibilistic_solver.md``);
    ``method="dykstra"`` (and the ``"paper"`` / ``"fixed"`` rules) runs Dykstra's algorithm
    with KL projections in its one-scalar-per-constraint dual form (spec 2.4). See the module
    docstring for the constraints, the closed-form steps and the stopping rules.

    The projection is a *target*: it is returned behind ``tf.stop_gradient`` (no gradient
    flows through the iterations, spec 4); use :func:`possibilistic_projection_loss` for the
    loss ``KL(p* || q)`` whose exact gradient is ``softmax(z) - p*``.

    Args:
      logits_or_log_probs: ``[..., K]`` logits or log-probabilities (``log_softmax`` is
        applied, so both give the same ``q``); ``-inf`` masks a class; NaN, ``+inf`` and
        rows of only ``-inf`` are rejected. Leading dims may be unknown at trace time,
        ``K`` must be static.
      possibility: ``[..., K]`` possibility degrees in ``[0, 1]`` with row maximum 1;
        other rows are rejected (``ValueError`` eagerly, an assertion in graphs; NaN rows
        under XLA).
      tol: feasibility tolerance ``tau`` on the max violation ``V``.
      max_cycles: maximum number of Dykstra cycles (each visits all 3(K-1) constraints);
        with the interior point, the budget of its Dykstra finish.
      stopping: ``"certified"`` (``V <= tol`` and ``|gap| <= gap_tol``), ``"paper"``
        (``V <= tol``) or ``"fixed"`` (exactly ``max_cycles`` cycles).
      support_mode: ``"floor"`` or ``"restrict"`` (spec 5).
      gap_tol: duality-gap tolerance of the certified rule.
      floor, eps_cap, tie_tol, gap_policy: constraint options (:func:`possibility_constraints`).
      q_clip: ``log q`` is clamped at ``log(q_clip)`` and renormalised before projecting.
      compute_dtype: must stay ``"float64"`` unless ``tol`` and ``eps_cap`` are >= 1e-5
        (the kernel then still runs in float64; the argument documents the weaker regime).
      unroll_max_k: unroll the inner constraint loops in Python when ``K <= unroll_max_k``.
      jit: run the iterations in a cached ``tf.function(jit_compile=True)``.
      method: ``None`` (the interior point for ``stopping="certified"``, Dykstra for the
        other rules), ``"interior_point"`` or ``"dykstra"``.
      name: optional name scope.

    Returns:
      ``(projection, info)``: ``projection`` has the shape and floating dtype of the logits;
      ``info`` is a dict of ``[...]`` tensors: ``iterations`` (int32: interior-point
      iterations, 0 for closed-form rows; Dykstra cycles with ``method="dykstra"``),
      ``cycles`` (int32: Dykstra cycles), ``max_violation`` ``V``, ``duality_gap``
      (``KL(p||q) - g(lam)``, float64), ``residual`` (``max(V, |gap|)``), ``converged``
      (certified: ``V <= tol`` and ``|gap| <= gap_tol``), ``valid`` (bool), and ``lambda``
      (``[..., 3, K-1]`` float64 multipliers for pref/low/up, in sorted order).

    Example:
      >>> p, info = possibilistic_projection(tf.math.log([[0.48, 0.261, 0.259]]),
      ...                                    [[1.0, 0.51, 0.5]])
      >>> p.numpy().round(6)
      array([[0.49    , 0.255981, 0.254019]], dtype=float32)
    """
    cfg = _config(
        tol,
        gap_tol,
        max_cycles,
        stopping,
        support_mode,
        floor,
        eps_cap,
        tie_tol,
        gap_policy,
        q_clip,
        compute_dtype,
        method,
    )
    with tf.name_scope(name or "possibilistic_projection"):
        z, z2, pi2, restore = _prepare(logits_or_log_probs, possibility, cfg)
        dtype = z.dtype if z.dtype.is_floating else tf.float32
        z2 = tf.stop_gradient(tf.cast(z2, _F64))
        p, info, _, lq = _projection_from_z(
            z2,
            pi2,
            tol=tol,
            gap_tol=gap_tol,
            max_cycles=max_cycles,
            stopping=stopping,
            support_mode=support_mode,
            floor=floor,
            eps_cap=eps_cap,
            tie_tol=tie_tol,
            gap_policy=gap_policy,
            q_clip=q_clip,
            unroll_max_k=unroll_max_k,
            jit=jit,
            method=_resolve_method(method, stopping),
        )
        # row_has_nan(lq): in 'restrict' mode, every class of the support masked by -inf.
        invalid = _possibility_invalid(pi2) | _logits_invalid(z2) | row_has_nan(lq)
        p = nan_where(invalid[:, None], p)
        info["valid"] = info["valid"] & ~invalid
        info["converged"] = info["converged"] & ~invalid
        info = {key: restore(val) for key, val in info.items()}
        _warn_uncertified(info)
        return tf.cast(restore(p), dtype), info


# --------------------------------------------------------------------------------------
# Losses: KL(target || softmax(z)) with the hand-derived gradient
# --------------------------------------------------------------------------------------


_LOG_Q_CLIP = float(np.log(1e-15))


@tf.custom_gradient
def _kl_from_logits(target, z):
    """``sum_k t_k (log t_k - max(log softmax(z)_k, log 1e-15))`` per row (0 log 0 = 0).

    float64. The clamp (the paper clips probabilities at 1e-15 wherever a log is taken)
    only matters when ``q_k < 1e-15`` while ``t_k > 0`` (e.g. a -inf logit on a possible
    class), where it keeps the value finite. Gradient: ``sum(t) softmax(z) - t`` for ``z``
    (exact for a constant target away from the clamp); none for the target (a label).
    """
    lq = tf.nn.log_softmax(z, axis=-1)
    pos = target > 0.0
    lq_c = tf.maximum(lq, _LOG_Q_CLIP)
    terms = tf.where(
        pos, target * (tf.math.log(tf.where(pos, target, 1.0)) - lq_c), tf.zeros_like(target)
    )
    # A NaN target (the projection of an invalid row) or q (+inf logits, every class of the
    # support masked) would drop out of the sum above: the row is NaN instead.
    loss = nan_where(row_has_nan(target) | row_has_nan(lq), tf.reduce_sum(terms, axis=-1))

    def grad(upstream):
        q = tf.exp(lq)
        total = tf.reduce_sum(target, axis=-1, keepdims=True)
        return None, upstream[:, None] * (total * q - target)

    return loss, grad


def possibilistic_projection_loss(
    logits,
    possibility,
    tol: float = 1e-8,
    max_cycles: int = 2000,
    stopping: str = "certified",
    support_mode: str = "floor",
    gap_tol: float = 1e-10,
    floor: float = 1e-6,
    eps_cap: float = 1e-9,
    tie_tol: float = 0.0,
    gap_policy: str = "wide",
    q_clip: float = 1e-15,
    compute_dtype: str = "float64",
    unroll_max_k: int = 8,
    jit: bool = True,
    method: str | None = None,
    name: str | None = None,
):
    """Per-example loss ``KL(p* || softmax(z))`` with ``p*`` the projection of ``softmax(z)``.

    ``p*`` is recomputed from the current logits and held fixed; by Danskin's theorem the
    gradient ``softmax(z) - p*`` is the exact gradient of ``z -> min_{p in F} KL(p||q)``
    (spec 4). In ``"restrict"`` mode ``q`` is renormalised on the support and classes
    outside it get zero gradient. Invalid rows (``possibility`` breaking the rule of the
    module docstring; NaN, +inf or all -inf logits) raise eagerly and in graphs, naming the
    argument, and give a NaN loss under XLA (and with validation off).

    Args:
      logits: ``[..., K]`` logits (float16/bfloat16/float32/float64).
      possibility: ``[..., K]`` possibility degrees.
      Other arguments: as :func:`possibilistic_projection`.

    Returns:
      ``(loss, info)``: ``loss`` ``[...]`` in the logits' dtype; ``info`` as
      :func:`possibilistic_projection` (float64 / int / bool, no gradient).

    Example:
      >>> loss, info = possibilistic_projection_loss([[2.0, 0.0, -1.0]], [[0.3, 1.0, 0.2]])
    """
    cfg = _config(
        tol,
        gap_tol,
        max_cycles,
        stopping,
        support_mode,
        floor,
        eps_cap,
        tie_tol,
        gap_policy,
        q_clip,
        compute_dtype,
        method,
    )
    with tf.name_scope(name or "possibilistic_projection_loss"):
        z, z2, pi2, restore = _prepare(logits, possibility, cfg)
        dtype = z.dtype if z.dtype.is_floating else tf.float32
        z64 = tf.cast(z2, _F64)
        p, info, zm, lq = _projection_from_z(
            z64,
            pi2,
            tol=tol,
            gap_tol=gap_tol,
            max_cycles=max_cycles,
            stopping=stopping,
            support_mode=support_mode,
            floor=floor,
            eps_cap=eps_cap,
            tie_tol=tie_tol,
            gap_policy=gap_policy,
            q_clip=q_clip,
            unroll_max_k=unroll_max_k,
            jit=jit,
            method=_resolve_method(method, stopping),
        )
        loss = _kl_from_logits(p, zm)
        invalid = _possibility_invalid(pi2) | _logits_invalid(z64) | row_has_nan(lq)
        loss = nan_where(invalid, loss)
        info["valid"] = info["valid"] & ~invalid
        info["converged"] = info["converged"] & ~invalid
        info = {key: restore(val) for key, val in info.items()}
        _warn_uncertified(info)
        return tf.cast(restore(loss), dtype), info


def antipignistic_kl_loss(logits, possibility, floor: float = 0.0, name: str | None = None):
    """Model B of the paper: ``KL(pdot(pi) || softmax(z))`` with the antipignistic target.

    Gradient ``softmax(z) - pdot``. Invalid rows (``possibility`` outside ``[0, 1]``, not
    max-normalised or with NaN/Inf; NaN, +inf or all -inf logits) raise eagerly and in
    graphs, naming the argument, and give a NaN loss under XLA. ``K`` may be unknown at
    trace time.

    Args:
      logits: ``[..., K]`` logits.
      possibility: ``[..., K]`` possibility degrees.
      floor: floor applied to the normalised ``pi`` before the transform (0: none).
      name: optional name scope.

    Returns:
      ``[...]`` per-example loss in the logits' dtype.

    Example:
      >>> antipignistic_kl_loss([[0.0, 0.0]], [[1.0, 1.0]]).numpy()
      array([0.], dtype=float32)
    """
    if not 0.0 <= floor < 1.0:
        raise ValueError(f"`floor` must be in [0, 1), got {floor!r}.")

    def target(pi2):
        _, valid = _sanitize(pi2)
        return _antipignistic_2d(pi2, tf.constant(floor, _F64)), valid

    with tf.name_scope(name or "antipignistic_kl_loss"):
        return _fixed_target_kl(logits, possibility, "possibility", target)


def vote_kl_loss(logits, votes, name: str | None = None):
    """Model C of the paper: ``KL(v / sum(v) || softmax(z))`` with vote proportions.

    Negative or non-finite counts, rows without a positive count and NaN, +inf or all -inf
    logits are invalid: they raise eagerly and in graphs, naming the argument, and give a
    NaN loss under XLA. Gradient ``softmax(z) - v/sum(v)``. ``K`` may be unknown at trace
    time.

    Args:
      logits: ``[..., K]`` logits.
      votes: ``[..., K]`` non-negative vote counts (any scale).
      name: optional name scope.

    Returns:
      ``[...]`` per-example loss in the logits' dtype.

    Example:
      >>> vote_kl_loss([[0.0, 0.0]], [[5, 5]]).numpy()
      array([0.], dtype=float32)
    """

    def target(v2):
        finite = tf.reduce_all(tf.math.is_finite(v2), axis=-1)
        v2 = tf.where(tf.math.is_finite(v2), tf.maximum(v2, 0.0), tf.zeros_like(v2))
        total = tf.reduce_sum(v2, axis=-1, keepdims=True)
        valid = finite & (total[:, 0] > 0.0)
        return tf.where(
            valid[:, None], v2 / tf.where(total > 0.0, total, 1.0), tf.zeros_like(v2)
        ), valid

    with tf.name_scope(name or "vote_kl_loss"):
        return _fixed_target_kl(logits, votes, "votes", target)


def _fixed_target_kl(logits, labels, labels_name, make_target):
    """``KL(t || softmax(z))`` per row for a target ``t`` that does not depend on ``z``.

    ``make_target(labels [N, K] float64) -> (t, valid [N])``; invalid rows get a NaN loss.
    Shared by the paper's fixed-target baselines (Models B and C).
    """
    z = _as_float(logits, "logits")
    y = tf.stop_gradient(_as_float(labels, labels_name))
    _check_same_shape(z, y, "logits", labels_name)
    dtype = z.dtype if z.dtype.is_floating else tf.float32
    z2, restore = _flatten(z, "logits", static_k=False)
    y2, _ = _flatten(y, labels_name, k=z2.shape[-1], static_k=False)
    z2 = _validate_logits(z2, "logits")
    if labels_name == "possibility":
        y2 = _validate_possibility(y2, labels_name)
    else:
        y2 = _validate_votes(y2, labels_name)
    target, valid = make_target(tf.cast(y2, _F64))
    y64 = tf.cast(y2, _F64)
    invalid = ~valid | _logits_invalid(tf.cast(z2, _F64)) | tf.reduce_any(y64 < 0.0, axis=-1)
    if labels_name == "possibility":
        invalid |= _possibility_invalid(y64)
    loss = _kl_from_logits(tf.stop_gradient(target), tf.cast(z2, _F64))
    loss = nan_where(invalid, loss)
    return tf.cast(restore(loss), dtype)


def _validate_votes(v, name):
    """Eager ValueError / graph assertion: finite, non-negative counts with a positive sum."""
    if not validation_enabled():
        return v
    message = f"`{name}` must hold finite, non-negative vote counts with a positive row sum."
    value = static_value(v)
    if value is not None:
        a = np.asarray(value, np.float64)
        with np.errstate(invalid="ignore"):
            ok = np.all(np.isfinite(a) & (a >= 0)) and np.all(a.sum(-1) > 0)
        if a.size and not ok:
            raise ValueError(message)
        return v
    v64 = tf.cast(v, _F64)
    ok = tf.reduce_all(tf.math.is_finite(v64) & (v64 >= 0.0)) & tf.reduce_all(
        tf.reduce_sum(v64, -1) > 0.0
    )
    with tf.control_dependencies([tf.debugging.Assert(ok, [message])]):
        return tf.identity(v)
