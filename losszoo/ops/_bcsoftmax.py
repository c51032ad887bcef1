"""Box-constrained softmax (BCSoftmax; Atarashi et al., 2025), on every Keras backend.

For logits ``x`` in R^K, temperature ``tau > 0`` and bounds ``a <= y <= b`` (paper eq. 7)::

    BCSoftmax_tau(x; a, b) = argmax_{y in simplex, a <= y <= b}  <x, y> - tau * sum_k y_k log y_k
                           = clip(exp(x / tau - nu), a, b)

with the one scalar ``nu`` per row that solves ``sum_k clip(exp(x_k/tau - nu), a_k, b_k) = 1``;
feasible iff ``a <= b`` and ``sum(a) <= 1 <= sum(b)``. On the coordinates at neither bound,
``y_F = s * softmax(x_F / tau)`` with ``s`` the mass the bounds leave (paper Thm. 3).
``method="newton"`` (default) takes the classes that can sit at their upper bound from one
``top_k`` and solves for ``nu`` with monotone Newton steps on a model that keeps those classes
exact, so its work does not grow at low temperatures (1-4 passes over the row); rows it cannot
finish go to a safeguarded Newton search, which also solves every row unless the temperature
is a number below 1 (few steps at T >= 1, and no ``top_k``). ``"sort"`` and ``"bisect"``
are the spec's Algorithms A and B; all end with the closed form, so they are exact. Gradients are
hand-derived (paper eqs. 23-25, erratum E5 fixed), O(K) per row. The solver, the gradient
(pinned rows included) and the numerics: ``docs/design/bcsoftmax.md``. Spec:
``shared/specs/bcsoftmax.md``.

A ``-inf`` logit masks its class (``y_k = max(lower_k, 0)``); ``a_k = b_k = 0`` masks it too.
Bounds outside ``[0, 1]`` by at most 1e-5 are clamped; half precision is computed in float32.

Fail-loud contract (README, "Bad input"), rules ``contract.LOGITS`` (``logits``),
:data:`TEMPERATURE` (``temperature``) and :data:`PROBABILITY_BOUNDS` (``lower`` and ``upper``):
``ValueError`` naming the argument when the values are known, a graph assertion in a TensorFlow
graph; skipped with ``losszoo.set_validation(False)``. Under XLA / ``jax.jit``, and with
validation off, the affected rows come back NaN.
"""

from __future__ import annotations

import functools

import numpy as np
from keras import ops

from losszoo._backend import (
    custom_gradient,
    divide_no_nan,
    jit_on_jax,
    maximum,
    minimum,
    reduce_max,
    reduce_min,
    take_along_axis,
)
from losszoo.contract import (
    LOGITS,
    PROBABILITY_BOUNDS,
    Rule,
    check_bool,
    check_choice,
    check_number,
    check_real,
    check_static_rank,
    dtype_name,
    move_axis_last,
    nan_where,
    rules_enforced,
    static_rank,
    to_compute_dtype,
)

FREE, LOWER, UPPER = 0, 1, 2


def _temperature_mask(xp, t):
    tiny = np.finfo(dtype_name(t)).tiny
    return xp.logical_not(xp.logical_and(xp.isfinite(t), t >= tiny))


TEMPERATURE = Rule(
    "must be finite and at least the smallest normal number of the logits' dtype "
    "(1.2e-38 in float32): TensorFlow and XLA read a subnormal temperature as 0",
    _temperature_mask,
)
"""The temperature rule (entry-wise): :data:`losszoo.contract.POSITIVE` without the subnormal
numbers, which TensorFlow and XLA flush to 0 on the CPU (a division by 0 follows)."""
METHODS = ("newton", "sort", "bisect")
# Backward pass: in a row where every free coordinate lies within this many eps * K of one of
# its bounds, those coordinates count as at the bound (docs/design/bcsoftmax.md, "Gradients").
_PIN_TOL = 4.0


def _info(x):
    return np.finfo(dtype_name(x))


# --------------------------------------------------------------------------------------------
# Forward solvers on [N, K] rows. x is already divided by tau and shifted (row max 0).
# a, b are [N, K] tensors or None (no bound on that side). All return (y, state).
# --------------------------------------------------------------------------------------------


def _pattern(x, a, b, nu):
    """Classification at ``nu`` ([N, 1]): returns z = exp(x - nu), U, L masks (or None)."""
    z = ops.exp(x - nu)
    upper, lower = _clamp_sets(None if b is None else z > b, None if a is None else z <= a)
    return z, upper, lower


def _clamp_sets(above_upper, below_lower):
    """Upper/lower clamp masks from the raw bound tests (None: no such bound).

    A coordinate that passes both tests (only possible where lower == upper) is counted
    at the upper bound, so no coordinate is clamped twice.
    """
    if above_upper is not None and below_lower is not None:
        below_lower = ops.logical_and(below_lower, ops.logical_not(above_upper))
    return above_upper, below_lower


def _free_mask(x, upper, lower):
    if upper is None and lower is None:
        return ops.ones_like(x, dtype="bool")
    if upper is None:
        return ops.logical_not(lower)
    if lower is None:
        return ops.logical_not(upper)
    return ops.logical_not(ops.logical_or(upper, lower))


def _masses(z, a, b, upper, lower):
    """s = 1 - bound mass, R = free mass sum(z_F), no_free flag; all [N, 1]."""
    zero = ops.zeros_like(z)
    bound = ops.zeros_like(z[:, :1])
    if lower is not None:
        bound += ops.sum(ops.where(lower, a, zero), -1, keepdims=True)
    if upper is not None:
        bound += ops.sum(ops.where(upper, b, zero), -1, keepdims=True)
    free = _free_mask(z, upper, lower)
    r = ops.sum(ops.where(free, z, zero), -1, keepdims=True)
    no_free = ops.logical_not(ops.any(free, -1, keepdims=True))
    return 1.0 - bound, r, no_free


def _same(m1, m2):
    return ops.all(ops.equal(m1, m2), -1, keepdims=True)


def _assemble(z, a, b, upper, lower, s, r):
    """y from a pattern: bounds on L/U, free coordinates normalised to the mass s."""
    scale = divide_no_nan(maximum(s, 0.0), r)
    y = z * scale
    state = ops.zeros_like(z, dtype="int8")
    if upper is not None:
        y = ops.where(upper, b, y)
        state = ops.where(upper, ops.cast(UPPER, "int8"), state)
    if lower is not None:
        y = ops.where(lower, a, y)
        state = ops.where(lower, ops.cast(LOWER, "int8"), state)
    return y, state


def _finite_min(t, axis=-1):
    return reduce_min(ops.where(ops.isfinite(t), t, np.inf), axis, keepdims=True)


def _finite_max(t, axis=-1):
    return reduce_max(ops.where(ops.isfinite(t), t, -np.inf), axis, keepdims=True)


def _closed_form(x, a, b, upper, lower):
    """The closed form of a given pattern: y_F = s softmax(x_F), bounds elsewhere."""
    free = _free_mask(x, upper, lower)
    xf = ops.where(free, x, -np.inf)
    lse = ops.logsumexp(xf, -1, keepdims=True)
    lse = ops.where(ops.isfinite(lse), lse, ops.zeros_like(lse))
    z = ops.where(free, ops.exp(xf - lse), ops.zeros_like(x))
    s, _, _ = _masses(z, a, b, upper, lower)
    return _assemble(z, a, b, upper, lower, s, ops.ones_like(s))


def _bracket(x, a, b, nu0):
    """``(lo, hi)`` with ``phi(lo) >= 1 >= phi(hi)`` around the root (docs/design/bcsoftmax.md);
    ``nu0`` is the softmax normaliser ``logsumexp(x)``."""
    lo = hi = nu0
    if b is not None:
        lo = _finite_min(x - ops.log(b))
        lo = ops.where(ops.isfinite(lo), lo, nu0)
    if a is not None:
        rest = maximum(1.0 - ops.sum(a, -1, keepdims=True), float(_info(x).tiny))
        hi = nu0 - ops.log(rest)
    return minimum(lo, hi), hi


def _safeguarded_step(i, nu, lo, hi, active, phi_ge, ok, cand):
    """Step ``i`` of the safeguarded Newton iteration for the ``active`` rows at ``nu``.

    The bracket ``[lo, hi]`` moves its end to ``nu`` on the side ``phi_ge`` (``phi(nu) >= 1``)
    gives. The next ``nu`` is the Newton candidate ``cand`` (the closed-form root of the
    current pattern; usable where ``ok``) if it is strictly inside the bracket (every bracket
    end is a visited point, so no pattern comes back) or equal to ``nu`` (converged), else the
    bracket midpoint. Every 5th step is a bisection step, so the bracket shrinks geometrically
    whatever the Newton steps do; the first one comes after 4 steps, by which nearly every row
    has landed (a bisection at the 4th step threw rows off a landing Newton step: one row in
    128 then took 7 steps at K = 1024, and the batch waits for its slowest row).
    Returns ``(lo, hi, new_nu, took, stalled)``: where the candidate was taken, and where the
    bracket is two adjacent floats.
    """
    lo = ops.where(ops.logical_and(active, phi_ge), maximum(lo, nu), lo)
    hi = ops.where(ops.logical_and(active, ops.logical_not(phi_ge)), minimum(hi, nu), hi)
    inside = ops.logical_and(ops.logical_and(cand > lo, cand < hi), ops.not_equal(i % 5, 4))
    took = ops.logical_and(ok, ops.logical_or(inside, ops.equal(cand, nu)))
    mid = 0.5 * lo + 0.5 * hi  # no overflow near the float range
    stalled = ops.logical_and(ops.logical_not(took), ops.logical_or(mid <= lo, mid >= hi))
    return lo, hi, ops.where(active, ops.where(took, cand, mid), nu), took, stalled


def _solve_newton_robust(x, a, b):
    """Safeguarded Newton classifying from ``exp(x - nu)`` at every step
    (docs/design/bcsoftmax.md); rows that stall or hit the cap use the bracket fallback."""
    info = _info(x)
    k = x.shape[-1]
    tol = 10.0 * info.eps * k
    max_iter = 100 if dtype_name(x) == "float32" else 200

    nu0 = ops.logsumexp(x, -1, keepdims=True)  # >= 0 since max x = 0
    lo, hi = _bracket(x, a, b, nu0)
    z, upper, lower = _pattern(x, a, b, nu0)
    s, r, no_free = _masses(z, a, b, upper, lower)
    # nu0 is the closed-form root of the all-free pattern.
    none_clamped = ops.all(_free_mask(z, upper, lower), -1, keepdims=True)
    done = ops.logical_or(ops.logical_and(no_free, ops.abs(s) <= tol), none_clamped)
    dummy = ops.zeros_like(x, dtype="bool")
    masks = (upper if upper is not None else dummy, lower if lower is not None else dummy)

    def cond(i, nu, lo, hi, z, m_up, m_lo, s, r, done, converged):
        return ops.logical_not(ops.all(done))

    def body(i, nu, lo, hi, z, m_up, m_lo, s, r, done, converged):
        upper = m_up if b is not None else None
        lower = m_lo if a is not None else None
        phi_ge = (1.0 - s + r) >= 1.0
        active = ops.logical_not(done)
        ok = ops.logical_and(r > 0, s > 0)
        safe_r = ops.where(ok, r, ops.ones_like(r))
        safe_s = ops.where(ok, s, ops.ones_like(s))
        cand = nu + ops.log(safe_r) - ops.log(safe_s)
        lo, hi, new_nu, ok, stalled = _safeguarded_step(i, nu, lo, hi, active, phi_ge, ok, cand)
        z2, up2, lo2 = _pattern(x, a, b, new_nu)
        s2, r2, no_free2 = _masses(z2, a, b, up2, lo2)
        same = ok
        if up2 is not None:
            same = ops.logical_and(same, _same(up2, upper))
        if lo2 is not None:
            same = ops.logical_and(same, _same(lo2, lower))
        conv = ops.logical_or(same, ops.logical_and(no_free2, ops.abs(s2) <= tol))
        conv = ops.logical_and(conv, active)
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
            ops.logical_or(done, ops.logical_or(conv, stalled)),
            ops.logical_or(converged, conv),
        )

    start = ops.convert_to_tensor(0, "int32")
    loop_vars = (start, nu0, lo, hi, z, masks[0], masks[1], s, r, done, done)
    out = ops.while_loop(cond, body, loop_vars, maximum_iterations=max_iter)
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
        y_f, state_f = _closed_form(x, a, b, *_clamp_sets(up_hi, lo_lo))
        return ops.where(converged, y, y_f), ops.where(converged, state, state_f)

    return ops.cond(ops.all(converged), lambda: (y, state), fallback)


def _comparison_bounds(x, a, b):
    """The bounds the log-free pattern test compares ``exp(x)`` with.

    At ``nu`` (``c = exp(nu)``) a coordinate is U iff ``exp(x) > b c`` and L iff
    ``exp(x) <= a c``: the tests ``x - log b > nu`` and ``x - log a <= nu`` without logs. A zero
    bound would make an underflowed ``exp(x) = 0`` look clamped, so it is replaced by -1 (U for
    ``b = 0``: always; L for ``a = 0``: never), except for a ``-inf`` logit, which is never U
    and always L, as the log-domain tests say.
    """
    dead = ops.equal(x, -np.inf)

    def replace_zero(t):
        return None if t is None else ops.where(ops.logical_or(t > 0, dead), t, -1.0)

    return replace_zero(a), replace_zero(b)


def _pattern_at(e, a_cmp, b_cmp, c):
    """The U and L masks at ``c = exp(nu)`` ([N, 1]); None where that bound is not given."""
    up = None if b_cmp is None else e > b_cmp * c
    low = None if a_cmp is None else e <= a_cmp * c  # wins over `up` (only where a = b)
    return up, low


def _masses_at(e, a, b, a_cmp, b_cmp, c):
    """The clamp pattern at ``c = exp(nu)`` ([N, 1]) and its two sums: ``s = 1 -`` bound mass
    and the free mass ``E = sum_F exp(x)`` (both [N, 1]); a mask is None where its bound is
    not given."""
    zero = ops.zeros_like(e)
    up, low = _pattern_at(e, a_cmp, b_cmp, c)
    bound = zero if up is None else ops.where(up, b, zero)
    if low is not None:
        bound = ops.where(low, a, bound)
    free = _free_mask(e, up, low)
    s = 1.0 - ops.sum(bound, -1, keepdims=True)
    return up, low, s, ops.sum(ops.where(free, e, zero), -1, keepdims=True)


def _newton_root(x, a, b):
    """Safeguarded Newton for ``nu`` on log-free passes (docs/design/bcsoftmax.md).

    Returns ``(nu, s, E, e, a_cmp, b_cmp, converged)``: the root of each row with the two sums
    of its pattern, ``exp(x)``, the comparison bounds of :func:`_comparison_bounds` and whether
    every row converged (if not, the caller reruns the batch in :func:`_solve_newton_robust`).
    """
    k = x.shape[-1]
    info = _info(x)
    tol = 10.0 * info.eps * k
    e_min = float(info.tiny) * k / float(info.eps)
    max_iter = 100 if dtype_name(x) == "float32" else 200
    e = ops.exp(x)  # row max 0, so e <= 1 and sum e >= 1
    a_cmp, b_cmp = _comparison_bounds(x, a, b)
    nu0 = ops.log(ops.sum(e, -1, keepdims=True))
    lo, hi = _bracket(x, a, b, nu0)

    def newton_candidate(s, big_e):
        ok = ops.logical_and(big_e > 0, s > 0)
        one = ops.ones_like(s)
        return ok, ops.log(ops.where(ok, big_e, one)) - ops.log(ops.where(ok, s, one))

    up, low, s, big_e = _masses_at(e, a, b, a_cmp, b_cmp, ops.exp(nu0))
    # nu0 is the exact root when nothing is clamped (the softmax satisfies the box)
    none_clamped = ops.all(_free_mask(e, up, low), -1, keepdims=True)
    pinned = ops.logical_and(ops.equal(big_e, 0.0), ops.abs(s) <= tol)
    done = ops.logical_or(none_clamped, pinned)

    def cond(i, nu, lo, hi, s, big_e, done, conv):
        return ops.logical_not(ops.all(done))

    def body(i, nu, lo, hi, s, big_e, done, conv):
        ok, cand = newton_candidate(s, big_e)
        # phi(nu) = 1 - s + E exp(-nu) >= 1  <=>  s <= 0, or E > 0 and cand >= nu
        phi_ge = ops.logical_or(s <= 0, ops.logical_and(ok, cand >= nu))
        active = ops.logical_not(done)
        # no Newton step when the free mass is too small for an exact one: the mid-point
        usable = ops.logical_and(ok, big_e >= e_min)
        lo, hi, new_nu, newton, stalled = _safeguarded_step(
            i, nu, lo, hi, active, phi_ge, usable, cand
        )
        _, _, s2, e2 = _masses_at(e, a, b, a_cmp, b_cmp, ops.exp(new_nu))
        # The pattern at new_nu is the one that produced it iff its sums are the same, i.e.
        # its own Newton candidate is new_nu again: then new_nu is the exact root.
        ok2, cand2 = newton_candidate(s2, e2)
        same = ops.logical_and(newton, ops.logical_and(ok2, ops.equal(cand2, new_nu)))
        c = ops.logical_or(same, ops.logical_and(ops.equal(e2, 0.0), ops.abs(s2) <= tol))
        c = ops.logical_and(c, active)
        # A row whose free mass stays below e_min bisects for a few steps, then hands the
        # batch to the robust solver.
        hard = ops.logical_and(e2 < e_min, i >= 6)
        stop = ops.logical_or(ops.logical_or(c, stalled), hard)
        return i + 1, new_nu, lo, hi, s2, e2, ops.logical_or(done, stop), ops.logical_or(conv, c)

    start = ops.convert_to_tensor(0, "int32")
    loop_vars = (start, nu0, lo, hi, s, big_e, done, done)
    out = ops.while_loop(cond, body, loop_vars, maximum_iterations=max_iter)
    _, nu, _, _, s, big_e, _, conv = out
    return nu, s, big_e, e, a_cmp, b_cmp, ops.all(conv)


def _solution_at(e, a, b, a_cmp, b_cmp, nu, s, big_e):
    """``y`` and the state codes at the root ``nu`` whose pattern has the sums ``s``, ``E``:
    bounds on U/L, the free coordinates ``exp(x)`` scaled to the mass left (one pass)."""
    up, low = _pattern_at(e, a_cmp, b_cmp, ops.exp(nu))
    return _assemble(e, a, b, up, low, s, big_e)


def _solve_newton(x, a, b):
    """Safeguarded Newton on log-free passes (docs/design/bcsoftmax.md); rows that stall, hit
    the cap or keep a free mass below ``K * tiny / eps`` (logit gaps near the float range) make
    the whole batch rerun in :func:`_solve_newton_robust` (exp per step; rare)."""
    if a is None and b is None:
        e = ops.exp(x)
        return e / ops.sum(e, -1, keepdims=True), ops.zeros_like(x, dtype="int8")
    nu, s, big_e, e, a_cmp, b_cmp, converged = _newton_root(x, a, b)
    return ops.cond(
        converged,
        lambda: _solution_at(e, a, b, a_cmp, b_cmp, nu, s, big_e),
        lambda: _solve_newton_robust(x, a, b),
    )


# The candidate solver (method="newton"): at most floor(1 / min(upper)) classes sit at their
# upper bound. With bounds known only when the program runs, the solver takes _N_UPPER
# candidates; rows with more classes at the upper bound go to the safeguarded Newton solver.
_N_UPPER = 16
_N_UPPER_MAX = 64
_MAX_STEPS = 8


def n_upper_candidates(upper, k: int) -> int:
    """How many upper-set candidates :func:`_solve_candidates` takes for ``upper`` (the
    argument as given) and ``k`` classes: ``floor(1 / min positive upper)`` where the values
    are Python numbers or numpy arrays (never read from a device), else :data:`_N_UPPER`;
    at most :data:`_N_UPPER_MAX` and ``k``."""
    m = _N_UPPER
    if isinstance(upper, (int, float, list, tuple, np.ndarray, np.generic)):
        pos = np.asarray(upper, np.float64)
        pos = pos[pos > 0]
        if pos.size and np.all(np.isfinite(pos)):
            m = int(np.floor((1.0 + 1e-6) / float(np.min(pos))))
    return max(1, min(m, _N_UPPER_MAX, k))


def _use_candidates(temperature) -> bool:
    """Whether ``method="newton"`` takes the candidate solver: for a temperature given as a
    number below 1. At T >= 1 the safeguarded Newton search needs few steps and skips the
    candidates' ``top_k`` (0.5-0.9 softmax passes on XLA:CPU; it was 1.2-2x faster at T = 10
    and at T = 1, 128x1024, and 5-7x slower at T = 0.1: BENCHMARKS.md, "New default
    solver"). A temperature given as a tensor (a calibrator's trained one) also keeps the
    safeguarded search: JAX lowers ``top_k`` to a StableHLO composite that TensorFlow 2.21
    cannot load, so a calibrated model exported on JAX could not be served by TensorFlow."""
    if isinstance(temperature, (int, float, np.ndarray, np.generic)):
        t = np.asarray(temperature, np.float64)
        return bool(t.size) and bool(np.all(t < 1.0))
    return False


def _solve_candidates(x, a, b, n_upper=_N_UPPER, uniform_upper=False):
    """Exact BCSoftmax whose work does not grow with the temperature (docs/design/bcsoftmax.md).

    With ``c = exp(nu)``, ``phi(c) = sum_k clip(e_k / c, a_k, b_k)`` (``e = exp(x - sigma)``) is
    non-increasing and its upper clips make Newton from either side add one class at a time
    at low temperatures. Here:

    1. The classes that can be at the upper bound are among the ``m = n_upper`` largest keys
       ``x - log b`` (``top_k``; ``x`` itself where ``uniform_upper``: one bound per row). The
       ``(m+1)``-th key gives ``c_lo`` with ``phi(c_lo) >= 1`` when ``m >= 1 / min b``, and no
       other class reaches its upper bound for ``c >= c_lo``.
    2. Each step solves the model ``A + E / c + sum_cand clip(e_j / c, a_j, b_j) = 1`` exactly:
       the candidates as they are (their breakpoints are searched, O(m^2) per row), the other
       classes linearised in ``1 / c`` at the current point (``A``: lower-bound mass, ``E``:
       free mass). That part is convex in ``1 / c``, so the model is below ``phi``: the steps
       rise monotonically to the root from ``c_lo`` and land on it once the pattern of the
       other classes stops changing (1-4 passes over the row at every temperature tried).
    3. The closed form on the final pattern (paper Thm. 3). ``sigma`` is the largest logit
       outside the candidates, so the free mass never underflows where it matters.

    Rows the steps cannot finish (more than ``m`` classes at the upper bound, no convergence
    in :data:`_MAX_STEPS`, or a non-finite ``c``) are solved by :func:`_solve_newton` (under
    an ``ops.cond``, only when some row needs it).
    """
    k = x.shape[-1]
    if a is None and b is None:
        e = ops.exp(x)
        return e / ops.sum(e, -1, keepdims=True), ops.zeros_like(x, dtype="int8")
    eps = float(_info(x).eps)
    cap = 80.0 if dtype_name(x) == "float32" else 700.0  # exp(cap) is finite
    a_cmp, b_cmp = _comparison_bounds(x, a, b)
    zero = ops.zeros_like(x)
    neg_inf = ops.full_like(x[:, :1], -np.inf)
    m = 0 if b is None else min(n_upper, k)
    if m:
        if uniform_upper:
            key = x
        else:
            pos = b > 0
            key = ops.where(pos, x - ops.log(ops.where(pos, b, 1.0)), -np.inf)
        # Unsorted: XLA's CPU TopK turns into a sort of the whole row when a sorted result is
        # sliced (128x1024: 50 ms against 2 ms).
        top, idx = ops.top_k(key, min(m + 1, k), sorted=False)
        if m < k:
            tau_key = reduce_min(top, -1, keepdims=True)  # the (m+1)-th largest key
            valid = top > tau_key  # at most m; ties with the (m+1)-th key stay outside
            others = key <= tau_key
            if uniform_upper:
                sigma = tau_key
            else:
                sigma = reduce_max(ops.where(others, x, -np.inf), -1, keepdims=True)
        else:
            tau_key, valid, sigma = neg_inf, top > -np.inf, neg_inf
            others = ops.zeros_like(x, dtype="bool")
        sigma = ops.where(ops.isfinite(sigma), sigma, ops.zeros_like(sigma))
        c_lo = ops.exp(tau_key - sigma)  # 0 where every class is a candidate
        if uniform_upper:
            c_lo = c_lo / b[:, :1]
        e = ops.exp(minimum(x - sigma, cap))
        ec, bv, bcm = (take_along_axis(t, idx, axis=-1) for t in (e, b, b_cmp))
        av = acm = None
        if a is not None:
            av, acm = (take_along_axis(t, idx, axis=-1) for t in (a, a_cmp))
        others = ops.logical_and(others, b_cmp >= 0)  # b = 0: at the bound, mass 0
    else:
        others = ops.ones_like(x, dtype="bool")
        c_lo = ops.zeros_like(x[:, :1])
        e = ops.exp(x)
    e_others = ops.sum(ops.where(others, e, zero), -1, keepdims=True)

    def cand_pattern(c):
        """The candidates' U and L masks at ``c`` ([N, 1], or [N, J, 1] for J points)."""
        v, e_, bm, am = valid, ec, bcm, acm
        if len(c.shape) == 3:
            v, e_, bm = v[:, None, :], e_[:, None, :], bm[:, None, :]
            am = None if am is None else am[:, None, :]
        up = ops.logical_and(v, e_ > bm * c)
        if am is None:
            return up, None
        low = ops.logical_and(v, e_ <= am * c)  # wins over `up` (only where a = b)
        return ops.logical_and(up, ops.logical_not(low)), low

    def cand_sums(c):
        """The candidates' bound mass and free mass ``sum_F e`` at ``c``, [N, 1] each."""
        if not m:
            return ops.zeros_like(c), ops.zeros_like(c)
        up, low = cand_pattern(c)
        free = ops.logical_and(valid, ops.logical_not(up))
        bound = ops.where(up, bv, 0.0)
        if low is not None:
            free = ops.logical_and(free, ops.logical_not(low))
            bound = ops.where(low, av, bound)
        free_mass = ops.sum(ops.where(free, ec, 0.0), -1, keepdims=True)
        return ops.sum(bound, -1, keepdims=True), free_mass

    def others_at(c):
        """``A`` (lower-bound mass) and ``E`` (free mass) of the other classes at ``c``."""
        if a is None:
            return ops.zeros_like(c), e_others
        low = ops.logical_and(others, e <= a_cmp * c)
        free = ops.logical_and(others, ops.logical_not(low))
        mass_a = ops.sum(ops.where(low, a, zero), -1, keepdims=True)
        return mass_a, ops.sum(ops.where(free, e, zero), -1, keepdims=True)

    def model_root(mass_a, mass_e, c0):
        """The root ``c >= c0`` of ``A + E / c + sum_cand clip(e_j / c, a_j, b_j) = 1``: the
        last candidate breakpoint with the model >= 1, then the closed form of the pattern
        just after it."""
        beta, nxt, mid = c0, ops.full_like(c0, np.inf), c0
        if m:
            pts = [c0, ops.where(valid, ec / ops.where(valid, bv, 1.0), c0)]
            if av is not None:
                ok = ops.logical_and(valid, av > 0)
                pts.append(ops.where(ok, ec / ops.where(ok, av, 1.0), c0))
            pts = ops.concatenate(pts, -1)
            pts = ops.where(ops.logical_and(ops.isfinite(pts), pts > c0), pts, c0)  # [N, J]
            cj = pts[:, :, None]
            up, low = cand_pattern(cj)
            yj = ops.where(up, bv[:, None, :], ec[:, None, :] / cj)
            if low is not None:
                yj = ops.where(low, av[:, None, :], yj)
            yj = ops.where(valid[:, None, :], yj, 0.0)
            model = mass_a + mass_e / pts + ops.sum(yj, -1)
            beta = reduce_max(ops.where(model >= 1.0, pts, c0), -1, keepdims=True)
            nxt = -reduce_max(ops.where(pts > beta, -pts, -np.inf), -1, keepdims=True)
            mid = ops.where(ops.isfinite(nxt), 0.5 * beta + 0.5 * nxt, maximum(2.0 * beta, 1.0))
        bound_c, free_c = cand_sums(mid)
        s = 1.0 - mass_a - bound_c
        ef = mass_e + free_c
        ok = ops.logical_and(s > 0, ef > 0)
        c_new = ops.where(ok, ef / ops.where(ok, s, 1.0), beta)
        return minimum(maximum(c_new, beta), nxt)

    def residual(c, mass_a, mass_e):
        """``phi(c) - 1`` from the sums; returns (converged, left of the root, s, E_F)."""
        bound_c, free_c = cand_sums(c)
        s = 1.0 - mass_a - bound_c
        ef = mass_e + free_c
        resid = ef / c - s
        pinned = ops.logical_and(ops.equal(ef, 0.0), ops.abs(s) <= 10.0 * eps * k)
        conv = ops.logical_or(ops.abs(resid) <= 8.0 * eps, pinned)
        left = ops.logical_and(resid < -8.0 * eps, ops.logical_not(pinned))
        return conv, left, s, ef

    # First step: the other classes all free (E / c is below their part of phi).
    c = model_root(ops.zeros_like(c_lo), e_others, c_lo)
    mass_a, mass_e = others_at(c)
    conv, left, s, ef = residual(c, mass_a, mass_e)
    if a is not None:

        def cond(i, c, mass_a, mass_e, done, bad):
            return ops.logical_not(ops.all(ops.logical_or(done, bad)))

        def body(i, c, mass_a, mass_e, done, bad):
            active = ops.logical_not(ops.logical_or(done, bad))
            c2 = model_root(mass_a, mass_e, c)
            a2, e2 = others_at(c2)
            conv2, left2, _, _ = residual(c2, a2, e2)
            return (
                i + 1,
                ops.where(active, c2, c),
                ops.where(active, a2, mass_a),
                ops.where(active, e2, mass_e),
                ops.logical_or(done, ops.logical_and(active, conv2)),
                ops.logical_or(bad, ops.logical_and(active, left2)),
            )

        start = ops.convert_to_tensor(0, "int32")
        out = ops.while_loop(
            cond, body, (start, c, mass_a, mass_e, conv, left), maximum_iterations=_MAX_STEPS
        )
        _, c, mass_a, mass_e, conv, left = out
        conv, left, s, ef = residual(c, mass_a, mass_e)
    bad = ops.logical_or(ops.logical_not(conv), left)
    bad = ops.logical_or(bad, ops.logical_not(ops.isfinite(c)))
    if m:
        # a candidate whose exp was capped is only exact at its upper bound
        capped = ops.logical_and(valid, take_along_axis(x, idx, axis=-1) - sigma >= cap)
        capped = ops.logical_and(capped, ops.logical_not(cand_pattern(c)[0]))
        bad = ops.logical_or(bad, ops.any(capped, -1, keepdims=True))
    y, state = _assemble(e, a, b, *_pattern_at(e, a_cmp, b_cmp, c), s, ef)

    def fallback():
        y2, state2 = _solve_newton(x, a, b)
        return ops.where(bad, y2, y), ops.where(bad, state2, state)

    return ops.cond(ops.any(bad), fallback, lambda: (y, state))


def _log_keys(x, a, b):
    def key(t):
        return ops.where(t > 0, x - ops.log(ops.where(t > 0, t, 1.0)), np.inf)

    return (None if b is None else key(b)), (None if a is None else key(a))


def _finalize_at(x, a, b, u, lk, e_lo):
    """Spec Algorithm A steps 7-9: classify at the bracket's left end, closed form."""
    upper, lower = _clamp_sets(None if u is None else u > e_lo, None if lk is None else lk <= e_lo)
    return _closed_form(x, a, b, upper, lower)


def _clip(y, a, b):
    """``y`` clipped into ``[a, b]`` (None: no bound on that side)."""
    if a is not None:
        y = maximum(y, a)
    if b is not None:
        y = minimum(y, b)
    return y


def _phi(x, a, b, nu):
    return ops.sum(_clip(ops.exp(x - nu), a, b), -1, keepdims=True)


def _solve_sort(x, a, b):
    u, lk = _log_keys(x, a, b)
    if u is None and lk is None:
        return _finalize_at(x, a, b, u, lk, ops.full_like(x[:, :1], -np.inf))
    e = ops.sort(ops.concatenate([t for t in (u, lk) if t is not None], -1), axis=-1)
    n = e.shape[-1]
    sum_a = ops.sum(a, -1, keepdims=True) if a is not None else ops.zeros_like(x[:, :1])
    lo = ops.zeros_like(x[:, :1], dtype="int32")
    hi = ops.full_like(lo, n)
    for _ in range(int(np.ceil(np.log2(n + 1)))):
        mid = (lo + hi + 1) // 2
        ej = take_along_axis(e, ops.clip(mid - 1, 0, n - 1), axis=-1)
        fin = ops.isfinite(ej)
        p = ops.where(
            fin, _phi(x, a, b, ops.where(fin, ej, ops.zeros_like(ej))) >= 1.0, sum_a >= 1.0
        )
        active = lo < hi
        lo = ops.where(ops.logical_and(active, p), mid, lo)
        hi = ops.where(ops.logical_and(active, ops.logical_not(p)), mid - 1, hi)
    e_lo = ops.where(
        lo > 0, take_along_axis(e, maximum(lo - 1, 0), axis=-1), ops.cast(-np.inf, x.dtype)
    )
    return _finalize_at(x, a, b, u, lk, e_lo)


def _solve_bisect(x, a, b):
    u, lk = _log_keys(x, a, b)
    k = x.shape[-1]
    tiny = float(_info(x).tiny)
    lo = _finite_min(u) if u is not None else _finite_min(x)
    cands = [ops.full_like(lo, np.log(k))]
    if lk is not None:
        cands += [
            _finite_max(lk),
            np.log(k) - ops.log(maximum(1.0 - ops.sum(a, -1, keepdims=True), tiny)),
        ]
    if u is not None:
        cands.append(_finite_max(u))
    hi = cands[0]
    for c in cands[1:]:
        hi = maximum(hi, ops.where(ops.isfinite(c), c, hi))
    lo = ops.where(ops.isfinite(lo), lo, hi)

    def step(lo, hi):
        mid = 0.5 * lo + 0.5 * hi  # no overflow near the float range
        ge = _phi(x, a, b, mid) >= 1.0
        return ops.where(ge, mid, lo), ops.where(ge, hi, mid)

    steps = 40 if dtype_name(x) == "float32" else 64
    lo, hi = ops.while_loop(lambda lo, hi: True, step, (lo, hi), maximum_iterations=steps)
    return _finalize_at(x, a, b, u, lk, lo)


_SOLVERS = {"newton": _solve_candidates, "sort": _solve_sort, "bisect": _solve_bisect}


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
    eps = float(_info(xs).eps)
    tol = 16.0 * eps * np.sqrt(k) + 4.0 * eps
    off = ops.abs(ops.sum(_clip(y, ac, bc), -1, keepdims=True) - 1.0) > tol
    feasible = ops.ones_like(off)
    if ac is not None:
        feasible = ops.sum(ac, -1, keepdims=True) <= 1.0
    if bc is not None:
        feasible = ops.logical_and(feasible, ops.sum(bc, -1, keepdims=True) >= 1.0)
    off = ops.logical_and(off, feasible)

    def fix():
        y2, state2 = _solve_newton_robust(xs, ac, bc)
        return ops.where(off, y2, y), ops.where(off, state2, state)

    return ops.cond(ops.any(off), fix, lambda: (y, state))


def _solve_limit(x, a, b):
    """The ``tau -> 0`` limit of BCSoftmax, exactly: the bounds' linear program
    ``max <x, y>`` on the box and the simplex, ties broken by the most entropy.

    From ``y = a``, the mass ``1 - sum(a)`` goes to the classes in decreasing order of ``x``,
    each up to its upper bound; the group of equal logits where the mass runs out (level
    ``v``) shares what is left as ``clip(lam, a, b)`` (water filling). A binary search over the
    sorted logits finds ``v`` (the last level with less capacity above it than mass to give),
    a bisection ``lam``. ``-inf`` logits keep their lower bound. Used for the rows whose
    solution the other solvers cannot represent (scaled logit gaps beyond float resolution, at
    temperatures near 1e-10 and below), where it is the solution up to rounding.
    """
    zero = ops.zeros_like(x)
    lo_b = zero if a is None else a
    up_b = ops.ones_like(x) if b is None else b
    alive = ops.isfinite(x)
    cap = ops.where(alive, up_b - lo_b, zero)
    rem = 1.0 - ops.sum(lo_b, -1, keepdims=True)
    k = x.shape[-1]
    xs = -ops.sort(-ops.where(alive, x, -np.inf), axis=-1)  # descending

    def above(v):  # capacity of the classes strictly above level v
        return ops.sum(ops.where(x > v, cap, zero), -1, keepdims=True)

    # last sorted position i with above(xs_i) < rem (positions 0..K-1; -1: none)
    lo = ops.full_like(rem, -1, dtype="int32")
    hi = ops.full_like(lo, k - 1)
    for _ in range(int(np.ceil(np.log2(k + 1)))):
        mid = (lo + hi + 1) // 2
        v = take_along_axis(xs, maximum(mid, 0), axis=-1)
        ok = ops.logical_and(above(v) < rem, ops.isfinite(v))
        active = lo < hi
        lo = ops.where(ops.logical_and(active, ok), mid, lo)
        hi = ops.where(ops.logical_and(active, ops.logical_not(ok)), mid - 1, hi)
    v = ops.where(lo >= 0, take_along_axis(xs, maximum(lo, 0), axis=-1), np.inf)
    group = ops.logical_and(ops.equal(x, v), alive)
    target = rem - above(v) + ops.sum(ops.where(group, lo_b, zero), -1, keepdims=True)

    def fill(lam):
        filled = minimum(maximum(lam + zero, lo_b), up_b)
        return ops.sum(ops.where(group, filled, zero), -1, keepdims=True)

    lam_lo, lam_hi = ops.zeros_like(rem), ops.ones_like(rem)
    for _ in range(64 if dtype_name(x) == "float64" else 40):
        lam = 0.5 * (lam_lo + lam_hi)
        low = fill(lam) < target
        lam_lo, lam_hi = ops.where(low, lam, lam_lo), ops.where(low, lam_hi, lam)
    lam = 0.5 * (lam_lo + lam_hi)
    at_low = ops.logical_and(group, lam <= lo_b)
    at_up = ops.logical_and(group, ops.logical_and(lam >= up_b, ops.logical_not(at_low)))
    free = ops.logical_and(group, ops.logical_not(ops.logical_or(at_low, at_up)))
    n_free = ops.sum(ops.cast(free, x.dtype), -1, keepdims=True)
    bound = ops.where(at_low, lo_b, ops.where(at_up, up_b, zero))
    share = divide_no_nan(target - ops.sum(bound, -1, keepdims=True), n_free)
    upper = ops.logical_or(ops.logical_and(x > v, alive), at_up)
    lower = ops.logical_not(ops.logical_or(upper, free))
    y = ops.where(upper, up_b, ops.where(lower, lo_b, share))
    state = ops.where(upper, ops.cast(UPPER, "int8"), ops.cast(LOWER, "int8"))
    return y, ops.where(free, ops.cast(FREE, "int8"), state)


def _not_solved(xs, ac, bc, y):
    """[N, 1] mask of the feasible rows whose ``y`` (clipped into the box) does not sum to 1."""
    k = xs.shape[-1]
    eps = float(_info(xs).eps)
    tol = 16.0 * eps * np.sqrt(k) + 4.0 * eps
    off = ops.abs(ops.sum(_clip(y, ac, bc), -1, keepdims=True) - 1.0) > tol
    if ac is not None:
        off = ops.logical_and(off, ops.sum(ac, -1, keepdims=True) <= 1.0)
    if bc is not None:
        off = ops.logical_and(off, ops.sum(bc, -1, keepdims=True) >= 1.0)
    return off


def _limit_repair(xs, ac, bc, y, state):
    """Rows the solver left unsolved (their sum is off) take the ``tau -> 0`` limit
    (:func:`_solve_limit`). It happens only where the scaled logit gaps exceed what the
    float type resolves (e.g. tied logits below an upper bound at ``tau = 1e-10``, where every
    ``exp`` but the row max's underflows); there the limit is the solution up to rounding.
    One row sum; the limit runs only when needed."""
    off = _not_solved(xs, ac, bc, y)

    def fix():
        y2, state2 = _solve_limit(xs, ac, bc)
        return ops.where(off, y2, y), ops.where(off, state2, state)

    return ops.cond(ops.any(off), fix, lambda: (y, state))


# --------------------------------------------------------------------------------------------
# The differentiable kernel (class axis last) and the public op.
# --------------------------------------------------------------------------------------------


def _bad_rows(xs, m_raw, t2, a2, b2, tol, checked):
    """[N, 1] mask of the rows the kernel cannot solve; they come back NaN (the XLA half of the
    fail-loud contract: assertions vanish there).

    The logits part is folded into the forward pass (the row max and one sum): scaled logits
    holding NaN or +inf, or all -inf; then the rules :data:`TEMPERATURE` (temperature) and
    :data:`PROBABILITY_BOUNDS` (each given bound). Where the rules were ``checked`` before the
    kernel, only ``x / tau`` overflowing to +inf is left to find (the row max).
    """
    k = xs.shape[-1]
    # m_raw: +inf (a +inf logit, or tau <= 0 flipping a -inf one), -inf (every class masked),
    # NaN; after the shift a NaN anywhere makes the row sum NaN (the rest is <= 0 or -inf).
    bad = ops.logical_not(ops.isfinite(m_raw))
    if checked:
        return bad
    bad = ops.logical_or(bad, ops.isnan(ops.sum(xs, -1, keepdims=True)))
    bad = ops.logical_or(bad, TEMPERATURE.invalid(t2))
    if a2 is not None:
        other = 1.0 if b2 is None else b2
        bad = ops.logical_or(bad, PROBABILITY_BOUNDS.invalid(a2, other, tol, k, True)[:, None])
    if b2 is not None:
        other = 0.0 if a2 is None else a2
        bad = ops.logical_or(bad, PROBABILITY_BOUNDS.invalid(b2, other, tol, k, False)[:, None])
    return bad


def _reduce_to(g, target):
    """Sum ``g`` (the broadcast shape) back to ``target``'s static shape."""
    lead = len(g.shape) - len(target.shape)
    axes = list(range(lead)) + [lead + i for i, d in enumerate(target.shape) if d == 1]
    if axes:
        g = ops.sum(g, axes)
    return ops.reshape(g, ops.shape(target))


@functools.partial(jit_on_jax, static_argnames=("method", "clip", "solver", "n_upper"))
def _kernel(x, a, b, tau, method: str, clip: bool, solver=None, n_upper: int = _N_UPPER):
    """BCSoftmax of compute-dtype tensors with the class axis last (``a``, ``b`` may be None),
    with its hand-derived gradient to every tensor input. ``solver(x, a, b) -> (y, state)``
    replaces ``method``'s (the benchmarks' floor rows pass one with ``nu`` given);
    ``n_upper``: the upper-set candidates of ``method="newton"``."""
    k = x.shape[-1]
    if solver is None and method == "newton":
        uniform = b is not None and (static_rank(b) == 0 or b.shape[-1] == 1)
        solver = functools.partial(_solve_candidates, n_upper=n_upper, uniform_upper=uniform)
    solver = solver or _SOLVERS[method]
    eps = float(_info(x).eps)
    # whether bad input was stopped before the kernel (an error or a graph assertion)
    checked = rules_enforced(*[t for t in (x, a, b, tau) if t is not None])

    has_a, has_b = a is not None, b is not None

    @custom_gradient
    def f(x, *rest):  # rest: the bounds given, then the temperature
        a = rest[0] if has_a else None
        b = rest[int(has_a)] if has_b else None
        tau = rest[-1]
        shape = ops.shape(x)
        x2 = ops.reshape(x, (-1, k))
        t2 = ops.reshape(ops.broadcast_to(tau, tuple(shape[:-1]) + (1,)), (-1, 1))
        # Shift, then scale: the row max of (x - max x) / tau is exactly 0 however XLA
        # rewrites the division (x / tau - max(x / tau) is not: XLA turns a constant tau
        # into a multiplication by 1 / tau in one fusion and not in another, and at
        # tau = 1e-10 the "0" came out 119, exp overflowed and the row went NaN).
        m_raw = reduce_max(x2, -1, keepdims=True)
        xs = (x2 - ops.where(ops.isfinite(m_raw), m_raw, ops.zeros_like(m_raw))) / t2

        def flat(t):
            return None if t is None else ops.reshape(ops.broadcast_to(t, shape), (-1, k))

        a2, b2 = flat(a), flat(b)
        ac = None if a2 is None else maximum(a2, 0.0)
        bc = None if b2 is None else ops.clip(b2, 0.0, 1.0)
        y, state = solver(xs, ac, bc)
        if method != "newton":
            y, state = _repair(xs, ac, bc, y, state)
        if ac is not None or bc is not None:
            y, state = _limit_repair(xs, ac, bc, y, state)
        if clip:
            y = _clip(y, ac, bc)
        y = nan_where(_bad_rows(xs, m_raw, t2, a2, b2, 10.0 * eps * k, checked), y)

        def grad(v):
            v2 = ops.reshape(ops.cast(v, y.dtype), (-1, k))
            zero = ops.zeros_like(y)
            free = ops.equal(state, FREE)
            at_lower = ops.equal(state, LOWER)
            at_upper = ops.equal(state, UPPER)
            q = ops.where(free, y, zero)
            ssum = ops.sum(q, -1, keepdims=True)
            vbar = divide_no_nan(ops.sum(q * v2, -1, keepdims=True), ssum)
            # Pinned rows (every coordinate at a bound up to rounding, e.g. sum(lower) = 1):
            # the computed free mass lands on either side of 0 depending on the summation
            # order (eager vs XLA), and the one-sided derivatives differ by O(|v|). A row whose
            # free coordinates all lie within _PIN_TOL * eps * K of a bound counts them at that
            # bound, so every mode uses the derivative along the face sum(bounds) = 1 (spec
            # section 3, S = 0): dL/da = g * v, dL/db = h * v, dL/dx = 0. The test is one more
            # reduction in the same pass as the sums above.
            pin_tol = _PIN_TOL * eps * k
            dist_a = None if a2 is None else y - maximum(a2, 0.0)
            dist_b = None if b2 is None else ops.clip(b2, 0.0, 1.0) - y
            if dist_a is not None or dist_b is not None:
                if dist_a is None or dist_b is None:
                    dist = dist_b if dist_a is None else dist_a
                else:
                    dist = minimum(dist_a, dist_b)
                slack = reduce_max(ops.where(free, dist, zero), -1, keepdims=True)
                pinned = ops.logical_and(slack <= pin_tol, ops.logical_not(ops.isnan(ssum)))
                pf = ops.logical_and(pinned, free)
                if dist_b is None:
                    at_lower = ops.logical_or(at_lower, pf)
                else:
                    to_upper = pf if dist_a is None else ops.logical_and(pf, dist_b <= pin_tol)
                    at_upper = ops.logical_or(at_upper, to_upper)
                    if dist_a is not None:
                        at_lower = ops.logical_or(
                            at_lower, ops.logical_and(pf, ops.logical_not(to_upper))
                        )
                q = ops.where(pf, zero, q)
                vbar = ops.where(pinned, ops.zeros_like(vbar), vbar)
            # rows the forward pass made NaN (invalid input) get NaN gradients
            vbar = nan_where(ops.isnan(y[:, :1]), vbar)
            w = v2 - vbar
            qw = q * w
            grads = [ops.reshape(qw / t2, shape)]
            if a is not None:
                ga = ops.where(ops.logical_and(at_lower, a2 >= 0), w, zero)
                grads.append(_reduce_to(ops.reshape(ga, shape), a))
            if b is not None:
                inside = ops.logical_and(b2 >= 0, b2 <= 1)  # clamped entries: gradient 0
                gb = ops.where(ops.logical_and(at_upper, inside), w, zero)
                grads.append(_reduce_to(ops.reshape(gb, shape), b))
            gt = -ops.sum(ops.where(free, xs, zero) * qw, -1, keepdims=True) / t2  # [N, 1]
            grads.append(_reduce_to(ops.reshape(gt, tuple(shape[:-1]) + (1,)), tau))
            return grads

        return ops.reshape(y, shape), grad

    return f(x, *[t for t in (a, b) if t is not None], tau)


def _convert(t, name: str, x, rank: int):
    """A bound or temperature as a tensor of ``x``'s dtype that broadcasts to ``x`` (of rank
    ``rank``; unknown sizes pass)."""
    if t is None:
        return None
    if isinstance(t, (int, float, list, tuple, np.ndarray, np.generic)):
        t = np.asarray(t)
        if t.dtype.kind in "iuf":  # straight to x's dtype: no float32 detour for 0.1
            t = ops.convert_to_tensor(t.astype(dtype_name(x)), dtype_name(x))
    t = ops.convert_to_tensor(t)
    check_real(t, name, bool_ok=False)
    t = ops.cast(t, x.dtype)
    t_rank = static_rank(t)
    if t_rank is None:
        return t
    if t_rank > rank:
        raise ValueError(
            f"`{name}` (rank {t_rank}) must not have a higher rank than `logits` ({rank})."
        )
    pairs = zip(tuple(t.shape)[::-1], tuple(x.shape)[::-1])
    if not all(d is None or s is None or d in (1, s) for d, s in pairs):
        raise ValueError(
            f"`{name}` with shape {tuple(t.shape)} does not broadcast to `logits` "
            f"{tuple(x.shape)} (each axis must have the logits' size or 1)."
        )
    return t


def _class_last(t, rank: int, ax: int):
    """``t`` (broadcastable to rank-``rank`` logits) with the class axis ``ax`` moved last."""
    if t is None or ax == rank - 1:
        return t
    while static_rank(t) < rank:
        t = ops.expand_dims(t, 0)
    return move_axis_last(t, ax)[0]


def bcsoftmax(
    logits,
    lower=None,
    upper=None,
    temperature=1.0,
    axis: int = -1,
    *,
    method: str = "newton",
    clip: bool = True,
):
    """Box-constrained softmax: the exact maximiser of ``<x,y> - tau sum y log y`` on the simplex
    within ``lower <= y <= upper``.

    ``y = clip(exp(x/tau - nu), lower, upper)`` with the one ``nu`` per row that makes ``y`` sum
    to 1. With ``lower=None, upper=None`` this is ``softmax(x / tau)``; upper-only is the paper's
    UBSoftmax, lower-only its LBSoftmax.

    Args:
      logits: float tensor of rank >= 1 with a static class dimension. float16/bfloat16 are
        computed in float32 and the result is cast back. ``-inf`` masks class k
        (``y_k = max(lower_k, 0)``); NaN / +inf / all -inf rows break ``contract.LOGITS``.
      lower: lower bounds ``a`` broadcastable to ``logits`` (scalar, per-class vector,
        ``[..., 1]`` per-example uniform bound, or full tensor), or None (``a = 0``).
      upper: upper bounds ``b``, same broadcasting, or None (``b = 1``). ``lower = upper = 0``
        masks a class. Both keep :data:`PROBABILITY_BOUNDS`: ``0 <= lower <= upper <= 1``,
        ``sum(lower) <= 1 <= sum(upper)``.
      temperature: ``tau > 0``, a normal float (:data:`TEMPERATURE`; a subnormal one raises):
        scalar or broadcastable to ``logits`` with size 1 on ``axis``. Below about 1e-10 the
        scaled logit gaps exceed what the float type resolves, and the result is the
        ``tau -> 0`` limit (the bounds' linear program, ties sharing by water filling).
      axis: the class axis.
      method: ``"newton"`` (default; the upper-bound candidates from one ``top_k`` of size
        ``floor(1 / min upper)`` where ``upper`` is a Python number or numpy array, else 16,
        then monotone Newton steps, the same work at every temperature, for a temperature
        given as a number below 1; otherwise the safeguarded Newton search), ``"sort"`` (spec
        Algorithm A) or ``"bisect"`` (spec Algorithm B). All finish with the closed-form
        solve on the identified clamp pattern.
      clip: clip the result into ``[lower, upper]`` so the box holds exactly (the sum is then 1
        up to about ``K * eps``).

    Rule breaks raise ``ValueError`` naming the argument when the values are known and fail a
    graph assertion in a TensorFlow graph (both skipped with ``losszoo.set_validation(False)``).
    Under XLA / ``jax.jit`` the rows with invalid logits, temperature or bounds come back
    entirely NaN (also with validation off), and so do their gradients. Logit offsets and
    scales of 1e8 give the same result as the float64 solution of the rounded inputs.

    Returns:
      Probabilities with the shape and dtype of ``logits``.

    Example:
      >>> y = bcsoftmax([[-1.5, 1.0, -0.5]], upper=[1.0, 0.6, 0.5])
      >>> keras.ops.convert_to_numpy(y).round(4)
      array([[0.1076, 0.6   , 0.2924]], dtype=float32)
    """
    check_choice(method, "method", METHODS)
    check_bool(clip, "clip")
    axis = check_number(axis, "axis", integer=True)
    x, dtype = to_compute_dtype(logits, "logits")
    check_static_rank(x, 1, "logits")
    rank = static_rank(x)
    if rank is None or not -rank <= axis < rank:
        raise ValueError(f"`axis`={axis} is out of range for `logits` of rank {rank}.")
    ax = axis % rank
    k = x.shape[ax]
    if k is None:
        raise ValueError("`logits` must have a static size along the class axis.")
    if k == 0:
        raise ValueError("`logits` must have at least one class.")
    a, b, tau = (
        _convert(t, name, x, rank)
        for t, name in ((lower, "lower"), (upper, "upper"), (temperature, "temperature"))
    )
    t_rank = static_rank(tau)
    if t_rank:
        pos = ax - (rank - t_rank)
        if pos >= 0 and tau.shape[pos] not in (1, None):
            raise ValueError("`temperature` must have size 1 along the class axis.")
    x, undo = move_axis_last(x, ax)
    a, b, tau = (_class_last(t, rank, ax) for t in (a, b, tau))
    tol = 10.0 * float(_info(x).eps) * k
    x = LOGITS.check(x, "logits")
    tau = TEMPERATURE.check(tau, "temperature")
    if a is not None:
        a = PROBABILITY_BOUNDS.check(a, "lower", 1.0 if b is None else b, tol, k, True)
    if b is not None:
        b = PROBABILITY_BOUNDS.check(b, "upper", 0.0 if a is None else a, tol, k, False)
    n_upper = n_upper_candidates(upper, k)
    solver = None if method != "newton" or _use_candidates(temperature) else _solve_newton
    return ops.cast(
        undo(_kernel(x, a, b, tau, method, clip, solver=solver, n_upper=n_upper)), dtype
    )
