"""BCSoftmax by safeguarded Newton on the pieces of ``phi(nu)``: the log-free solver
(:func:`_solve_newton`) and the one that classifies from ``exp(x - nu)`` at every step
(:func:`_solve_newton_robust`); ``docs/design/bcsoftmax.md``, "Safeguarded Newton"."""

from __future__ import annotations

from keras import ops

from losszoo._backend import (
    LOOPS_READ_HOST,
    maximum,
    minimum,
    reduce_min,
)
from losszoo.contract import dtype_name

from ._common import (
    _assemble,
    _bound_sum,
    _clamp_sets,
    _closed_form,
    _comparison_bounds,
    _finite_min,
    _free_mask,
    _info,
    _masses,
    _masses_at,
    _pattern,
    _pattern_at,
    _same,
    _while_loop,
)

# Trips of :func:`_newton_root` run as straight-line code on PyTorch before each host read:
# none first (at T >= 1 the softmax often keeps the box: 0 trips), then 3 (most rows land in
# 2-3 at T = 1), then 5; the rest (up to the cap) as a loop.
_NEWTON_ROUNDS = (0, 3, 5)


def _bracket(x, a, b, nu0):
    """``(lo, hi)`` with ``phi(lo) >= 1 >= phi(hi)`` around the root (docs/design/bcsoftmax.md);
    ``nu0`` is the softmax normaliser ``logsumexp(x)``."""
    lo = hi = nu0
    if b is not None:
        lo = _finite_min(x - ops.log(b))
        lo = ops.where(ops.isfinite(lo), lo, nu0)
    if a is not None:
        rest = maximum(1.0 - _bound_sum(a, x), float(_info(x).tiny))
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


def _newton_root(x, a, b, positive=False):
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
    a_cmp, b_cmp = _comparison_bounds(x, a, b, positive)
    sum_e = ops.sum(e, -1, keepdims=True)
    nu0 = ops.log(sum_e)
    lo, hi = _bracket(x, a, b, nu0)

    def newton_candidate(s, big_e):
        ok = ops.logical_and(big_e > 0, s > 0)
        one = ops.ones_like(s)
        return ok, ops.log(ops.where(ok, big_e, one)) - ops.log(ops.where(ok, s, one))

    c0 = ops.exp(nu0)

    def at_nu0():
        up, low, s, big_e = _masses_at(e, a, b, a_cmp, b_cmp, c0)
        # nu0 is the exact root when nothing is clamped (the softmax satisfies the box)
        return s, big_e, ops.all(_free_mask(e, up, low), -1, keepdims=True)

    if positive and not LOOPS_READ_HOST and all(t is None or t.shape[-1] == 1 for t in (a, b)):
        # One bound per row: nothing is clamped at nu0 iff max e = 1 (the row max of x is 0)
        # is not above b c0 and min e is above a c0 (the per-class tests of `_masses_at`).
        # Where that holds in every row (high temperatures), the pattern pass is skipped
        # (compiled programs only: on PyTorch the cond would be one more host read).
        free = ops.ones_like(c0, dtype="bool")
        if b is not None:
            free = ops.logical_and(free, 1.0 <= b * c0)
        if a is not None:
            free = ops.logical_and(free, reduce_min(e, -1, keepdims=True) > a * c0)
        s, big_e, none_clamped = ops.cond(
            ops.all(free), lambda: (ops.ones_like(c0), sum_e, free), at_nu0
        )
    else:
        s, big_e, none_clamped = at_nu0()
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
    # PyTorch: straight-line rounds, one read each of "all done" and "all converged" (a done
    # row's trip is a no-op: its nu, bracket and flags stay, its sums are recomputed at nu).
    out, known = _while_loop(
        cond, body, loop_vars, max_iter, _NEWTON_ROUNDS, lambda *v: (ops.all(v[-1]),)
    )
    _, nu, _, _, s, big_e, _, conv = out
    return nu, s, big_e, e, a_cmp, b_cmp, ops.all(conv) if known is None else known[0]


def _solution_at(e, a, b, a_cmp, b_cmp, nu, s, big_e):
    """``y`` and the state codes at the root ``nu`` whose pattern has the sums ``s``, ``E``:
    bounds on U/L, the free coordinates ``exp(x)`` scaled to the mass left (one pass)."""
    up, low = _pattern_at(e, a_cmp, b_cmp, ops.exp(nu))
    return _assemble(e, a, b, up, low, s, big_e)


def _solve_newton(x, a, b, positive=False):
    """Safeguarded Newton on log-free passes (docs/design/bcsoftmax.md); rows that stall, hit
    the cap or keep a free mass below ``K * tiny / eps`` (logit gaps near the float range) make
    the whole batch rerun in :func:`_solve_newton_robust` (exp per step; rare)."""
    if a is None and b is None:
        e = ops.exp(x)
        return e / ops.sum(e, -1, keepdims=True), ops.zeros_like(x, dtype="int8")
    nu, s, big_e, e, a_cmp, b_cmp, converged = _newton_root(x, a, b, positive)
    return ops.cond(
        converged,
        lambda: _solution_at(e, a, b, a_cmp, b_cmp, nu, s, big_e),
        lambda: _solve_newton_robust(x, a, b),
    )


# The candidate solver (method="newton"): at most floor(1 / min(upper)) classes sit at their
