"""Retrieval against the whole catalogue: the exact loss over every item, never sampled.

:class:`FullCatalogueRetrieval` is the task-level layer over :func:`losszoo.ops.catalogue_loss`
(issue 34): instead of in-batch or sampled negatives, every query is scored against every row
of the candidate table, and the exact softmax cross-entropy, sparsemax or Rankmax (k = 1) loss
is computed chunk by chunk, so the ``[batch, catalogue]`` scores are never held in memory.
"""

from __future__ import annotations

import keras
from keras import ops

from losszoo.contract import check_choice, check_number
from losszoo.ops import catalogue_loss

# Registered loss names (and the op's own) -> catalogue_loss's `loss`.
LOSS_NAMES = {
    "softmax_cross_entropy": "softmax",
    "softmax_ce": "softmax",
    "softmax": "softmax",
    "sparsemax": "sparsemax",
    "sparsemax_loss": "sparsemax",
    "rankmax": "rankmax",
    "rankmax_loss": "rankmax",
}


@keras.saving.register_keras_serializable(package="losszoo")
class FullCatalogueRetrieval(keras.layers.Layer):
    """Retrieval task whose negatives are the whole catalogue (exact, streamed).

    For queries ``u_i``, the candidate table ``V`` (``[N, D]``, e.g. the item tower's
    ``Embedding.embeddings``) and positives ``y_i``, the loss is
    ``sum_i w_i l(z_i, y_i)`` (``reduction="sum"``, as TFRS) or its mean over the batch
    (``"mean"``), where ``z_ij = u_i . v_j / T`` over all ``N`` items (``-inf`` for the ids
    ``exclude`` lists for row ``i``) and ``l`` is softmax cross-entropy, sparsemax or Rankmax
    (k = 1): :func:`losszoo.ops.catalogue_loss`. No sampling, so no logQ correction and no
    accidental hits. Memory grows with ``batch * chunk_size``, not ``batch * N``.

    Args:
      loss: ``"softmax_cross_entropy"`` (default), ``"sparsemax"`` or ``"rankmax"`` (the
        registered names; ``"softmax"`` too).
      temperature: ``T > 0``; ``None`` for 1.
      margin: Rankmax's margin.
      chunk_size: items per chunk (a multiple of 256); ``None``: the op's default (8192, or
        32768 where programs run on a GPU).
      reduction: ``"sum"`` (default) or ``"mean"`` over the batch.
      metrics: :class:`~losszoo.retrieval.metrics.CatalogueTopK` metric(s) updated with the
        queries and the positive ids when ``compute_metrics`` (not in the config).
      name: layer name.

    Example:
      >>> from losszoo.retrieval.full_catalogue import FullCatalogueRetrieval
      >>> task = FullCatalogueRetrieval(loss="rankmax")
      >>> queries = np.array([[1.0, 0.0]], "float32")
      >>> items = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], "float32")
      >>> round(float(task(queries, items, positive_ids=[1])), 4)   # log 4
      1.3863

      In a two-tower model's ``compute_loss``::

          return self.task(self.users(x["user"]), self.items.embeddings, x["item"])
    """

    def __init__(
        self,
        loss="softmax_cross_entropy",
        temperature: float | None = None,
        margin: float = 1.0,
        chunk_size: int | None = None,
        reduction: str = "sum",
        metrics=None,
        name: str | None = None,
        **kwargs,
    ):
        super().__init__(name=name, **kwargs)
        self.loss_name = check_choice(loss, "loss", tuple(LOSS_NAMES))
        self.temperature = check_number(
            temperature, "temperature", low=0, low_open=True, allow_none=True, tensor_ok=False
        )
        self.margin = check_number(margin, "margin", low=0, low_open=True, tensor_ok=False)
        self.chunk_size = check_number(
            chunk_size, "chunk_size", low=256, integer=True, allow_none=True
        )
        self.reduction = check_choice(reduction, "reduction", ("sum", "mean"))
        if metrics is None:
            metrics = []
        self.task_metrics = list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]
        self.built = True

    def call(
        self,
        query_embeddings,
        candidate_table,
        positive_ids,
        sample_weight=None,
        exclude=None,
        compute_metrics: bool = True,
    ):
        """The loss of one batch (a scalar); updates ``metrics`` when ``compute_metrics``.

        Args:
          query_embeddings: ``[B, D]``.
          candidate_table: ``[N, D]``, every item's embedding (static ``N``).
          positive_ids: ``[B]`` integer ids in ``[0, N)``.
          sample_weight: ``[B]`` per-query weights.
          exclude: ``[B, M]`` ids to leave out of each row (``-1`` pads); not the positive.
          compute_metrics: update ``metrics``.
        """
        per_row = catalogue_loss(
            query_embeddings,
            candidate_table,
            positive_ids,
            loss=LOSS_NAMES[self.loss_name],
            temperature=1.0 if self.temperature is None else self.temperature,
            exclude=exclude,
            margin=self.margin,
            chunk_size=self.chunk_size,
        )
        if sample_weight is not None:
            per_row = per_row * ops.cast(ops.reshape(sample_weight, (-1,)), per_row.dtype)
        loss = ops.sum(per_row) if self.reduction == "sum" else ops.mean(per_row)
        if compute_metrics:
            for metric in self.task_metrics:
                metric.update_state(query_embeddings, positive_ids, sample_weight=sample_weight)
        return loss

    def compute_output_shape(self, *args, **kwargs):
        return ()

    def get_config(self):
        return {
            **super().get_config(),
            "loss": self.loss_name,
            "temperature": self.temperature,
            "margin": self.margin,
            "chunk_size": self.chunk_size,
            "reduction": self.reduction,
        }
