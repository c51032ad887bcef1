"""Interior point (Mehrotra predictor-corrector) on the tie-reduced block chain.

Ties are pooled into blocks (exact), two-block rows (one-hot labels) are solved in closed
form, the others iterate on the tail masses ``U`` of the chain with one pentadiagonal
Newton solve (:mod:`._banded`) per iteration. Returns the primal iterate and the dual point
for the caller to certify on the original constraints. Derivation:
``docs/design/possibilistic_solver.md``. Written with ``keras.ops`` in float64.
"""

import numpy as np
from keras import ops

from losszoo import _backend
from losszoo._backend import compiled, maximum, minimum
from losszoo.ops.possibilistic._banded import penta_factor, penta_solve
from losszoo.ops.possibilistic._certificates import (
    _chain_violation_and_gap,
    _dual_slacks,
    _fold,
    _normalize_log,
    _rcumsum,
)
from losszoo.ops.possibilistic._config import F64, _0, _1
from losszoo.ops.possibilistic._constraints import antipignistic_sorted
from losszoo.ops.possibilistic._dykstra import _compacted_size, run_in_stages

_IPM_STEP = 0.99  # fraction to the boundary
_IPM_MASS_STEP = 0.9  # masses shrink at most 10x per iteration
_IPM_SIGMA_FLOOR = np.float64(0.01)  # mu falls at most 100x per iteration
_IPM_MAX_ITER = 60
# The primal aims this factor below the certificate (gap 1e-10 only bounds |p - p*|_1 by
# 1.4e-5); Mehrotra's steps converge superlinearly at the end: a few iterations.
_IPM_SHARPEN = 1e-5


def _prev(x):
    return ops.concatenate([ops.zeros_like(x[:1]), x[:-1]], axis=0)


def _next(x):
    return ops.concatenate([x[1:], ops.zeros_like(x[:1])], axis=0)


def _cumsum_rows(x):
    """Inclusive cumulative sum along axis 1 of ``[B, K]`` (doubling scan; XLA-friendly)."""
    return ops.transpose(ops.flip(_rcumsum(ops.flip(ops.transpose(x), 0)), 0))


def _block_starts(strict, in_support):
    """``[B, K]`` bool: the sorted class opens a block (a strict drop before it)."""
    return ops.concatenate([ops.ones_like(strict[:, :1]), strict], axis=1) & in_support


def _reduce_ties(lq, cons, in_support, size):
    """Pool tied classes into blocks (batch-major [B, K] sorted log q and constraints).

    ``size`` (static, >= the largest block count of the batch) is the length of the block
    axis. Returns time-major block data: ``w`` block sizes [size, B] (1 on padding), ``g``
    log of the block reference mass ``w * geomean(q)`` [size, B], ``c`` ceiling
    (possibility of the next block) [size-1, B], ``lo``/``up`` shape bounds between
    consecutive blocks [size-1, B], ``real`` [size, B] / ``var`` [size-1, B] masks, ``bid``
    [B, K] block id of each sorted class.
    """
    pt, strict = cons.sorted_possibility, cons.strict
    batch = ops.shape(pt)[0]
    start = _block_starts(strict, in_support)
    bid = _cumsum_rows(ops.cast(start, "int32")) - 1
    bid = ops.where(in_support, bid, size)  # classes outside the support: a dropped segment
    n_blocks = ops.sum(ops.cast(start, "int32"), axis=1)
    ids = bid + ops.arange(batch, dtype="int32")[:, None] * (size + 1)
    ends = ops.concatenate([strict, ops.zeros_like(strict[:, :1])], axis=1)  # pair (r, r+1) strict
    pad0 = ops.zeros_like(pt[:, :1])
    # All block sums in one scatter (XLA:CPU scatters update by update): sizes, sums of
    # log q, the block's possibility, the shape bounds at its end, its antipignistic mass.
    columns = [
        ops.cast(in_support, F64),
        ops.where(in_support, lq, 0.0),
        ops.where(start, pt, 0.0),
        ops.where(ends, ops.concatenate([cons.gap_lower, pad0], 1), 0.0),
        ops.where(ends, ops.concatenate([cons.gap_upper, pad0], 1), 0.0),
        ops.where(in_support, antipignistic_sorted(pt), 0.0),
    ]
    sums = ops.segment_sum(
        ops.reshape(ops.stack(columns, -1), (-1, len(columns))),
        ops.reshape(ids, (-1,)),
        num_segments=batch * (size + 1),
    )
    w, slq, pblock, lob, upb, mdot = ops.unstack(
        ops.reshape(sums, (batch, size + 1, len(columns)))[:, :size], axis=-1
    )
    jj = ops.arange(size, dtype="int32")[None, :]
    real = jj < n_blocks[:, None]
    w_safe = ops.where(real, w, 1.0)
    g = ops.where(real, slq / w_safe + ops.log(w_safe), 0.0)
    lob, upb = lob[:, :-1], upb[:, :-1]
    var = jj[:, :-1] < (n_blocks - 1)[:, None]
    c = pblock[:, 1:]
    tm = ops.transpose
    return {
        "mdot": tm(mdot),
        "w": tm(w_safe),
        "g": tm(g),
        "c": tm(c),
        "lo": tm(lob),
        "up": tm(upb),
        "real": tm(real),
        "var": tm(var),
        "bid": minimum(bid, size - 1),
        "n_blocks": n_blocks,
    }


def _ipm_dual_point(red, lam1, lam2, lam3):
    """Block log-masses of the dual point ``softmax(G + A^T lam)`` (normalised), [K, B]."""
    big_lam = ops.concatenate([_rcumsum(lam1), ops.zeros_like(lam1[:1])], 0)
    nu = ops.concatenate([lam2 - lam3, ops.zeros_like(lam2[:1])], 0)
    x = red["g"] + big_lam + (nu - _prev(nu)) / red["w"]
    x = ops.where(red["real"], x, -np.inf)
    return _normalize_log(x)


# The certificate is evaluated only once some row's complementarity n_con * mu is within
# this factor of gap_tol: before that the gap, which is at least about n_con * mu on a
# feasible iterate, cannot pass (skipping it only delays a stop, never changes a result).
_IPM_CERTIFY_FROM = 1e3


def _ipm_body(red, tol, gap_tol):
    """One Mehrotra predictor-corrector iteration on the tail masses ``U`` of the chain.

    Time-major, batch last: ``red`` holds the block chain (see :func:`_reduce_ties`),
    ``tol`` / ``gap_tol`` the certificate's tolerances. The three constraint families
    (ceiling, lower and upper shape bounds) are stacked on a leading axis: slacks ``s`` and
    multipliers ``lam`` are [3, J-1, B]. Returns the while-loop body over the state
    ``(it, u, s, lam, active, iters, best_score, best_u, best_lam)`` and ``start(m0)``,
    the starting ``(u, s, lam)`` from block masses ``m0`` [J, B] (> 0 on real blocks).
    """
    var = red["var"]
    var3 = var[None]
    real = red["real"]
    w = red["w"]
    iw = 1.0 / w
    kk = ops.arange(var.shape[0], dtype="int32")[:, None]
    zero = ops.zeros_like(red["c"])
    var_next = _next(var)
    a_c = ops.where(var & (kk >= 1), iw[:-1], 0.0)  # coefficient of shape j on U_{j-1}
    b_c = ops.where(var, -(iw[:-1] + iw[1:]), 0.0)  # on U_j
    g_c = ops.where(var & var_next, iw[1:], 0.0)  # on U_{j+1}
    n_con = maximum(3.0 * ops.sum(ops.cast(var, F64), axis=0), _1)
    cert_mu = _IPM_CERTIFY_FROM * gap_tol / n_con
    inf = ops.convert_to_tensor(np.inf, F64)
    one = ops.convert_to_tensor(1.0, F64)

    def shape_of(du):  # S du
        return a_c * _prev(du) + b_c * du + g_c * _next(du)

    def shape_t(z):  # S^T z
        return _next(a_c * z) + b_c * z + _prev(g_c * z)

    def masses(u):
        ext_prev = ops.concatenate([ops.ones_like(u[:1]), u], 0)
        ext_cur = ops.concatenate([u, ops.zeros_like(u[:1])], 0)
        return ops.where(real, ext_prev - ext_cur, 0.0)

    def constraints(u):
        """Block masses and the stacked constraint values (slacks at ``u``)."""
        m = masses(u)
        v = m / w
        sh = v[:-1] - v[1:]
        return m, ops.stack([red["c"] - u, sh - red["lo"], red["up"] - sh])

    def max_step(mask, *pairs):
        """Longest step along each ``dx`` keeping each ``x > 0`` (per row), over pairs."""
        ratio = None
        for x, dx in pairs:
            r = ops.where(mask & (dx < 0.0), -x / ops.where(dx < 0.0, dx, -1.0), inf)
            ratio = r if ratio is None else minimum(ratio, r)
        return ops.min(ratio if len(ratio.shape) == 2 else _fold(minimum, ratio), 0)

    def mean_comp(s, lam):
        return ops.sum(_fold(ops.add, ops.where(var3, s * lam, 0.0)), axis=0) / n_con

    def start(m0):
        u0 = ops.where(var, _rcumsum(m0, exclusive=True)[:-1], 0.0)
        s0 = ops.where(var3, maximum(constraints(u0)[1], np.float64(1e-2)), 1.0)
        return u0, s0, ops.where(var3, ops.ones_like(s0), 0.0)

    def body(it, u, s, lam, active, iters, best_score, best_u, best_lam):
        m, y = constraints(u)
        mu = mean_comp(s, lam)
        # The masses carry a barrier -t log m (t = mu / 10): entropy alone lets a Newton
        # step drive a small mass 100x down per iteration, after which it recovers by only
        # a factor ~|log m| per iteration.
        t_mass = 0.1 * mu
        safe_m = ops.where(real & (m > 0.0), m, 1.0)
        ell = ops.where(real, ops.log(safe_m) - red["g"] - t_mass / safe_m, 0.0)
        grad = ops.where(var, ell[1:] - ell[:-1], 0.0)
        r_d = ops.where(var, grad + lam[0] - shape_t(lam[1] - lam[2]), 0.0)
        rp = ops.where(var3, y - s, 0.0)
        wl = lam / s  # 0 off the chain (s = 1, lam = 0 there)
        w1, w2 = wl[0], wl[1] + wl[2]
        im = ops.where(real & (m > 0.0), (1.0 + t_mass / safe_m) / safe_m, 0.0)
        d0 = im[:-1] + im[1:] + w1 + _next(w2 * a_c * a_c) + w2 * b_c * b_c + _prev(w2 * g_c * g_c)
        d1 = -im[1:] + _next(w2 * a_c * b_c) + w2 * b_c * g_c
        d2 = _next(w2 * a_c * g_c)
        d0 = ops.where(var, d0, 1.0)
        d1 = ops.where(var & var_next, d1, 0.0)
        d2 = ops.where(var & _next(var_next), d2, 0.0)
        factors, dropped = penta_factor(d0, d1, d2)

        def direction(rc):
            """Newton step for the stacked complementarity residuals ``rc``."""
            psi = ops.where(var3, (rc + lam * rp) / s, 0.0)
            rhs = ops.where(var, -r_d + psi[0] - shape_t(psi[1] - psi[2]), 0.0)
            du = ops.where(var, penta_solve(factors, rhs), 0.0)
            dsh = shape_of(du)
            ds = ops.where(var3, ops.stack([-du, dsh, -dsh]) + rp, 0.0)
            dl = ops.where(var3, -(rc + lam * ds) / s, 0.0)
            return du, ds, dl

        # Mehrotra predictor-corrector: the affine step (no centring) measures how far the
        # complementarity can fall; sigma = (mu_aff / mu)^3 centres only as much as needed,
        # and the corrector adds the second-order term ds_aff * dl_aff. Same factors. The
        # two solves are the two trips of one loop, so that the program holds one copy of
        # the banded solve (its levels are unrolled): half the solve's compile.
        def solve_trip(trip, rc, du, ds, dl):
            du, ds_a, dl_a = direction(rc)
            a_aff = minimum(one, max_step(var3, (s, ds_a), (lam, dl_a)))
            mu_aff = mean_comp(s + a_aff * ds_a, lam + a_aff * dl_a)
            sigma = ops.clip((mu_aff / ops.where(mu > 0.0, mu, 1.0)) ** 3, _IPM_SIGMA_FLOOR, _1)
            return trip + 1, lam * s + ds_a * dl_a - sigma * mu, du, ds_a, dl_a

        _, _, du, ds, dl = ops.while_loop(
            lambda trip, *_: trip < 2,
            solve_trip,
            (ops.convert_to_tensor(0, "int32"), lam * s, ops.zeros_like(u), s, lam),
            maximum_iterations=2,
        )
        du_ext = ops.concatenate([du, zero[:1]], 0)  # dU_{J-1} = 0
        dm = ops.where(real, _prev(du_ext) - du_ext, 0.0)  # dm_j = dU_{j-1} - dU_j
        alpha = minimum(
            one,
            minimum(
                _IPM_STEP * max_step(var3, (s, ds), (lam, dl)),
                _IPM_MASS_STEP * max_step(real, (m, dm)),
            ),
        )
        nu_ = u + alpha * du
        ns, nl = s + alpha * ds, lam + alpha * dl
        # Rows whose step is not finite (exhausted float64 near the solution) stop here.
        ok = ops.isfinite(ns) & ops.isfinite(nl) & (((ns > 0.0) & (nl > 0.0)) | ~var3)
        fin = ops.all(ops.isfinite(nu_) & _fold(ops.logical_and, ok), axis=0)
        # A dropped pivot means float64 is exhausted in the Newton matrix: a row already
        # certified stops there (its best iterate stands), others go on with that
        # component of the step set to 0.
        run = active & fin & ~(dropped & (best_score <= 1.0))
        u = ops.where(run, nu_, u)
        s, lam = ops.where(run, ns, s), ops.where(run, nl, lam)

        def certify():
            # The primal iterate's and the dual point's certificates in one call on [., 2B]
            # (one copy of the certificate's program; the dual one is only used once a
            # primal score is below _IPM_SHARPEN).
            m, y = constraints(u)
            xm = _ipm_dual_point(red, *ops.unstack(lam))
            m_d, y_d = _dual_slacks(red, xm)
            red2 = {key: ops.concatenate([red[key]] * 2, -1) for key in ("var", "w", "real")}
            cat = ops.concatenate
            big_v, gap = _chain_violation_and_gap(
                red2, cat([m, m_d], -1), cat([y, y_d], -1), cat([xm, xm], -1), cat([lam, lam], -1)
            )
            (v_p, v_d), (gap_p, gap_d) = ops.split(big_v, 2), ops.split(gap, 2)
            score = maximum(v_p / tol, ops.abs(gap_p) / gap_tol)
            return score, (v_d <= tol) & (ops.abs(gap_d) <= gap_tol)

        score, dual_ok = ops.cond(
            ops.any(run & (mean_comp(s, lam) <= cert_mu)),
            certify,
            lambda: (ops.full_like(run, np.inf, F64), ops.zeros_like(run)),
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
        best_u = ops.where(better, u, best_u)
        best_lam = ops.where(better, lam, best_lam)
        best_score = ops.where(better, score, best_score)
        iters = iters + ops.cast(run, "int32")
        return it + 1, u, s, lam, run & ~done, iters, best_score, best_u, best_lam

    return body, start


_IPM_CHAIN = ("w", "g", "c", "lo", "up", "real", "var")
# Rows finish after 10 to 20 iterations and an iteration costs about in proportion to the
# batch: once at most a quarter of the rows are active, they go on in a batch a quarter as
# wide (one more compiled copy of the iteration). Below 128 rows the iteration costs little
# more than its kernel launches, so the copy (a quarter of the program) is not compiled.
_IPM_COMPACT_MIN_BATCH = 128
_IPM_COMPACT_FACTOR = 4


def _ipm_core(red, m0, active, tol, gap_tol):
    """The interior point from block masses ``m0`` [J, B] for the ``active`` rows [B].

    Returns the best iterate by the certificate score: ``U`` [J-1, B],
    ``(lam1, lam2, lam3)`` [J-1, B] (ceiling, lower and upper shape multipliers), and the
    iteration count [B].
    """
    chain = {key: red[key] for key in _IPM_CHAIN}
    body, start = _ipm_body(chain, tol, gap_tol)
    u0, s0, l0 = start(m0)
    size = _compacted_size(active, _IPM_COMPACT_MIN_BATCH, _IPM_COMPACT_FACTOR)
    state = (
        ops.convert_to_tensor(0, "int32"),
        u0,
        s0,
        l0,
        active,
        ops.zeros_like(active, "int32"),
        ops.full_like(active, np.inf, F64),
        u0,
        ops.zeros_like(s0),
    )

    def loop(data, state, nxt):
        def cond(it, u, s, lam, active, *_):
            return (it < _IPM_MAX_ITER) & (ops.sum(ops.cast(active, "int32")) > nxt)

        # The first stage runs the body built for ``start``; a compacted one builds its own.
        step = body if data is chain else _ipm_body(data, tol, gap_tol)[0]
        return ops.while_loop(cond, step, state)

    state = run_in_stages(loop, chain, state, size)
    return state[7], tuple(ops.unstack(state[8])), state[5]


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
    top = minimum(c, shape_top)
    bottom = maximum((1.0 / w1 - up) / h, _0)
    free = ops.sigmoid(g2 - g1)
    m2 = ops.clip(free, bottom, top)
    t = ops.log1p(-m2) - ops.log(m2) - (g1 - g2)
    above, below = free > top, free < bottom
    zero = ops.zeros_like(t)
    l1 = ops.where(above & (c <= shape_top), t, zero)
    l2 = ops.where(above & (c > shape_top), t / h, zero)
    l3 = ops.where(below, -t / h, zero)
    first = (ops.arange(red["c"].shape[0], dtype="int32") == 0)[:, None]
    return ops.where(first, m2, 0.0), [ops.where(first, v, 0.0) for v in (l1, l2, l3)]


_IPM_SMALL_CHAIN = 128


def _ipm_solve(lq, cons, run, tol, gap_tol):
    """Interior-point projection in sorted coordinates: batch-major ``[B, K]`` sorted log q
    and :class:`PossibilityConstraints` ``cons``, for the rows ``run`` [B].

    Returns ``x_primal``, ``x_dual`` ([K, B] normalised log projections: the primal
    iterate and the dual point of ``lam``, for the caller to certify), ``lam`` [3, m1, B]
    multipliers in the original constraint indexing (inner tie pairs carry the signed
    multiplier that makes the tied coordinates equal), iterations [B].

    The interior point's sequential sweeps run over blocks, not classes: a batch whose rows
    all have at most ``_IPM_SMALL_CHAIN`` distinct possibility levels (graded labels, ratings)
    is solved on a chain of that length whatever K is (a ``cond``, both compiled).
    """
    args = (lq, cons, run, tol, gap_tol)
    k = lq.shape[-1]
    if k <= _IPM_SMALL_CHAIN:
        return _ipm_solve_blocks(*args, size=k)
    in_support = cons.sorted_possibility > 0.0
    n_blocks = ops.sum(ops.cast(_block_starts(cons.strict, in_support), "int32"), axis=1)
    return ops.cond(
        ops.max(n_blocks) <= _IPM_SMALL_CHAIN,
        lambda: _ipm_solve_blocks(*args, size=_IPM_SMALL_CHAIN),
        lambda: _ipm_solve_blocks(*args, size=k),
    )


def _ipm_solve_blocks(lq, cons, run, tol, gap_tol, size):
    """:func:`_ipm_solve` on a block axis of static length ``size``."""
    pt, strict = cons.sorted_possibility, cons.strict
    in_support = pt > 0.0
    red = _reduce_ties(lq, cons, in_support, size)
    qm = ops.exp(_normalize_log(ops.where(red["real"], red["g"], -np.inf)))
    mdot = red["mdot"] / ops.sum(red["mdot"], axis=0, keepdims=True)
    m0 = ops.where(red["real"], 0.5 * qm + 0.5 * mdot, 0.0)
    two = red["n_blocks"] == 2
    u, (lam1, lam2, lam3), iters = _ipm_core(red, m0, run & ~two, tol, gap_tol)
    u2, lams2 = _two_block(red)
    sel = two[None, :]
    u = ops.where(sel, u2, u)
    lam1, lam2, lam3 = [ops.where(sel, a, b) for a, b in zip(lams2, (lam1, lam2, lam3))]
    # Two candidates, both certified by the caller on the original constraints: the
    # primal iterate (feasible; the exact duality gap against lam) and the dual point.
    ext = ops.concatenate([ops.ones_like(u[:1]), u, ops.zeros_like(u[:1])], 0)
    xm_primal = ops.log(ops.where(red["real"], ext[:-1] - ext[1:], 1.0))
    xm_dual = _ipm_dual_point(red, lam1, lam2, lam3)

    # Back to classes with one gather of a [B, blocks, 10] table (XLA:CPU gathers index by
    # index). Multipliers in the original indexing: boundary r of block j carries block j's
    # values; inside a tie block, nu_r = mu_r (lower minus upper) solves the stationarity
    # of the tied coordinates:
    # mu_i - mu_{i-1} = (block mean of log q) - log q_i + (nu_j - nu_{j-1})/w_j.
    def batch_major(x):  # [size or size-1, B] -> [B, size]
        x = ops.transpose(x)
        return ops.concatenate([x, ops.zeros_like(pt[:, : size - x.shape[1]])], 1)

    log_w = ops.log(red["w"])
    w_b = ops.transpose(red["w"])
    nu_b = batch_major(lam2 - lam3)
    table = [batch_major(t) for t in (xm_primal - log_w, xm_dual - log_w, red["w"])]
    table.append(batch_major(red["g"] - log_w))  # block mean of log q
    table += [nu_b, ops.concatenate([ops.zeros_like(nu_b[:, :1]), nu_b[:, :-1]], 1)]
    table.append(_cumsum_rows(w_b) - w_b)  # first sorted class of the block
    table += [batch_major(t) for t in (lam1, lam2, lam3)]
    rows = red["bid"] + ops.arange(ops.shape(pt)[0], dtype="int32")[:, None] * size
    per_cls = _backend.take(ops.reshape(ops.stack(table, -1), (-1, len(table))), rows, axis=0)
    x_primal, x_dual, w_cls, mean_lq, nu, nu_prev, first, l1c, l2c, l3c = ops.unstack(
        per_cls, axis=-1
    )
    step = ops.where(
        in_support, mean_lq - ops.where(in_support, lq, 0.0) + (nu - nu_prev) / w_cls, 0.0
    )
    csum = _cumsum_rows(step)
    base = _backend.take_along_axis(csum - step, ops.cast(first, "int32"))  # before the block
    mu = ops.where(strict, nu[:, :-1], (nu_prev + csum - base)[:, :-1])
    mu = ops.where(in_support[:, 1:], mu, 0.0)
    lp = ops.where(strict, l1c[:, :-1], 0.0)
    ll = ops.where(strict, l2c[:, :-1], maximum(mu, _0))
    lu = ops.where(strict, l3c[:, :-1], maximum(-mu, _0))
    lam = ops.stack([ops.transpose(lp), ops.transpose(ll), ops.transpose(lu)], 0)

    def per_class(x):
        return ops.transpose(ops.where(in_support, x, -np.inf))

    return per_class(x_primal), per_class(x_dual), lam, iters


IPM_JIT = compiled(_ipm_solve)
