"""Keras loss: the Rankmax loss (Kong et al., NeurIPS 2020)."""

from __future__ import annotations

from losszoo import ops
from losszoo.contract import check_choice
from losszoo.losses._base_loss import OpLoss
from losszoo.registry import register

# The loss' label formats and the op's reading of each: "auto" is the op's shape-only rule.
_LABEL_FORMATS = {"auto": "keras", "ids": "ids", "dense": "dense"}


@register(
    "rankmax",
    kind="loss",
    aliases=("rankmax_loss",),
    description="Rankmax loss (Kong et al. 2020): adaptive-alpha projection onto the (n,k)-simplex",
)
class RankmaxLoss(OpLoss):
    """Rankmax loss on scores: cross-entropy of the adaptive (n, k)-simplex projection.

    For scores ``z`` over n candidates and a positive ``y``, with threshold
    ``mu_y = min(z_y, z_[k]) - margin`` and ``alpha_y`` chosen so that
    ``sum_i min(1, alpha_y (z_i - mu_y)_+) = k``:

        loss(z, y) = -log min(1, alpha_y (z_y - mu_y)),

    summed over the positives of each example. For ``k = 1`` (the default) this is
    ``log sum_i (z_i - z_y + margin)_+ - log margin``: zero once ``y`` beats every other
    score by the margin, and O(n) without sorting. Train on raw scores; at inference rank
    by the scores (every such projection preserves their order). Logits attached to
    ``y_pred`` (a model ending in Keras' softmax, see :func:`losszoo._logits.attached_logits`)
    are used instead of the probabilities.

    Targets (``label_format="auto"``, the rule Keras users expect and the op's
    ``label_format="keras"``; Keras 3 casts ``y_true`` to float, so the rule looks at shapes,
    never at the dtype): ids ``[B]`` or ``[B, 1]`` (as
    ``SparseCategoricalCrossentropy``); padded ids ``[B, M]`` when both ``M`` and ``n`` are
    static and ``M != n`` (``-1`` pads; several positives per example); otherwise ``[B, n]``
    (also when a size is unknown, e.g. TFRS's ``tf.eye(B)`` in-batch labels) is dense
    non-negative weights (one-hot, multi-hot, identity): each positive's loss is multiplied by
    its weight. So integer and float one-hot labels give the same loss. Force a reading with
    ``label_format="ids"`` or ``"dense"`` (e.g. ``[B, n]`` padded id lists). A
    ``tf.RaggedTensor`` (positive ids per row, natural for retrieval) is read as padded ids; a
    ``tf.SparseTensor`` is densified (absent entries: -1 padding for ids, 0 for dense
    weights). Examples without a positive get loss 0. A rank-1 ``y_pred`` is one example
    (``y_true`` a scalar id); a rank-0 one raises ``ValueError``. ``n`` may be dynamic
    (in-batch retrieval with an unknown batch size). Computed in float32 (or float64) even
    under a mixed-precision policy. Use :func:`losszoo.tf_keras_loss` ("rankmax") for
    tf_keras / TensorFlow Recommenders.

    Bad input (fail-loud contract): ids outside ``[0, n)`` (other than -1 padding), NaN or
    non-whole ids, negative / NaN / inf dense targets and NaN scores raise naming ``y_true``
    or ``y_pred`` (eagerly and in graphs; skipped with ``losszoo.set_validation(False)``).
    Under XLA: assertions vanish and those examples' loss is NaN (never a clamped id). A
    positive masked with a ``-inf`` score gives loss ``+inf``. ``sample_weight`` that does not
    fit ``y_pred``'s batch shape raises ``ValueError`` naming it.

    Args:
      k: the projection's mass (``1 <= k < n``); the paper's k for top-k retrieval. k = 1 is
        the O(n) closed form; larger k costs one ``top_k``.
      margin: ``eta > 0``, the margin in the threshold (the paper uses 1). Scores are not
        rescaled, so the margin sets the scale the model learns in.
      max_positives: dense targets only: batches whose rows have at most this many positives
        take the fast O(M n) path; other batches use an exact O(n log n) sort per row. The
        result is the same either way. ``None`` always sorts.
      label_format: ``"auto"`` (default), ``"ids"`` or ``"dense"`` (see above).
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
        label_format: str = "auto",
        reduction="sum_over_batch_size",
        name: str = "rankmax_loss",
        dtype=None,
    ):
        k, margin, max_positives = ops.check_rankmax_arguments(k, margin, max_positives)
        label_format = check_choice(label_format, "label_format", tuple(_LABEL_FORMATS))
        config = dict(k=k, margin=margin, max_positives=max_positives, label_format=label_format)
        super().__init__(ops.rankmax_loss, reduction, name, dtype, **config)

    @property
    def op_config(self):
        return {**self._config, "label_format": _LABEL_FORMATS[self.label_format]}
