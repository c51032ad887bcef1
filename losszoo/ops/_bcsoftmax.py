"""Box-constrained softmax (BCSoftmax; Atarashi et al., 2025).

Spec: ``shared/specs/bcsoftmax.md`` sections 1 (definition, feasibility), 2.3-2.4 (exact
algorithms), 2.6 (shapes, dtypes, validation), 3 (gradients) and 4 (numerics).

Definition (spec section 1, paper eq. 7), for logits ``x`` in R^K, temperature ``tau > 0`` and
bounds ``a <= y <= b``::

    BCSoftmax_tau(x; a, b) = argmax_{y in simplex, a <= y <= b}  <x, y> - tau * sum_k y_k log y_k
                           = clip(exp(x / tau - nu), a, b)

with the one scalar ``nu`` per row that solves
``phi(nu) = sum_k clip(exp(x_k/tau - nu), a_k, b_k) = 1``.
``phi`` is continuous and non-increasing. Each coordinate is in one of three *states*:
``L`` (``y_k = a_k``, when ``exp(x_k/tau - nu) <= a_k``), ``U`` (``y_k = b_k``, when
``exp(x_k/tau - nu) > b_k``) or ``F`` (free). For a fixed state pattern the root is in closed
form (paper Thm. 3, spec eq. for ``z = r/s``)::

    s = 1 - sum_L a - sum_U b ,   nu = logsumexp_F(x/tau) - log s ,   y_F = s * softmax(x_F/tau)

Feasible iff ``a <= b`` and ``sum(a) <= 1 <= sum(b)`` (spec section 1).

Forward algorithms (all exact: each ends with the closed-form solve on the identified pattern):

* ``method="newton"`` (default; not in the spec, derived here): safeguarded Newton on the
  pieces of ``phi``. On a piece, ``phi(nu) = (1 - s) + R exp(nu_0 - nu)`` is affine in ``exp(-nu)``,
  so the closed form above *is* the Newton step and lands on the exact root whenever the root is
  in the current piece. Start at ``nu_0 = logsumexp(x/tau)`` (the softmax normaliser; rows whose
  softmax already satisfies the box stop here). Each step takes the closed-form root of the
  current pattern if it lies in the bracket ``[lo, hi]`` (``phi(lo) >= 1 >= phi(hi)``), else the
  bracket midpoint. A row stops when the pattern at the new ``nu`` equals the pattern that produced
  it (then ``nu`` is the exact root), or when no coordinate is free and the bounds sum to 1. It is
  a ``tf.while_loop`` over static shapes (XLA-compilable) that stops when all rows have stopped;
  O(K) per step, typically 2-9 steps; every 4th step is a bisection step, so the bracket
  shrinks geometrically; a cap of 100 (float32) / 200 (float64) steps.
  Bracket (spec 2.4, with cheaper forms): ``lo = min_k (x_k/tau - log b_k)`` (or ``nu_0`` without
  upper bounds), ``hi = nu_0 - log(1 - sum a)`` (or ``nu_0`` without lower bounds).
* ``method="sort"``: spec Algorithm A (section 2.3): sort the 2K breakpoints
  ``u = x - log b``, ``l = x - log a``, binary search for the last breakpoint with ``phi >= 1``,
  closed form. O(K log K).
* ``method="bisect"``: spec Algorithm B (section 2.4): 40 (float32) / 64 (float64) bisection
  steps on ``nu``, then the same closed form.
  Rows where the bracket collapses to adjacent floats (logit gaps near the float range) fall back
  to: U/L where the state is the same at both bracket ends, the rest free, closed form; only
  ``"newton"`` has this fallback, so it is the method for logit gaps beyond about 1e30.

Gradients (spec section 3; paper eqs. 23-25 with the erratum E5 fixed): with exclusive states
``g = [L]``, ``h = [U]`` from the forward pass, ``q = y * [F]``, ``S = sum q``,
``vbar = <q, v> / S`` (0 if ``S = 0``), ``w = v - vbar``::

    dL/dx = q * w / tau,   dL/da = g * w,   dL/db = h * w,
    dL/dtau = -(1/tau) sum_k (x_k - max x) dL/dx_k

Bounds given with broadcast shapes get the gradient summed over the broadcast axes. O(K) per row.

Pinned rows (every coordinate at a bound, e.g. ``sum(lower) = 1``, ``sum(upper) = 1``,
``lower = upper``): the map is differentiable only along the face ``sum(bounds) = 1``; the
one-sided derivatives into the interior (``vbar`` = the ``v`` of the coordinate that would come
free) depend on which side of 0 the computed free mass rounds to, which differs between eager
and XLA summation orders. Every mode uses the face derivative (spec section 3, ``S = 0``):
``dL/da = g * v``, ``dL/db = h * v``, ``dL/dx = 0``; a row counts as pinned when each free
coordinate lies within ``4 * eps * K`` of one of its bounds.

Numerics (spec section 4): logits are divided by ``tau`` and shifted by the row max; the
patterns are read from ``exp(x - nu)`` compared with the bounds, which overflows to ``+inf``
(state U) or underflows to 0 (state L) harmlessly. ``lower < 0`` / ``upper > 1`` are clamped
(their gradient is then 0; when values are known, more than 1e-5 outside [0, 1] is an
error); the output is clipped into ``[a, b]`` at the end, so
the box holds exactly and the sum is 1 up to about ``K * eps``. A ``-inf`` logit forces
``y_k = a_k``; ``a_k = b_k = 0`` masks class ``k``. Half precision is computed in float32.

Fail-loud contract (README, "Bad input"): NaN or +inf logits, a row whose logits are all -inf,
a temperature that is not finite and > 0, NaN bounds, bounds more than 1e-5 outside [0, 1] and
infeasible bounds (``sum a > 1``, ``sum b < 1`` or some ``a_k > b_k``, tolerance
``10 * eps * K``) raise ``ValueError`` when the values are known (eager, constants) and fail a
graph assertion inside ``tf.function``, both naming the argument (``validate=False`` or
``losszoo.set_validation(False)`` skips these checks). Under XLA, where assertions vanish, and
with validation off, the affected rows come back NaN (the test is folded into the kernel and
always runs). A ``-inf`` logit masks its class: ``y_k = max(lower_k, 0)``, i.e. 0 unless the
caller demands a minimum mass for it; the other classes are BCSoftmax over the rest.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from losszoo.contract import (
    check_choice,
    check_static_rank,
    move_axis_last,
    static_value,
    to_compute_dtype,
    validation_enabled,
)

FREE, LOWER, UPPER = 0, 1, 2
# Element-wise range rules (0 <= lower, upper <= 1) are checked with this slack; values inside
# it are clamped (the spec's random-problem recipe produces upper = 1 + 1e-6).
_RANGE_TOL = 1e-5
METHODS = ("newton", "sort", "bisect")
# Backward pass: in a row where every free coordinate lies within this many eps * K of one of
# its bounds, those coordinates count as at the bound (see the gradient notes in the docstring).
_PIN_TOL = 4.0


# --------------------------------------------------------------------------------------------
# Forward solvers on [N, K] rows. x is already divided by tau and shifted (row max 0).
# a, b are [N, K] tensors or None (no bound on that side). All return (y, state).
# --------------------------------------------------------------------------------------------


def _pattern(x, a, b, nu):
    """Classification at ``nu`` ([N, 1]): returns z = exp(x - nu), U, L masks (or None)."""
    z = tf.exp(x - nu)
    upper, lower = _clamp_sets(None if b is None else z > b, None if a is None else z <= a)
    return z, upper, lower


def _clamp_sets(above_upper, below_lower):
    """Upper/lower clamp masks from the raw bound tests (None: no such bound).

    A coordinate that passes both tests (only possible where lower == upper) is counted
    at the upper bound, so no coordinate is clamped twice.
    """
    if above_upper is not None and below_lower is not None:
        below_lower = tf.logical_and(below_lower, tf.logical_not(above_upper))
    return above_upper, below_lower


def _free_mask(x, upper, lower):
    if upper is None and lower is None:
        return tf.ones_like(x, dtype=tf.bool)
    if upper is None:
        return tf.logical_not(lower)
    if lower is None:
        return tf.logical_not(upper)
    return tf.logical_not(tf.logical_or(upper, lower))


def _masses(z, a, b, upper, lower):
    """s = 1 - bound mass, R = free mass sum(z_F), no_free flag; all [N, 1]."""
    zero = tf.zeros_like(z)
    bound = tf.zeros_like(z[:, :1])
    if lower is not None:
        bound += tf.reduce_sum(tf.where(lower, a, zero), -1, keepdims=True)
    if upper is not None:
        bound += tf.reduce_sum(tf.where(upper, b, zero), -1, keepdims=True)
    free = _free_mask(z, upper, lower)
    r = tf.reduce_sum(tf.where(free, z, zero), -1, keepdims=True)
    no_free = tf.logical_not(tf.reduce_any(free, -1, keepdims=True))
    return 1.0 - bound, r, no_free


def _same(m1, m2):
    if m1 is None:
        return None
    return tf.reduce_all(tf.equal(m1, m2), -1, keepdims=True)


def _assemble(z, a, b, upper, lower, s, r):
    """y from a pattern: bounds on L/U, free coordinates normalised to the mass s."""
    scale = tf.math.divide_no_nan(tf.maximum(s, 0.0), r)
    y = z * scale
    state = tf.zeros_like(z, dtype=tf.int8)
    if upper is not None:
        y = tf.where(upper, b, y)
        state = tf.where(upper, tf.constant(UPPER, tf.int8), state)
    if lower is not None:
        y = tf.where(lower, a, y)
        state = tf.where(lower, tf.constant(LOWER, tf.int8), state)
    return y, state


def _finite_min(t, axis=-1):
    big = tf.constant(np.inf, t.dtype)
    return tf.reduce_min(tf.where(tf.math.is_finite(t), t, big), axis, keepdims=True)


def _finite_max(t, axis=-1):
    small = tf.constant(-np.inf, t.dtype)
    return tf.reduce_max(tf.where(tf.math.is_finite(t), t, small), axis, keepdims=True)


def _solve_newton_robust(x, a, b):
    dtype = x.dtype
    k = x.shape[-1]
    eps = np.finfo(dtype.as_numpy_dtype).eps
    tiny = np.finfo(dtype.as_numpy_dtype).tiny
    tol = 10.0 * eps * k
    max_iter = 100 if dtype == tf.float32 else 200

    nu0 = tf.reduce_logsumexp(x, -1, keepdims=True)  # >= 0 since max x = 0
    if b is None:
        lo = nu0
    else:
        safe_b = tf.where(b > 0, b, tf.ones_like(b))
        u = tf.where(b > 0, x - tf.math.log(safe_b), tf.constant(np.inf, dtype))
        lo = _finite_min(u)
        lo = tf.where(tf.math.is_finite(lo), lo, nu0)
    if a is None:
        hi = nu0
    else:
        rest = tf.maximum(1.0 - tf.reduce_sum(a, -1, keepdims=True), tiny)
        hi = nu0 - tf.math.log(rest)
    lo = tf.minimum(lo, hi)

    z, upper, lower = _pattern(x, a, b, nu0)
    s, r, no_free = _masses(z, a, b, upper, lower)
    # nu0 is the closed-form root of the all-free pattern.
    done = tf.logical_or(
        tf.logical_and(no_free, tf.abs(s) <= tol),
        tf.logical_and(
            tf.logical_not(tf.reduce_any(upper, -1, keepdims=True))
            if upper is not None
            else tf.ones_like(s, tf.bool),
            tf.logical_not(tf.reduce_any(lower, -1, keepdims=True))
            if lower is not None
            else tf.ones_like(s, tf.bool),
        ),
    )
    dummy = tf.zeros_like(x, tf.bool)
    masks = (upper if upper is not None else dummy, lower if lower is not None else dummy)

    def cond(i, nu, lo, hi, z, m_up, m_lo, s, r, done, converged):
        return tf.logical_not(tf.reduce_all(done))

    def body(i, nu, lo, hi, z, m_up, m_lo, s, r, done, converged):
        upper = m_up if b is not None else None
        lower = m_lo if a is not None else None
        phi_ge = (1.0 - s + r) >= 1.0
        active = tf.logical_not(done)
        lo = tf.where(tf.logical_and(active, phi_ge), tf.maximum(lo, nu), lo)
        hi = tf.where(tf.logical_and(active, tf.logical_not(phi_ge)), tf.minimum(hi, nu), hi)
        ok = tf.logical_and(r > 0, s > 0)
        safe_r = tf.where(ok, r, tf.ones_like(r))
        safe_s = tf.where(ok, s, tf.ones_like(s))
        cand = nu + tf.math.log(safe_r) - tf.math.log(safe_s)
        # Take the closed-form root of the current pattern only if it is strictly inside the
        # bracket (every bracket end is an already-visited point, so no pattern is revisited)
        # or equal to nu (converged); every 4th step is a plain bisection step, so the bracket
        # shrinks geometrically whatever the Newton steps do.
        inside = tf.logical_and(cand > lo, cand < hi)
        inside = tf.logical_and(inside, tf.not_equal(i % 4, 3))
        ok = tf.logical_and(ok, tf.logical_or(inside, tf.equal(cand, nu)))
        mid = 0.5 * lo + 0.5 * hi  # no overflow near the float range
        stalled = tf.logical_and(tf.logical_not(ok), tf.logical_or(mid <= lo, mid >= hi))
        new_nu = tf.where(done, nu, tf.where(ok, cand, mid))
        z2, up2, lo2 = _pattern(x, a, b, new_nu)
        s2, r2, no_free2 = _masses(z2, a, b, up2, lo2)
        same = ok
        if up2 is not None:
            same = tf.logical_and(same, _same(up2, upper))
        if lo2 is not None:
            same = tf.logical_and(same, _same(lo2, lower))
        conv = tf.logical_or(same, tf.logical_and(no_free2, tf.abs(s2) <= tol))
        conv = tf.logical_and(conv, tf.logical_not(done))
        return (
            i + 1,
            new_nu,
            lo,
            hi,
            z2,
            up2 if up2 is not None else m_up,
            lo2 if lo2 is not None else m_lo,
            s2,
            r2,
            tf.logical_or(done, tf.logical_or(conv, stalled)),
            tf.logical_or(converged, conv),
        )

    loop_vars = (tf.constant(0), nu0, lo, hi, z, masks[0], masks[1], s, r, done, done)
    out = tf.while_loop(cond, body, loop_vars, maximum_iterations=max_iter)
    _, _, lo, hi, z, m_up, m_lo, s, r, _, converged = out
    y, state = _assemble(
        z, a, b, m_up if b is not None else None, m_lo if a is not None else None, s, r
    )

    def fallback():
        # Rows that stalled (bracket of adjacent floats, e.g. logit gaps near the float range)
        # or hit the cap: U = upper on the whole bracket, L = lower on the whole bracket, the
        # rest (coordinates whose breakpoint lies inside the bracket) free, closed form.
        # Exact when no breakpoint lies inside the bracket.
        _, up_hi, _ = _pattern(x, a, b, hi)
        _, _, lo_lo = _pattern(x, a, None, lo)
        upper = up_hi
        lower = (
            lo_lo
            if (lo_lo is None or up_hi is None)
            else tf.logical_and(lo_lo, tf.logical_not(up_hi))
        )
        free = _free_mask(x, upper, lower)
        xf = tf.where(free, x, tf.constant(-np.inf, x.dtype))
        lse = tf.reduce_logsumexp(xf, -1, keepdims=True)
        lse = tf.where(tf.math.is_finite(lse), lse, tf.zeros_like(lse))
        zf = tf.where(free, tf.exp(xf - lse), tf.zeros_like(x))
        s_f, _, _ = _masses(zf, a, b, upper, lower)
        y_f, state_f = _assemble(zf, a, b, upper, lower, s_f, tf.ones_like(s_f))
        return tf.where(converged, y, y_f), tf.where(converged, state, state_f)

    return tf.cond(tf.reduce_all(converged), lambda: (y, state), fallback)


def _fast_masses(e, a, b, u, lk, nu):
    """One fused pass at ``nu`` ([N, 1]) in the logit domain (no exp): a pattern code
    ``#U + (K + 1) * #L`` (equal codes <=> equal counts), s = 1 - bound mass,
    E = sum_F exp(x) (all [N, 1])."""
    k = e.shape[-1]
    zero = tf.zeros_like(e)
    itype = tf.int32 if (k + 1) * (k + 1) < 2**31 else tf.int64
    bound = zero
    free = None
    code = tf.zeros_like(e, itype)
    if u is not None:
        up = u > nu
        code = tf.cast(up, itype)
        bound = tf.where(up, b, bound)
        free = tf.logical_not(up)
    if lk is not None:
        low = lk <= nu  # disjoint from `up` when a <= b (lk >= u); infeasible rows end as NaN
        code = tf.where(low, tf.constant(k + 1, itype), code)
        bound = tf.where(low, a, bound)
        free = tf.logical_not(low) if free is None else tf.logical_and(free, tf.logical_not(low))
    code = tf.reduce_sum(code, -1, keepdims=True)
    s = 1.0 - tf.reduce_sum(bound, -1, keepdims=True)
    big_e = tf.reduce_sum(e if free is None else tf.where(free, e, zero), -1, keepdims=True)
    return code, s, big_e


def _solve_newton(x, a, b):
    """Safeguarded Newton in the logit domain: ``exp(x)`` and the log-domain breakpoints
    ``u = x - log b`` (U iff ``u > nu``) and ``l = x - log a`` (L iff ``l <= nu``) are computed
    once; each step is one fused pass of comparisons and masked sums (counts of U/L, bound mass,
    free mass ``E = sum_F exp(x)``), the Newton step is ``nu = log E - log s`` and the pattern is
    unchanged iff both counts are (the U and L sets are nested in ``nu``; one code
    ``#U + (K + 1) #L`` carries both). Rows whose free mass
    is below ``K * tiny / eps`` (logit gaps near the float range), or that do not converge,
    make the whole batch rerun in :func:`_solve_newton_robust` (exp per step; rare)."""
    dtype = x.dtype
    k = x.shape[-1]
    info = np.finfo(dtype.as_numpy_dtype)
    tol = 10.0 * info.eps * k
    e_min = float(info.tiny) * k / float(info.eps)
    max_iter = 100 if dtype == tf.float32 else 200
    if a is None and b is None:
        e = tf.exp(x)
        y = e / tf.reduce_sum(e, -1, keepdims=True)
        return y, tf.zeros_like(x, tf.int8)

    minus_inf = tf.constant(-np.inf, dtype)
    dead = tf.equal(x, minus_inf)
    e = tf.exp(x)  # row max 0, so e <= 1 and sum e >= 1
    nu0 = tf.math.log(tf.reduce_sum(e, -1, keepdims=True))
    u = None if b is None else tf.where(dead, minus_inf, x - tf.math.log(b))
    lk = None if a is None else tf.where(dead, minus_inf, x - tf.math.log(a))
    if b is None:
        lo = nu0
    else:
        lo = _finite_min(u)
        lo = tf.where(tf.math.is_finite(lo), lo, nu0)
    if a is None:
        hi = nu0
    else:
        rest = tf.maximum(1.0 - tf.reduce_sum(a, -1, keepdims=True), float(info.tiny))
        hi = nu0 - tf.math.log(rest)
    lo = tf.minimum(lo, hi)

    def stats(nu):
        code, s, big_e = _fast_masses(e, a, b, u, lk, nu)
        no_free = tf.equal(code % (k + 1) + code // (k + 1), k)
        hard = tf.logical_and(tf.logical_not(no_free), big_e < e_min)
        return code, s, big_e, no_free, hard

    code, s, big_e, no_free, _ = stats(nu0)
    # nu0 is the closed-form root of the all-free pattern.
    conv = tf.logical_or(tf.logical_and(no_free, tf.abs(s) <= tol), tf.equal(code, 0))
    done = conv

    def cond(i, nu, lo, hi, code, s, big_e, done, conv):
        return tf.logical_not(tf.reduce_all(done))

    def body(i, nu, lo, hi, code, s, big_e, done, conv):
        pos_e = big_e > 0
        ok = tf.logical_and(pos_e, s > 0)
        ok_newton = tf.logical_and(ok, big_e >= e_min)
        cand = tf.math.log(tf.where(ok, big_e, tf.ones_like(big_e))) - tf.math.log(
            tf.where(ok, s, tf.ones_like(s))
        )
        # phi(nu) = 1 - s + E exp(-nu) >= 1  <=>  s <= 0, or E > 0 and cand >= nu
        phi_ge = tf.logical_or(s <= 0, tf.logical_and(ok, cand >= nu))
        active = tf.logical_not(done)
        lo = tf.where(tf.logical_and(active, phi_ge), tf.maximum(lo, nu), lo)
        hi = tf.where(tf.logical_and(active, tf.logical_not(phi_ge)), tf.minimum(hi, nu), hi)
        # As in _solve_newton_robust: the closed-form root of the current pattern if strictly
        # inside the bracket (or equal to nu), every 4th step a bisection step.
        inside = tf.logical_and(tf.logical_and(cand > lo, cand < hi), tf.not_equal(i % 4, 3))
        ok = tf.logical_and(ok_newton, tf.logical_or(inside, tf.equal(cand, nu)))
        mid = 0.5 * lo + 0.5 * hi
        stalled = tf.logical_and(tf.logical_not(ok), tf.logical_or(mid <= lo, mid >= hi))
        new_nu = tf.where(done, nu, tf.where(ok, cand, mid))
        code2, s2, e2, no_free2, hard2 = stats(new_nu)
        same = tf.logical_and(ok, tf.equal(code2, code))
        c = tf.logical_or(same, tf.logical_and(no_free2, tf.abs(s2) <= tol))
        c = tf.logical_and(c, active)
        # A row whose free mass stays below e_min (its Newton step would be inexact) bisects
        # for a few steps, then hands the batch to the robust solver.
        stop = tf.logical_or(tf.logical_or(c, stalled), tf.logical_and(hard2, i >= 6))
        return (
            i + 1,
            new_nu,
            lo,
            hi,
            code2,
            s2,
            e2,
            tf.logical_or(done, stop),
            tf.logical_or(conv, c),
        )

    loop_vars = (tf.constant(0), nu0, lo, hi, code, s, big_e, done, conv)
    out = tf.while_loop(cond, body, loop_vars, maximum_iterations=max_iter)
    nu, s, big_e, conv = out[1], out[5], out[6], out[8]

    def fast():
        y = e * tf.math.divide_no_nan(tf.maximum(s, 0.0), big_e)
        state = tf.zeros_like(x, tf.int8)
        if u is not None:
            up = u > nu
            y = tf.where(up, b, y)
            state = tf.where(up, tf.constant(UPPER, tf.int8), state)
        if lk is not None:
            low = lk <= nu
            y = tf.where(low, a, y)
            state = tf.where(low, tf.constant(LOWER, tf.int8), state)
        return y, state

    return tf.cond(tf.reduce_all(conv), fast, lambda: _solve_newton_robust(x, a, b))


def _log_keys(x, a, b):
    inf = tf.constant(np.inf, x.dtype)
    u = None if b is None else tf.where(b > 0, x - tf.math.log(tf.where(b > 0, b, 1.0)), inf)
    lk = None if a is None else tf.where(a > 0, x - tf.math.log(tf.where(a > 0, a, 1.0)), inf)
    return u, lk


def _finalize_at(x, a, b, u, lk, e_lo):
    """Spec Algorithm A steps 7-9: classify at the bracket's left end, closed form."""
    upper, lower = _clamp_sets(None if u is None else u > e_lo, None if lk is None else lk <= e_lo)
    free = _free_mask(x, upper, lower)
    xf = tf.where(free, x, tf.constant(-np.inf, x.dtype))
    lse = tf.reduce_logsumexp(xf, -1, keepdims=True)
    lse = tf.where(tf.math.is_finite(lse), lse, tf.zeros_like(lse))
    z = tf.where(free, tf.exp(xf - lse), tf.zeros_like(x))
    s, _, _ = _masses(z, a, b, upper, lower)
    return _assemble(z, a, b, upper, lower, s, tf.ones_like(s))


def _phi(x, a, b, nu):
    z = tf.exp(x - nu)
    if a is not None:
        z = tf.maximum(z, a)
    if b is not None:
        z = tf.minimum(z, b)
    return tf.reduce_sum(z, -1, keepdims=True)


def _solve_sort(x, a, b):
    u, lk = _log_keys(x, a, b)
    if u is None and lk is None:
        return _finalize_at(
            x, a, b, u, lk, tf.fill(tf.shape(x[:, :1]), tf.constant(-np.inf, x.dtype))
        )
    keys = [t for t in (u, lk) if t is not None]
    e = tf.sort(tf.concat(keys, -1), axis=-1)
    n = e.shape[-1]
    sum_a = tf.reduce_sum(a, -1, keepdims=True) if a is not None else tf.zeros_like(x[:, :1])
    lo = tf.zeros_like(x[:, :1], tf.int32)
    hi = tf.fill(tf.shape(lo), n)
    for _ in range(int(np.ceil(np.log2(n + 1)))):
        mid = (lo + hi + 1) // 2
        ej = tf.gather(e, tf.clip_by_value(mid - 1, 0, n - 1), batch_dims=1)
        fin = tf.math.is_finite(ej)
        p = tf.where(fin, _phi(x, a, b, tf.where(fin, ej, tf.zeros_like(ej))) >= 1.0, sum_a >= 1.0)
        active = lo < hi
        lo = tf.where(tf.logical_and(active, p), mid, lo)
        hi = tf.where(tf.logical_and(active, tf.logical_not(p)), mid - 1, hi)
    e_lo = tf.where(
        lo > 0, tf.gather(e, tf.maximum(lo - 1, 0), batch_dims=1), tf.constant(-np.inf, x.dtype)
    )
    return _finalize_at(x, a, b, u, lk, e_lo)


def _solve_bisect(x, a, b):
    dtype = x.dtype
    u, lk = _log_keys(x, a, b)
    k = x.shape[-1]
    tiny = np.finfo(dtype.as_numpy_dtype).tiny
    lo = _finite_min(u) if u is not None else _finite_min(x)
    cands = [tf.fill(tf.shape(lo), tf.constant(np.log(k), dtype))]
    if lk is not None:
        cands += [
            _finite_max(lk),
            np.log(k) - tf.math.log(tf.maximum(1.0 - tf.reduce_sum(a, -1, keepdims=True), tiny)),
        ]
    if u is not None:
        cands.append(_finite_max(u))
    hi = cands[0]
    for c in cands[1:]:
        hi = tf.maximum(hi, tf.where(tf.math.is_finite(c), c, hi))
    lo = tf.where(tf.math.is_finite(lo), lo, hi)

    def step(lo, hi):
        mid = 0.5 * lo + 0.5 * hi  # no overflow near the float range
        ge = _phi(x, a, b, mid) >= 1.0
        return tf.where(ge, mid, lo), tf.where(ge, hi, mid)

    steps = 40 if dtype == tf.float32 else 64
    lo, hi = tf.while_loop(lambda lo, hi: True, step, (lo, hi), maximum_iterations=steps)
    return _finalize_at(x, a, b, u, lk, lo)


_SOLVERS = {"newton": _solve_newton, "sort": _solve_sort, "bisect": _solve_bisect}


# --------------------------------------------------------------------------------------------
# Validation (values known) and shape plumbing.
# --------------------------------------------------------------------------------------------


def _broadcasts_to(shape, target) -> bool:
    """Whether ``shape`` broadcasts to ``target`` (statically; unknown sizes pass)."""
    if shape.rank is None or target.rank is None:
        return True
    if shape.rank > target.rank:
        return False
    return all(
        d is None or t is None or d in (1, t) for d, t in zip(reversed(shape), reversed(target))
    )


def _static_known_shape(shape):
    return [1 if d is None else d for d in shape]


def _validate_static(x, lower, upper, temperature, axis, k):
    """Raise ValueError for rule violations whose values are known; no-op for unknown values."""
    xv = static_value(x)
    if xv is not None:
        xv = np.asarray(xv, np.float64)
        if np.isnan(xv).any():
            raise ValueError("`logits` must not contain NaN.")
        if np.isposinf(xv).any():
            raise ValueError("`logits` must not contain +inf (-inf masks a class).")
        if xv.size and np.isneginf(xv).all(axis=axis).any():
            raise ValueError(
                "`logits`: every class of a row is -inf (no class left to put probability on)."
            )
    tv = static_value(temperature)
    if tv is not None:
        tv = np.asarray(tv, np.float64)
        if not (np.all(np.isfinite(tv)) and np.all(tv > 0)):
            raise ValueError("`temperature` must be finite and > 0.")
    rank = x.shape.rank
    base = _static_known_shape(x.shape)
    vals = {}
    for name, t in (("lower", lower), ("upper", upper)):
        if t is None:
            continue
        v = static_value(t)
        if v is None:
            continue
        v = np.asarray(v, np.float64)
        if np.isnan(v).any():
            raise ValueError(f"`{name}` must not contain NaN.")
        shape = list(np.broadcast_shapes(tuple(base), v.shape))
        shape[axis % rank] = k
        vals[name] = np.broadcast_to(v, shape)
    eps = np.finfo(np.float32 if x.dtype != tf.float64 else np.float64).eps
    tol = 10.0 * eps * k
    if "lower" in vals:
        lo = vals["lower"]
        if (lo < -_RANGE_TOL).any():
            raise ValueError(
                "Infeasible bounds: every `lower` must be >= 0 (rule 0 <= lower <= upper <= 1)."
            )
        if (lo.sum(axis % rank) > 1 + tol).any():
            raise ValueError(
                "Infeasible bounds: `lower` must sum to <= 1 along the class axis "
                "(rule sum(lower) <= 1)."
            )
    if "upper" in vals:
        up = vals["upper"]
        if (up > 1 + _RANGE_TOL).any():
            raise ValueError(
                "Infeasible bounds: every `upper` must be <= 1 (rule 0 <= lower <= upper <= 1)."
            )
        if (up.sum(axis % rank) < 1 - tol).any():
            raise ValueError(
                "Infeasible bounds: `upper` must sum to >= 1 along the class axis "
                "(rule sum(upper) >= 1)."
            )
    if "lower" in vals and "upper" in vals:
        lo, up = np.broadcast_arrays(vals["lower"], vals["upper"])
        if (lo > up).any():
            raise ValueError(
                "Infeasible bounds: `lower` must be <= `upper` element-wise (rule lower <= upper)."
            )


def _symbolic(t):
    return t is not None and static_value(t) is None


def _graph_checks(x, a, b, tau, axis, k):
    """Graph assertions for the inputs whose values are unknown at trace time (the eager and
    constant cases were checked by :func:`_validate_static`). Returns ``x`` with a control
    dependency on them. Under XLA they vanish and :func:`_bad_rows` makes the rows NaN."""
    if not any(_symbolic(t) for t in (x, a, b, tau)):
        return x
    checks = []

    def check(cond, message):
        checks.append(tf.debugging.Assert(cond, [message]))

    if _symbolic(x):
        check(tf.logical_not(tf.reduce_any(tf.math.is_nan(x))), "`logits` must not contain NaN.")
        check(
            tf.logical_not(tf.reduce_any(tf.equal(x, np.inf))),
            "`logits` must not contain +inf (-inf masks a class).",
        )
        check(
            tf.reduce_all(tf.reduce_any(x > -np.inf, axis)),
            "`logits`: every class of a row is -inf (no class left to put probability on).",
        )
    if _symbolic(tau):
        check(
            tf.reduce_all(tf.logical_and(tau > 0, tf.math.is_finite(tau))),
            "`temperature` must be finite and > 0.",
        )
    tol = 10.0 * np.finfo(x.dtype.as_numpy_dtype).eps * k
    shape = tf.shape(x)
    ac = bc = None
    if a is not None:
        ac = tf.maximum(tf.broadcast_to(a, shape), 0.0)
        if _symbolic(a):
            check(tf.logical_not(tf.reduce_any(tf.math.is_nan(a))), "`lower` must not contain NaN.")
            check(
                tf.reduce_all(a >= -_RANGE_TOL),
                "Infeasible bounds: every `lower` must be >= 0 (rule 0 <= lower <= upper <= 1).",
            )
            check(
                tf.reduce_all(tf.reduce_sum(ac, axis) <= 1.0 + tol),
                "Infeasible bounds: `lower` must sum to <= 1 along the class axis "
                "(rule sum(lower) <= 1).",
            )
    if b is not None:
        bc = tf.minimum(tf.broadcast_to(b, shape), 1.0)
        if _symbolic(b):
            check(tf.logical_not(tf.reduce_any(tf.math.is_nan(b))), "`upper` must not contain NaN.")
            check(
                tf.reduce_all(b <= 1.0 + _RANGE_TOL),
                "Infeasible bounds: every `upper` must be <= 1 (rule 0 <= lower <= upper <= 1).",
            )
            check(
                tf.reduce_all(tf.reduce_sum(bc, axis) >= 1.0 - tol),
                "Infeasible bounds: `upper` must sum to >= 1 along the class axis "
                "(rule sum(upper) >= 1).",
            )
    if ac is not None and bc is not None and (_symbolic(a) or _symbolic(b)):
        check(
            tf.reduce_all(ac <= bc),
            "Infeasible bounds: `lower` must be <= `upper` element-wise (rule lower <= upper).",
        )
    if not checks:
        return x
    with tf.control_dependencies(checks):
        return tf.identity(x)


def _reduce_to(g, target):
    """Sum ``g`` (the broadcast shape) back to ``target``'s static shape."""
    gr, tr = g.shape.rank, target.shape.rank
    lead = gr - tr
    axes = list(range(lead)) + [lead + i for i, d in enumerate(target.shape) if d == 1]
    if axes:
        g = tf.reduce_sum(g, axes)
    return tf.reshape(g, tf.shape(target))


def _bad_rows(xs, m_raw, t2, a2, b2, ac, bc):
    """[N, 1] mask of the rows the kernel cannot solve; they come back NaN (the XLA half of the
    fail-loud contract: assertions vanish there). Folded into the forward pass: two reductions
    over ``[N, K]`` besides the feasibility sums.

    A row is bad if its scaled logits hold NaN or +inf or are all -inf, its temperature is not
    finite and > 0, a bound holds NaN or lies more than ``_RANGE_TOL`` outside [0, 1], or the
    bounds are infeasible (``sum a > 1``, ``sum b < 1`` or some ``a_k > b_k``, tolerance
    ``10 * eps * K``, spec section 2.6).
    """
    k = xs.shape[-1]
    tol = 10.0 * np.finfo(xs.dtype.as_numpy_dtype).eps * k
    # m_raw: +inf (a +inf logit, or tau <= 0 flipping a -inf one), -inf (every class masked),
    # NaN; after the shift a NaN anywhere makes the row sum NaN (the rest is <= 0 or -inf).
    bad = tf.logical_not(tf.math.is_finite(m_raw))
    bad = tf.logical_or(bad, tf.math.is_nan(tf.reduce_sum(xs, -1, keepdims=True)))
    bad = tf.logical_or(bad, tf.logical_not(tf.logical_and(t2 > 0, tf.math.is_finite(t2))))
    elementwise = None
    if a2 is not None:
        sum_a = tf.reduce_sum(ac, -1, keepdims=True)
        bad = tf.logical_or(bad, tf.logical_not(sum_a <= 1.0 + tol))  # also NaN
        elementwise = a2 < -_RANGE_TOL
    if b2 is not None:
        sum_b = tf.reduce_sum(bc, -1, keepdims=True)
        bad = tf.logical_or(bad, tf.logical_not(sum_b >= 1.0 - tol))  # also NaN
        out = b2 > 1.0 + _RANGE_TOL
        elementwise = out if elementwise is None else tf.logical_or(elementwise, out)
    if a2 is not None and b2 is not None:
        elementwise = tf.logical_or(elementwise, ac > bc)
    if elementwise is not None:
        bad = tf.logical_or(bad, tf.reduce_any(elementwise, -1, keepdims=True))
    return bad


def _repair(xs, ac, bc, y, state):
    """Rows of the sort/bisect result that are not a solution (after the final clip they would
    not sum to 1) are re-solved by the robust Newton solver.

    This happens where a coordinate's two breakpoints ``x_k - log b_k`` and ``x_k - log a_k``
    round to the same float (logit gaps near 1e8 in float32): the sort/bisect bracket then
    cannot tell ``F`` from ``L``/``U`` and the closed form lands outside the box. The robust
    solver classifies from ``exp(x - nu)`` and falls back to the bracket test (see
    :func:`_solve_newton_robust`). One extra sum per row; the fallback runs only when needed.
    """
    k = xs.shape[-1]
    eps = np.finfo(xs.dtype.as_numpy_dtype).eps
    tol = 16.0 * eps * np.sqrt(k) + 4.0 * eps
    yc = y
    if ac is not None:
        yc = tf.maximum(yc, ac)
    if bc is not None:
        yc = tf.minimum(yc, bc)
    off = tf.abs(tf.reduce_sum(yc, -1, keepdims=True) - 1.0) > tol
    feasible = tf.ones_like(off)
    if ac is not None:
        feasible = tf.reduce_sum(ac, -1, keepdims=True) <= 1.0
    if bc is not None:
        feasible = tf.logical_and(feasible, tf.reduce_sum(bc, -1, keepdims=True) >= 1.0)
    off = tf.logical_and(off, feasible)

    def fix():
        y2, state2 = _solve_newton_robust(xs, ac, bc)
        return tf.where(off, y2, y), tf.where(off, state2, state)

    return tf.cond(tf.reduce_any(off), fix, lambda: (y, state))


def _bcsoftmax_impl(x, a, b, tau, axis, method, clip):
    """Differentiable core on compute-dtype tensors in the caller's layout (a, b may be None)."""
    has_a, has_b = a is not None, b is not None
    solver = _SOLVERS[method]
    rank = x.shape.rank
    ax = axis % rank
    k = x.shape[ax]

    def forward(x, a, b, tau):
        shape = tf.shape(x)
        tau_shape = tf.concat([shape[:ax], [1], shape[ax + 1 :]], 0)  # XLA folds this
        xt, undo = move_axis_last(x, ax)
        tt, _ = move_axis_last(tf.broadcast_to(tau, tau_shape), ax)
        x2 = tf.reshape(xt, [-1, k])
        t2 = tf.reshape(tt, [-1, 1])
        xs = x2 / t2
        m_raw = tf.reduce_max(xs, -1, keepdims=True)
        m = tf.where(tf.math.is_finite(m_raw), m_raw, tf.zeros_like(m_raw))
        xs = xs - m

        def flat(t):
            if t is None:
                return None
            tb, _ = move_axis_last(tf.broadcast_to(t, shape), ax)
            return tf.reshape(tb, [-1, k])

        a2, b2 = flat(a), flat(b)
        ac = None if a2 is None else tf.maximum(a2, 0.0)
        bc = None if b2 is None else tf.minimum(b2, 1.0)
        y, state = solver(xs, ac, bc)
        if method != "newton":
            y, state = _repair(xs, ac, bc, y, state)
        if clip:
            if ac is not None:
                y = tf.maximum(y, ac)
            if bc is not None:
                y = tf.minimum(y, bc)
        y = tf.where(_bad_rows(xs, m_raw, t2, a2, b2, ac, bc), tf.constant(np.nan, y.dtype), y)
        out = undo(tf.reshape(y, tf.shape(xt)))
        return out, (y, state, xs, t2, a2, b2, xt, undo)

    def make_grad(saved, inputs):
        y, state, xs, t2, a2, b2, xt, undo = saved
        _, a, b, tau = inputs

        def unflat(g):
            return undo(tf.reshape(g, tf.shape(xt)))

        def grad(v):
            xt_v, _ = move_axis_last(tf.cast(v, y.dtype), ax)
            v2 = tf.reshape(xt_v, [-1, k])
            zero = tf.zeros_like(y)
            free = tf.equal(state, FREE)
            at_lower = tf.equal(state, LOWER)
            at_upper = tf.equal(state, UPPER)
            q = tf.where(free, y, zero)
            ssum = tf.reduce_sum(q, -1, keepdims=True)
            vbar = tf.math.divide_no_nan(tf.reduce_sum(q * v2, -1, keepdims=True), ssum)
            # Pinned rows (every coordinate at a bound up to rounding, e.g. sum(lower) = 1):
            # the computed free mass lands on either side of 0 depending on the summation
            # order (eager vs XLA), and the one-sided derivatives differ by O(|v|). A row whose
            # free coordinates all lie within _PIN_TOL * eps * K of a bound counts them at that
            # bound, so every mode uses the derivative along the face sum(bounds) = 1 (spec
            # section 3, S = 0): dL/da = g * v, dL/db = h * v, dL/dx = 0. The test is one more
            # reduction in the same pass as the sums above.
            pin_tol = _PIN_TOL * np.finfo(y.dtype.as_numpy_dtype).eps * k
            dist_a = None if a2 is None else y - tf.maximum(a2, 0.0)
            dist_b = None if b2 is None else tf.minimum(b2, 1.0) - y
            if dist_a is not None or dist_b is not None:
                dist = (
                    dist_b
                    if dist_a is None
                    else dist_a
                    if dist_b is None
                    else tf.minimum(dist_a, dist_b)
                )
                slack = tf.reduce_max(tf.where(free, dist, zero), -1, keepdims=True)
                pinned = tf.logical_and(slack <= pin_tol, tf.logical_not(tf.math.is_nan(ssum)))
                pf = tf.logical_and(pinned, free)
                if dist_b is None:
                    at_lower = tf.logical_or(at_lower, pf)
                else:
                    to_upper = pf if dist_a is None else tf.logical_and(pf, dist_b <= pin_tol)
                    at_upper = tf.logical_or(at_upper, to_upper)
                    if dist_a is not None:
                        at_lower = tf.logical_or(
                            at_lower, tf.logical_and(pf, tf.logical_not(to_upper))
                        )
                q = tf.where(pf, zero, q)
                vbar = tf.where(pinned, tf.zeros_like(vbar), vbar)
            # rows the forward pass made NaN (invalid input) get NaN gradients
            vbar = tf.where(tf.math.is_nan(y[:, :1]), tf.constant(np.nan, y.dtype), vbar)
            w = v2 - vbar
            qw = q * w
            grads = [unflat(qw / t2)]
            if a is not None:
                ga = tf.where(tf.logical_and(at_lower, a2 >= 0), w, zero)
                grads.append(_reduce_to(unflat(ga), a))
            if b is not None:
                gb = tf.where(tf.logical_and(at_upper, b2 <= 1), w, zero)
                grads.append(_reduce_to(unflat(gb), b))
            xs_safe = tf.where(free, xs, zero)
            gt = -tf.reduce_sum(xs_safe * qw, -1, keepdims=True) / t2  # [N, 1]
            gt_full = undo(tf.reshape(gt, tf.concat([tf.shape(xt)[:-1], [1]], 0)))
            grads.append(_reduce_to(gt_full, tau))
            return grads

        return grad

    if has_a and has_b:

        @tf.custom_gradient
        def f(x, a, b, tau):
            out, saved = forward(x, a, b, tau)
            return out, make_grad(saved, (x, a, b, tau))

        return f(x, a, b, tau)
    if has_a:

        @tf.custom_gradient
        def f(x, a, tau):
            out, saved = forward(x, a, None, tau)
            return out, make_grad(saved, (x, a, None, tau))

        return f(x, a, tau)
    if has_b:

        @tf.custom_gradient
        def f(x, b, tau):
            out, saved = forward(x, None, b, tau)
            return out, make_grad(saved, (x, None, b, tau))

        return f(x, b, tau)

    @tf.custom_gradient
    def f(x, tau):
        out, saved = forward(x, None, None, tau)
        return out, make_grad(saved, (x, None, None, tau))

    return f(x, tau)


def bcsoftmax(
    logits,
    lower=None,
    upper=None,
    temperature=1.0,
    axis: int = -1,
    *,
    method: str = "newton",
    clip: bool = True,
    validate: bool = True,
    name: str | None = None,
) -> tf.Tensor:
    """Box-constrained softmax: the exact maximiser of ``<x,y> - tau sum y log y`` on the simplex
    within ``lower <= y <= upper``.

    ``y = clip(exp(x/tau - nu), lower, upper)`` with the one ``nu`` per row that makes ``y`` sum
    to 1. With ``lower=None, upper=None`` this is ``softmax(x / tau)``; upper-only is the paper's
    UBSoftmax, lower-only its LBSoftmax.

    Args:
      logits: float tensor of rank >= 1 with a static class dimension. float16/bfloat16 are
        computed in float32 and the result is cast back. ``-inf`` masks class k
        (``y_k = max(lower_k, 0)``); NaN / +inf / all -inf rows are invalid (see below).
      lower: lower bounds ``a`` broadcastable to ``logits`` (scalar, per-class vector,
        ``[..., 1]`` per-example uniform bound, or full tensor), or None (``a = 0``).
      upper: upper bounds ``b``, same broadcasting, or None (``b = 1``). ``lower = upper = 0``
        masks a class.
      temperature: ``tau > 0``: scalar or broadcastable to ``logits`` with size 1 on ``axis``.
      axis: the class axis.
      method: ``"newton"`` (default; safeguarded Newton on the pieces of ``phi``), ``"sort"``
        (spec Algorithm A) or ``"bisect"`` (spec Algorithm B). All finish with the closed-form
        solve on the identified clamp pattern.
      clip: clip the result into ``[lower, upper]`` so the box holds exactly (the sum is then 1
        up to about ``K * eps``).
      validate: check the feasibility rules ``0 <= lower <= upper <= 1``,
        ``sum(lower) <= 1 <= sum(upper)``, ``temperature > 0`` and the logits (no NaN, no
        +inf, not all -inf in a row): ``ValueError`` when the values are known, a graph
        assertion otherwise. Also off when ``losszoo.set_validation(False)``.
      name: optional name scope.

    Under XLA (``jit_compile=True``) the assertions vanish: rows with invalid logits,
    temperature or bounds come back entirely NaN (also with validation off); gradients of those
    rows are NaN too. Logit offsets and scales of 1e8 give the same result as the float64
    solution of the rounded inputs, for every method.

    Returns:
      Probabilities with the shape and dtype of ``logits``.

    Example:
      >>> bcsoftmax([[-1.5, 1.0, -0.5]], upper=[1.0, 0.6, 0.5]).numpy().round(4)
      array([[0.1076, 0.6   , 0.2924]], dtype=float32)
    """
    check_choice(method, "method", METHODS)
    if not isinstance(clip, bool):
        raise TypeError(f"`clip` must be a bool, got {clip!r}.")
    if not isinstance(validate, bool):
        raise TypeError(f"`validate` must be a bool, got {validate!r}.")
    validate = validate and validation_enabled()
    with tf.name_scope(name or "bcsoftmax"):
        x, dtype = to_compute_dtype(logits, "logits")
        check_static_rank(x, 1, "logits")
        rank = x.shape.rank
        if not -rank <= axis < rank:
            raise ValueError(f"`axis`={axis} is out of range for `logits` of rank {rank}.")
        k = x.shape[axis]
        if k is None:
            raise ValueError("`logits` must have a static size along the class axis.")
        if k == 0:
            raise ValueError("`logits` must have at least one class.")

        def conv(t, name):
            if t is None:
                return None
            if isinstance(t, (int, float, list, tuple)):
                t = np.asarray(t, dtype=x.dtype.as_numpy_dtype)  # no float32 detour for 0.1
            t = tf.convert_to_tensor(t) if not isinstance(t, tf.Tensor) else t
            if not (t.dtype.is_floating or t.dtype.is_integer):
                raise TypeError(f"`{name}` must be a real tensor, got {t.dtype.name}.")
            t = tf.cast(t, x.dtype)
            if t.shape.rank is not None and t.shape.rank > rank:
                raise ValueError(
                    f"`{name}` (rank {t.shape.rank}) must not have a higher rank than "
                    f"`logits` ({rank})."
                )
            if not _broadcasts_to(t.shape, x.shape):
                raise ValueError(
                    f"`{name}` with shape {t.shape} does not broadcast to `logits` {x.shape} "
                    "(each axis must have the logits' size or 1)."
                )
            return t

        a = conv(lower, "lower")
        b = conv(upper, "upper")
        tau = conv(temperature, "temperature")
        if tau.shape.rank is not None and tau.shape.rank > 0:
            ax = axis % rank
            pos = ax - (rank - tau.shape.rank)
            if pos >= 0 and tau.shape[pos] not in (1, None):
                raise ValueError("`temperature` must have size 1 along the class axis.")
        if validate:
            _validate_static(x, a, b, tau, axis, k)
            x = _graph_checks(x, a, b, tau, axis, k)
        y = _bcsoftmax_impl(x, a, b, tau, axis, method, clip)
        return tf.cast(y, dtype)


def bcsoftmax_with_state(logits, lower=None, upper=None, temperature=1.0, *, method="newton"):
    """Forward only, last axis, compute dtype: returns ``(y, state)`` with state codes
    0 free, 1 at lower, 2 at upper (for tests and diagnostics; no gradient)."""
    x, _ = to_compute_dtype(logits, "logits")
    x2 = tf.reshape(x, [-1, x.shape[-1]])
    tau = tf.cast(temperature, x.dtype)
    tau = tf.reshape(tf.broadcast_to(tau, tf.concat([tf.shape(x)[:-1], [1]], 0)), [-1, 1])
    xs = x2 / tau
    xs = xs - tf.reduce_max(xs, -1, keepdims=True)

    def flat(t):
        if t is None:
            return None
        return tf.reshape(tf.broadcast_to(tf.cast(t, x.dtype), tf.shape(x)), [-1, x.shape[-1]])

    a, b = flat(lower), flat(upper)
    y, state = _SOLVERS[method](
        xs, None if a is None else tf.maximum(a, 0.0), None if b is None else tf.minimum(b, 1.0)
    )
    return tf.reshape(y, tf.shape(x)), tf.reshape(state, tf.shape(x))
