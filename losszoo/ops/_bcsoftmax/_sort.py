"""The spec's exact algorithms A (``method="sort"``) and B (``method="bisect"``), and the
repair of their rows that are not a solution."""

from __future__ import annotations

import numpy as np
from keras import ops

from losszoo._backend import (
    maximum,
    take_along_axis,
)
from losszoo.contract import dtype_name

from ._common import (
    _bound_sum,
    _clamp_sets,
    _clip,
    _closed_form,
    _finite_max,
    _finite_min,
    _info,
    _repeat,
)
from ._limit import _not_solved
from ._newton import _solve_newton_robust


def _log_keys(x, a, b):
    def key(t):
        return ops.where(t > 0, x - ops.log(ops.where(t > 0, t, 1.0)), np.inf)

    return (None if b is None else key(b)), (None if a is None else key(a))


def _finalize_at(x, a, b, u, lk, e_lo):
    """Spec Algorithm A steps 7-9: classify at the bracket's left end, closed form."""
    upper, lower = _clamp_sets(None if u is None else u > e_lo, None if lk is None else lk <= e_lo)
    return _closed_form(x, a, b, upper, lower)


def _phi(x, a, b, nu):
    return ops.sum(_clip(ops.exp(x - nu), a, b), -1, keepdims=True)


def _solve_sort(x, a, b):
    u, lk = _log_keys(x, a, b)
    if u is None and lk is None:
        return _finalize_at(x, a, b, u, lk, ops.full_like(x[:, :1], -np.inf))
    e = ops.sort(ops.concatenate([t for t in (u, lk) if t is not None], -1), axis=-1)
    n = e.shape[-1]
    sum_a = _bound_sum(a, x) if a is not None else ops.zeros_like(x[:, :1])

    def search(lo, hi):  # one step of the binary search (a loop trip: one copy compiled)
        mid = (lo + hi + 1) // 2
        ej = take_along_axis(e, ops.clip(mid - 1, 0, n - 1), axis=-1)
        fin = ops.isfinite(ej)
        p = ops.where(
            fin, _phi(x, a, b, ops.where(fin, ej, ops.zeros_like(ej))) >= 1.0, sum_a >= 1.0
        )
        active = lo < hi
        lo = ops.where(ops.logical_and(active, p), mid, lo)
        return lo, ops.where(ops.logical_and(active, ops.logical_not(p)), mid - 1, hi)

    lo = ops.zeros_like(x[:, :1], dtype="int32")
    lo, _ = _repeat(search, (lo, ops.full_like(lo, n)), int(np.ceil(np.log2(n + 1))))
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
            np.log(k) - ops.log(maximum(1.0 - _bound_sum(a, x), tiny)),
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


def _repair(xs, ac, bc, y, state):
    """Rows of the sort/bisect result that are not a solution (after the final clip they would
    not sum to 1) are re-solved by the robust Newton solver.

    This happens where a coordinate's two breakpoints ``x_k - log b_k`` and ``x_k - log a_k``
    round to the same float (logit gaps near 1e8 in float32): the sort/bisect bracket then
    cannot tell ``F`` from ``L``/``U`` and the closed form lands outside the box. The robust
    solver classifies from ``exp(x - nu)`` and falls back to the bracket test (see
    :func:`_solve_newton_robust`). One extra sum per row; the fallback runs only when needed.
    """
    off = _not_solved(xs, ac, bc, y)

    def fix():
        y2, state2 = _solve_newton_robust(xs, ac, bc)
        return ops.where(off, y2, y), ops.where(off, state2, state)

    return ops.cond(ops.any(off), fix, lambda: (y, state))
