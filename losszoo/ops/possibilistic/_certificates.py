"""Certificates of a projection: max violation ``V`` and exact duality gap (spec 2.6).

``V = max_h (b_h - <a_h, p>)_+``; for multipliers ``lam >= 0`` the gap
``KL(p||q) - g(lam) = KL(p || p(lam)) + sum_h lam_h slack_h(p)`` (``p(lam)`` the dual point
``softmax(log q + A^T lam)``) is >= 0 for feasible ``p`` and 0 only at the optimum, so
``V <= tol`` and ``|gap| <= gap_tol`` certify ``||p - p*||_1 <= sqrt(2 gap)``. Computed on the
sorted classes (time-major ``[K, B]``) and on the interior point's tie-reduced block chain;
with the scans they share. Written with ``keras.ops``, called in float64.
"""

from keras import ops

from losszoo._backend import maximum, reduce_max
from losszoo.ops.possibilistic._config import _0


def _rcumsum(x, exclusive=False):
    """Reverse cumulative sum along axis 0 by log-step doubling (Hillis-Steele).

    XLA lowers a cumulative sum to an O(K^2) reduce-window on CPU; this is O(K log K) with
    a few fused shifted adds (same sums up to rounding).
    """
    n = x.shape[0]
    shift = 1
    while shift < n:
        x = x + ops.concatenate([x[shift:], ops.zeros_like(x[:shift])], axis=0)
        shift *= 2
    if exclusive:
        x = ops.concatenate([x[1:], ops.zeros_like(x[:1])], axis=0)
    return x


def _at_lambda(lp, ll, lu):
    """``A^T lam`` in sorted coordinates, time-major: lam parts [m1, B] -> [K, B]."""
    zero = ops.zeros_like(lp[:1])
    pref = ops.concatenate([_rcumsum(lp), zero], axis=0)
    g = ll - lu  # lower: +e_r - e_{r+1}; upper: -e_r + e_{r+1}
    return pref + ops.concatenate([g, zero], 0) - ops.concatenate([zero, g], 0)


def _normalize_log(x):
    m = reduce_max(x, axis=0, keepdims=True)
    return x - (m + ops.log(ops.sum(ops.exp(x - m), axis=0, keepdims=True)))


def _violation_and_gap(x, lp, ll, lu, cst, lq=None):
    """Max violation V and duality gap of the normalised iterate (spec 2.6). [B] each.

    For the dual point ``x = log q + A^T lam`` the gap is ``sum_h lam_h slack_h``. With
    ``lq`` (log q) given, ``x`` may be any point (e.g. a primal iterate) and the gap is the
    exact ``KL(p||q) - g(lam) = KL(p || p(lam)) + sum_h lam_h slack_h(p)``, ``p(lam)`` the
    dual point: both terms are >= 0 when ``p`` is feasible, and it is 0 only at the optimum.
    """
    xn = _normalize_log(x)
    p = ops.exp(xn)
    tail = _rcumsum(p, exclusive=True)[:-1]  # sum_{k>r} p_k
    d = p[:-1] - p[1:]
    act = cst["act"]
    zero = ops.zeros_like(d)
    slack_pref = cst["pt_next"] - tail  # <a,p> - b for prefix r
    slack_low = d - cst["lo"]
    slack_up = cst["up"] - d
    viol = maximum(maximum(-slack_pref, -slack_low), -slack_up)
    v = maximum(reduce_max(ops.where(act, viol, zero), axis=0), _0)
    gap = ops.sum(ops.where(act, lp * slack_pref + ll * slack_low + lu * slack_up, zero), axis=0)
    if lq is not None:
        x_dual = _normalize_log(lq + _at_lambda(lp, ll, lu))
        gap += _kl_rows(p, xn, x_dual)
    return v, gap


def _kl_rows(p, log_p, log_r):
    """``KL(p || r)`` per column of time-major ``[K, B]`` (0 log 0 = 0)."""
    return ops.sum(ops.where(p > 0.0, p * (log_p - log_r), 0.0), axis=0)


def _fold(op, x):
    """Combine the slices of the leading (family) axis elementwise: XLA fuses this, while
    a reduction over [families, chain] becomes unfused reduce-window passes on CPU."""
    out = x[0]
    for i in range(1, x.shape[0]):
        out = op(out, x[i])
    return out


def _dual_slacks(red, xm):
    """Block masses [K, B] and stacked constraint values [3, K-1, B] of the dual point (log
    block masses ``xm``), for :func:`_chain_violation_and_gap`."""
    m = ops.where(red["real"], ops.exp(xm), 0.0)
    tail = _rcumsum(m, exclusive=True)[:-1]
    v = m / red["w"]
    sh = v[:-1] - v[1:]
    return m, ops.stack([red["c"] - tail, sh - red["lo"], red["up"] - sh])


def _chain_violation_and_gap(red, m, slacks, xm, lams):
    """Max violation and exact duality gap of the primal block masses ``m`` [K, B].

    ``slacks`` [3, K-1, B] are the constraint values at ``m`` (ceiling, lower, upper; >= 0
    when feasible), ``xm`` the log block masses of the dual point of ``lams`` [3, K-1, B].
    The gap ``KL(m || m(lam)) + sum_h lam_h slack_h(m)`` is the primal objective minus the
    dual function, so it certifies ``m`` whatever produced ``lam`` (see :func:`_violation_and_gap`).
    """
    var = red["var"][None]
    big_v = maximum(reduce_max(_fold(maximum, ops.where(var, -slacks, 0.0)), 0), _0)
    comp = ops.sum(_fold(ops.add, ops.where(var, lams * slacks, 0.0)), axis=0)
    safe = ops.where(m > 0.0, m, 1.0)
    return big_v, comp + _kl_rows(m, ops.log(safe), xm)
