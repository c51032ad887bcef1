"""Keras loss: the Rankmax loss (Kong et al., NeurIPS 2020)."""

from __future__ import annotations

import keras
import tensorflow as tf

from losszoo import ops
from losszoo.losses._targets import class_ids_and_invalid, is_sparse
from losszoo.ops._common import nan_where, to_compute_dtype
from losszoo.registry import register


@register(
    "rankmax",
    kind="loss",
    aliases=("rankmax_loss",),
    description="Rankmax loss (Kong et al. 2020): adaptive-alpha projection onto the (n,k)-simplex",
)
class RankmaxLoss(keras.losses.Loss):
    """Rankmax loss on scores: cross-entropy of the adaptive (n, k)-simplex projection.

    For scores ``z`` over n candidates and a positive ``y``, with threshold
    ``mu_y = min(z_y, z_[k]) - margin`` and ``alpha_y`` chosen so that
    ``sum_i min(1, alpha_y (z_i - mu_y)_+) = k``:

        loss(z, y) = -log min(1, alpha_y (z_y - mu_y)),

    summed over the positives of each example. For ``k = 1`` (the default) this is
    ``log sum_i (z_i - z_y + margin)_+ - log margin``: zero once ``y`` beats every other
    score by the margin, and O(n) without sorting. Train on raw scores; at inference rank
    by the scores (every such projection preserves their order).

    Targets: integer ids ``[B]`` or ``[B, 1]`` (as ``SparseCategoricalCrossentropy``), padded
    ids ``[B, M]`` with ``M != n`` (``-1`` pads; several positives per example), or dense
    non-negative targets ``[B, n]`` (multi-hot, or weights such as the identity matrix that
    ``tfrs.tasks.Retrieval`` passes): each positive's loss is multiplied by its target
    value. Examples without a positive get loss 0. Computed in float32 (or float64) even
    under a mixed-precision policy. Use :func:`losszoo.tf_keras_loss` ("rankmax") for
    tf_keras / TensorFlow Recommenders.

    Args:
      k: the projection's mass (``1 <= k < n``); the paper's k for top-k retrieval. k = 1 is
        the O(n) closed form; larger k costs one ``top_k``.
      margin: ``eta > 0``, the margin in the threshold (the paper uses 1). Scores are not
        rescaled, so the margin sets the scale the model learns in.
      max_positives: dense targets only: batches whose rows have at most this many positives
        take the fast O(M n) path; other batches use an exact O(n log n) sort per row. The
        result is the same either way. ``None`` always sorts.
      reduction: Keras reduction (default ``"sum_over_batch_size"``).
      name: loss name.
      dtype: dtype of the loss computation (default float32).

    Example:
      >>> model.compile(optimizer="adam", loss="rankmax")   # after `import losszoo`
      >>> loss = losszoo.losses.RankmaxLoss(k=1)
      >>> round(float(loss([0], [[2.0, 1.5, -3.0]])), 4)   # log(1 + 0.5)
      0.4055
    """

    def __init__(
        self,
        k: int = 1,
        margin: float = 1.0,
        max_positives: int | None = 1,
        reduction="sum_over_batch_size",
        name: str = "rankmax_loss",
        dtype=None,
    ):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        ops._rankmax._check_k_margin(k, margin, None)
        if max_positives is not None:
            ops._rankmax._check_max_positives(max_positives, float("inf"))
        self.k = int(k)
        self.margin = float(margin)
        self.max_positives = None if max_positives is None else int(max_positives)

    def call(self, y_true, y_pred):
        y_pred, _ = to_compute_dtype(y_pred, "y_pred")
        y_true = tf.convert_to_tensor(y_true)
        n = y_pred.shape[-1]
        if is_sparse(y_true, y_pred):
            labels, invalid = class_ids_and_invalid(y_true, y_pred)
            loss = ops.rankmax_loss(labels, y_pred, k=self.k, margin=self.margin)
            return nan_where(invalid, loss)
        elif y_true.shape.rank == y_pred.shape.rank and y_true.shape[-1] != n:
            labels = y_true  # padded ids [B, M]
            if labels.dtype.is_floating:
                labels = tf.round(labels)
            labels = tf.cast(labels, tf.int32)
        else:
            labels = tf.cast(y_true, y_pred.dtype)
        return ops.rankmax_loss(labels, y_pred, k=self.k, margin=self.margin,
                                max_positives=self.max_positives)

    def get_config(self):
        return {
            **super().get_config(),
            "k": self.k,
            "margin": self.margin,
            "max_positives": self.max_positives,
        }
