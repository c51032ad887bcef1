"""Keras layer: the box-constrained softmax (BCSoftmax) head."""

from __future__ import annotations

import numpy as np
from keras import ops as kops

from losszoo import ops
from losszoo.contract import PROBABILITY_BOUNDS, check_bool, check_choice, check_number, dtype_name
from losszoo.heads._base import ScoresLayer
from losszoo.ops import bcsoftmax_methods as METHODS
from losszoo.registry import register


def _inverse_sigmoid(p):
    p = np.clip(np.asarray(p, np.float64), 1e-7, 1 - 1e-7)
    return np.log(p) - np.log1p(-p)


@register(
    "bcsoftmax",
    kind="head",
    aliases=("box_constrained_softmax",),
    description="Box-constrained softmax: softmax(x/tau) projected into lower <= p <= upper",
)
class BCSoftmax(ScoresLayer):
    """Box-constrained softmax head (Atarashi et al., 2025).

    ``p = argmax_{p in simplex, a <= p <= b} <x, p> - tau * sum_k p_k log p_k
    = clip(exp(x / tau - nu), a, b)`` with the scalar ``nu`` that makes ``p`` sum to 1.
    With no bounds it is ``softmax(x / tau)``. Computed exactly (see
    :func:`losszoo.ops.bcsoftmax`) in float32 or wider whatever the compute policy.

    Bounds can be fixed in the config (``lower``/``upper``: a scalar or a per-class list),
    learned (``learn_bounds=True``: per-class parameters ``a = sigmoid(a')/K`` and
    ``b = 1/K + (1 - 1/K) sigmoid(b')``, feasible by construction and initialised from
    ``lower``/``upper``), or passed at call time (``layer(logits, lower=..., upper=...)``,
    which override the configured ones). The temperature is fixed or learned
    (``learn_temperature=True``, ``tau = exp(t')``).

    Args:
      lower: lower bound(s) ``a``: None, a float, or a list of K floats.
      upper: upper bound(s) ``b``: None, a float, or a list of K floats.
      temperature: ``tau > 0`` (initial value when learned).
      learn_bounds: learn both per-class bounds. Initial values ``lower < 1/K < upper`` (None
        gives the defaults ``0.5/K`` and ``0.5``).
      learn_temperature: learn ``tau``.
      axis: the class axis.
      method: solver, ``"newton"`` (default), ``"sort"`` or ``"bisect"``.
      **kwargs: ``keras.layers.Layer`` arguments.

    Example:
      >>> head = losszoo.heads.BCSoftmax(upper=[1.0, 0.6, 0.5])
      >>> keras.ops.convert_to_numpy(head(np.array([[-1.5, 1.0, -0.5]]))).round(4)
      array([[0.1076, 0.6   , 0.2924]], dtype=float32)
    """

    _config_keys = (
        "lower",
        "upper",
        "temperature",
        "learn_bounds",
        "learn_temperature",
        "axis",
        "method",
    )

    def __init__(
        self,
        lower=None,
        upper=None,
        temperature: float = 1.0,
        learn_bounds: bool = False,
        learn_temperature: bool = False,
        axis: int = -1,
        method: str = "newton",
        **kwargs,
    ):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.lower = _to_config(lower, "lower")
        self.upper = _to_config(upper, "upper")
        self.temperature = check_number(temperature, "temperature", low=0.0, low_open=True)
        self.learn_bounds = check_bool(learn_bounds, "learn_bounds")
        self.learn_temperature = check_bool(learn_temperature, "learn_temperature")
        self.axis = check_number(axis, "axis", integer=True)
        self.method = check_choice(method, "method", METHODS)
        # The element-wise half of the box rule now; the sums once K is known (in the op).
        lo = np.reshape(0.0 if self.lower is None else self.lower, (1, -1))
        hi = np.reshape(1.0 if self.upper is None else self.upper, (1, -1))
        for name, bound, other, is_lower in (("lower", lo, hi, True), ("upper", hi, lo, False)):
            if PROBABILITY_BOUNDS.mask(np, bound, other, np.inf, bound.shape[-1], is_lower).any():
                raise ValueError(f"`{name}` {PROBABILITY_BOUNDS.text}.")

    def build(self, input_shape):
        rank = len(input_shape)
        if not -rank <= self.axis < rank:
            raise ValueError(
                f"`logits` of rank {rank} (shape {tuple(input_shape)}) has no class axis "
                f"`axis`={self.axis}."
            )
        k = input_shape[self.axis]
        if k is None:
            raise ValueError("BCSoftmax needs a static number of classes.")
        self.num_classes = int(k)
        for name, v in (("lower", self.lower), ("upper", self.upper)):
            if v is not None and np.ndim(v) == 1 and len(v) != k:
                raise ValueError(f"`{name}` has {len(v)} entries but the input has {k} classes.")
        if self.learn_bounds:
            lo = np.broadcast_to(0.5 / k if self.lower is None else self.lower, (k,))
            hi = np.broadcast_to(0.5 if self.upper is None else self.upper, (k,))
            if np.any(lo * k >= 1) or np.any(hi * k <= 1) or k == 1:
                raise ValueError("Learned bounds need initial values lower < 1/K < upper.")
            self.lower_logit = self.constant_weight("lower_logit", _inverse_sigmoid(lo * k), (k,))
            upper = _inverse_sigmoid((hi - 1 / k) / (1 - 1 / k))
            self.upper_logit = self.constant_weight("upper_logit", upper, (k,))
        if self.learn_temperature:
            self.log_temperature = self.constant_weight("log_temperature", np.log(self.temperature))

    def bounds(self):
        """The current ``(lower, upper)`` tensors or None (configured or learned)."""
        if self.learn_bounds:
            k = self.num_classes
            lo = kops.sigmoid(self.lower_logit) / k
            hi = 1.0 / k + (1.0 - 1.0 / k) * kops.sigmoid(self.upper_logit)
            return lo, hi
        lo = None if self.lower is None else kops.convert_to_tensor(self.lower, "float32")
        hi = None if self.upper is None else kops.convert_to_tensor(self.upper, "float32")
        return lo, hi

    def call(self, inputs, lower=None, upper=None):
        x = kops.convert_to_tensor(inputs)
        x = kops.cast(x, "float32") if dtype_name(x) in ("float16", "bfloat16") else x
        lo, hi = self.bounds()
        lo = lo if lower is None else lower
        hi = hi if upper is None else upper
        tau = kops.exp(self.log_temperature) if self.learn_temperature else self.temperature
        return ops.bcsoftmax(x, lo, hi, tau, axis=self.axis, method=self.method)


def _to_config(v, name):
    if v is None:
        return None
    try:
        arr = np.asarray(v, np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"`{name}` must be None, a number or a list of numbers, got {v!r}."
        ) from err
    if arr.ndim > 1:
        raise ValueError(f"`{name}` must be a scalar or a per-class list, got shape {arr.shape}.")
    return float(arr) if arr.ndim == 0 else [float(t) for t in arr.reshape(-1)]
