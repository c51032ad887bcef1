"""BCSoftmax by upper-set candidates and monotone model steps (``method="newton"`` at a
temperature below 1): the same work at every temperature (``docs/design/bcsoftmax.md``,
"Forward algorithms")."""

from __future__ import annotations

import numpy as np
from keras import ops

from losszoo._backend import (
    maximum,
    minimum,
    reduce_max,
    reduce_min,
    take_along_axis,
)
from losszoo.contract import dtype_name

from ._common import _assemble, _bound_take, _comparison_bounds, _info, _pattern_at, _while_loop
from ._newton import _solve_newton

# upper bound. With bounds known only when the program runs, the solver takes _N_UPPER
# candidates; rows with more classes at the upper bound go to the safeguarded Newton solver.
_N_UPPER = 16
_N_UPPER_MAX = 64
_MAX_STEPS = 8
# Trips run as straight-line code on PyTorch before each host read, with lower bounds (3 trips
# for nearly every batch tried, 4 for a few); without them the loop has one trip.
_ROUNDS = (3, _MAX_STEPS + 1 - 3)


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


def _solve_candidates(x, a, b, n_upper=_N_UPPER, uniform_upper=False, positive=False):
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
    a_cmp, b_cmp = _comparison_bounds(x, a, b, positive)
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
        ec = take_along_axis(e, idx, axis=-1)
        bv, bcm = (_bound_take(t, idx, x) for t in (b, b_cmp))
        av = acm = None
        if a is not None:
            av, acm = (_bound_take(t, idx, x) for t in (a, a_cmp))
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
        # scalar zeros: a [N, K] zero made outside the loop would be written to memory
        mass_a = ops.sum(ops.where(low, a, 0.0), -1, keepdims=True)
        return mass_a, ops.sum(ops.where(free, e, 0.0), -1, keepdims=True)

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

    def cond(c, mass_a, mass_e, s, ef, conv, left):
        return ops.logical_not(ops.all(ops.logical_or(conv, left)))

    def body(c, mass_a, mass_e, s, ef, conv, left):
        # One monotone step for the rows still going, from the model linearised at c.
        active = ops.logical_not(ops.logical_or(conv, left))
        c2 = model_root(mass_a, mass_e, c)
        a2, e2 = others_at(c2)
        conv2, left2, s2, ef2 = residual(c2, a2, e2)
        new = (c2, a2, e2, s2, ef2, conv2, left2)
        old = (c, mass_a, mass_e, s, ef, conv, left)
        return tuple(ops.where(active, n, o) for n, o in zip(new, old))

    # The first trip linearises at c_lo (<= the root, so the model is below phi from there
    # on): one trip fewer at low temperatures than from c = 0 with every other class free
    # (1024x4096, T = 0.1: 3 trips instead of 4), for one more sum before the loop. Without
    # lower bounds the other classes are all free and that step is exact: one trip.
    zero1 = ops.zeros_like(c_lo)
    false1 = ops.zeros_like(c_lo, dtype="bool")
    a0, e0 = (zero1, e_others) if a is None else others_at(c_lo)
    state = (c_lo, a0, e0, zero1, zero1, false1, false1)

    def unsolved(c, conv, left):
        """The rows :func:`_solve_newton` takes over ([N, 1])."""
        bad = ops.logical_or(ops.logical_not(conv), left)
        bad = ops.logical_or(bad, ops.logical_not(ops.isfinite(c)))
        if m:
            # a candidate whose exp was capped is only exact at its upper bound
            capped = ops.logical_and(valid, take_along_axis(x, idx, axis=-1) - sigma >= cap)
            capped = ops.logical_and(capped, ops.logical_not(cand_pattern(c)[0]))
            bad = ops.logical_or(bad, ops.any(capped, -1, keepdims=True))
        return bad

    trips = 1 if a is None else _MAX_STEPS + 1
    # PyTorch: straight-line rounds, one read each of "all stopped" and "any unsolved" (a
    # stopped row's trip is a no-op: the body keeps its old values).
    rounds = (1,) if a is None else _ROUNDS
    (c, _, _, s, ef, conv, left), known = _while_loop(
        cond, body, state, trips, rounds, lambda c, *v: (ops.any(unsolved(c, v[-2], v[-1])),)
    )
    bad = unsolved(c, conv, left)

    def solution():
        return _assemble(e, a, b, *_pattern_at(e, a_cmp, b_cmp, c), s, ef)

    def fallback():
        y, state = solution()
        y2, state2 = _solve_newton(x, a, b, positive)
        return ops.where(bad, y2, y), ops.where(bad, state2, state)

    # the closed form in both branches: a branch returning its operands makes XLA copy them
    return ops.cond(ops.any(bad) if known is None else known[0], fallback, solution)
