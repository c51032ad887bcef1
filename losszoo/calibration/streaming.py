"""Streaming Keras metrics for calibration: accumulate per-bin sums over batches.

They agree with the plain functions in :mod:`losszoo.calibration.metrics` on the union of the
batches (``AdaptiveECE`` up to its histogram resolution). ``y_true``: integer labels ``[N]`` /
``[N, 1]`` or one-hot ``[N, K]``; ``y_pred``: probabilities ``[N, K]``. Sample weights are not
supported (they would change the bin weights; pass ``sample_weight=None``).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from losszoo.registry import register


def _labels_probs(y_true, y_pred):
    y_pred = tf.cast(tf.convert_to_tensor(y_pred), tf.float32)
    k = y_pred.shape[-1]
    y_pred = tf.reshape(y_pred, [-1, k])
    y_true = tf.convert_to_tensor(y_true)
    if y_true.shape.rank is not None and y_true.shape.rank >= 2 and y_true.shape[-1] == k and k > 1:
        labels = tf.argmax(tf.reshape(y_true, [-1, k]), -1, output_type=tf.int32)
    else:
        labels = tf.cast(tf.reshape(y_true, [-1]), tf.int32)
    return labels, y_pred


def _bin_index(values, n_bins):
    edges = tf.range(1, n_bins, dtype=tf.float32) / float(n_bins)
    return tf.reduce_sum(tf.cast(values[..., None] > edges, tf.int32), -1)


class _BinnedTopLabel(keras.metrics.Metric):
    def __init__(self, n_bins, name, **kwargs):
        super().__init__(name=name, **kwargs)
        self.n_bins = int(n_bins)
        self.counts = self.add_variable(shape=(self._resolution(),), initializer="zeros", name="counts")
        self.conf_sum = self.add_variable(shape=(self._resolution(),), initializer="zeros", name="conf_sum")
        self.correct_sum = self.add_variable(shape=(self._resolution(),), initializer="zeros", name="correct_sum")

    def _resolution(self):
        return self.n_bins

    def update_state(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            raise ValueError(f"{type(self).__name__} does not support sample weights.")
        labels, probs = _labels_probs(y_true, y_pred)
        conf = tf.reduce_max(probs, -1)
        correct = tf.cast(tf.equal(tf.argmax(probs, -1, output_type=tf.int32), labels), tf.float32)
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


@register("ece", kind="metric", aliases=("expected_calibration_error",),
          description="Top-label expected calibration error (equal-width bins, default 15)")
class ExpectedCalibrationError(_BinnedTopLabel):
    """Streaming top-label ECE: ``sum_m |B_m|/N |acc(B_m) - conf(B_m)|`` over ``n_bins``
    right-closed equal-width confidence bins (paper eq. 28).

    Example:
      >>> m = losszoo.calibration.ExpectedCalibrationError()
      >>> m.update_state([0, 1], [[0.9, 0.1], [0.8, 0.2]])
      >>> float(m.result())
      0.45
    """

    def __init__(self, n_bins: int = 15, name: str = "ece", **kwargs):
        super().__init__(n_bins, name, **kwargs)

    def result(self):
        n = tf.maximum(tf.reduce_sum(self.counts), 1.0)
        return tf.reduce_sum(tf.abs(self.correct_sum - self.conf_sum)) / n


@register("adaptive_ece", kind="metric",
          description="Top-label ECE with equal-mass bins (streaming histogram approximation)")
class AdaptiveECE(_BinnedTopLabel):
    """Streaming equal-mass ECE. Confidences are accumulated in ``resolution`` fine equal-width
    bins; at ``result()`` consecutive fine bins are grouped into ``n_bins`` groups of about equal
    mass (a fine bin is never split, so this approximates
    :func:`losszoo.calibration.adaptive_ece` to within the fine-bin width).

    Example:
      >>> m = losszoo.calibration.AdaptiveECE(n_bins=2)
      >>> m.update_state([0, 1], [[0.9, 0.1], [0.8, 0.2]])
      >>> round(float(m.result()), 3)
      0.45
    """

    def __init__(self, n_bins: int = 15, resolution: int = 4096, name: str = "adaptive_ece",
                 **kwargs):
        self.resolution = int(resolution)
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
        group = tf.where(before < big, tf.floor(before / (q + 1.0)),
                         rem + tf.floor((before - big) / tf.maximum(q, 1.0)))
        group = tf.clip_by_value(tf.cast(group, tf.int32), 0, self.n_bins - 1)
        corr = tf.math.unsorted_segment_sum(self.correct_sum, group, self.n_bins)
        conf = tf.math.unsorted_segment_sum(self.conf_sum, group, self.n_bins)
        return tf.reduce_sum(tf.abs(corr - conf)) / tf.maximum(n, 1.0)

    def get_config(self):
        return {**super().get_config(), "resolution": self.resolution}


@register("classwise_ece", kind="metric",
          description="Classwise ECE: mean over classes of the binned calibration error of p_k")
class ClasswiseECE(keras.metrics.Metric):
    """Streaming classwise ECE over ``num_classes`` classes and ``n_bins`` equal-width bins.

    Example:
      >>> m = losszoo.calibration.ClasswiseECE(num_classes=2)
      >>> m.update_state([0, 1], [[0.9, 0.1], [0.8, 0.2]])
      >>> round(float(m.result()), 4)
      0.45
    """

    def __init__(self, num_classes: int, n_bins: int = 15, name: str = "classwise_ece", **kwargs):
        super().__init__(name=name, **kwargs)
        self.num_classes, self.n_bins = int(num_classes), int(n_bins)
        shape = (self.num_classes * self.n_bins,)
        self.counts = self.add_variable(shape=shape, initializer="zeros", name="counts")
        self.prob_sum = self.add_variable(shape=shape, initializer="zeros", name="prob_sum")
        self.hit_sum = self.add_variable(shape=shape, initializer="zeros", name="hit_sum")

    def update_state(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            raise ValueError("ClasswiseECE does not support sample weights.")
        labels, probs = _labels_probs(y_true, y_pred)
        k, m = self.num_classes, self.n_bins
        idx = _bin_index(probs, m) + tf.range(k)[None, :] * m      # [N, K] flat (class, bin)
        hits = tf.one_hot(labels, k, dtype=tf.float32)
        seg = tf.reshape(idx, [-1])
        self.counts.assign_add(tf.math.unsorted_segment_sum(tf.ones_like(tf.reshape(probs, [-1])), seg, k * m))
        self.prob_sum.assign_add(tf.math.unsorted_segment_sum(tf.reshape(probs, [-1]), seg, k * m))
        self.hit_sum.assign_add(tf.math.unsorted_segment_sum(tf.reshape(hits, [-1]), seg, k * m))

    def result(self):
        n = tf.maximum(tf.reduce_sum(self.counts) / self.num_classes, 1.0)
        return tf.reduce_sum(tf.abs(self.hit_sum - self.prob_sum)) / n / self.num_classes

    def reset_state(self):
        for v in (self.counts, self.prob_sum, self.hit_sum):
            v.assign(tf.zeros_like(v))

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes, "n_bins": self.n_bins}


class _MeanOf(keras.metrics.Metric):
    def __init__(self, name, **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        labels, probs = _labels_probs(y_true, y_pred)
        values = self._values(labels, probs)
        w = tf.ones_like(values) if sample_weight is None else tf.cast(
            tf.reshape(sample_weight, [-1]), tf.float32)
        self.total.assign_add(tf.reduce_sum(values * w))
        self.count.assign_add(tf.reduce_sum(w))

    def result(self):
        return self.total / tf.maximum(self.count, 1e-12)

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)


@register("nll", kind="metric", aliases=("negative_log_likelihood",),
          description="Mean negative log-likelihood -log p[y] of probabilities")
class NegativeLogLikelihood(_MeanOf):
    """Streaming mean ``-log p[y]`` (probabilities floored at 1e-12).

    Example:
      >>> m = losszoo.calibration.NegativeLogLikelihood()
      >>> m.update_state([0], [[0.5, 0.5]])
      >>> round(float(m.result()), 4)
      0.6931
    """

    def __init__(self, name: str = "nll", **kwargs):
        super().__init__(name, **kwargs)

    def _values(self, labels, probs):
        p = tf.gather(probs, labels, batch_dims=1)
        return -tf.math.log(tf.maximum(p, 1e-12))


@register("brier_score", kind="metric", aliases=("brier",),
          description="Brier score: mean of sum_k (p_k - [y = k])^2")
class BrierScore(_MeanOf):
    """Streaming Brier score ``mean sum_k (p_k - [y = k])^2``.

    Example:
      >>> m = losszoo.calibration.BrierScore()
      >>> m.update_state([0], [[0.5, 0.5]])
      >>> float(m.result())
      0.5
    """

    def __init__(self, name: str = "brier_score", **kwargs):
        super().__init__(name, **kwargs)

    def _values(self, labels, probs):
        hits = tf.one_hot(labels, probs.shape[-1], dtype=probs.dtype)
        return tf.reduce_sum(tf.square(probs - hits), -1)


@register("calibration_accuracy", kind="metric",
          description="Top-1 accuracy of probabilities (argmax), for calibration reports")
class Accuracy(_MeanOf):
    """Streaming top-1 accuracy (argmax of the probabilities against integer or one-hot labels).

    Example:
      >>> m = losszoo.calibration.Accuracy()
      >>> m.update_state([0, 1], [[0.9, 0.1], [0.8, 0.2]])
      >>> float(m.result())
      0.5
    """

    def __init__(self, name: str = "accuracy", **kwargs):
        super().__init__(name, **kwargs)

    def _values(self, labels, probs):
        return tf.cast(tf.equal(tf.argmax(probs, -1, output_type=tf.int32), labels), tf.float32)
