"""Keras layers: post-hoc calibrators (temperature scaling, probability bounding, logit bounding).

Spec ``shared/specs/bcsoftmax.md`` section 5 (paper Sec. 4). Each layer maps the frozen base
model's logits -- and, for the linear variants, its penultimate embedding ``z`` -- to calibrated
probabilities. Call them on ``logits`` or on ``[logits, z]``. Fit them with
:func:`losszoo.calibration.fit_calibrator`.

Fail-loud contract (README, "Bad input"), shared by the three layers: hyper-parameters are
checked at construction (``temperature`` finite and > 0, ``init_lower`` / ``init_upper`` finite,
``bound_fn`` / ``bounds`` / ``method`` from their lists), raising ``ValueError`` naming them.
Logits breaking ``contract.LOGITS`` (NaN or +inf, or a row whose logits are all -inf) raise
``ValueError`` eagerly and fail a graph assertion in a TensorFlow graph (skipped with
``losszoo.set_validation(False)``). Under XLA / ``jax.jit`` those rows come back NaN. A
``-inf`` logit masks its class: probability exactly 0, and the other classes get what the
calibrator gives on the unmasked classes alone (PB counts only unmasked classes in ``K``; LB-C's
norm is over the unmasked logits).
"""

from __future__ import annotations

import numpy as np
from keras import ops as kops

from losszoo import _backend, ops
from losszoo.contract import (
    LOGITS,
    check_bool,
    check_choice,
    check_number,
    check_real,
    check_static_rank,
    nan_where,
)
from losszoo.heads._base import ScoresLayer
from losszoo.ops import bcsoftmax_methods as METHODS
from losszoo.registry import register


def _split(inputs):
    if isinstance(inputs, (list, tuple)):
        if len(inputs) != 2:
            raise ValueError("Calibrators take `logits` or `[logits, features]`.")
        logits, feats = inputs
    else:
        logits, feats = inputs, None
    check_real(kops.convert_to_tensor(logits), "logits")  # text: "Cast string to float"
    logits = kops.cast(logits, "float32")
    check_static_rank(logits, 1, "logits")
    logits = LOGITS.check(logits, "logits")
    feats = None if feats is None else kops.cast(feats, "float32")
    return logits, feats


def _shapes(input_shape):
    """``(logits shape, features shape or None)``; rank-0 logits raise ValueError."""
    if input_shape and isinstance(input_shape[0], (list, tuple)):
        logits_shape, feat_shape = tuple(input_shape[0]), tuple(input_shape[1])
    else:
        logits_shape, feat_shape = tuple(input_shape), None
    if not logits_shape:
        raise ValueError("`logits` must have rank >= 1 (classes on the last axis), got rank 0.")
    return logits_shape, feat_shape


class _Calibrator(ScoresLayer):
    _config_keys = ("temperature", "fit_temperature")

    def __init__(self, temperature=1.5, fit_temperature=True, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.temperature = check_number(temperature, "temperature", low=0.0, low_open=True)
        self.fit_temperature = check_bool(fit_temperature, "fit_temperature")

    def build(self, input_shape):
        _shapes(input_shape)
        self.log_temperature = self.constant_weight(
            "log_temperature", np.log(self.temperature), trainable=self.fit_temperature
        )

    def tau(self):
        return kops.exp(self.log_temperature)

    def compute_output_shape(self, input_shape):
        return _shapes(input_shape)[0]


@register(
    "temperature_scaling",
    kind="head",
    aliases=("ts",),
    description="Temperature scaling calibrator: softmax(logits / tau), tau learned",
)
class TemperatureScaling(_Calibrator):
    """Temperature scaling (Guo et al., 2017): ``p = softmax(logits / tau)``, ``tau = exp(t')``.

    Args:
      temperature: initial ``tau`` (1.5, as in the paper's protocol).
      fit_temperature: whether ``tau`` is trainable.
      **kwargs: ``keras.layers.Layer`` arguments.

    Example:
      >>> ts = losszoo.heads.TemperatureScaling(temperature=2.0)
      >>> keras.ops.convert_to_numpy(ts(np.array([[0.0, 2.0]]))).round(4)
      array([[0.2689, 0.7311]], dtype=float32)
    """

    def call(self, inputs):
        logits, _ = _split(inputs)
        # NaN / +inf / all -inf rows come out NaN by themselves; -inf classes get 0.
        return kops.softmax(logits / self.tau(), axis=-1)


class _Bounded(_Calibrator):
    """A calibrator with lower and upper bounds: constants or linear in the features (the
    defaults are :class:`LogitBounding`'s)."""

    _config_keys = (*_Calibrator._config_keys, "bound_fn", "init_lower", "init_upper")

    def __init__(
        self,
        bound_fn="constant",
        temperature=1.5,
        fit_temperature=True,
        init_lower=0.0,
        init_upper=0.0,
        **kwargs,
    ):
        super().__init__(temperature, fit_temperature, **kwargs)
        self.bound_fn = check_choice(bound_fn, "bound_fn", ("constant", "linear"))
        self.init_lower = check_number(init_lower, "init_lower")
        self.init_upper = check_number(init_upper, "init_upper")

    def _bound(self, name, init, input_shape):
        """A bound's pre-activation ``(bias, kernel or None)``: a constant (``bound_fn``
        ``"constant"``) or linear in the features, kernel initialised to 0."""
        if self.bound_fn == "constant":
            return self.constant_weight(name, init), None
        feat_shape = _shapes(input_shape)[1]
        if feat_shape is None or feat_shape[-1] is None:
            raise ValueError(
                f"{self._SHORT}-L needs [logits, features] with a static feature size."
            )
        kernel_shape = (int(feat_shape[-1]),)
        w = self.add_weight(
            name=name + "_kernel", shape=kernel_shape, initializer="zeros", dtype="float32"
        )
        return self.constant_weight(name + "_bias", init), w

    @staticmethod
    def _eval(param, feats):
        bias, w = param
        if w is None:
            return kops.convert_to_tensor(bias)
        if feats is None:
            raise ValueError(
                "The linear variant needs the features: call it on [logits, features]."
            )
        return kops.matmul(feats, w)[:, None] + bias


@register(
    "probability_bounding",
    kind="head",
    aliases=("pb",),
    description="Probability bounding calibrator: BCSoftmax with learned uniform bounds",
)
class ProbabilityBounding(_Bounded):
    """Probability bounding (PB; paper eqs. 30-32).

    ``p = BCSoftmax_tau(logits; a(x) 1, b(x) 1)`` with ``a = sigmoid(a') / K`` in ``(0, 1/K)``
    and ``b = 1/K + (1 - 1/K) sigmoid(b')`` in ``(1/K, 1)`` (always feasible). ``a'``, ``b'`` are
    scalar constants (PB-C) or linear in the embedding ``z`` (PB-L: ``w^T z + beta``, weights
    initialised to 0). ``bounds="lower"`` (PB-*-L, ``b = 1``: never changes the argmax) and
    ``bounds="upper"`` (PB-*-U, ``a = 0``) are the paper's ablations; ``fit_temperature=False``
    is "w/o TS".

    Args:
      bound_fn: ``"constant"`` or ``"linear"``.
      bounds: ``"both"``, ``"lower"`` or ``"upper"``.
      temperature: initial ``tau`` (default 1.5).
      fit_temperature: learn ``tau`` (else fixed at ``temperature``).
      init_lower: initial ``a'`` (bias). The default -4 gives ``a = 0.018/K``: active on the
        tail classes of an over-confident model (so it gets a gradient) without forcing much
        mass onto them. The spec's suggestion 0 (``a = 0.5/K``) puts half the mass on the lower
        bounds at the start, which Adam at lr 1e-3 cannot undo on a small validation set.
      init_upper: initial ``b'`` (bias). The default 4 gives ``b = 1/K + 0.982 (1 - 1/K)``.
      method: BCSoftmax solver.
      **kwargs: ``keras.layers.Layer`` arguments.

    Example:
      >>> pb = losszoo.heads.ProbabilityBounding(init_lower=0.0, init_upper=0.0)
      >>> keras.ops.convert_to_numpy(pb(np.array([[0.0, 1.0, 8.0]]))).round(3)
      array([[0.167, 0.167, 0.667]], dtype=float32)
    """

    _config_keys = (*_Bounded._config_keys, "bounds", "method")
    _SHORT = "PB"

    def __init__(
        self,
        bound_fn="constant",
        bounds="both",
        temperature=1.5,
        fit_temperature=True,
        init_lower=-4.0,
        init_upper=4.0,
        method="newton",
        **kwargs,
    ):
        super().__init__(bound_fn, temperature, fit_temperature, init_lower, init_upper, **kwargs)
        self.bounds = check_choice(bounds, "bounds", ("both", "lower", "upper"))
        self.method = check_choice(method, "method", METHODS)

    def build(self, input_shape):
        super().build(input_shape)
        self._a = self._b = None
        if self.bounds in ("both", "lower"):
            self._a = self._bound("lower", self.init_lower, input_shape)
        if self.bounds in ("both", "upper"):
            self._b = self._bound("upper", self.init_upper, input_shape)

    def bound_values(self, inputs):
        """``(a, b)``: the lower/upper probability bounds (None where absent).

        ``K`` in the formulas is the number of unmasked (finite-logit) classes of the row;
        masked classes (``-inf`` logits) get ``a = b = 0``, so they get probability 0.
        """
        logits, feats = _split(inputs)
        live = kops.isfinite(logits)
        k = kops.sum(kops.cast(live, "float32"), -1, keepdims=True)
        inv_k = 1.0 / kops.maximum(k, 1.0)
        zero = kops.zeros_like(logits)
        a = b = None
        if self._a is not None:
            a = kops.where(live, kops.sigmoid(self._eval(self._a, feats)) * inv_k, zero)
        if self._b is not None:
            upper = inv_k + (1.0 - inv_k) * kops.sigmoid(self._eval(self._b, feats))
            b = kops.where(live, upper, zero)
        return a, b

    def call(self, inputs):
        logits, _ = _split(inputs)
        a, b = self.bound_values(inputs)
        if b is None:
            # masked classes must not take mass: with upper bounds absent, b = [live].
            b = kops.cast(kops.isfinite(logits), logits.dtype)
        # The bounds are feasible by construction; under XLA, rows with NaN / +inf / all -inf
        # logits come back NaN (bcsoftmax's bad-row test).
        return ops.bcsoftmax(logits, a, b, self.tau(), method=self.method)


@register(
    "logit_bounding",
    kind="head",
    aliases=("lb",),
    description="Logit bounding calibrator: softmax(clip(logits, c, C) / tau)",
)
class LogitBounding(_Bounded):
    """Logit bounding (LB; paper eqs. 35-38): ``p = softmax(clip(logits, c(x), C(x)) / tau)``.

    ``c = h1(c')`` and ``C = h1(c' + softplus(C'))`` so ``c < C``. LB-L: ``c'``, ``C'`` linear in
    the embedding ``z`` and ``h1 = identity``. LB-C: constants and
    ``h1(e) = ||logits||_2 tanh(e)`` (keeps the bounds inside ``(-||logits||, ||logits||)``;
    with the identity LB-C collapses, spec section 5.2). By Thm. 7 this covers the
    uniform-bound BCSoftmax family with an O(K) clip.

    Args:
      bound_fn: ``"constant"`` or ``"linear"``.
      temperature: initial ``tau`` (default 1.5).
      fit_temperature: learn ``tau``.
      init_lower: initial ``c'`` (bias).
      init_upper: initial ``C'`` (bias).
      **kwargs: ``keras.layers.Layer`` arguments.

    Example:
      >>> lb = losszoo.heads.LogitBounding(temperature=1.0, init_lower=-1.0, init_upper=0.0)
      >>> tuple(lb(np.array([[-3.0, 0.0, 4.0]])).shape)
      (1, 3)
    """

    _SHORT = "LB"

    def build(self, input_shape):
        super().build(input_shape)
        self._c = self._bound("lower", self.init_lower, input_shape)
        self._C = self._bound("upper", self.init_upper, input_shape)

    def bound_values(self, inputs):
        """``(c, C)``: the lower/upper logit bounds, shape ``[N, 1]`` or scalar."""
        logits, feats = _split(inputs)
        lo = self._eval(self._c, feats)
        hi = lo + kops.softplus(self._eval(self._C, feats))
        if self.bound_fn == "constant":
            # The norm of the unmasked logits (-inf classes are masked, not infinitely large),
            # as scale * ||logits / scale|| with scale = max |logit|: squares of 1e30 overflow.
            live = kops.where(kops.isfinite(logits), logits, 0.0)
            scale = kops.stop_gradient(_backend.reduce_max(kops.abs(live), -1, keepdims=True))
            scale = kops.where(scale > 0, scale, 1.0)
            unit = kops.sqrt(kops.sum(kops.square(live / scale), -1, keepdims=True))
            return scale * (unit * kops.tanh(lo)), scale * (unit * kops.tanh(hi))
        return lo, hi

    def call(self, inputs):
        logits, _ = _split(inputs)
        c, cap = self.bound_values(inputs)
        clipped = kops.minimum(kops.maximum(logits, c), cap)  # gradients reach both bounds
        # -inf (masked) classes stay -inf, so they get probability 0 and the rest is unchanged;
        # rows breaking contract.LOGITS are NaN (the clip alone would make them finite).
        clipped = kops.where(kops.equal(logits, -np.inf), logits, clipped)
        p = kops.softmax(clipped / self.tau(), axis=-1)
        return nan_where(LOGITS.invalid(logits)[..., None], p)
