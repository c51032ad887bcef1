"""Banded linear algebra: ``H x = r`` for a batch of SPD pentadiagonal ``H`` by cyclic reduction.

``H`` is read as block tridiagonal in 2x2 blocks; :func:`penta_factor` eliminates the odd
blocks level after level (``log2 n`` stages of batched 2x2 arithmetic instead of ``n``
sequential steps) and :func:`penta_solve` reuses the factors for each right-hand side.
Time-major: ``[n, B]``, ``B`` may be unknown. Used by the interior point's Newton systems;
derivation in ``docs/design/possibilistic_solver.md``. Written with ``keras.ops`` (any dtype;
the interior point calls it in float64).
"""

from keras import ops

from losszoo import _backend
from losszoo._backend import maximum

# Blocks X_k = (x_2k, x_2k+1). Cyclic reduction is the block Cholesky factorisation of the
# matrix in odd-even order (backward stable like any symmetric ordering of Cholesky: the
# updates are Gram matrices of triangular solves, never explicit inverses). Blocks carry
# their entries on a leading axis of [entries, n, B] tensors, so that XLA writes one array
# per quantity and level: general [p, q, r, s] = [[p, q], [r, s]], symmetric
# [a, b, c] = [[a, b], [b, c]], lower triangular [l00, l10, l11], vectors [v0, v1].


def _shift_down(x):  # x[:, i - 1] along the block axis (0 first)
    return ops.pad(x[:, :-1], [[0, 0], [1, 0], [0, 0]])


def _shift_up(x):  # x[:, i + 1] along the block axis (0 last)
    return ops.pad(x[:, 1:], [[0, 0], [0, 1], [0, 0]])


def _chol2(d, tiny):
    """``L`` of ``D = L L^T`` as ``[1/l00, l10, 1/l11]``: the solves then only multiply,
    which XLA may recompute inside each consumer (a divide it materialises).

    A pivot at or below ``tiny`` (per row: 1e-30 of the largest diagonal entry) is rounding
    noise of a nearly singular Newton matrix at the end of the interior point; it is
    dropped (``1/l = 0``: that component of the step is 0), as in the modified Cholesky
    of interior-point codes, instead of blowing up to inf / NaN in the next level. A NaN
    pivot is dropped too.
    """
    a, b, c = ops.unstack(d)
    il00 = ops.where(a > tiny, ops.rsqrt(maximum(a, tiny)), 0.0)
    l10 = b * il00
    schur = c - l10 * l10
    il11 = ops.where(schur > tiny, ops.rsqrt(maximum(schur, tiny)), 0.0)
    return ops.stack([il00, l10, il11])


def _lsolve(chol, v0, v1):  # L^{-1} (v0, v1)
    il00, l10, il11 = ops.unstack(chol)
    y0 = v0 * il00
    return y0, (v1 - l10 * y0) * il11


def _ltsolve(chol, v):  # L^{-T} v, stacked
    il00, l10, il11 = ops.unstack(chol)
    x1 = v[1] * il11
    return ops.stack([(v[0] - l10 * x1) * il00, x1])


def _mv(g, v):  # g v, stacked
    p, q, r, s = ops.unstack(g)
    return ops.stack([p * v[0] + q * v[1], r * v[0] + s * v[1]])


def _mtv(g, v):  # g^T v, stacked
    p, q, r, s = ops.unstack(g)
    return ops.stack([p * v[0] + r * v[1], q * v[0] + s * v[1]])


def _level(dd, cc, tiny):
    """One level of cyclic reduction on ``dd`` [3, m, B], ``cc`` [4, m, B] (``m`` even):
    ``(chol, ef)`` of the odd blocks and the reduced ``(dd, cc)`` of size ``m / 2``."""
    chol = _chol2(dd[:, 1::2], tiny)
    p, q, r, s = ops.unstack(cc[:, 0::2])
    e00, e01 = _lsolve(chol, p, q)  # rows of C_even L^{-T}
    e10, e11 = _lsolve(chol, r, s)
    p, q, r, s = ops.unstack(cc[:, 1::2])
    f00, f10 = _lsolve(chol, p, r)  # columns of L^{-1} C_odd
    f01, f11 = _lsolve(chol, q, s)
    ef = ops.stack([e00, e01, e10, e11, f00, f01, f10, f11])  # kept for the solves
    # The products below read the stored E, F (XLA would otherwise recompute them).
    e00, e01, e10, e11, f00, f01, f10, f11 = ops.unstack(ef)
    ee = ops.stack([e00 * e00 + e01 * e01, e00 * e10 + e01 * e11, e10 * e10 + e11 * e11])
    ff = ops.stack([f00 * f00 + f10 * f10, f00 * f01 + f10 * f11, f01 * f01 + f11 * f11])
    dd = dd[:, 0::2] - ee - _shift_down(ff)
    cc = -ops.stack(
        [
            e00 * f00 + e01 * f10,
            e00 * f01 + e01 * f11,
            e10 * f00 + e11 * f10,
            e10 * f01 + e11 * f11,
        ]
    )
    return chol, ef, dd, cc


# Levels on at most this many blocks run as the trips of one loop on arrays of that size
# (the reduced system in front, identity blocks behind): one compiled copy of a level
# instead of log2 of them. Larger levels stay unrolled (each on its own size), so the
# rolled trips add at most ``_ROLL_BLOCKS / 2`` block rows of work per level.
_ROLL_BLOCKS = 16


def _identity_tail(dd, cc):
    """``dd``, ``cc`` of half the size padded back with identity blocks and zero couplings."""
    pad_d = ops.stack([ops.ones_like(dd[0]), ops.zeros_like(dd[0]), ops.ones_like(dd[0])])
    return ops.concatenate([dd, pad_d], 1), ops.concatenate([cc, ops.zeros_like(cc)], 1)


def penta_factor(d0, d1, d2):
    """Cyclic-reduction factorisation of an SPD pentadiagonal ``H`` (time-major ``[n, B]``).

    ``d0[i] = H[i, i]``, ``d1[i] = H[i, i+1]``, ``d2[i] = H[i, i+2]``; entries that would
    reach past row ``n - 1`` must be 0. The system is padded with identity rows to ``2N``
    (``N`` a power of two) and read as ``N`` block rows
    ``C_{k-1}^T X_{k-1} + D_k X_k + C_k X_{k+1} = R_k``. One level factors the odd blocks,
    ``D_2i+1 = L L^T``, and keeps the even ones with ``E_i = C_2i L^{-T}``,
    ``F_i = L^{-1} C_2i+1``: ``D'_i = D_2i - E_i E_i^T - F_i-1^T F_i-1`` and
    ``C'_i = -E_i F_i``. Levels on more than ``_ROLL_BLOCKS`` blocks are unrolled; the
    last ``log2`` of at most that many run in a loop on a fixed size (same arithmetic on the
    blocks that are left). Returns the factors (the unrolled levels' ``(L, [E, F])``, the
    rolled levels' stacked ``(L, [E, F])`` and the last block's ``L``, in the form of
    :func:`_chol2`) and, per row, whether a pivot was dropped.
    """
    n = d0.shape[0]
    half = 1 << (max(1, -(-n // 2)) - 1).bit_length()

    def padded(x, fill):
        return ops.pad(x, [[0, 2 * half - n], [0, 0]], constant_values=fill)

    tiny = 1e-30 * ops.max(ops.abs(d0), axis=0)
    d0, d1, d2 = padded(d0, 1.0), padded(d1, 0.0), padded(d2, 0.0)
    dd = ops.stack([d0[0::2], d1[0::2], d0[1::2]])
    cc = ops.stack([d2[0::2], ops.zeros_like(d2[0::2]), d1[1::2], d2[1::2]])
    levels = []
    while dd.shape[1] > _ROLL_BLOCKS:
        chol, ef, dd, cc = _level(dd, cc, tiny)
        levels.append((chol, ef))
    # A dropped pivot is a stored 0 (a kept one has a positive reciprocal square root).
    # Read from the stored factors: testing the pivots themselves, XLA recomputed the
    # whole factorisation inside the reduction (10% of a training step at K = 64).
    pivots = [chol[::2] for chol, _ in levels]
    size = dd.shape[1]
    trips = size.bit_length() - 1
    rolled = None
    if trips:
        chol0, ef0 = _chol2(dd[:, 1::2], tiny), ops.zeros_like(cc[:, 0::2])
        ef0 = ops.concatenate([ef0, ef0], 0)

        def body(level, dd, cc, chols, efs):
            chol, ef, dd, cc = _level(dd, cc, tiny)
            dd, cc = _identity_tail(dd, cc)
            index = (level, *([ops.zeros_like(level)] * 3))
            chols = ops.slice_update(chols, index, chol[None])
            efs = ops.slice_update(efs, index, ef[None])
            return level + 1, dd, cc, chols, efs

        state = (
            ops.convert_to_tensor(0, "int32"),
            dd,
            cc,
            ops.stack([ops.zeros_like(chol0)] * trips),
            ops.stack([ops.zeros_like(ef0)] * trips),
        )
        _, dd, cc, chols, efs = ops.while_loop(
            lambda level, *_: level < trips, body, state, maximum_iterations=trips
        )
        rolled = (chols, efs)
        # Level t keeps size / 2^(t+1) odd blocks; the others are identity padding.
        lane = ops.arange(size // 2, dtype="int32")[None, :, None]
        live = lane < ops.convert_to_tensor([size >> (t + 1) for t in range(trips)])[:, None, None]
        pivots.append(ops.where(live[:, None], chols[:, ::2], 1.0))
    root = _chol2(dd[:, :1], tiny)
    pivots.append(root[::2])
    pivots = ops.concatenate([ops.reshape(x, (-1, ops.shape(x)[-1])) for x in pivots], axis=0)
    return (levels, rolled, root), ops.any(pivots <= 0.0, axis=0)


def _interleave(even, odd):  # [C, M, B] x 2 -> [C, 2M, B], even rows first (B may be None)
    c, m, _ = even.shape
    return ops.reshape(ops.stack([even, odd], axis=2), (c, 2 * m, -1))


def penta_solve(factors, rhs):
    """``H x = rhs`` with the factorisation of :func:`penta_factor` (``rhs`` ``[n, B]``)."""
    levels, rolled, root = factors
    n = rhs.shape[0]
    trips = 0 if rolled is None else rolled[0].shape[0]
    rhs = ops.pad(rhs, [[0, 2 ** (len(levels) + trips + 1) - n], [0, 0]])
    r = ops.stack([rhs[0::2], rhs[1::2]])
    ys = []
    for chol, ef in levels:
        odd = r[:, 1::2]
        y = ops.stack(_lsolve(chol, odd[0], odd[1]))
        r = r[:, 0::2] - _mv(ef[:4], y) - _shift_down(_mtv(ef[4:], y))
        ys.append(y)
    if trips:
        chols, efs = rolled

        def down(level, r, ys):
            chol, ef = _backend.take(chols, level, axis=0), _backend.take(efs, level, axis=0)
            odd = r[:, 1::2]
            y = ops.stack(_lsolve(chol, odd[0], odd[1]))
            r = r[:, 0::2] - _mv(ef[:4], y) - _shift_down(_mtv(ef[4:], y))
            index = (level, *([ops.zeros_like(level)] * 3))
            return (
                level + 1,
                ops.concatenate([r, ops.zeros_like(r)], 1),
                ops.slice_update(ys, index, y[None]),
            )

        ys0 = ops.stack([ops.zeros_like(r[:, 1::2])] * trips)
        start = (ops.convert_to_tensor(0, "int32"), r, ys0)
        _, r, rolled_ys = ops.while_loop(
            lambda level, *_: level < trips, down, start, maximum_iterations=trips
        )
        r = r[:, :1]
    x = _ltsolve(root, ops.stack(_lsolve(root, r[0], r[1])))
    if trips:
        size = rolled_ys.shape[2]

        def up(level, x):  # level counts down; x [2, 2 * size, B], its front half in use
            chol, ef = _backend.take(chols, level, axis=0), _backend.take(efs, level, axis=0)
            y = _backend.take(rolled_ys, level, axis=0)
            x = x[:, :size]
            t = y - _mtv(ef[:4], x) - _mv(ef[4:], _shift_up(x))
            return level - 1, _interleave(x, _ltsolve(chol, t))

        x = ops.pad(x, [[0, 0], [0, 2 * size - 1], [0, 0]])
        start = (ops.convert_to_tensor(trips - 1, "int32"), x)
        _, x = ops.while_loop(lambda level, _: level >= 0, up, start, maximum_iterations=trips)
    for (chol, ef), y in zip(reversed(levels), reversed(ys)):
        t = y - _mtv(ef[:4], x) - _mv(ef[4:], _shift_up(x))
        x = _interleave(x, _ltsolve(chol, t))
    return ops.reshape(ops.transpose(x, (1, 0, 2)), (2 * x.shape[1], -1))[:n]
