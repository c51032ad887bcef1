"""Streaming exact KL-DRO risk ``lam log (sum s_i exp(l_i/lam) / sum s_i)`` over many batches
(spec 2.5): state ``(m, acc, n)`` with ``m`` the running max of ``l/lam``."""

from __future__ import annotations

import numpy as np
from keras import ops

from losszoo._backend import maximum
from losszoo.contract import NON_NEGATIVE_OR_NAN, dtype_name, nan_where
from losszoo.ops.dro import _risks as risks


def _scaled_by_lam(losses, sample_weight, lam, dtype):
    """Checked flat losses ``l`` and weights ``s`` in ``dtype``, ``a = l / lam`` (``-inf``
    where ``s = 0``) and the invalid-weight flag."""
    lam = risks.check_lam(lam)
    l, s, _, bad = risks.prepare(losses, sample_weight)
    l, s = ops.cast(l, dtype), ops.cast(s, dtype)
    return l, s, ops.where(s > 0, l * risks.const(1.0 / lam, dtype), ops.full_like(l, -np.inf)), bad


def kl_dro_exact_batch_max(losses, lam, sample_weight=None, dtype="float64"):
    """``max_i l_i/lam`` over entries with positive weight (``-inf`` if none), in ``dtype``.

    NaN live losses give NaN. Traced under XLA / ``jax.jit``: invalid sample weights give
    NaN. (JAX computes float64 only with ``jax_enable_x64``; otherwise float32.)

    Args:
      losses: per-example losses, any shape (flattened).
      lam: temperature, Python float, finite and > 0.
      sample_weight: optional weights ``s_i``, finite and >= 0, a scalar or broadcastable over
        a prefix of the losses' shape; entries with ``s_i = 0`` are ignored.
      dtype: the dtype to compute in (default ``"float64"``): that of the streaming state.

    Returns:
      A scalar in ``dtype``, to pass as ``batch_max`` to :func:`kl_dro_exact_state_update`.

    Raises:
      ValueError: (TypeError for a wrong type) naming ``lam`` or ``sample_weight``, as
        :func:`losszoo.ops.safe_kl_dro_risk`.

    Example:
      >>> m = losszoo.ops.kl_dro_exact_batch_max([1.0, 3.0], lam=2.0, dtype="float32")
      >>> float(m)
      1.5
    """
    l, s, a, bad = _scaled_by_lam(losses, sample_weight, lam, dtype)
    return risks.poison(risks.any_flag(bad, risks.live_nan(l, s)), risks.max_or_minus_inf(a))


def _state_dtype(m, acc, n):
    """The dtype of the streaming state ``(m, acc, n)``; a TypeError naming the argument
    unless all three are floating tensors, variables or arrays of one dtype."""
    dtypes = []
    for x, name in ((m, "m"), (acc, "acc"), (n, "n")):
        python_number = isinstance(x, (bool, int, float)) and not isinstance(x, np.generic)
        if python_number or getattr(x, "dtype", None) is None:
            raise TypeError(
                f"`{name}` must be a floating tensor, variable or array (the streaming "
                f"state, in the dtype to accumulate in), got {type(x).__name__} {x!r}."
            )
        dt = dtype_name(x)
        if dt not in ("float16", "bfloat16", "float32", "float64"):
            raise TypeError(f"`{name}` must be floating (the streaming state), got dtype {dt}.")
        if dtypes and dt != dtypes[0]:
            raise TypeError(f"`{name}` must have the dtype of `m` ({dtypes[0]}), got {dt}.")
        dtypes.append(dt)
    return dtypes[0]


def kl_dro_exact_state_update(m, acc, n, losses, lam, sample_weight=None, batch_max=None):
    """One streaming step of ``R = lam log(sum s exp(l/lam) / sum s)``.

    ``m' = max(m, b)``, ``acc' = acc exp(m - m') + sum_i s_i exp(l_i/lam - m')``,
    ``n' = n + sum_i s_i``, with ``b`` the batch's ``max_i l_i/lam`` over positive weights.

    State: ``m`` running max of ``l/lam`` (start -inf), ``acc = sum s exp(l/lam - m)``
    (start 0), ``n = sum s`` (start 0); all in the state's dtype. ``batch_max`` overrides
    the batch's own maximum (any value >= it works; replicas pass a shared one so that
    their ``acc`` share the shift and can be summed). Returns the new state. NaN losses
    with positive weight make ``acc`` NaN (and so the result). Traced under XLA /
    ``jax.jit``: invalid sample weights make ``acc`` NaN.

    Args:
      m, acc, n: the state: floating tensors, variables or arrays (numpy scalars such as
        ``np.float32(0)`` too) of one dtype, which the step computes in.
      losses: this batch's per-example losses, any shape (flattened).
      lam: temperature, Python float, finite and > 0.
      sample_weight: optional weights ``s_i``, finite and >= 0, a scalar or broadcastable over
        a prefix of the losses' shape; entries with ``s_i = 0`` are ignored.
      batch_max: ``None`` (default: the batch's own maximum of ``l/lam``), or a scalar
        ``>=`` it (e.g. :func:`kl_dro_exact_batch_max`'s maximum over every replica).

    Returns:
      The new state ``(m, acc, n)``, scalar tensors in the state's dtype.

    Raises:
      TypeError: naming ``m``, ``acc`` or ``n`` when one is not a floating tensor, variable
        or array (a Python number's dtype would be the backend's guess), or when ``acc`` or
        ``n`` has another dtype than ``m``.
      ValueError: (TypeError for a wrong type) naming ``lam`` or ``sample_weight``, as
        :func:`losszoo.ops.safe_kl_dro_risk`.

    Example:
      >>> m, acc, n = np.float32(-np.inf), np.float32(0.0), np.float32(0.0)
      >>> m, acc, n = losszoo.ops.kl_dro_exact_state_update(m, acc, n, [0.0, 1.0], lam=1.0)
      >>> m, acc, n = losszoo.ops.kl_dro_exact_state_update(m, acc, n, [2.0, 3.0], lam=1.0)
      >>> float(m), round(float(acc), 4), float(n)  # acc = exp(-3) + exp(-2) + exp(-1) + 1
      (3.0, 1.553, 4.0)
    """
    dt = _state_dtype(m, acc, n)
    m = ops.convert_to_tensor(m)
    l, s, a, bad = _scaled_by_lam(losses, sample_weight, lam, dt)
    live = s > 0
    if batch_max is None:
        batch_max = risks.max_or_minus_inf(a)
    m_new = maximum(m, ops.cast(batch_max, dt))
    m_safe = ops.where(ops.isfinite(m_new), m_new, ops.zeros_like(m_new))
    scale = ops.where(ops.isinf(m) & (m < 0), ops.zeros_like(m), ops.exp(m - m_safe))
    acc_new = ops.cast(acc, dt) * scale + ops.sum(
        ops.where(live, s * ops.exp(a - m_safe), ops.zeros_like(a))
    )
    return m_new, risks.poison(bad, acc_new), risks.poison(bad, ops.cast(n, dt) + ops.sum(s))


def kl_dro_exact_state_result(m, acc, n, lam):
    """``lam (m + log acc - log n)``; 0 before any example was seen (``n == 0``).

    A NaN state (NaN losses or, under XLA, invalid weights) gives NaN. Otherwise ``acc`` and
    ``n`` keep :data:`NON_NEGATIVE_OR_NAN`: eagerly a ``ValueError`` naming the argument, in a
    TensorFlow graph an assertion (skippable with ``losszoo.set_validation(False)``), traced
    under XLA / ``jax.jit`` a NaN result.

    Args:
      m, acc, n: the state of :func:`kl_dro_exact_state_update` (``acc`` and ``n`` are cast
        to ``m``'s dtype).
      lam: temperature, Python float, finite and > 0.

    Returns:
      The risk ``R``, a scalar in ``m``'s dtype.

    Raises:
      ValueError: naming ``lam``, or ``acc`` / ``n`` when negative or infinite (as above).

    Example:
      >>> m, acc, n = np.float32(3.0), np.float32(1.553), np.float32(4.0)  # losses 0, 1, 2, 3
      >>> round(float(losszoo.ops.kl_dro_exact_state_result(m, acc, n, lam=1.0)), 4)
      2.0539
      >>> round(float(np.log(np.mean(np.exp([0.0, 1.0, 2.0, 3.0])))), 4)  # lam log mean exp(l/lam)
      2.0539
    """
    lam = risks.check_lam(lam)
    m = ops.convert_to_tensor(m)
    dt = dtype_name(m)
    acc = NON_NEGATIVE_OR_NAN.check(ops.cast(acc, dt), "acc")
    n = NON_NEGATIVE_OR_NAN.check(ops.cast(n, dt), "n")
    bad = ops.any(NON_NEGATIVE_OR_NAN.invalid(acc)) | ops.any(NON_NEGATIVE_OR_NAN.invalid(n))
    val = risks.const(lam, dt) * (m + ops.log(acc) - ops.log(n))
    return nan_where(bad, ops.where(ops.equal(n, 0), ops.zeros_like(val), val))
