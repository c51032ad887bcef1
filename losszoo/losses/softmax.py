"""Keras loss: softmax cross-entropy on logits, registered so the baseline is one string away."""

from __future__ import annotations

from losszoo import ops
from losszoo.contract import check_bool
from losszoo.losses._base_loss import OpLoss
from losszoo.registry import register


@register(
    "softmax_cross_entropy",
    kind="loss",
    aliases=("softmax_ce",),
    description="Softmax cross-entropy on logits (ids or dense targets); -inf = not a candidate",
)
class SoftmaxCrossEntropyLoss(OpLoss):
    """Softmax cross-entropy on logits, with ``-inf`` read as "not a candidate".

    For logits ``z`` and a target distribution ``q``:

        L(z; q) = -sum_{j: q_j > 0} q_j log softmax(z)_j,     dL/dz = softmax(z) - q.

    The baseline of every losszoo loss, under the same target rules: integer class ids
    ``[B]`` or ``[B, 1]`` (as ``SparseCategoricalCrossentropy``) or dense non-negative
    targets ``[B, K]`` (as ``CategoricalCrossentropy``), dense rows divided by their sum when
    ``normalize_labels`` is true; a row without any target gets loss 0. ``K`` may be dynamic.
    Unlike Keras' ``CategoricalCrossentropy(from_logits=True)``, a ``-inf`` logit of a
    non-target class gives a finite loss (its ``0 * log 0`` term is dropped), so masked
    scores (accidental hits in retrieval) work. Computed in float32 (or float64) even under
    a mixed-precision policy. The op: :func:`losszoo.ops.softmax_cross_entropy`.

    Bad input (fail-loud contract): ids outside ``[0, K)``, NaN or non-whole ids, NaN/inf or
    negative dense targets and NaN logits raise naming ``y_true`` or ``y_pred`` eagerly and in
    graphs (skipped with ``losszoo.set_validation(False)``). Under XLA those rows' loss is NaN,
    never a clamped id. A row holding a ``+inf`` logit, or only ``-inf``, has a NaN loss in
    every mode; a target class masked with ``-inf`` gives ``+inf``.

    Args:
      normalize_labels: divide dense targets by their row sum (a no-op for one-hot/soft).
      reduction: Keras reduction, e.g. ``"sum_over_batch_size"`` (default), ``"sum"``.
      name: loss name.
      dtype: dtype of the loss computation (default: float32 via ``keras.config.floatx``).

    Example:
      >>> loss = losszoo.get("softmax_cross_entropy")
      >>> round(float(loss([0], [[0.0, 0.0, float("-inf")]])), 4)   # log 2
      0.6931
    """

    def __init__(
        self,
        normalize_labels: bool = True,
        reduction="sum_over_batch_size",
        name: str = "softmax_cross_entropy",
        dtype=None,
    ):
        normalize_labels = check_bool(normalize_labels, "normalize_labels")
        super().__init__(
            ops.softmax_cross_entropy, reduction, name, dtype, normalize_labels=normalize_labels
        )
