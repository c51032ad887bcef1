"""The DRO risks of one batch (spec 1.5, 2.1, 3.1-3.4, 4, 7 C0), and the argument checks,
input preparation and invalid-input flags that every module of :mod:`losszoo.ops.dro` shares
(``check_lam``, ``prepare``, ``poison``, ...: the package's own vocabulary, not public API).

* Safe-KL risk (calibrated; ``calibrate=False`` drops the ``- lam``, the paper's G)::

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
* ``safe_kl_dro_solve_alpha``: the batch stationarity ``sum pi_i w_i = 1`` by bisection on
  ``[min l + lam log(1-rho), max l]`` (spec 7 C0), fixed iteration count, XLA-compilable.
* Batch LogSumExp baseline (spec 2.1, biased): ``lam log sum_i pi_i exp(l_i/lam)``, gradient
  ``softmax(l/lam + log pi)``; max-shifted.
* Sum-of-exp baseline (spec 2.1, paper eq. 21): ``sum_i pi_i exp(l_i/lam)``, gradient
  ``pi_i exp(l_i/lam)/lam``. Unbiased but overflows by design (no safe form exists).
* CVaR at level rho (spec 4, Rockafellar-Uryasev eq. 9), the safe-KL risk's ``lam -> 0``
  limit: ``min_a a + (1/rho) sum_i pi_i (l_i - a)_+`` = the mean of the upper ``rho`` tail
  of the weighted empirical law. Computed exactly by a sort; gradient ``q_i/rho`` where
  ``q_i`` is the mass of example i inside the tail.

The pieces of the baselines (``batch_lse_terms``, ``cvar_tail_mass``) and of the safe-KL risk
(``risk_and_stats``) are shared with the global-batch versions in
:mod:`losszoo.ops.dro.distribute`.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from keras import ops

from losszoo import _backend

# maximum, minimum, cumsum and divide_no_nan: the keras.ops that keep float64 on PyTorch.
from losszoo._backend import cumsum, custom_gradient, divide_no_nan, maximum, minimum
from losszoo.contract import (
    NON_NEGATIVE,
    check_bool,
    check_finite,
    check_number,
    check_real,
    dtype_name,
    nan_where,
    static_rank,
    to_compute_dtype,
)


# ----------------------------------------------------------------------------- shared inputs
def check_lam(lam) -> float:
    """Return ``lam`` as a Python float; ``ValueError`` unless finite and > 0."""
    return check_number(lam, "lam", low=0.0, low_open=True, tensor_ok=False)


def check_rho(rho) -> float:
    """Return ``rho`` as a Python float; ``ValueError`` unless 0 < rho < 1 (spec 1.6 item 4:
    rho = 1 is degenerate, alpha* = -inf, and rho > 1 makes the risk unbounded below)."""
    return check_number(
        rho, "rho", low=0.0, high=1.0, low_open=True, high_open=True, tensor_ok=False
    )


def poison(bad, x):
    """``x`` with NaN everywhere if the scalar flag ``bad`` is set (``None``: unchanged)."""
    return x if bad is None else nan_where(bad, x)


def any_flag(*flags):
    """The logical or of the flags that are not ``None`` (``None`` if all are)."""
    flags = [f for f in flags if f is not None]
    return functools.reduce(ops.logical_or, flags) if flags else None


def live_nan(l, s):
    """Scalar flag: a NaN loss with positive weight (reductions under XLA skip NaN)."""
    return ops.any(ops.isnan(l) & (s > 0))


def const(x, dtype):
    # A Python float converted straight to ``dtype`` keeps float64 precision (spec 3.4).
    return ops.convert_to_tensor(x, dtype)


def max_or_minus_inf(a):
    """``max(a)`` of a flat tensor, ``-inf`` when empty (XLA and numpy agree then)."""
    return ops.max(ops.concatenate([a, const([-np.inf], dtype_name(a))], 0))


def weights_like(sample_weight, l):
    """Checked weights ``sample_weight`` broadcast to the losses ``l`` (Keras convention: a
    scalar or a prefix of ``l``'s shape). Returns ``(s, bad)`` (``bad``: invalid flag)."""
    s = ops.convert_to_tensor(sample_weight)
    check_real(s, "sample_weight")
    s = NON_NEGATIVE.check(ops.cast(s, dtype_name(l)), "sample_weight")
    bad = ops.any(NON_NEGATIVE.invalid(s))
    s_rank, l_rank = static_rank(s), static_rank(l)
    if s_rank is not None and l_rank is not None:
        while s_rank > l_rank and s.shape[-1] == 1:
            s, s_rank = ops.squeeze(s, -1), s_rank - 1
        fits = s_rank <= l_rank and all(
            a is None or b is None or a in (1, b) for a, b in zip(s.shape, l.shape)
        )
        if not fits:
            raise ValueError(
                f"`sample_weight` of shape {tuple(s.shape)} does not fit the losses' shape "
                f"{tuple(l.shape)}: it must be a scalar or broadcast over a prefix of it."
            )
        for _ in range(l_rank - s_rank if s_rank > 0 else 0):
            s = s[..., None]
    return ops.broadcast_to(s, ops.shape(l)), bad


def prepare(losses, sample_weight, ones=True):
    """Flat losses in the compute dtype and their checked flat weights.

    Returns ``(l, s, original_dtype, bad)``: ``s`` broadcast as in :func:`safe_kl_dro_risk`
    and checked finite and >= 0; without ``sample_weight`` all ones, or ``None`` when
    ``ones=False``. ``bad`` is the scalar invalid-weight flag (``None`` without weights).
    """
    l, original = to_compute_dtype(losses, "losses")
    if sample_weight is None:
        l = ops.reshape(l, [-1])
        return l, (ops.ones_like(l) if ones else None), original, None
    s, bad = weights_like(sample_weight, l)
    return ops.reshape(l, [-1]), ops.reshape(s, [-1]), original, bad


def scalar_alpha(alpha, dtype):
    """``alpha`` as a scalar tensor of ``dtype`` (Python numbers without a float32 detour)."""
    if isinstance(alpha, (int, float, np.number)) and not isinstance(alpha, bool):
        return const(float(alpha), dtype)
    a = ops.cast(ops.convert_to_tensor(alpha), dtype)
    if static_rank(a) in (None, 0):
        return a
    sizes = tuple(a.shape)
    if None not in sizes and int(np.prod(sizes)) != 1:
        raise ValueError(f"`alpha` must be a scalar, got shape {sizes}.")
    return ops.reshape(a, [])


# ----------------------------------------------------------------------------- safe-KL
def _safe_kl_core(lam: float, rho: float, calibrate: bool):
    inv_lam, log_rho, inv_rho = 1.0 / lam, math.log(rho), 1.0 / rho

    @custom_gradient
    def core(l, alpha, s, bad):
        dt = dtype_name(l)
        z = (l - alpha) * const(inv_lam, dt) + const(log_rho, dt)
        e = ops.exp(-ops.abs(z))
        zeros = ops.zeros_like(l)
        sp = maximum(z, zeros) + ops.log1p(e)
        sig = ops.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
        live = s > 0
        s_sum = ops.sum(s)
        num = ops.sum(ops.where(live, s * sp, zeros))
        sw = ops.where(live, s * sig, zeros) * const(inv_rho, dt)  # s_i w_i
        sw_sum = ops.sum(sw)
        nonempty = s_sum > 0
        val = alpha + const(lam / rho, dt) * divide_no_nan(num, s_sum)
        if calibrate:
            val = val - const(lam, dt)
        val = nan_where(bad, ops.where(nonempty, val, ops.zeros_like(val)))
        mean_w = divide_no_nan(sw_sum, s_sum)
        # saturation rho * max_i w_i = max_i sigmoid(z_i) over live entries (0 if empty)
        sat = ops.max(ops.concatenate([ops.where(live, sig, zeros), ops.zeros([1], dt)], 0))
        sat = nan_where(ops.isnan(sw_sum), sat)  # XLA's max drops NaN; the sum keeps it
        grad_alpha = ops.where(nonempty, 1.0 - mean_w, ops.zeros_like(mean_w))
        # lam * d^2V/dalpha^2 = sum pi w (1 - rho w)   (spec 3.1; w (1 - rho w) = sw (1 - sig))
        curv = divide_no_nan(ops.sum(sw * (1.0 - sig)), s_sum)
        mean_w, sat, grad_alpha, curv = (nan_where(bad, x) for x in (mean_w, sat, grad_alpha, curv))

        def grad(dv, *_):
            # Only the value is differentiable; the statistics are diagnostics
            # (stop-gradient semantics, documented): their upstream gradients are ignored.
            g_l = nan_where(bad, dv * divide_no_nan(sw, s_sum))
            return g_l, dv * grad_alpha, ops.zeros_like(s), None

        return (val, mean_w, sat, grad_alpha, curv), grad

    return core


def _safe_kl_core_unweighted(lam: float, rho: float, calibrate: bool):
    """The same kernel for ``s_i = 1`` (no sample weights): fewer ops, identical maths.

    A lean path matters for small models, where a training step is only a few hundred
    microseconds and every graph op counts. ``ops.softplus`` / ``ops.sigmoid`` are the
    stable forms of spec 3.2.
    """
    inv_lam, log_rho, inv_rho = 1.0 / lam, math.log(rho), 1.0 / rho

    @custom_gradient
    def core(l, alpha):
        dt = dtype_name(l)
        n = ops.cast(ops.size(l), dt)
        inv_n = divide_no_nan(ops.ones([], dt), n)
        z = (l - alpha) * const(inv_lam, dt) + const(log_rho, dt)
        sig = ops.sigmoid(z)
        val = alpha + const(lam / rho, dt) * (ops.sum(ops.softplus(z)) * inv_n)
        if calibrate:
            val = val - const(lam, dt)
        val = ops.where(n > 0, val, ops.zeros_like(val))
        mean_w = ops.sum(sig) * (inv_n * const(inv_rho, dt))
        sat = ops.max(ops.concatenate([sig, ops.zeros([1], dt)], 0))
        sat = nan_where(ops.isnan(mean_w), sat)  # XLA's max drops NaN; the sum keeps it
        grad_alpha = ops.where(n > 0, 1.0 - mean_w, ops.zeros_like(mean_w))
        curv = ops.sum(sig * (1.0 - sig)) * (inv_n * const(inv_rho, dt))

        def grad(dv, *_):  # the statistics get no gradient, as above
            return dv * (sig * (inv_n * const(inv_rho, dt))), dv * grad_alpha

        return (val, mean_w, sat, grad_alpha, curv), grad

    return core


def risk_and_stats(l, a, s, bad, lam, rho, calibrate):
    """The safe-KL value and statistics of flat losses ``l`` (compute dtype), scalar ``a``,
    flat weights ``s`` (``None``: all 1) and the invalid-input flag ``bad`` (``None``: valid;
    always a flag with weights); ``lam``, ``rho`` and ``calibrate`` already checked. The
    statistics carry no gradient."""
    if s is None:
        outs = [poison(bad, x) for x in _safe_kl_core_unweighted(lam, rho, calibrate)(l, a)]
    else:
        outs = _safe_kl_core(lam, rho, calibrate)(l, a, s, bad)
    val, *rest = outs
    keys = ("mean_w", "saturation", "grad_alpha", "curvature")
    return val, {k: ops.stop_gradient(x) for k, x in zip(keys, rest)}


def safe_kl_dro_risk_and_stats(losses, alpha, lam, rho, sample_weight=None, calibrate=True):
    """Safe-KL risk ``V = sum_i pi_i [alpha - lam + (lam/rho) softplus(z_i)]`` and diagnostics.

    With ``z_i = (l_i - alpha)/lam + ln rho`` and ``w_i = sigmoid(z_i)/rho``, in one pass.
    The fail-loud behaviour is that of :func:`safe_kl_dro_risk`.

    Args:
      losses: per-example losses, any shape (flattened; each entry is one sample).
      alpha: scalar dual variable (tensor, variable or Python number), finite.
      lam: temperature, Python float, finite and > 0.
      rho: accuracy, Python float in (0, 1); weights are capped at ``1/rho``.
      sample_weight: optional weights ``s_i`` (``pi_i = s_i / sum_j s_j``), finite and >= 0,
        a scalar or broadcastable over a prefix of the losses' shape.
      calibrate: bool (default True); subtract ``lam`` (``False``: the paper's G).

    Returns:
      ``(value, stats)`` where ``value`` is the risk (differentiable in ``losses`` and
      ``alpha``) and ``stats`` is a dict of float tensors without gradient:
      ``mean_w = sum pi_i w_i`` (1 at the optimal alpha), ``saturation = rho max_i w_i``
      in [0, 1) (near 1: the weight cap binds, CVaR regime), ``grad_alpha = 1 - mean_w``,
      the exact gradient of the value in alpha, and ``curvature = sum pi_i w_i (1 - rho w_i)``
      (``lam`` times the exact second derivative in alpha, spec 3.1). ``value`` is in the
      losses' dtype, the statistics in the compute dtype (float32 for half precision).

    Raises:
      ValueError: (TypeError for a wrong type) naming the argument, as
        :func:`safe_kl_dro_risk`.

    Example:
      >>> losses = [1.0, 2.0, 3.0]
      >>> value, stats = losszoo.ops.safe_kl_dro_risk_and_stats(losses, 2.0, lam=1.0, rho=0.1)
      >>> round(float(value), 4), round(float(stats["mean_w"]), 4)  # alpha below its optimum
      (2.2396, 1.1337)
    """
    lam, rho = check_lam(lam), check_rho(rho)
    calibrate = check_bool(calibrate, "calibrate")
    l, s, original, bad = prepare(losses, sample_weight, ones=False)
    a = check_finite(scalar_alpha(alpha, dtype_name(l)), "alpha")
    bad = any_flag(bad, ops.logical_not(ops.isfinite(a)))
    val, stats = risk_and_stats(l, a, s, bad, lam, rho, calibrate)
    return ops.cast(val, original), stats


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
        in a TensorFlow graph an assertion, skippable with ``losszoo.set_validation(False)``).

    Fail-loud behaviour: a NaN loss with positive weight gives a NaN value (and NaN
    gradient for that entry); a ``+inf`` loss gives ``+inf`` with finite gradients; zero
    weight entries are ignored; an empty batch gives 0. Traced under XLA / ``jax.jit``:
    invalid sample weights or a non-finite alpha make the value, its gradients and the
    statistics NaN.

    Example:
      >>> round(float(safe_kl_dro_risk([1.0, 2.0, 3.0], alpha=2.0, lam=1.0, rho=0.1)), 4)
      2.2396
    """
    return safe_kl_dro_risk_and_stats(losses, alpha, lam, rho, sample_weight, calibrate)[0]


def safe_kl_dro_weights(losses, alpha, lam, rho):
    """Per-example weights ``w_i = sigmoid((l_i - alpha)/lam + ln rho)/rho`` (same shape).

    The gradient of :func:`safe_kl_dro_risk` is ``pi_i w_i``; ``w_i`` lies in ``(0, 1/rho)``.
    NaN losses give NaN weights. Traced under XLA / ``jax.jit``: a non-finite alpha gives
    all-NaN weights.

    Args:
      losses: per-example losses, any shape.
      alpha: scalar dual variable (tensor, variable or Python number), finite.
      lam: temperature, Python float, finite and > 0.
      rho: accuracy, Python float in (0, 1).

    Returns:
      The weights, with the shape and dtype of ``losses`` (half precision computed in
      float32).

    Raises:
      ValueError: naming ``lam``, ``rho`` or a non-finite ``alpha`` (eagerly; in a
        TensorFlow graph an assertion), as :func:`safe_kl_dro_risk`.

    Example:
      >>> w = losszoo.ops.safe_kl_dro_weights([1.0, 2.0, 3.0], alpha=2.0, lam=1.0, rho=0.1)
      >>> np.round(keras.ops.convert_to_numpy(w), 4)
      array([0.3548, 0.9091, 2.1373], dtype=float32)
    """
    lam, rho = check_lam(lam), check_rho(rho)
    l, original = to_compute_dtype(losses, "losses")
    dt = dtype_name(l)
    a = check_finite(scalar_alpha(alpha, dt), "alpha")
    z = (l - a) * const(1.0 / lam, dt) + const(math.log(rho), dt)
    w = ops.sigmoid(z) * const(1.0 / rho, dt)
    return ops.cast(nan_where(ops.logical_not(ops.isfinite(a)), w), original)


def safe_kl_dro_solve_alpha(losses, lam, rho, sample_weight=None, iterations=80):
    """Batch optimal alpha: root of ``sum_i pi_i sigmoid((l_i-alpha)/lam + ln rho)/rho = 1``.

    Bisection on the bracket ``[min l + lam log(1-rho), max l]`` (spec 7, C0) over entries
    with positive weight, with a fixed number of iterations (an integer >= 1;
    XLA-compilable). A NaN live loss gives NaN, an infinite one a non-finite result; an
    empty batch gives 0. No gradient. Traced under XLA / ``jax.jit``: invalid sample
    weights give NaN.

    Args:
      losses: per-example losses, any shape (flattened).
      lam: temperature, Python float, finite and > 0.
      rho: accuracy, Python float in (0, 1).
      sample_weight: optional weights ``s_i`` (``pi_i = s_i / sum_j s_j``), finite and >= 0,
        a scalar or broadcastable over a prefix of the losses' shape.
      iterations: bisection steps, a Python int >= 1 (default 80; each halves the bracket).

    Returns:
      Scalar alpha in the compute dtype (float32 for float32 and half-precision losses,
      float64 for float64).

    Raises:
      ValueError: (TypeError for a wrong type) naming ``lam``, ``rho``, ``iterations`` or
        ``sample_weight``, as :func:`safe_kl_dro_risk`.

    Example:
      >>> alpha = losszoo.ops.safe_kl_dro_solve_alpha([1.0, 2.0, 3.0], lam=1.0, rho=0.1)
      >>> round(float(alpha), 4)
      2.1482
      >>> _, stats = losszoo.ops.safe_kl_dro_risk_and_stats([1.0, 2.0, 3.0], alpha, 1.0, 0.1)
      >>> round(float(stats["mean_w"]), 4)  # sum_i pi_i w_i = 1 at the solved alpha
      1.0
    """
    lam, rho = check_lam(lam), check_rho(rho)
    iterations = check_number(iterations, "iterations", low=1, integer=True, tensor_ok=False)
    l, s, _, bad = prepare(losses, sample_weight)
    l = ops.stop_gradient(l)
    dt = dtype_name(l)
    live = s > 0
    big = float(np.finfo(dt).max)
    low = -max_or_minus_inf(ops.where(live, -l, const(-big, dt)))
    lo = low + const(lam * math.log1p(-rho), dt)
    hi = max_or_minus_inf(ops.where(live, l, const(-big, dt)))
    c = ops.convert_to_tensor([1.0 / lam, math.log(rho), 1.0 / rho], dt)
    out = _bisect(l, s, lo, hi, c, ops.convert_to_tensor(int(iterations), "int32"))
    return poison(any_flag(bad, live_nan(l, s)), out)


def _bisect_loop(l, s, lo, hi, c, iterations):
    # c = [1/lam, log rho, 1/rho] and iterations as tensors: no retracing per value.
    live = s > 0
    s_sum = ops.sum(s)
    zeros = ops.zeros_like(l)
    inv_lam, log_rho, inv_rho = c[0], c[1], c[2]

    def h(a):  # sum pi w - 1, strictly decreasing in a
        w = ops.sigmoid((l - a) * inv_lam + log_rho) * inv_rho
        return divide_no_nan(ops.sum(ops.where(live, s * w, zeros)), s_sum) - 1.0

    def body(i, lo, hi):
        mid = 0.5 * (lo + hi)
        pos = h(mid) > 0
        return i + 1, ops.where(pos, mid, lo), ops.where(pos, hi, mid)

    start = ops.zeros([], "int32")
    _, lo, hi = ops.while_loop(lambda i, lo, hi: i < iterations, body, (start, lo, hi))
    return ops.where(s_sum > 0, 0.5 * (lo + hi), ops.zeros_like(lo))


_bisect = _backend.jit_on_jax(_bisect_loop)  # JAX outside jit: one program per shape
if _backend.TENSORFLOW:  # eager TensorFlow runs the loop as one graph (inlined when traced)
    _bisect = _backend.tf.function(_bisect_loop, reduce_retracing=True, autograph=False)


# ----------------------------------------------------------------------------- baselines
def batch_lse_terms(l, s, lam, top=lambda m: m, sums=lambda xs: xs):
    """``(V, e, T)`` of the batch LogSumExp ``V = lam log(sum_i s_i exp(l_i/lam) / sum_i s_i)``:
    ``e_i = s_i exp(l_i/lam - m)`` with ``m`` the maximum of ``l_i/lam + log s_i`` over
    ``s_i > 0`` made finite, and ``T = sum_i e_i``; ``V`` is 0 when the weights sum to 0. At
    ``m = +inf`` the limit: ``e_i = s_i`` on the ``+inf`` entries, 0 elsewhere (the softmax of
    an infinite logit), and ``V = +inf``. ``top`` (the maximum) and ``sums`` (the list
    ``[T, sum_i s_i]``) combine them across replicas (:mod:`~losszoo.ops.dro.distribute`);
    the defaults keep this batch's."""
    dt = dtype_name(l)
    live = s > 0
    ninf = ops.full_like(l, -np.inf)
    a = ops.where(
        live, l * const(1.0 / lam, dt) + ops.log(ops.where(live, s, ops.ones_like(s))), ninf
    )
    m = top(max_or_minus_inf(a))
    m_inf = ops.isinf(m) & (m > 0)
    m_safe = ops.where(ops.isfinite(m), m, ops.zeros_like(m))
    ex = ops.where(
        m_inf, ops.where(ops.isinf(a) & (a > 0), s, ops.zeros_like(a)), ops.exp(a - m_safe)
    )
    ex = ops.where(live, ex, ops.zeros_like(ex))
    tot, s_sum = sums([ops.sum(ex), ops.sum(s)])
    val = const(lam, dt) * (m_safe + ops.log(tot) - ops.log(s_sum))
    val = ops.where(m_inf, const(np.inf, dt), val)
    return ops.where(s_sum > 0, val, ops.zeros_like(val)), ex, tot


def kl_dro_batch_lse(losses, lam, sample_weight=None):
    """Naive mini-batch KL-DRO risk ``lam log sum_i pi_i exp(l_i/lam)`` (biased, spec 2.1).

    Max-shifted (no overflow); gradient ``softmax_i(l/lam + log pi)``. Zero-weight entries
    are ignored; an empty batch gives 0. A ``+inf`` loss gives ``+inf`` with the limit
    gradient (the ``+inf`` entries share the weight 1 in proportion to ``pi``, the others
    get 0); ``-inf`` losses get weight 0; a NaN loss with positive weight gives a NaN value
    and gradients. Bad ``lam`` or ``sample_weight`` raise as in :func:`safe_kl_dro_risk`.
    Traced under XLA / ``jax.jit``: invalid sample weights give a NaN value and gradients.

    Args:
      losses: per-example losses, any shape (flattened; each entry is one sample).
      lam: temperature, Python float, finite and > 0.
      sample_weight: optional weights ``s_i`` (``pi_i = s_i / sum_j s_j``), finite and >= 0,
        a scalar or broadcastable over a prefix of the losses' shape.

    Returns:
      Scalar risk in the losses' dtype (half precision is computed in float32).

    Example:
      >>> float(kl_dro_batch_lse([0.0, 0.0], lam=1.0))
      0.0
    """
    lam = check_lam(lam)
    l, s, original, bad = prepare(losses, sample_weight)

    @custom_gradient
    def core(l, s, bad):
        val, ex, tot = batch_lse_terms(l, s, lam)

        def grad(dv):
            return nan_where(bad, dv * divide_no_nan(ex, tot)), ops.zeros_like(s), None

        return nan_where(bad, val), grad

    return ops.cast(core(l, s, any_flag(bad, live_nan(l, s))), original)


def sumexp_terms(l, s, inv_lam, bad, sums=lambda xs: xs):
    """``(V, pi, e, unusable)`` of the sum-of-exp objective ``V = sum_i pi_i e_i``,
    ``e_i = exp(l_i/lam)`` (``inv_lam = 1/lam`` a tensor), NaN where the flag ``bad`` is set;
    ``unusable``: ``V`` is not finite (overflow, ``+inf`` or NaN), so no entry gets a
    gradient. ``sums`` (of a list) adds up over the replicas (default: this batch only)."""
    live = s > 0
    (s_sum,) = sums([ops.sum(s)])
    pi = ops.where(live, divide_no_nan(s, s_sum), ops.zeros_like(s))
    ex = ops.where(live, ops.exp(l * inv_lam), ops.zeros_like(l))
    (val,) = sums([ops.sum(pi * ex)])
    val = poison(bad, val)
    return val, pi, ex, ops.logical_not(ops.isfinite(val))


def kl_dro_sumexp(losses, lam, sample_weight=None):
    """Sum-of-exp objective ``sum_i pi_i exp(l_i/lam)`` (paper eq. 21, spec 2.1).

    Same minimisers as the KL-DRO risk and unbiased, but it overflows for ``l/lam`` above
    ~88.7 in float32 (by design: there is no safe form). Gradient ``pi_i exp(l_i/lam)/lam``.
    Whenever the value is not finite, every gradient entry is NaN: an overflow or a ``+inf``
    loss gives the value ``+inf``, a NaN loss with positive weight the value NaN (a finite
    gradient for the other entries would be a plausible but meaningless step). Zero-weight
    entries are ignored. Traced under XLA / ``jax.jit``: invalid sample weights give a NaN
    value and gradients. Bad ``lam`` or ``sample_weight`` raise as in
    :func:`safe_kl_dro_risk`.

    Args:
      losses: per-example losses, any shape (flattened; each entry is one sample).
      lam: temperature, Python float, finite and > 0.
      sample_weight: optional weights ``s_i`` (``pi_i = s_i / sum_j s_j``), finite and >= 0,
        a scalar or broadcastable over a prefix of the losses' shape.

    Returns:
      Scalar objective in the losses' dtype (half precision is computed in float32).

    Example:
      >>> float(kl_dro_sumexp([0.0, 0.0], lam=1.0))
      1.0
    """
    lam = check_lam(lam)
    l, s, original, bad = prepare(losses, sample_weight)

    @custom_gradient
    def core(l, s, *bad):
        inv_lam = const(1.0 / lam, dtype_name(l))
        val, pi, ex, unusable = sumexp_terms(l, s, inv_lam, bad[0] if bad else None)

        def grad(dv):
            g = nan_where(unusable, dv * pi * ex * inv_lam)
            return (g, ops.zeros_like(s)) + (None,) * len(bad)

        return val, grad

    return ops.cast(core(l, s, *(() if bad is None else (bad,))), original)


def cvar_tail_mass(l, s, rho):
    """``q_i``: the mass of example i inside the upper-``rho`` tail (stable sort by loss,
    ties in index order)."""
    dt = dtype_name(l)
    live = s > 0
    pi = ops.where(live, divide_no_nan(s, ops.sum(s)), ops.zeros_like(s))
    key = ops.where(live, -l, ops.full_like(l, np.inf))  # ascending in -l: descending in l
    order = ops.argsort(key)
    pi_sorted = ops.take(pi, order)
    before = cumsum(pi_sorted) - pi_sorted  # the mass ranked above each example
    q_sorted = minimum(maximum(const(rho, dt) - before, ops.zeros_like(before)), pi_sorted)
    return ops.scatter(ops.expand_dims(order, -1), q_sorted, ops.shape(l))


def cvar_risk(losses, rho, sample_weight=None):
    """CVaR at level rho: ``min_a a + (1/rho) sum_i pi_i (l_i - a)_+`` (exact, by sorting).

    Equals the average of the upper-``rho`` tail of the weighted empirical law; the
    gradient gives example i the weight ``q_i/rho`` with ``q_i`` its mass inside the tail
    (ties are split in index order). A NaN loss with positive weight makes the value and
    every gradient NaN (the tail is undefined); ``+inf`` in the tail gives ``+inf`` with
    finite gradients. Bad ``rho`` or ``sample_weight`` raise as in :func:`safe_kl_dro_risk`.
    Traced under XLA / ``jax.jit``: invalid sample weights give a NaN value and gradients.

    Args:
      losses: per-example losses, any shape (flattened; each entry is one sample).
      rho: tail level, Python float in (0, 1).
      sample_weight: optional weights ``s_i`` (``pi_i = s_i / sum_j s_j``), finite and >= 0,
        a scalar or broadcastable over a prefix of the losses' shape.

    Returns:
      Scalar risk in the losses' dtype (half precision is computed in float32).

    Example:
      >>> float(cvar_risk([1.0, 2.0, 3.0, 4.0], rho=0.5))
      3.5
    """
    rho = check_rho(rho)
    l, s, original, bad = prepare(losses, sample_weight)
    q = ops.stop_gradient(cvar_tail_mass(ops.stop_gradient(l), s, rho))
    inv_rho = const(1.0 / rho, dtype_name(l))

    @custom_gradient
    def core(l, q, bad):  # (1/rho) sum q_i l_i, gradient q_i/rho (q fixed)
        val = nan_where(bad, ops.sum(ops.where(q > 0, q * l, ops.zeros_like(l))) * inv_rho)

        def grad(dv):
            return nan_where(bad, dv * q * inv_rho), None, None

        return val, grad

    return ops.cast(core(l, q, any_flag(bad, live_nan(l, s))), original)
