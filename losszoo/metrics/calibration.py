"""Streaming Keras metrics for calibration: accumulate per-bin sums over batches.

Exported from :mod:`losszoo.metrics` (and, as before, from :mod:`losszoo.calibration`).
They agree with the plain functions in :mod:`losszoo.calibration.metrics` on the union of the
batches (``AdaptiveECE`` up to its histogram resolution). ``y_true``: integer labels ``[N]`` /
``[N, 1]`` or one-hot ``[N, K]``; ``y_pred``: probabilities ``[N, K]``. Written with
``keras.ops``: the same on TensorFlow, JAX and PyTorch.

Contract rules: ``y_true`` ids keep ``contract.CLASS_IDS``, one-hot ``y_true`` keeps
:data:`ONE_HOT`, ``y_pred`` keeps :data:`PROBABILITIES`. A violation raises naming the argument
(``ValueError`` eagerly, an assertion error inside a TensorFlow graph); ``n_bins``,
``resolution`` and a given ``num_classes`` must be positive integers. Traced for XLA
(``jit_compile=True``, ``jax.jit``), where assertions do not exist, such a row makes the
accumulated state and so ``result()`` NaN until ``reset_state()``. Checks can be switched off
with ``losszoo.set_validation(False)``; the NaN poisoning stays. The binned metrics take no
``sample_weight`` (it would change the bin weights).
"""

from __future__ import annotations

import keras
from keras import ops

from losszoo import _backend
from losszoo.contract import (
    CLASS_IDS,
    ONE_HOT,
    PROBABILITIES,
    check_number,
    check_real,
    nan_where,
    shapes_compatible,
    static_rank,
)
from losszoo.registry import register

__all__ = [
    "Accuracy",
    "AdaptiveECE",
    "BrierScore",
    "ClasswiseECE",
    "ExpectedCalibrationError",
    "NegativeLogLikelihood",
]


def _labels_probs(y_true, y_pred, num_classes=None):
    """Labels ``[N]`` (int32, safe to gather), probabilities ``[N, K]`` (float32) and the
    ``[N]`` mask of rows breaking ``CLASS_IDS`` / :data:`ONE_HOT` / :data:`PROBABILITIES`
    (eagerly and in graphs they raise first)."""
    y_pred = ops.cast(ops.convert_to_tensor(y_pred), "float32")
    k = y_pred.shape[-1]
    if k is None:
        raise ValueError("`y_pred` must have a static number of classes.")
    if num_classes is not None and k != num_classes:
        raise ValueError(f"`y_pred` has {k} classes but the metric was built for {num_classes}.")
    y_pred = ops.reshape(y_pred, (-1, k))
    y_true = ops.convert_to_tensor(y_true)
    check_real(y_true, "y_true", bool_ok=False)
    if (static_rank(y_true) or 0) >= 2 and y_true.shape[-1] == k and k > 1:
        onehot = ONE_HOT.check(ops.cast(ops.reshape(y_true, (-1, k)), "float32"), "y_true")
        true_bad = ONE_HOT.invalid(onehot)
        labels = ops.cast(ops.argmax(onehot, axis=-1), "int32")
    else:
        flat = CLASS_IDS.check(ops.reshape(y_true, (-1,)), "y_true", k)
        true_bad = CLASS_IDS.invalid(flat, k)
        labels = ops.cast(ops.where(true_bad, ops.zeros_like(flat), flat), "int32")
    y_pred = PROBABILITIES.check(y_pred, "y_pred")
    message = "`y_true` and `y_pred` must have as many rows"
    if not shapes_compatible(labels.shape, y_pred.shape[:1]):
        raise ValueError(f"{message}; got {labels.shape[0]} and {y_pred.shape[0]}.")
    same = ops.equal(ops.shape(labels)[0], ops.shape(y_pred)[0])  # sizes known only when run
    y_pred = _backend.assert_all(same, message + ".", y_pred)
    return labels, y_pred, true_bad | PROBABILITIES.invalid(y_pred)


def _bin_index(values, n_bins):
    """Right-closed equal-width bins ``((m-1)/M, m/M]`` of ``values`` in ``[0, 1]``."""
    edges = ops.arange(1, n_bins, dtype="float32") / float(n_bins)
    return ops.sum(ops.cast(values[..., None] > edges, "int32"), axis=-1)


def _add_per_segment(variable, values, segments):
    sums = ops.segment_sum(values, segments, num_segments=variable.shape[0], sorted=False)
    variable.assign_add(sums)


def _top_label(labels, probs):
    """Whether each row's argmax (ties: the lowest index) is its label, as float32."""
    return ops.cast(ops.equal(ops.cast(ops.argmax(probs, axis=-1), "int32"), labels), "float32")


class _BinnedTopLabel(keras.metrics.Metric):
    def __init__(self, n_bins, name, resolution=None, **kwargs):
        super().__init__(name=name, **kwargs)
        self.n_bins = check_number(n_bins, "n_bins", low=1, integer=True)
        shape = (resolution or self.n_bins,)
        self.counts = self.add_variable(shape=shape, initializer="zeros", name="counts")
        self.conf_sum = self.add_variable(shape=shape, initializer="zeros", name="conf_sum")
        self.correct_sum = self.add_variable(shape=shape, initializer="zeros", name="correct_sum")

    def update_state(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            raise ValueError(f"{type(self).__name__} does not support sample weights.")
        labels, probs, bad = _labels_probs(y_true, y_pred)
        conf = nan_where(bad, _backend.reduce_max(probs, axis=-1))
        correct = nan_where(bad, _top_label(labels, probs))
        idx = _bin_index(conf, self.counts.shape[0])
        _add_per_segment(self.counts, ops.ones_like(conf), idx)
        _add_per_segment(self.conf_sum, conf, idx)
        _add_per_segment(self.correct_sum, correct, idx)

    def get_config(self):
        return {**super().get_config(), "n_bins": self.n_bins}


@register(
    "ece",
    kind="metric",
    aliases=("expected_calibration_error",),
    description="Top-label expected calibration error (equal-width bins, default 15)",
)
class ExpectedCalibrationError(_BinnedTopLabel):
    """Streaming top-label ECE: ``sum_m |B_m|/N |acc(B_m) - conf(B_m)|`` over ``n_bins``
    right-closed equal-width confidence bins (paper eq. 28).

    Args:
      n_bins: the number of bins (a positive integer, default 15).
      name, **kwargs: as for any Keras metric.

    Example:
      >>> m = losszoo.metrics.ExpectedCalibrationError()
      >>> m.update_state([0, 1], [[0.9, 0.1], [0.8, 0.2]])
      >>> round(float(m.result()), 4)
      0.45
    """

    def __init__(self, n_bins: int = 15, name: str = "ece", **kwargs):
        super().__init__(n_bins, name, **kwargs)

    def result(self):
        n = ops.maximum(ops.sum(self.counts), 1.0)
        return ops.sum(ops.abs(self.correct_sum - self.conf_sum)) / n


@register(
    "adaptive_ece",
    kind="metric",
    description="Top-label ECE with equal-mass bins (streaming histogram approximation)",
)
class AdaptiveECE(_BinnedTopLabel):
    """Streaming equal-mass ECE. Confidences are accumulated in ``resolution`` fine equal-width
    bins; at ``result()`` consecutive fine bins are grouped into ``n_bins`` groups of about equal
    mass (a fine bin is never split, so this approximates
    :func:`losszoo.calibration.adaptive_ece` to within the fine-bin width).

    Args:
      n_bins: the number of equal-mass groups (a positive integer, default 15).
      resolution: the number of fine bins (an integer >= ``n_bins``, default 4096).
      name, **kwargs: as for any Keras metric.

    Example:
      >>> m = losszoo.metrics.AdaptiveECE(n_bins=2)
      >>> m.update_state([0, 1], [[0.9, 0.1], [0.8, 0.2]])
      >>> round(float(m.result()), 3)
      0.45
    """

    def __init__(
        self, n_bins: int = 15, resolution: int = 4096, name: str = "adaptive_ece", **kwargs
    ):
        n_bins = check_number(n_bins, "n_bins", low=1, integer=True)
        self.resolution = check_number(resolution, "resolution", low=n_bins, integer=True)
        super().__init__(n_bins, name, self.resolution, **kwargs)

    def result(self):
        n = ops.sum(self.counts)
        before = ops.cumsum(self.counts) - self.counts  # rank of each fine bin's first sample
        # np.array_split(range(n), n_bins): the first n % M groups hold q + 1 samples, the
        # others q, so group j starts at rank j q + min(j, n % M)
        q = ops.floor(n / self.n_bins)
        j = ops.arange(self.n_bins, dtype="float32")
        starts = j * q + ops.minimum(j, n - q * self.n_bins)
        group = ops.searchsorted(starts, before, side="right") - 1
        corr = ops.segment_sum(self.correct_sum, group, num_segments=self.n_bins)
        conf = ops.segment_sum(self.conf_sum, group, num_segments=self.n_bins)
        return ops.sum(ops.abs(corr - conf)) / ops.maximum(n, 1.0)

    def get_config(self):
        return {**super().get_config(), "resolution": self.resolution}


@register(
    "classwise_ece",
    kind="metric",
    description="Classwise ECE: mean over classes of the binned calibration error of p_k",
)
class ClasswiseECE(keras.metrics.Metric):
    """Streaming classwise ECE over ``num_classes`` classes and ``n_bins`` equal-width bins.

    Args:
      num_classes: the number of classes ``K``; ``None`` (default, what
        ``compile(metrics=["classwise_ece"])`` uses) reads it from the static last axis of
        ``y_pred`` at the first ``update_state`` (as Keras' ``F1Score`` does); later batches
        must have the same ``K``. ``result()`` is 0 before any update.
      n_bins: equal-width bins per class.
      name, dtype: as for any Keras metric.

    Example:
      >>> m = losszoo.metrics.ClasswiseECE()
      >>> m.update_state([0, 1], [[0.9, 0.1], [0.8, 0.2]])
      >>> round(float(m.result()), 4), m.num_classes
      (0.45, 2)
    """

    def __init__(
        self,
        num_classes: int | None = None,
        n_bins: int = 15,
        name: str = "classwise_ece",
        **kwargs,
    ):
        super().__init__(name=name, **kwargs)
        self.num_classes = check_number(
            num_classes, "num_classes", low=1, integer=True, allow_none=True
        )
        self.n_bins = check_number(n_bins, "n_bins", low=1, integer=True)
        if self.num_classes is not None:
            self._build_state(self.num_classes)

    def _build_state(self, num_classes):
        self.num_classes = num_classes
        shape = (num_classes * self.n_bins,)
        self.counts = self.add_variable(shape=shape, initializer="zeros", name="counts")
        self.prob_sum = self.add_variable(shape=shape, initializer="zeros", name="prob_sum")
        self.hit_sum = self.add_variable(shape=shape, initializer="zeros", name="hit_sum")

    def update_state(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            raise ValueError("ClasswiseECE does not support sample weights.")
        labels, probs, bad = _labels_probs(y_true, y_pred, self.num_classes)
        if self.num_classes is None:
            self._build_state(probs.shape[-1])
        probs = nan_where(bad[:, None], probs)
        k, m = self.num_classes, self.n_bins
        idx = _bin_index(probs, m) + ops.arange(k, dtype="int32")[None, :] * m  # (class, bin)
        segments = ops.reshape(idx, (-1,))
        hits = ops.reshape(ops.one_hot(labels, k, dtype="float32"), (-1,))
        probs = ops.reshape(probs, (-1,))
        _add_per_segment(self.counts, ops.ones_like(probs), segments)
        _add_per_segment(self.prob_sum, probs, segments)
        _add_per_segment(self.hit_sum, hits, segments)

    def result(self):
        if self.num_classes is None:
            return ops.zeros((), self.dtype)
        n = ops.maximum(ops.sum(self.counts) / self.num_classes, 1.0)
        return ops.sum(ops.abs(self.hit_sum - self.prob_sum)) / n / self.num_classes

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes, "n_bins": self.n_bins}


class _MeanOf(keras.metrics.Mean):
    """The (weighted) mean over examples of ``_values(labels, probs)``; rows breaking the
    rules are NaN."""

    def update_state(self, y_true, y_pred, sample_weight=None):
        labels, probs, bad = _labels_probs(y_true, y_pred)
        super().update_state(nan_where(bad, self._values(labels, probs)), sample_weight)


@register(
    "nll",
    kind="metric",
    aliases=("negative_log_likelihood",),
    description="Mean negative log-likelihood -log p[y] of probabilities",
)
class NegativeLogLikelihood(_MeanOf):
    """Streaming mean ``-log max(p[y], 1e-12)``.

    ``y_true``: integer class ids ``[N]`` / ``[N, 1]`` or one-hot ``[N, K]``; ``y_pred``:
    probabilities ``[N, K]`` (module docstring: rules, NaN under XLA).
    ``update_state`` takes an optional per-example ``sample_weight`` (a weighted mean, as
    ``keras.metrics.Mean``).

    Args:
      name: the metric's name (default ``"nll"``).
      **kwargs: as for any Keras metric (e.g. ``dtype``).

    Example:
      >>> m = losszoo.metrics.NegativeLogLikelihood()
      >>> m.update_state([0], [[0.5, 0.5]])
      >>> round(float(m.result()), 4)
      0.6931
    """

    def __init__(self, name: str = "nll", **kwargs):
        super().__init__(name, **kwargs)

    def _values(self, labels, probs):
        p = ops.take_along_axis(probs, labels[:, None], axis=-1)[:, 0]
        return -ops.log(ops.maximum(p, 1e-12))


@register(
    "brier_score",
    kind="metric",
    aliases=("brier",),
    description="Brier score: mean of sum_k (p_k - [y = k])^2",
)
class BrierScore(_MeanOf):
    """Streaming Brier score ``mean sum_k (p_k - [y = k])^2``.

    ``y_true``: integer class ids ``[N]`` / ``[N, 1]`` or one-hot ``[N, K]``; ``y_pred``:
    probabilities ``[N, K]`` (module docstring: rules, NaN under XLA).
    ``update_state`` takes an optional per-example ``sample_weight`` (a weighted mean, as
    ``keras.metrics.Mean``).

    Args:
      name: the metric's name (default ``"brier_score"``).
      **kwargs: as for any Keras metric (e.g. ``dtype``).

    Example:
      >>> m = losszoo.metrics.BrierScore()
      >>> m.update_state([0], [[0.5, 0.5]])
      >>> float(m.result())
      0.5
    """

    def __init__(self, name: str = "brier_score", **kwargs):
        super().__init__(name, **kwargs)

    def _values(self, labels, probs):
        hits = ops.one_hot(labels, probs.shape[-1], dtype=probs.dtype)
        return ops.sum(ops.square(probs - hits), axis=-1)


@register(
    "calibration_accuracy",
    kind="metric",
    description="Top-1 accuracy of probabilities (argmax), for calibration reports",
)
class Accuracy(_MeanOf):
    """Streaming top-1 accuracy ``mean [argmax_k p_k = y]`` (ties: the lowest index).

    ``y_true``: integer class ids ``[N]`` / ``[N, 1]`` or one-hot ``[N, K]``; ``y_pred``:
    probabilities ``[N, K]`` (module docstring: rules, NaN under XLA). Registered as
    ``"calibration_accuracy"`` (``"accuracy"`` is Keras' own).
    ``update_state`` takes an optional per-example ``sample_weight`` (a weighted mean, as
    ``keras.metrics.Mean``).

    Args:
      name: the metric's name (default ``"accuracy"``).
      **kwargs: as for any Keras metric (e.g. ``dtype``).

    Example:
      >>> m = losszoo.metrics.Accuracy()
      >>> m.update_state([0, 1], [[0.9, 0.1], [0.8, 0.2]])
      >>> float(m.result())
      0.5
    """

    def __init__(self, name: str = "accuracy", **kwargs):
        super().__init__(name, **kwargs)

    def _values(self, labels, probs):
        return _top_label(labels, probs)
