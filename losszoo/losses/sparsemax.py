"""Keras loss: the sparsemax loss."""

from __future__ import annotations

from losszoo.contract import check_bool
from losszoo.losses._base_loss import OpLoss
from losszoo.ops import sparsemax_loss
from losszoo.registry import register


@register(
    "sparsemax",
    kind="loss",
    aliases=("sparsemax_loss",),
    description="Sparsemax loss (Martins & Astudillo 2016): gradient sparsemax(z) - q",
)
class SparsemaxLoss(OpLoss):
    """Sparsemax loss on logits, the sparse analogue of softmax cross-entropy.

    For logits ``z``, ``p = sparsemax(z)`` with threshold ``tau``, and a target
    distribution ``q``:

        L(z; q) = 1/2 ||p||^2 + 1/2 ||q||^2 - <z - tau, q>,     dL/dz = p - q.

    ``L >= 0``, convex in ``z``, and 0 exactly when ``p = q`` (for a one-hot target: the
    true class leads every other logit by at least 1). Pair it with a
    :class:`losszoo.heads.Sparsemax` head at inference; train on the raw logits.

    Targets are read the way Keras users expect: integer class ids of shape ``[B]`` or
    ``[B, 1]`` as in ``SparseCategoricalCrossentropy``, or dense targets ``[B, K]`` (one-hot,
    soft, or multi-hot, also as a ``tf.SparseTensor``) as in ``CategoricalCrossentropy``.
    Dense rows are divided by their sum when ``normalize_labels`` is true, so a multi-hot row
    means "uniform over these classes"; a row with no target at all gets loss 0. With
    ``normalize_labels=False`` the other rows must already sum to 1 (see
    :func:`losszoo.ops.sparsemax_loss`). A ``tf.RaggedTensor`` raises ``TypeError``.
    ``sample_weight`` must match the batch shape of ``y_pred`` (or broadcast to it as Keras
    allows); otherwise a ``ValueError`` names it. ``K`` may be dynamic (in-batch
    retrieval with ids and an unknown batch size). The loss is computed in float32 (or
    float64) even under a mixed-precision policy.

    Bad input (fail-loud contract): class ids outside ``[0, K)``, NaN or non-whole ids,
    NaN/inf or negative dense targets (or, unnormalised, rows not summing to 1) raise naming
    ``y_true`` eagerly and in graphs (skipped
    with ``losszoo.set_validation(False)``). Under XLA: those rows' loss (and gradient) is
    NaN, never a clamped id. A row of scores holding a NaN or ``+inf`` (or only ``-inf``) has
    a NaN loss in every mode; a true class masked with ``-inf`` gives ``+inf``.

    The loss is defined on scores. ``y_pred`` is taken as logits, except when it carries
    attached logits (:func:`losszoo._logits.attached_logits`): the output of a
    :class:`losszoo.heads.Sparsemax` head, or of Keras' own softmax or sigmoid (e.g.
    ``Dense(K, activation="softmax")``, which attaches ``_keras_logits`` as Keras'
    cross-entropies expect). The loss then uses those logits, so a model ending in such a head
    can be compiled with ``loss="sparsemax"`` and still predicts probabilities.

    Args:
      from_logits: ``None`` (default): use the logits attached to ``y_pred`` when present,
        else treat ``y_pred`` as logits. ``True``: same. ``False``: require attached logits
        and raise if ``y_pred`` carries none (guards against silently treating probabilities
        as scores).
      normalize_labels: divide dense targets by their row sum (a no-op for one-hot/soft).
      reduction: Keras reduction, e.g. ``"sum_over_batch_size"`` (default), ``"sum"``,
        ``"mean"`` or ``None``.
      name: loss name.
      dtype: dtype of the loss computation (default: float32 via ``keras.config.floatx``).

    Example:
      >>> model.compile(optimizer="adam", loss="sparsemax")       # after `import losszoo`
      >>> loss = losszoo.losses.SparsemaxLoss()
      >>> float(loss([1], [[0.0, 2.0, 0.0]]))
      0.0
    """

    def __init__(
        self,
        from_logits: bool | None = None,
        normalize_labels: bool = True,
        reduction="sum_over_batch_size",
        name: str = "sparsemax_loss",
        dtype=None,
    ):
        if from_logits is not None and not isinstance(from_logits, bool):
            raise TypeError(f"`from_logits` must be None or a bool, got {from_logits!r}.")
        normalize_labels = check_bool(normalize_labels, "normalize_labels")
        config = dict(from_logits=from_logits, normalize_labels=normalize_labels)
        super().__init__(sparsemax_loss, reduction, name, dtype, **config)
