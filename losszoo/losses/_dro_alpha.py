"""The update rule of the safe-KL loss's dual scalar alpha (spec safe_kl_dro.md 2.6, 3.1).

The state is one float32 vector ``[alpha, initialised, m, v, t]`` (alpha, the first-batch
flag and the moments of alpha's own SGD / Adam). :func:`next_state` moves alpha from the
exact statistics of the risk's pass: ``mean_w = sum pi w`` (the stationarity equation is
``mean_w = 1``, the gradient in alpha ``1 - mean_w``) and ``curvature = sum pi w (1 - rho w)``.
"""

from __future__ import annotations

import keras
from keras import ops

from losszoo import _keras_hooks

#: ``alpha_optimizer`` values: damped Newton, the model optimiser's family, SGD, Adam.
RULES = ("newton", "auto", "sgd", "adam")


def newton_step(mean_w, curvature, nonempty, options):
    """Damped Newton step on ``log(sum pi w) = 0`` with the exact curvature (``lam``, ``rho``
    and the ``damping``: ``options.alpha_damping``, of the loss ``options``).

    ``f(alpha) = log mean_w`` is decreasing with ``f' = -curvature / (lam mean_w)``, so the
    Newton step is ``lam log(mean_w) mean_w / curvature``: exactly ``lam log mean_w`` in
    the KL regime (rho w << 1, one step solves the batch), larger where the cap binds.
    The ratio ``mean_w / curvature`` is clipped to ``[1, 1/rho]`` (it diverges when every
    weight is saturated) and ``mean_w`` floored at 1e-30 (underflow), so a step is at most
    ``lam * 69`` down and ``lam log(1/rho) / rho`` up, before the ``damping``; 0 for an empty
    batch.
    """
    tiny = ops.convert_to_tensor(1e-30, "float32")
    ratio = ops.divide_no_nan(mean_w, ops.maximum(curvature, tiny))
    step = (options.alpha_damping * options.lam) * ops.log(ops.maximum(mean_w, tiny))
    step = step * ops.clip(ratio, 1.0, 1.0 / options.rho)
    return ops.where(nonempty, step, ops.zeros_like(step))


def step_size(alpha_learning_rate, multiplier, optimizer):
    """``multiplier`` times ``alpha_learning_rate``, or (``None``) the model optimiser's
    current learning rate (schedules included; 1e-3 without an optimiser), float32.

    On JAX the trainer's step passes the optimiser's variables in explicitly (their stored
    values are released during ``fit``): the rate is read from those
    (:func:`~losszoo._keras_hooks.optimizer_scope`).
    """
    if alpha_learning_rate is None and optimizer is not None:
        with _keras_hooks.optimizer_scope(optimizer):
            lr = ops.cast(ops.convert_to_tensor(optimizer.learning_rate), "float32")
    else:
        rate = 1e-3 if alpha_learning_rate is None else alpha_learning_rate
        lr = ops.convert_to_tensor(rate, "float32")
    return lr * ops.convert_to_tensor(multiplier, "float32")


def gradient_rule(alpha_optimizer, optimizer):
    """``(kind, momentum, nesterov)`` of a gradient rule: ``"auto"`` mirrors the model's
    optimiser (its SGD with momentum / Nesterov flag, else Adam)."""
    if alpha_optimizer != "auto":
        return alpha_optimizer, 0.0, False
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    if isinstance(optimizer, keras.optimizers.SGD):
        return "sgd", float(optimizer.momentum), bool(optimizer.nesterov)
    return "adam", 0.0, False


def next_state(state, alpha, mean_w, curvature, nonempty, options, optimizer):
    """The state after one step from ``alpha`` (the alpha the risk used).

    ``options`` is the :class:`~losszoo.losses.SafeKLDRORisk` whose ``alpha_optimizer`` (one
    of :data:`RULES`), ``lam``, ``rho`` and ``alpha_damping`` (Newton) or
    ``alpha_learning_rate`` and ``alpha_lr_multiplier`` (the gradient rules, see
    :func:`step_size`) set the step; ``optimizer`` is the model's (``None`` outside a
    trainer). Adam uses beta 0.9 / 0.999 and epsilon 1e-7; the flag is set to 1.
    """
    one = ops.ones([], "float32")
    m, v, t = state[2], state[3], state[4]
    if options.alpha_optimizer == "newton":
        return ops.stack([alpha + newton_step(mean_w, curvature, nonempty, options), one, m, v, t])
    lr = step_size(options.alpha_learning_rate, options.alpha_lr_multiplier, optimizer)
    grad = ops.where(nonempty, 1.0 - mean_w, ops.zeros_like(mean_w))
    kind, momentum, nesterov = gradient_rule(options.alpha_optimizer, optimizer)
    if kind == "sgd":
        if momentum > 0.0:
            m = momentum * m - lr * grad
            step = momentum * m - lr * grad if nesterov else m
        else:
            step = -lr * grad
    else:
        b1, b2, eps = 0.9, 0.999, 1e-7
        t = t + 1.0
        m = b1 * m + (1.0 - b1) * grad
        v = b2 * v + (1.0 - b2) * grad * grad
        m_hat = m / (1.0 - ops.power(b1, t))
        v_hat = v / (1.0 - ops.power(b2, t))
        step = -lr * m_hat / (ops.sqrt(v_hat) + eps)
    return ops.stack([alpha + step, one, m, v, t])
