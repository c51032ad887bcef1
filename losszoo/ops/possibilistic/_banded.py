"""Banded linear algebra: ``H x = r`` for a batch of SPD pentadiagonal ``H`` by cyclic reduction.

``H`` is read as block tridiagonal in 2x2 blocks; :func:`penta_factor` eliminates the odd
blocks level after level (``log2 n`` stages of batched 2x2 arithmetic instead of ``n``
sequential steps) and :func:`penta_solve` reuses the factors for each right-hand side.
Time-major: ``[n, B]``, ``B`` may be unknown. Used by the interior point's Newton systems;
derivation in ``docs/design/possibilistic_solver.md``. Written with ``keras.ops`` (any dtype;
the interior point calls it in float64).
"""

from keras import ops

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


def penta_factor(d0, d1, d2):
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
        return ops.pad(x, [[0, 2 * half - n], [0, 0]], constant_values=fill)

    tiny = 1e-30 * ops.max(ops.abs(d0), axis=0)
    d0, d1, d2 = padded(d0, 1.0), padded(d1, 0.0), padded(d2, 0.0)
    dd = ops.stack([d0[0::2], d1[0::2], d0[1::2]])
    cc = ops.stack([d2[0::2], ops.zeros_like(d2[0::2]), d1[1::2], d2[1::2]])
    levels = []
    while dd.shape[1] > 1:
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
        levels.append((chol, ef))
    root = _chol2(dd, tiny)
    # A dropped pivot is a stored 0 (a kept one has a positive reciprocal square root).
    # Read from the stored factors: testing the pivots themselves, XLA recomputed the
    # whole factorisation inside the reduction (10% of a training step at K = 64).
    pivots = [chol[::2] for chol, _ in levels] + [root[::2]]
    pivots = ops.concatenate([ops.reshape(x, (-1, ops.shape(x)[-1])) for x in pivots], axis=0)
    return (levels, root), ops.any(pivots <= 0.0, axis=0)


def _interleave(even, odd):  # [C, M, B] x 2 -> [C, 2M, B], even rows first (B may be None)
    c, m, _ = even.shape
    return ops.reshape(ops.stack([even, odd], axis=2), (c, 2 * m, -1))


def penta_solve(factors, rhs):
    """``H x = rhs`` with the factorisation of :func:`penta_factor` (``rhs`` ``[n, B]``)."""
    levels, root = factors
    n = rhs.shape[0]
    rhs = ops.pad(rhs, [[0, 2 ** (len(levels) + 1) - n], [0, 0]])
    r = ops.stack([rhs[0::2], rhs[1::2]])
    ys = []
    for chol, ef in levels:
        odd = r[:, 1::2]
        y = ops.stack(_lsolve(chol, odd[0], odd[1]))
        r = r[:, 0::2] - _mv(ef[:4], y) - _shift_down(_mtv(ef[4:], y))
        ys.append(y)
    x = _ltsolve(root, ops.stack(_lsolve(root, r[0], r[1])))
    for (chol, ef), y in zip(reversed(levels), reversed(ys)):
        t = y - _mtv(ef[:4], x) - _mv(ef[4:], _shift_up(x))
        x = _interleave(x, _ltsolve(chol, t))
    return ops.reshape(ops.transpose(x, (1, 0, 2)), (2 * x.shape[1], -1))[:n]
