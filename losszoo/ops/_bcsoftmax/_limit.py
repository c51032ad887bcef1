"""The ``tau -> 0`` limit of BCSoftmax (the bounds' linear program, ties sharing by water
filling) and the repair of the rows no solver could represent (``docs/design/bcsoftmax.md``,
"Tiny and subnormal temperatures")."""

from __future__ import annotations

import numpy as np
from keras import ops

from losszoo._backend import (
    divide_no_nan,
    maximum,
    minimum,
    take_along_axis,
)
from losszoo.contract import dtype_name

from ._common import FREE, LOWER, UPPER, _bound_sum, _clip, _info, _repeat


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
    rem = 1.0 - _bound_sum(lo_b, x)
    k = x.shape[-1]
    xs = -ops.sort(-ops.where(alive, x, -np.inf), axis=-1)  # descending

    def above(v):  # capacity of the classes strictly above level v
        return ops.sum(ops.where(x > v, cap, zero), -1, keepdims=True)

    def search(lo, hi):  # one step of the binary search (a loop trip: one copy compiled)
        mid = (lo + hi + 1) // 2
        v = take_along_axis(xs, maximum(mid, 0), axis=-1)
        ok = ops.logical_and(above(v) < rem, ops.isfinite(v))
        active = lo < hi
        lo = ops.where(ops.logical_and(active, ok), mid, lo)
        return lo, ops.where(ops.logical_and(active, ops.logical_not(ok)), mid - 1, hi)

    # last sorted position i with above(xs_i) < rem (positions 0..K-1; -1: none)
    lo = ops.full_like(rem, -1, dtype="int32")
    lo, _ = _repeat(search, (lo, ops.full_like(lo, k - 1)), int(np.ceil(np.log2(k + 1))))
    v = ops.where(lo >= 0, take_along_axis(xs, maximum(lo, 0), axis=-1), np.inf)
    group = ops.logical_and(ops.equal(x, v), alive)
    target = rem - above(v) + ops.sum(ops.where(group, lo_b, zero), -1, keepdims=True)

    def fill(lam):
        filled = minimum(maximum(lam + zero, lo_b), up_b)
        return ops.sum(ops.where(group, filled, zero), -1, keepdims=True)

    def bisect(lam_lo, lam_hi):
        lam = 0.5 * (lam_lo + lam_hi)
        low = fill(lam) < target
        return ops.where(low, lam, lam_lo), ops.where(low, lam_hi, lam)

    steps = 64 if dtype_name(x) == "float64" else 40
    lam_lo, lam_hi = _repeat(bisect, (ops.zeros_like(rem), ops.ones_like(rem)), steps)
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
        off = ops.logical_and(off, _bound_sum(ac, xs) <= 1.0)
    if bc is not None:
        off = ops.logical_and(off, _bound_sum(bc, xs) >= 1.0)
    return off


def _limit_repair(xs, ac, bc, y, state, finish=None):
    """Rows the solver left unsolved (their sum is off) take the ``tau -> 0`` limit
    (:func:`_solve_limit`). It happens only where the scaled logit gaps exceed what the
    float type resolves (e.g. tied logits below an upper bound at ``tau = 1e-10``, where every
    ``exp`` but the row max's underflows); there the limit is the solution up to rounding.
    One row sum; the limit runs only when needed. ``finish(y)`` (e.g. the final clip) is
    applied in both branches of the ``cond``: a branch that returned ``y`` as it came would
    make XLA copy it (one more pass over [N, K])."""
    off = _not_solved(xs, ac, bc, y)
    finish = finish or (lambda t: t)

    def fix():
        y2, state2 = _solve_limit(xs, ac, bc)
        return finish(ops.where(off, y2, y)), ops.where(off, state2, state)

    return ops.cond(ops.any(off), fix, lambda: (finish(y), state))
