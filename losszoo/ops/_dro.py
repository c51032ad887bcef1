"""Safe-KL DRO risk (Gladin et al., "Improved Stochastic Optimization of LogSumExp") and
its KL-DRO baselines.

Spec: ``shared/specs/safe_kl_dro.md`` sections 1.5 (objective), 2.1 (baselines), 2.5
(kernel), 3.1-3.4 (gradients, stability, dtype), 4 (CVaR link), 6 (edge inputs), 7 (C0).

Notation: per-example losses ``l_i`` (any shape, flattened: every entry is one sample),
sample weights ``s_i >= 0`` (default 1) and ``pi_i = s_i / sum_j s_j``, temperature
``lam > 0``, accuracy ``rho in (0, 1)``, dual scalar ``alpha`` (loss units).

* Safe-KL risk (spec 1.5, calibrated; ``calibrate=False`` drops the ``- lam``, paper's G)::

      z_i = (l_i - alpha)/lam + ln rho
      V   = sum_i pi_i [alpha - lam + (lam/rho) softplus(z_i)]
      dV/dl_i = pi_i w_i,   w_i = sigmoid(z_i)/rho in (0, 1/rho)
      dV/dalpha = 1 - sum_i pi_i w_i

  ``min_alpha V`` over the full data is ``lam F_rho(l/lam)`` with
  ``R - lam rho n max p* <= V* <= R``, ``R = lam log mean exp(l/lam)`` (spec section 4).
  The mini-batch value and gradient are unbiased for fixed ``(theta, alpha)`` (spec 1.7).
  Stable evaluation (spec 3.2): one ``e = exp(-|z|)`` gives ``softplus(z) = max(z,0) +
  log1p(e)`` and ``sigmoid(z) = 1/(1+e)`` (z >= 0) or ``e/(1+e)``. No exponential of a
  loss is ever formed, so losses of 1e4 and beyond are fine in float32; the value grows
  linearly and every weight saturates at ``1/rho``.
* Batch LogSumExp baseline (spec 2.1, biased): ``lam log sum_i pi_i exp(l_i/lam)``, gradient
  ``softmax(l/lam + log pi)``; max-shifted.
* Sum-of-exp baseline (spec 2.1, paper eq. 21): ``sum_i pi_i exp(l_i/lam)``, gradient
  ``pi_i exp(l_i/lam)/lam``. Unbiased but overflows by design (no safe form exists).
* CVaR at level rho (spec 4, Rockafellar-Uryasev eq. 9), the safe-KL risk's ``lam -> 0``
  limit: ``min_a a + (1/rho) sum_i pi_i (l_i - a)_+`` = the mean of the upper ``rho`` tail
  of the weighted empirical law. Computed exactly by a sort; gradient ``q_i/rho`` where
  ``q_i`` is the mass of example i inside the tail.
* Streaming exact KL-DRO risk ``lam log (sum s_i exp(l_i/lam) / sum s_i)`` over many
  batches (spec 2.5): state ``(m, acc, n)`` with ``m`` the running max of ``l/lam``.
* ``safe_kl_dro_solve_alpha``: the batch stationarity ``sum pi_i w_i = 1`` by bisection on
  ``[min l + lam log(1-rho), max l]`` (spec 7 C0), fixed iteration count, XLA-compilable.

Edge inputs (spec 6): entries with ``s_i = 0`` are ignored entirely (also NaN/inf there);
an all-zero or empty batch gives value 0 and zero gradients; a ``+inf`` loss gives value
``+inf`` with finite gradients (``kl_dro_sumexp``, whose gradient is infinite there: value
``+inf`` and every gradient entry NaN); ``-inf`` gets weight 0; NaN with ``s_i > 0``
propagates (NaN value, never silently dropped).
Half-precision inputs are computed in float32 and the result cast back; float64 stays
float64.

Fail-loud contract (README, "Bad input"): hyper-parameters (``lam``, ``rho``,
``iterations``, ``calibrate``) are checked when called and raise naming the argument.
Sample weights must be finite and >= 0 and ``alpha`` finite: eagerly a ``ValueError``,
inside ``tf.function`` a graph assertion (both skippable with
``losszoo.set_validation(False)``). Under XLA, where assertions vanish, such values make
the result and its gradients NaN (a scalar flag folded into the kernels, always on).
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from losszoo.contract import (
    check_number,
    nan_where,
    static_value,
    to_compute_dtype,
    validation_enabled,
)

__all__ = [
    "check_bool",
    "check_lam",
    "check_rho",
    "cvar_risk",
    "kl_dro_batch_lse",
    "kl_dro_exact_batch_max",
    "kl_dro_exact_state_result",
    "kl_dro_exact_state_update",
    "kl_dro_sumexp",
    "safe_kl_dro_risk",
    "safe_kl_dro_risk_and_stats",
    "safe_kl_dro_solve_alpha",
    "safe_kl_dro_weights",
]


# ----------------------------------------------------------------------------- validation
def _python_number(value, name):
    if isinstance(value, (tf.Tensor, tf.Variable)):
        raise TypeError(f"`{name}` must be a Python number, not a tensor.")
    return value


def check_lam(lam) -> float:
    """Return ``lam`` as a Python float; ``ValueError`` unless finite and > 0."""
    return check_number(_python_number(lam, "lam"), "lam", low=0.0, low_open=True)


def check_rho(rho) -> float:
    """Return ``rho`` as a Python float; ``ValueError`` unless 0 < rho < 1 (spec 1.6 item 4)."""
    value = check_number(_python_number(rho, "rho"), "rho")
    if not (0.0 < value < 1.0):
        raise ValueError(
            f"`rho` must lie in the open interval (0, 1), got {rho!r}; rho = 1 is "
            "degenerate (alpha* = -inf) and rho > 1 makes the risk unbounded below."
        )
    return value


def check_bool(value, name):
    """Return ``value`` as a bool; ``TypeError`` naming ``name`` unless it is one."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be a bool, got {value!r}.")
    return bool(value)


def _poison(bad, x):
    """``x`` with NaN everywhere if the scalar flag ``bad`` is set (``None``: unchanged)."""
    return x if bad is None else nan_where(bad, x)


def _any(*flags):
    flags = [f for f in flags if f is not None]
    if not flags:
        return None
    out = flags[0]
    for f in flags[1:]:
        out = tf.logical_or(out, f)
    return out


def _live_nan(l, s):
    """Scalar flag: a NaN loss with positive weight (reductions under XLA skip NaN)."""
    nan = tf.math.is_nan(l)
    return tf.reduce_any(nan if s is None else nan & (s > 0))


def _check_nonnegative(x, name, allow_nan=False):
    """Eager / graph check that ``x`` is finite and >= 0 (skippable); returns ``x`` and the
    always-on scalar ``bad`` flag that poisons results under XLA. ``allow_nan``: NaN passes
    (a state that NaN losses made NaN, whose result is NaN anyway)."""
    value = static_value(x) if validation_enabled() else None
    if value is not None:
        value = np.asarray(value, np.float64)
        checks = ((np.isinf, "Inf"),) if allow_nan else ((np.isnan, "NaN"), (np.isinf, "Inf"))
        for broken, what in checks:
            if np.any(broken(value)):
                raise ValueError(f"`{name}` contains {what} values; it must be finite and >= 0.")
        if np.any(value < 0):
            raise ValueError(f"`{name}` must be >= 0; got a negative value.")
    ok = (x >= 0) & tf.math.is_finite(x)
    ok = tf.reduce_all(ok | tf.math.is_nan(x) if allow_nan else ok)
    if value is None and validation_enabled():
        message = f"`{name}` must be finite and >= 0 (Inf or a negative value found)."
        if not allow_nan:
            message = f"`{name}` must be finite and >= 0 (NaN, Inf or negative found)."
        with tf.control_dependencies([tf.debugging.Assert(ok, [message])]):
            x = tf.identity(x)
    return x, tf.logical_not(ok)


def _prepare(losses, sample_weight):
    """Flatten losses (compute dtype) and weights (same dtype, default ones).

    Weights follow the Keras convention: a scalar, or a tensor whose shape is a prefix of
    the losses' shape (e.g. ``[B]`` for losses ``[B, T]``), broadcast over trailing axes.
    Returns ``(l, s, original_dtype, bad)`` with ``bad`` a scalar flag for invalid weights
    (``None`` without weights).
    """
    l, original = to_compute_dtype(losses, "losses")
    if sample_weight is None:
        return tf.reshape(l, [-1]), tf.ones_like(tf.reshape(l, [-1])), original, None
    sw = tf.convert_to_tensor(sample_weight)
    if not (sw.dtype.is_floating or sw.dtype.is_integer or sw.dtype == tf.bool):
        raise TypeError(f"`sample_weight` must be real numbers, got dtype {sw.dtype.name}.")
    s = tf.cast(sw, l.dtype)
    s, bad = _check_nonnegative(s, "sample_weight")
    if s.shape.rank is not None and l.shape.rank is not None:
        while s.shape.rank > l.shape.rank and s.shape[-1] == 1:
            s = tf.squeeze(s, -1)
        fits = s.shape.rank <= l.shape.rank and all(
            a is None or b is None or a in (1, b) for a, b in zip(s.shape, l.shape)
        )
        if not fits:
            raise ValueError(
                f"`sample_weight` of shape {s.shape} does not fit the losses' shape "
                f"{l.shape}: it must be a scalar or broadcast over a prefix of it."
            )
        for _ in range(l.shape.rank - s.shape.rank if s.shape.rank > 0 else 0):
            s = s[..., None]
    s = tf.broadcast_to(s, tf.shape(l))
    return tf.reshape(l, [-1]), tf.reshape(s, [-1]), original, bad


def _const(x, dtype):
    # tf.constant(python_float, float64) keeps full precision; tf.cast(float) would go via
    # float32 (spec 3.4).
    return tf.constant(x, dtype)


# ----------------------------------------------------------------------------- safe-KL
def _safe_kl_core(lam: float, rho: float, calibrate: bool, bad=None):
    inv_lam, log_rho, inv_rho = 1.0 / lam, math.log(rho), 1.0 / rho

    @tf.custom_gradient
    def core(l, alpha, s):
        dt = l.dtype
        z = (l - alpha) * _const(inv_lam, dt) + _const(log_rho, dt)
        e = tf.exp(-tf.abs(z))
        sp = tf.maximum(z, tf.zeros_like(z)) + tf.math.log1p(e)
        sig = tf.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
        live = s > 0
        zeros = tf.zeros_like(l)
        s_sum = tf.reduce_sum(s)
        num = tf.reduce_sum(tf.where(live, s * sp, zeros))
        sw = tf.where(live, s * sig, zeros) * _const(inv_rho, dt)  # s_i w_i
        sw_sum = tf.reduce_sum(sw)
        nonempty = s_sum > 0
        val = alpha + _const(lam / rho, dt) * tf.math.divide_no_nan(num, s_sum)
        if calibrate:
            val = val - _const(lam, dt)
        val = _poison(bad, tf.where(nonempty, val, tf.zeros_like(val)))
        mean_w = tf.math.divide_no_nan(sw_sum, s_sum)
        # saturation rho * max_i w_i = max_i sigmoid(z_i) over live entries (0 if empty)
        sat = tf.reduce_max(tf.concat([tf.where(live, sig, zeros), tf.zeros([1], dt)], 0))
        sat = nan_where(tf.math.is_nan(sw_sum), sat)  # XLA's max drops NaN; the sum keeps it
        grad_alpha = tf.where(nonempty, 1.0 - mean_w, tf.zeros_like(mean_w))
        # lam * d^2V/dalpha^2 = sum pi w (1 - rho w)   (spec 3.1; w (1 - rho w) = sw (1 - sig))
        curv = tf.math.divide_no_nan(tf.reduce_sum(sw * (1.0 - sig)), s_sum)
        mean_w, sat, grad_alpha, curv = (_poison(bad, x) for x in (mean_w, sat, grad_alpha, curv))

        def grad(dv, d_mean_w, d_sat, d_galpha, d_curv):
            # Only the value is differentiable; the statistics are diagnostics
            # (stop-gradient semantics, documented).
            del d_mean_w, d_sat, d_galpha, d_curv
            g_l = _poison(bad, dv * tf.math.divide_no_nan(sw, s_sum))
            g_a = dv * grad_alpha
            return g_l, g_a, tf.zeros_like(s)

        return (val, mean_w, sat, grad_alpha, curv), grad

    return core


def _safe_kl_core_unweighted(lam: float, rho: float, calibrate: bool):
    """The same kernel for ``s_i = 1`` (no sample weights): fewer ops, identical maths.

    A lean path matters for small models, where a training step is only a few hundred
    microseconds and every graph op counts. ``tf.math.softplus`` / ``sigmoid`` are the
    stable forms of spec 3.2.
    """
    inv_lam, log_rho, inv_rho = 1.0 / lam, math.log(rho), 1.0 / rho

    @tf.custom_gradient
    def core(l, alpha):
        dt = l.dtype
        n = tf.cast(tf.size(l), dt)
        inv_n = tf.math.divide_no_nan(tf.ones([], dt), n)
        z = (l - alpha) * _const(inv_lam, dt) + _const(log_rho, dt)
        sig = tf.math.sigmoid(z)
        val = alpha + _const(lam / rho, dt) * (tf.reduce_sum(tf.math.softplus(z)) * inv_n)
        if calibrate:
            val = val - _const(lam, dt)
        val = tf.where(n > 0, val, tf.zeros_like(val))
        mean_w = tf.reduce_sum(sig) * (inv_n * _const(inv_rho, dt))
        sat = tf.reduce_max(tf.concat([sig, tf.zeros([1], dt)], 0))
        sat = nan_where(tf.math.is_nan(mean_w), sat)  # XLA's max drops NaN; the sum keeps it
        grad_alpha = tf.where(n > 0, 1.0 - mean_w, tf.zeros_like(mean_w))
        curv = tf.reduce_sum(sig * (1.0 - sig)) * (inv_n * _const(inv_rho, dt))

        def grad(dv, d_mean_w, d_sat, d_galpha, d_curv):
            del d_mean_w, d_sat, d_galpha, d_curv
            return dv * (sig * (inv_n * _const(inv_rho, dt))), dv * grad_alpha

        return (val, mean_w, sat, grad_alpha, curv), grad

    return core


def _as_alpha(alpha, dtype):
    # Python / numpy numbers go straight to the compute dtype (no float32 detour).
    if isinstance(alpha, (int, float, np.number)) and not isinstance(alpha, bool):
        return tf.constant(float(alpha), dtype)
    return tf.cast(tf.convert_to_tensor(alpha), dtype)


def _check_alpha(alpha, dtype):
    a = _as_alpha(alpha, dtype)
    if a.shape.rank not in (None, 0):
        if a.shape.num_elements() not in (None, 1):
            raise ValueError(f"`alpha` must be a scalar, got shape {a.shape}.")
        a = tf.reshape(a, [])
    if validation_enabled():
        value = static_value(a)
        if value is not None:
            if not np.all(np.isfinite(value)):
                raise ValueError(f"`alpha` must be finite, got {float(value)!r}.")
        else:
            a = tf.debugging.assert_all_finite(a, "`alpha` must be finite (NaN or Inf found).")
    return a


def _risk_and_stats(l, a, s, bad, lam, rho, calibrate):
    """The safe-KL value and statistics of flat losses ``l`` (compute dtype), scalar ``a``,
    flat weights ``s`` (``None``: all 1) and the invalid-input flag ``bad`` (``None``: valid);
    ``lam``, ``rho`` and ``calibrate`` already checked. The statistics carry no gradient."""
    if s is None:
        outs = _safe_kl_core_unweighted(lam, rho, calibrate)(l, a)
        if bad is not None:
            outs = tuple(_poison(bad, x) for x in outs)
    else:
        outs = _safe_kl_core(lam, rho, calibrate, bad)(l, a, s)
    val, *rest = outs
    keys = ("mean_w", "saturation", "grad_alpha", "curvature")
    return val, {k: tf.stop_gradient(x) for k, x in zip(keys, rest)}


def _prepare_optional(losses, sample_weight):
    """Flat losses in the compute dtype and their checked flat weights.

    Returns ``(l, s, original_dtype, bad)``: ``s`` is ``None`` without ``sample_weight`` (else
    broadcast as in :func:`safe_kl_dro_risk`, checked finite and >= 0) and ``bad`` its scalar
    invalid-weight flag (``None`` without weights).
    """
    if sample_weight is None:
        l, original = to_compute_dtype(losses, "losses")
        return tf.reshape(l, [-1]), None, original, None
    return _prepare(losses, sample_weight)


def _scalar_alpha(alpha, dtype):
    """``alpha`` as a scalar tensor of ``dtype`` (Python numbers without a float32 detour)."""
    a = _as_alpha(alpha, dtype)
    return a if a.shape.rank in (None, 0) else tf.reshape(a, [])


def safe_kl_dro_risk_and_stats(losses, alpha, lam, rho, sample_weight=None, calibrate=True):
    """Safe-KL risk with its diagnostics in one pass.

    Arguments and the fail-loud behaviour are those of :func:`safe_kl_dro_risk`.

    Returns:
      ``(value, stats)`` where ``value`` is the risk (differentiable in ``losses`` and
      ``alpha``) and ``stats`` is a dict of float tensors without gradient:
      ``mean_w = sum pi_i w_i`` (1 at the optimal alpha), ``saturation = rho max_i w_i``
      in [0, 1) (near 1: the weight cap binds, CVaR regime), ``grad_alpha = 1 - mean_w``,
      the exact gradient of the value in alpha, and ``curvature = sum pi_i w_i (1 - rho w_i)``
      (``lam`` times the exact second derivative in alpha, spec 3.1).
    """
    lam, rho = check_lam(lam), check_rho(rho)
    calibrate = check_bool(calibrate, "calibrate")
    l, s, original, bad = _prepare_optional(losses, sample_weight)
    a = _check_alpha(alpha, l.dtype)
    bad = _any(bad, tf.logical_not(tf.math.is_finite(a)))
    val, stats = _risk_and_stats(l, a, s, bad, lam, rho, calibrate)
    if original != l.dtype:
        val = tf.cast(val, original)
    return val, stats


def safe_kl_dro_risk(losses, alpha, lam, rho, sample_weight=None, calibrate=True):
    """Safe-KL DRO risk ``V = sum_i pi_i [alpha - lam + (lam/rho) softplus(z_i)]``.

    With ``z_i = (l_i - alpha)/lam + ln rho``.

    Args:
      losses: per-example losses, any shape (flattened; each entry is one sample).
      alpha: scalar dual variable (tensor or variable); gets the gradient ``1 - sum pi w``.
        Must be finite.
      lam: temperature, Python float, finite and > 0.
      rho: accuracy, Python float in (0, 1); weights are capped at ``1/rho``.
      sample_weight: optional weights, finite and >= 0, a scalar or broadcastable over a
        prefix of the losses' shape.
      calibrate: bool; subtract ``lam`` so that ``min_alpha V -> R_lam`` as rho -> 0
        (spec 9.1).

    Returns:
      Scalar risk in the losses' dtype (half precision is computed in float32).

    Raises:
      ValueError: (TypeError for a wrong type) naming the argument: bad ``lam`` / ``rho`` /
        ``calibrate``, NaN/Inf/negative ``sample_weight`` or non-finite ``alpha`` (eagerly;
        inside ``tf.function`` an assertion, skippable with ``losszoo.set_validation(False)``).

    Fail-loud behaviour: a NaN loss with positive weight gives a NaN value (and NaN
    gradient for that entry); a ``+inf`` loss gives ``+inf`` with finite gradients; zero
    weight entries are ignored; an empty batch gives 0. Under XLA: (assertions vanish)
    invalid sample weights or a non-finite alpha make the value, its gradients and the
    statistics NaN.

    Example:
      >>> round(float(safe_kl_dro_risk([1.0, 2.0, 3.0], alpha=2.0, lam=1.0, rho=0.1)), 4)
      2.2396
    """
    return safe_kl_dro_risk_and_stats(losses, alpha, lam, rho, sample_weight, calibrate)[0]


def safe_kl_dro_weights(losses, alpha, lam, rho):
    """Per-example weights ``w_i = sigmoid((l_i - alpha)/lam + ln rho)/rho`` (same shape).

    NaN losses give NaN weights. ``alpha`` must be finite (checked as in
    :func:`safe_kl_dro_risk`). Under XLA: a non-finite alpha gives all-NaN weights.
    """
    lam, rho = check_lam(lam), check_rho(rho)
    l, original = to_compute_dtype(losses, "losses")
    a = _check_alpha(alpha, l.dtype)
    z = (l - a) * _const(1.0 / lam, l.dtype) + _const(math.log(rho), l.dtype)
    w = tf.math.sigmoid(z) * _const(1.0 / rho, l.dtype)
    w = nan_where(tf.logical_not(tf.math.is_finite(a)), w)
    return tf.cast(w, original) if original != l.dtype else w


def safe_kl_dro_solve_alpha(losses, lam, rho, sample_weight=None, iterations=80):
    """Batch optimal alpha: root of ``sum_i pi_i sigmoid((l_i-alpha)/lam + ln rho)/rho = 1``.

    Bisection on the bracket ``[min l + lam log(1-rho), max l]`` (spec 7, C0) over entries
    with positive weight, with a fixed number of iterations (an integer >= 1;
    XLA-compilable). A NaN live loss gives NaN, an infinite one a non-finite result; an
    empty batch gives 0. No gradient. Under XLA: invalid sample weights give NaN.
    """
    lam, rho = check_lam(lam), check_rho(rho)
    iterations = check_number(iterations, "iterations", low=1, integer=True)
    if isinstance(iterations, (tf.Tensor, tf.Variable)):
        raise TypeError("`iterations` must be a Python integer, not a tensor.")
    l, s, _, bad = _prepare(losses, sample_weight)
    l = tf.stop_gradient(l)
    dt = l.dtype
    live = s > 0
    big = _const(np.finfo(dt.as_numpy_dtype).max, dt)
    lo = tf.reduce_min(tf.where(live, l, tf.fill(tf.shape(l), big))) + _const(
        lam * math.log1p(-rho), dt
    )
    hi = tf.reduce_max(tf.where(live, l, tf.fill(tf.shape(l), -big)))
    c = tf.constant([1.0 / lam, math.log(rho), 1.0 / rho], dt)
    out = _bisect(l, s, lo, hi, c, tf.constant(int(iterations)))
    return _poison(_any(bad, _live_nan(l, s)), out)


@tf.function(reduce_retracing=True, autograph=False)
def _bisect(l, s, lo, hi, c, iterations):
    # A tf.function so that eager calls run the loop as one graph (fast); inside graphs
    # and XLA it is inlined. c = [1/lam, log rho, 1/rho] as a tensor: no retracing per value.
    live = s > 0
    s_sum = tf.reduce_sum(s)
    zeros = tf.zeros_like(l)
    inv_lam, log_rho, inv_rho = c[0], c[1], c[2]

    def h(a):  # sum pi w - 1, strictly decreasing in a
        w = tf.math.sigmoid((l - a) * inv_lam + log_rho) * inv_rho
        return tf.math.divide_no_nan(tf.reduce_sum(tf.where(live, s * w, zeros)), s_sum) - 1.0

    def body(i, lo, hi):
        mid = 0.5 * (lo + hi)
        pos = h(mid) > 0
        return i + 1, tf.where(pos, mid, lo), tf.where(pos, hi, mid)

    _, lo, hi = tf.while_loop(lambda i, lo, hi: i < iterations, body, (tf.constant(0), lo, hi))
    return tf.where(s_sum > 0, 0.5 * (lo + hi), tf.zeros_like(lo))


# ----------------------------------------------------------------------------- baselines
def _normalised_weights(s, s_total=None):
    return tf.math.divide_no_nan(s, tf.reduce_sum(s) if s_total is None else s_total)


def _batch_lse_parts(l, s, lam):
    """Shift-free pieces of ``log sum s exp(l/lam)``: ``a_i = l_i/lam + log s_i`` (-inf where
    ``s_i = 0``), the maximum ``m`` of ``a`` and whether it is ``+inf``."""
    dt = l.dtype
    live = s > 0
    ninf = tf.fill(tf.shape(l), _const(-np.inf, dt))
    a = tf.where(
        live, l * _const(1.0 / lam, dt) + tf.math.log(tf.where(live, s, tf.ones_like(s))), ninf
    )
    m = tf.reduce_max(tf.concat([a, _const([-np.inf], dt)], 0))
    return a, m


def _batch_lse_exp(a, s, m):
    """``exp(a - m)`` with ``m`` made finite; at ``m = +inf`` the limit weights: ``s_i`` on the
    ``+inf`` entries, 0 elsewhere (the softmax of an infinite logit)."""
    m_inf = tf.math.is_inf(m) & (m > 0)
    m_safe = tf.where(tf.math.is_finite(m), m, tf.zeros_like(m))
    ex = tf.where(
        m_inf, tf.where(tf.math.is_inf(a) & (a > 0), s, tf.zeros_like(a)), tf.exp(a - m_safe)
    )
    return tf.where(s > 0, ex, tf.zeros_like(ex)), m_safe, m_inf


def _batch_lse_value(lam, m_safe, m_inf, tot, s_sum):
    dt = tot.dtype
    val = _const(lam, dt) * (m_safe + tf.math.log(tot) - tf.math.log(s_sum))
    val = tf.where(m_inf, _const(np.inf, dt), val)
    return tf.where(s_sum > 0, val, tf.zeros_like(val))


def kl_dro_batch_lse(losses, lam, sample_weight=None):
    """Naive mini-batch KL-DRO risk ``lam log sum_i pi_i exp(l_i/lam)`` (biased, spec 2.1).

    Max-shifted (no overflow); gradient ``softmax_i(l/lam + log pi)``. Zero-weight entries
    are ignored; an empty batch gives 0. A ``+inf`` loss gives ``+inf`` with the limit
    gradient (the ``+inf`` entries share the weight 1 in proportion to ``pi``, the others
    get 0); ``-inf`` losses get weight 0; a NaN loss with positive weight gives a NaN value
    and gradients. Bad ``lam`` or ``sample_weight`` raise as in :func:`safe_kl_dro_risk`.
    Under XLA: invalid sample weights give a NaN value and gradients.

    Example:
      >>> float(kl_dro_batch_lse([0.0, 0.0], lam=1.0))
      0.0
    """
    lam = check_lam(lam)
    l, s, original, bad = _prepare(losses, sample_weight)
    bad = _any(bad, _live_nan(l, s))

    @tf.custom_gradient
    def core(l, s):
        a, m = _batch_lse_parts(l, s, lam)
        ex, m_safe, m_inf = _batch_lse_exp(a, s, m)
        tot = tf.reduce_sum(ex)
        val = _poison(bad, _batch_lse_value(lam, m_safe, m_inf, tot, tf.reduce_sum(s)))

        def grad(dv):
            return _poison(bad, dv * tf.math.divide_no_nan(ex, tot)), tf.zeros_like(s)

        return val, grad

    val = core(l, s)
    return tf.cast(val, original) if original != l.dtype else val


def kl_dro_sumexp(losses, lam, sample_weight=None):
    """Sum-of-exp objective ``sum_i pi_i exp(l_i/lam)`` (paper eq. 21, spec 2.1).

    Same minimisers as the KL-DRO risk and unbiased, but it overflows for ``l/lam`` above
    ~88.7 in float32 (by design: there is no safe form). Gradient ``pi_i exp(l_i/lam)/lam``.
    Whenever the value is not finite, every gradient entry is NaN: an overflow or a ``+inf``
    loss gives the value ``+inf``, a NaN loss with positive weight the value NaN (a finite
    gradient for the other entries would be a plausible but meaningless step). Zero-weight
    entries are ignored. Under XLA: invalid sample weights give a NaN value and gradients.

    Example:
      >>> float(kl_dro_sumexp([0.0, 0.0], lam=1.0))
      1.0
    """
    lam = check_lam(lam)
    l, s, original, bad = _prepare(losses, sample_weight)
    return _sumexp(l, s, lam, bad, original)


def _sumexp(l, s, lam, bad, original, s_total=None):
    @tf.custom_gradient
    def core(l, s):
        dt = l.dtype
        live = s > 0
        pi = tf.where(live, _normalised_weights(s, s_total), tf.zeros_like(s))
        ex = tf.where(live, tf.exp(l * _const(1.0 / lam, dt)), tf.zeros_like(l))
        val = _poison(bad, tf.reduce_sum(pi * ex))
        unusable = tf.logical_not(tf.math.is_finite(val))  # overflow, +inf or NaN: no gradient

        def grad(dv):
            return nan_where(unusable, dv * pi * ex * _const(1.0 / lam, dt)), tf.zeros_like(s)

        return val, grad

    val = core(l, s)
    return tf.cast(val, original) if original != l.dtype else val


def _cvar_tail_mass(l, s, rho, s_total=None):
    """``q_i``: the mass of example i inside the upper-``rho`` tail (stable sort by loss)."""
    dt = l.dtype
    live = s > 0
    pi = tf.where(live, _normalised_weights(s, s_total), tf.zeros_like(s))
    key = tf.where(live, l, tf.fill(tf.shape(l), _const(-np.inf, dt)))
    order = tf.argsort(key, direction="DESCENDING", stable=True)
    pi_sorted = tf.gather(pi, order)
    before = tf.cumsum(pi_sorted, exclusive=True)
    q_sorted = tf.clip_by_value(_const(rho, dt) - before, tf.zeros_like(before), pi_sorted)
    return tf.scatter_nd(order[:, None], q_sorted, tf.shape(l, out_type=order.dtype))


def _cvar_from_mass(l, q, rho, bad):
    """``(1/rho) sum q_i l_i`` with the gradient ``q_i/rho`` (q fixed)."""

    @tf.custom_gradient
    def core(l):
        dt = l.dtype
        contrib = tf.where(q > 0, q * l, tf.zeros_like(l))
        val = _poison(bad, tf.reduce_sum(contrib) * _const(1.0 / rho, dt))

        def grad(dv):
            return _poison(bad, dv * q * _const(1.0 / rho, dt))

        return val, grad

    return core(l)


def cvar_risk(losses, rho, sample_weight=None):
    """CVaR at level rho: ``min_a a + (1/rho) sum_i pi_i (l_i - a)_+`` (exact, by sorting).

    Equals the average of the upper-``rho`` tail of the weighted empirical law; the
    gradient gives example i the weight ``q_i/rho`` with ``q_i`` its mass inside the tail
    (ties are split in index order). A NaN loss with positive weight makes the value and
    every gradient NaN (the tail is undefined); ``+inf`` in the tail gives ``+inf`` with
    finite gradients. Bad ``rho`` or ``sample_weight`` raise as in :func:`safe_kl_dro_risk`.
    Under XLA: invalid sample weights give a NaN value and gradients.

    Example:
      >>> float(cvar_risk([1.0, 2.0, 3.0, 4.0], rho=0.5))
      3.5
    """
    rho = check_rho(rho)
    l, s, original, bad = _prepare(losses, sample_weight)
    bad = _any(bad, _live_nan(l, s))
    q = tf.stop_gradient(_cvar_tail_mass(tf.stop_gradient(l), s, rho))
    val = _cvar_from_mass(l, q, rho, bad)
    return tf.cast(val, original) if original != l.dtype else val


# ----------------------------------------------------------------------------- streaming exact risk
def kl_dro_exact_batch_max(losses, lam, sample_weight=None, dtype=tf.float64):
    """``max_i l_i/lam`` over entries with positive weight (``-inf`` if none), in ``dtype``.

    NaN live losses give NaN. Under XLA: invalid sample weights give NaN.
    """
    lam = check_lam(lam)
    l, s, _, bad = _prepare(losses, sample_weight)
    l, s = tf.cast(l, dtype), tf.cast(s, dtype)
    a = tf.where(s > 0, l * _const(1.0 / lam, dtype), tf.fill(tf.shape(l), _const(-np.inf, dtype)))
    out = tf.reduce_max(tf.concat([a, _const([-np.inf], dtype)], 0))
    return _poison(_any(bad, _live_nan(l, s)), out)


def kl_dro_exact_state_update(m, acc, n, losses, lam, sample_weight=None, batch_max=None):
    """One streaming step of ``R = lam log(sum s exp(l/lam) / sum s)``.

    State: ``m`` running max of ``l/lam`` (start -inf), ``acc = sum s exp(l/lam - m)``
    (start 0), ``n = sum s`` (start 0); all in the state's dtype. ``batch_max`` overrides
    the batch's own maximum (any value >= it works; replicas pass a shared one so that
    their ``acc`` share the shift and can be summed). Returns the new state. NaN losses
    with positive weight make ``acc`` NaN (and so the result). Under XLA: invalid sample
    weights make ``acc`` NaN.
    """
    lam = check_lam(lam)
    dt = tf.as_dtype(m.dtype)
    l, s, _, bad = _prepare(losses, sample_weight)
    l, s = tf.cast(l, dt), tf.cast(s, dt)
    live = s > 0
    a = tf.where(live, l * _const(1.0 / lam, dt), tf.fill(tf.shape(l), _const(-np.inf, dt)))
    if batch_max is None:
        batch_max = tf.reduce_max(tf.concat([a, _const([-np.inf], dt)], 0))
    m_new = tf.maximum(m, tf.cast(batch_max, dt))
    m_safe = tf.where(tf.math.is_finite(m_new), m_new, tf.zeros_like(m_new))
    scale = tf.where(tf.math.is_inf(m) & (m < 0), tf.zeros_like(m), tf.exp(m - m_safe))
    acc_new = acc * scale + tf.reduce_sum(tf.where(live, s * tf.exp(a - m_safe), tf.zeros_like(a)))
    return m_new, _poison(bad, acc_new), _poison(bad, n + tf.reduce_sum(s))


def kl_dro_exact_state_result(m, acc, n, lam):
    """``lam (m + log acc - log n)``; 0 before any example was seen (``n == 0``).

    A NaN state (NaN losses or, under XLA, invalid weights) gives NaN. Otherwise ``acc`` and
    ``n`` must be finite and >= 0: eagerly a ``ValueError`` naming the argument, inside
    ``tf.function`` a graph assertion (skippable with ``losszoo.set_validation(False)``), under
    XLA a NaN result.
    """
    lam = check_lam(lam)
    m = tf.convert_to_tensor(m)
    dt = m.dtype
    acc, bad_acc = _check_nonnegative(tf.cast(acc, dt), "acc", allow_nan=True)
    n, bad_n = _check_nonnegative(tf.cast(n, dt), "n", allow_nan=True)
    val = _const(lam, dt) * (m + tf.math.log(acc) - tf.math.log(n))
    return _poison(bad_acc | bad_n, tf.where(tf.equal(n, 0), tf.zeros_like(val), val))
