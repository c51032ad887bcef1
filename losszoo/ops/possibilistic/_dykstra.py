"""Dykstra's algorithm with KL projections in its dual form (spec 2.4), time-major ``[K, B]``.

Cyclic dual coordinate ascent on ``g(lam) = lam.b - log sum_k q_k exp((A^T lam)_k)``,
``lam >= 0``, iterate ``p = softmax(log q + A^T lam)``; each step sets one multiplier to the
closed form of its single-set projection (spec 2.2). Stops per row by the rule of
``stopping`` (0 paper: ``V <= tol``; 1 certified: and ``|gap| <= gap_tol``; 2 fixed). A
rolled kernel (``tf.while_loop`` over constraints, straggler compaction) and, for small K,
an unrolled one on lists of ``[B]`` vectors (same iterates). Derivation:
``docs/design/possibilistic_solver.md``.
"""

import functools

import tensorflow as tf

from losszoo.ops.possibilistic._certificates import (
    _at_lambda,
    _at_lambda_list,
    _normalize_log,
    _rcumsum,
    _suffix_sums,
    _violation_and_gap,
    _violation_and_gap_list,
)
from losszoo.ops.possibilistic._config import _F64


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
    lam_init=None,
):
    """:func:`_project_core` for small K: every step unrolled on lists of [B] vectors (same
    iterates and cycle counts as the rolled kernel; XLA fuses a cycle into a few loops)."""
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
        nlp = _sweep("pref", _at_lambda_list(lq_l, lp, ll, lu), lp, cst, True)
        nll = _sweep("low", _at_lambda_list(lq_l, nlp, ll, lu), ll, cst, True)
        nlu = _sweep("up", _at_lambda_list(lq_l, nlp, nll, lu), lu, cst, True)
        nv, ngap = _violation_and_gap_list(_at_lambda_list(lq_l, nlp, nll, nlu), nlp, nll, nlu, cst)
        feasible = nv <= tol
        done = tf.where(
            tf.equal(stopping, 0),
            feasible,
            feasible & (tf.abs(ngap) <= gap_tol) & tf.equal(stopping, 1),
        )
        run = active & (k < max_cycles)
        lp = [tf.where(run, a, b) for a, b in zip(nlp, lp)]
        ll = [tf.where(run, a, b) for a, b in zip(nll, ll)]
        lu = [tf.where(run, a, b) for a, b in zip(nlu, lu)]
        v = tf.where(run, nv, v)
        gap = tf.where(run, ngap, gap)
        cycles = cycles + tf.cast(run, tf.int32)
        active = active & ~(run & done)
        return k + 1, tf.stack(lp), tf.stack(ll), tf.stack(lu), active, cycles, v, gap

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
    v, gap = _violation_and_gap(x, lp, ll, lu, _cst_stacked(pt_next, ratio, lo, up, act))
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
    v, gap = _violation_and_gap(x, lp, ll, lu, cst)
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
        nv, ngap = _violation_and_gap(lq + _at_lambda(nlp, nll, nlu), nlp, nll, nlu, cst)
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


_CORE_JIT = tf.function(_project_core, jit_compile=True, autograph=False)


def _run_core(*args, jit=True, **kwargs):
    fn = _CORE_JIT if jit else _project_core
    return fn(*args, **kwargs)
