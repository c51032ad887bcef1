"""Streaming Keras metrics for calibration: accumulate per-bin sums over batches.

Exported from :mod:`losszoo.metrics` (and, as before, from :mod:`losszoo.calibration`).
They agree with the plain functions in :mod:`losszoo.calibration.metrics` on the union of the
batches (``AdaptiveECE`` up to its histogram resolution). ``y_true``: integer labels ``[N]`` /
``[N, 1]`` or one-hot ``[N, K]``; ``y_pred``: probabilities ``[N, K]``. Sample weights are not
supported (they would change the bin weights; pass ``sample_weight=None``).

Fail loud (README, "Bad input"): labels outside ``[0, K)``, fractional or NaN labels, malformed
one-hot rows and probabilities with NaN/Inf, negative entries or rows not summing to 1 raise
(``ValueError`` eagerly, an assertion error inside ``tf.function``) naming ``y_true`` /
``y_pred``; ``n_bins``, ``resolution`` and a given ``num_classes`` must be positive integers.
Under XLA (``jit_compile=True``), where assertions vanish, such a row makes the accumulated
state and so ``result()`` NaN until ``reset_state()``. Checks can be switched off with
``losszoo.set_validation(False)``; the NaN poisoning stays.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from losszoo.contract import (
    check_number,
    nan_where,
    static_value,
    validation_enabled,
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

#: Rows of probabilities must sum to 1 within this tolerance (float16 softmax outputs pass);
#: shared with the array functions of :mod:`losszoo.calibration.metrics`.
SUM_TOL = 1e-3


def _require(cond_value, cond_tensor, message, checks):
    """Eager/constant: raise ValueError now; graph: add an assertion to ``checks``."""
    if cond_value is not None:
        if not bool(np.all(cond_value)):
            raise ValueError(message)
    else:
        checks.append(tf.debugging.Assert(tf.reduce_all(cond_tensor), [message]))


def _labels_probs(y_true, y_pred, num_classes=None):
    """Labels ``[N]`` (int32, safe to gather), probabilities ``[N, K]`` and a ``[N]`` mask of
    invalid rows.

    Invalid (eager/graph: ``ValueError`` / assertion naming the argument; always: the row's
    contribution is NaN, which is what is left under XLA): ``y_pred`` with NaN/Inf, negative
    entries or rows not summing to 1 (within ``SUM_TOL``); ``y_true`` ids outside ``[0, K)``,
    fractional or NaN, or one-hot rows that are not 0/1 with a single 1.
    """
    y_pred = tf.cast(tf.convert_to_tensor(y_pred), tf.float32)
    k = y_pred.shape[-1]
    if k is None:
        raise ValueError("`y_pred` must have a static number of classes.")
    if num_classes is not None and k != num_classes:
        raise ValueError(f"`y_pred` has {k} classes but the metric was built for {num_classes}.")
    y_pred = tf.reshape(y_pred, [-1, k])
    y_true = tf.convert_to_tensor(y_true)
    if y_true.dtype == tf.bool or not (y_true.dtype.is_integer or y_true.dtype.is_floating):
        raise TypeError(f"`y_true` must be integer ids or one-hot rows, got {y_true.dtype.name}.")
    onehot = (
        y_true.shape.rank is not None and y_true.shape.rank >= 2 and y_true.shape[-1] == k and k > 1
    )
    checks = []
    validate = validation_enabled()
    pv = static_value(y_pred) if validate else None
    tv = static_value(y_true) if validate else None
    sums = tf.reduce_sum(y_pred, -1)
    pred_ok = tf.logical_and(tf.reduce_all(y_pred >= 0, -1), tf.abs(sums - 1.0) <= SUM_TOL)
    if onehot:
        yt = tf.cast(tf.reshape(y_true, [-1, k]), tf.float32)
        true_ok = tf.logical_and(
            tf.reduce_all(tf.logical_or(tf.equal(yt, 0.0), tf.equal(yt, 1.0)), -1),
            tf.equal(tf.reduce_sum(yt, -1), 1.0),
        )
        labels = tf.argmax(yt, -1, output_type=tf.int32)
        if validate:
            tvv = None if tv is None else np.asarray(tv, np.float64).reshape(-1, k)
            _require(
                None if tvv is None else (np.isin(tvv, (0.0, 1.0)).all(-1) & (tvv.sum(-1) == 1)),
                true_ok,
                "`y_true` of shape [N, K] must be one-hot rows (one 1, zeros elsewhere).",
                checks,
            )
    else:
        flat = tf.reshape(y_true, [-1])
        if flat.dtype.is_floating:
            ff = tf.cast(flat, tf.float64)
            true_ok = tf.logical_and(tf.math.is_finite(ff), tf.equal(ff, tf.round(ff)))
            true_ok = tf.logical_and(true_ok, tf.logical_and(ff >= 0, ff < k))
            labels = tf.cast(tf.where(true_ok, ff, 0.0), tf.int32)
        else:
            fi = tf.cast(flat, tf.int64)
            true_ok = tf.logical_and(fi >= 0, fi < k)
            labels = tf.cast(tf.where(true_ok, fi, 0), tf.int32)
        if validate:
            tvv = None if tv is None else np.asarray(tv, np.float64).reshape(-1)
            _require(
                None if tvv is None else np.isfinite(tvv) & (tvv == np.round(np.nan_to_num(tvv))),
                true_ok if flat.dtype.is_floating else tf.constant(True),
                "`y_true` must be integer class ids (got NaN, Inf or fractions).",
                checks,
            )
            _require(
                None if tvv is None else (tvv >= 0) & (tvv < k),
                true_ok,
                f"`y_true` must be class ids in [0, {k}).",
                checks,
            )
    if validate:
        pvv = None if pv is None else np.asarray(pv, np.float64).reshape(-1, k)
        _require(
            None if pvv is None else np.isfinite(pvv),
            tf.math.is_finite(y_pred),
            "`y_pred` must not contain NaN or Inf.",
            checks,
        )
        _require(
            None if pvv is None else (pvv >= 0).all(-1) & (np.abs(pvv.sum(-1) - 1) <= SUM_TOL),
            pred_ok,
            f"`y_pred` rows must be probabilities: non-negative, summing to 1 (within {SUM_TOL}).",
            checks,
        )
    n_true, n_pred = tf.shape(labels)[0], tf.shape(y_pred)[0]
    if labels.shape[0] is not None and y_pred.shape[0] is not None:
        if labels.shape[0] != y_pred.shape[0]:
            raise ValueError(
                f"`y_true` has {labels.shape[0]} rows but `y_pred` has {y_pred.shape[0]}."
            )
    elif validate:
        checks.append(
            tf.debugging.assert_equal(
                n_true, n_pred, "`y_true` and `y_pred` must have as many rows."
            )
        )
    bad = tf.logical_not(tf.logical_and(true_ok, pred_ok))  # NaN sums fail pred_ok too
    if checks:
        with tf.control_dependencies(checks):
            y_pred = tf.identity(y_pred)
    return labels, y_pred, bad


def _bin_index(values, n_bins):
    edges = tf.range(1, n_bins, dtype=tf.float32) / float(n_bins)
    return tf.reduce_sum(tf.cast(values[..., None] > edges, tf.int32), -1)


class _BinnedTopLabel(keras.metrics.Metric):
    def __init__(self, n_bins, name, **kwargs):
        super().__init__(name=name, **kwargs)
        self.n_bins = check_number(n_bins, "n_bins", low=1, integer=True)
        self.counts = self.add_variable(
            shape=(self._resolution(),), initializer="zeros", name="counts"
        )
        self.conf_sum = self.add_variable(
            shape=(self._resolution(),), initializer="zeros", name="conf_sum"
        )
        self.correct_sum = self.add_variable(
            shape=(self._resolution(),), initializer="zeros", name="correct_sum"
        )

    def _resolution(self):
        return self.n_bins

    def update_state(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            raise ValueError(f"{type(self).__name__} does not support sample weights.")
        labels, probs, bad = _labels_probs(y_true, y_pred)
        conf = nan_where(bad, tf.reduce_max(probs, -1))
        correct = tf.cast(tf.equal(tf.argmax(probs, -1, output_type=tf.int32), labels), tf.float32)
        correct = nan_where(bad, correct)
        idx = _bin_index(conf, self._resolution())
        r = self._resolution()
        self.counts.assign_add(tf.math.unsorted_segment_sum(tf.ones_like(conf), idx, r))
        self.conf_sum.assign_add(tf.math.unsorted_segment_sum(conf, idx, r))
        self.correct_sum.assign_add(tf.math.unsorted_segment_sum(correct, idx, r))

    def reset_state(self):
        for v in (self.counts, self.conf_sum, self.correct_sum):
            v.assign(tf.zeros_like(v))

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

    Example:
      >>> m = losszoo.metrics.ExpectedCalibrationError()
      >>> m.update_state([0, 1], [[0.9, 0.1], [0.8, 0.2]])
      >>> round(float(m.result()), 4)
      0.45
    """

    def __init__(self, n_bins: int = 15, name: str = "ece", **kwargs):
        super().__init__(n_bins, name, **kwargs)

    def result(self):
        n = tf.maximum(tf.reduce_sum(self.counts), 1.0)
        return tf.reduce_sum(tf.abs(self.correct_sum - self.conf_sum)) / n


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
        super().__init__(n_bins, name, **kwargs)

    def _resolution(self):
        return self.resolution

    def result(self):
        n = tf.reduce_sum(self.counts)
        before = tf.cumsum(self.counts, exclusive=True)
        # the group of rank r under np.array_split(range(n), n_bins): the first n % M groups
        # hold q + 1 samples, the others q
        m = float(self.n_bins)
        q = tf.floor(n / m)
        rem = n - q * m
        big = (q + 1.0) * rem
        group = tf.where(
            before < big,
            tf.floor(before / (q + 1.0)),
            rem + tf.floor((before - big) / tf.maximum(q, 1.0)),
        )
        group = tf.clip_by_value(tf.cast(group, tf.int32), 0, self.n_bins - 1)
        corr = tf.math.unsorted_segment_sum(self.correct_sum, group, self.n_bins)
        conf = tf.math.unsorted_segment_sum(self.conf_sum, group, self.n_bins)
        return tf.reduce_sum(tf.abs(corr - conf)) / tf.maximum(n, 1.0)

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
        if self.num_classes is None:
            k = tf.convert_to_tensor(y_pred).shape[-1]
            if k is None:
                raise ValueError(
                    "`y_pred` must have a static number of classes (or pass `num_classes`)."
                )
            self._build_state(k)
        labels, probs, bad = _labels_probs(y_true, y_pred, self.num_classes)
        probs = nan_where(bad[:, None], probs)
        k, m = self.num_classes, self.n_bins
        idx = _bin_index(probs, m) + tf.range(k)[None, :] * m  # [N, K] flat (class, bin)
        hits = tf.one_hot(labels, k, dtype=tf.float32)
        seg = tf.reshape(idx, [-1])
        self.counts.assign_add(
            tf.math.unsorted_segment_sum(tf.ones_like(tf.reshape(probs, [-1])), seg, k * m)
        )
        self.prob_sum.assign_add(tf.math.unsorted_segment_sum(tf.reshape(probs, [-1]), seg, k * m))
        self.hit_sum.assign_add(tf.math.unsorted_segment_sum(tf.reshape(hits, [-1]), seg, k * m))

    def result(self):
        if self.num_classes is None:
            return tf.constant(0.0, self.dtype)
        n = tf.maximum(tf.reduce_sum(self.counts) / self.num_classes, 1.0)
        return tf.reduce_sum(tf.abs(self.hit_sum - self.prob_sum)) / n / self.num_classes

    def reset_state(self):
        for v in self.variables:
            v.assign(tf.zeros_like(v))

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes, "n_bins": self.n_bins}


class _MeanOf(keras.metrics.Metric):
    def __init__(self, name, **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        labels, probs, bad = _labels_probs(y_true, y_pred)
        values = nan_where(bad, self._values(labels, probs))
        w = (
            tf.ones_like(values)
            if sample_weight is None
            else tf.cast(tf.reshape(sample_weight, [-1]), tf.float32)
        )
        self.total.assign_add(tf.reduce_sum(values * w))
        self.count.assign_add(tf.reduce_sum(w))

    def result(self):
        return self.total / tf.maximum(self.count, 1e-12)

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)


@register(
    "nll",
    kind="metric",
    aliases=("negative_log_likelihood",),
    description="Mean negative log-likelihood -log p[y] of probabilities",
)
class NegativeLogLikelihood(_MeanOf):
    """Streaming mean ``-log p[y]`` (probabilities floored at 1e-12).

    Example:
      >>> m = losszoo.metrics.NegativeLogLikelihood()
      >>> m.update_state([0], [[0.5, 0.5]])
      >>> round(float(m.result()), 4)
      0.6931
    """

    def __init__(self, name: str = "nll", **kwargs):
        super().__init__(name, **kwargs)

    def _values(self, labels, probs):
        p = tf.gather(probs, labels, batch_dims=1)
        return -tf.math.log(tf.maximum(p, 1e-12))


@register(
    "brier_score",
    kind="metric",
    aliases=("brier",),
    description="Brier score: mean of sum_k (p_k - [y = k])^2",
)
class BrierScore(_MeanOf):
    """Streaming Brier score ``mean sum_k (p_k - [y = k])^2``.

    Example:
      >>> m = losszoo.metrics.BrierScore()
      >>> m.update_state([0], [[0.5, 0.5]])
      >>> float(m.result())
      0.5
    """

    def __init__(self, name: str = "brier_score", **kwargs):
        super().__init__(name, **kwargs)

    def _values(self, labels, probs):
        hits = tf.one_hot(labels, probs.shape[-1], dtype=probs.dtype)
        return tf.reduce_sum(tf.square(probs - hits), -1)


@register(
    "calibration_accuracy",
    kind="metric",
    description="Top-1 accuracy of probabilities (argmax), for calibration reports",
)
class Accuracy(_MeanOf):
    """Streaming top-1 accuracy (argmax of the probabilities against integer or one-hot labels).

    Example:
      >>> m = losszoo.metrics.Accuracy()
      >>> m.update_state([0, 1], [[0.9, 0.1], [0.8, 0.2]])
      >>> float(m.result())
      0.5
    """

    def __init__(self, name: str = "accuracy", **kwargs):
        super().__init__(name, **kwargs)

    def _values(self, labels, probs):
        return tf.cast(tf.equal(tf.argmax(probs, -1, output_type=tf.int32), labels), tf.float32)
