"""Certificates of a projection: max violation ``V`` and exact duality gap (spec 2.6).

``V = max_h (b_h - <a_h, p>)_+``; for multipliers ``lam >= 0`` the gap
``KL(p||q) - g(lam) = KL(p || p(lam)) + sum_h lam_h slack_h(p)`` (``p(lam)`` the dual point
``softmax(log q + A^T lam)``) is >= 0 for feasible ``p`` and 0 only at the optimum, so
``V <= tol`` and ``|gap| <= gap_tol`` certify ``||p - p*||_1 <= sqrt(2 gap)``. Computed on the
sorted classes (time-major ``[K, B]``, or lists of ``[B]`` vectors for the unrolled kernel)
and on the interior point's tie-reduced block chain; with the scans they share.
"""

import tensorflow as tf


def _rcumsum(x, exclusive=False):
    """Reverse cumulative sum along axis 0 by log-step doubling (Hillis-Steele).

    XLA lowers ``tf.cumsum`` to an O(K^2) reduce-window on CPU; this is O(K log K) with
    a few fused shifted adds (same sums up to rounding).
    """
    n = x.shape[0]
    shift = 1
    while shift < n:
        x = x + tf.concat([x[shift:], tf.zeros_like(x[:shift])], axis=0)
        shift *= 2
    if exclusive:
        x = tf.concat([x[1:], tf.zeros_like(x[:1])], axis=0)
    return x


def _at_lambda(lp, ll, lu):
    """``A^T lam`` in sorted coordinates, time-major: lam parts [m1, B] -> [K, B]."""
    zero = tf.zeros_like(lp[:1])
    pref = tf.concat([_rcumsum(lp), zero], axis=0)
    g = ll - lu  # lower: +e_r - e_{r+1}; upper: -e_r + e_{r+1}
    return pref + tf.concat([g, zero], 0) - tf.concat([zero, g], 0)


def _normalize_log(x):
    m = tf.reduce_max(x, axis=0, keepdims=True)
    return x - (m + tf.math.log(tf.reduce_sum(tf.exp(x - m), axis=0, keepdims=True)))


def _violation_and_gap(x, lp, ll, lu, cst, lq=None):
    """Max violation V and duality gap of the normalised iterate (spec 2.6). [B] each.

    For the dual point ``x = log q + A^T lam`` the gap is ``sum_h lam_h slack_h``. With
    ``lq`` (log q) given, ``x`` may be any point (e.g. a primal iterate) and the gap is the
    exact ``KL(p||q) - g(lam) = KL(p || p(lam)) + sum_h lam_h slack_h(p)``, ``p(lam)`` the
    dual point: both terms are >= 0 when ``p`` is feasible, and it is 0 only at the optimum.
    """
    xn = _normalize_log(x)
    p = tf.exp(xn)
    tail = _rcumsum(p, exclusive=True)[:-1]  # sum_{k>r} p_k
    d = p[:-1] - p[1:]
    act = cst["act"]
    zero = tf.zeros_like(d)
    slack_pref = cst["pt_next"] - tail  # <a,p> - b for prefix r
    slack_low = d - cst["lo"]
    slack_up = cst["up"] - d
    viol = tf.maximum(tf.maximum(-slack_pref, -slack_low), -slack_up)
    v = tf.maximum(tf.reduce_max(tf.where(act, viol, zero), axis=0), 0.0)
    gap = tf.reduce_sum(
        tf.where(act, lp * slack_pref + ll * slack_low + lu * slack_up, zero), axis=0
    )
    if lq is not None:
        x_dual = _normalize_log(lq + _at_lambda(lp, ll, lu))
        gap += _kl_rows(p, xn, x_dual)
    return v, gap


def _kl_rows(p, log_p, log_r):
    """``KL(p || r)`` per column of time-major ``[K, B]`` (0 log 0 = 0)."""
    return tf.reduce_sum(tf.where(p > 0.0, p * (log_p - log_r), 0.0), axis=0)


def _suffix_sums(v, exclusive):
    """Python-list reverse cumulative sums of [B] vectors (``sum_{j>k}`` if exclusive)."""
    out, acc = [None] * len(v), None
    for k in reversed(range(len(v))):
        if exclusive:
            out[k] = tf.zeros_like(v[k]) if acc is None else acc
        acc = v[k] if acc is None else acc + v[k]
        if not exclusive:
            out[k] = acc
    return out


def _at_lambda_list(lq, lp, ll, lu):
    """``log q + A^T lam`` for lists of [B] vectors (same sums as :func:`_at_lambda`)."""
    m1 = len(lp)
    pref = _suffix_sums(lp, exclusive=False)
    g = [ll[r] - lu[r] for r in range(m1)]
    out = []
    for j in range(m1 + 1):
        t = pref[j] + g[j] if j < m1 else tf.zeros_like(lq[j])
        if j >= 1:
            t = t - g[j - 1]
        out.append(lq[j] + t)
    return out


def _violation_and_gap_list(x, lp, ll, lu, cst):
    """:func:`_violation_and_gap` for lists of [B] vectors: V and the duality gap, [B] each."""
    m1 = len(lp)
    top = x[0]
    for xk in x[1:]:
        top = tf.maximum(top, xk)
    total = tf.add_n([tf.exp(xk - top) for xk in x])
    lse = top + tf.math.log(total)
    p = [tf.exp(xk - lse) for xk in x]
    tail = _suffix_sums(p, exclusive=True)
    v = gap = None
    for r in range(m1):
        d = p[r] - p[r + 1]
        act = cst["act"][r]
        slack_pref = cst["pt_next"][r] - tail[r]
        slack_low = d - cst["lo"][r]
        slack_up = cst["up"][r] - d
        viol = tf.maximum(tf.maximum(-slack_pref, -slack_low), -slack_up)
        viol = tf.where(act, viol, tf.zeros_like(viol))
        term = tf.where(
            act, lp[r] * slack_pref + ll[r] * slack_low + lu[r] * slack_up, tf.zeros_like(viol)
        )
        v = viol if v is None else tf.maximum(v, viol)
        gap = term if gap is None else gap + term
    return tf.maximum(v, 0.0), gap


def _fold(op, x):
    """Combine the slices of the leading (family) axis elementwise: XLA fuses this, while
    a reduction over [families, chain] becomes unfused reduce-window passes on CPU."""
    out = x[0]
    for i in range(1, x.shape[0]):
        out = op(out, x[i])
    return out


def _chain_dual_violation_and_gap(red, xm, lams):
    """:func:`_chain_violation_and_gap` of the dual point itself (log block masses ``xm``)."""
    m = tf.where(red["real"], tf.exp(xm), 0.0)
    tail = _rcumsum(m, exclusive=True)[:-1]
    v = m / red["w"]
    sh = v[:-1] - v[1:]
    slacks = tf.stack([red["c"] - tail, sh - red["lo"], red["up"] - sh])
    return _chain_violation_and_gap(red, m, slacks, xm, lams)


def _chain_violation_and_gap(red, m, slacks, xm, lams):
    """Max violation and exact duality gap of the primal block masses ``m`` [K, B].

    ``slacks`` [3, K-1, B] are the constraint values at ``m`` (ceiling, lower, upper; >= 0
    when feasible), ``xm`` the log block masses of the dual point of ``lams`` [3, K-1, B].
    The gap ``KL(m || m(lam)) + sum_h lam_h slack_h(m)`` is the primal objective minus the
    dual function, so it certifies ``m`` whatever produced ``lam`` (see :func:`_violation_and_gap`).
    """
    var = red["var"][None]
    big_v = tf.maximum(tf.reduce_max(_fold(tf.maximum, tf.where(var, -slacks, 0.0)), 0), 0.0)
    comp = tf.reduce_sum(_fold(tf.add, tf.where(var, lams * slacks, 0.0)), axis=0)
    safe = tf.where(m > 0.0, m, 1.0)
    return big_v, comp + _kl_rows(m, tf.math.log(safe), xm)
