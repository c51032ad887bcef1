"""Top-k retrieval metrics over the whole catalogue, streamed in chunks of candidates.

Tie rule (pessimistic): the rank of a query's true candidate ``t`` is the number of other
candidates whose score is greater than *or equal to* ``s_t``:

    rank = #{j != t : s_j >= s_t},        hit@k  <=>  rank < k.

So a model that scores everything alike gets no hits (below ``k = N``), instead of the luck
of an index order. Scores are ``query . candidate`` computed by the same matmul for every
candidate (the true one included), so the comparison is exact. The catalogue is scored
``chunk_size`` candidates at a time: memory is ``O(batch * chunk_size)``, never
``O(batch * N)``. Written with ``keras.ops``.

Fail loud: a true id outside ``[0, N)`` raises naming it (eagerly / in graphs); under XLA its
rank is NaN, and so is the rank of a query whose scores hold a NaN.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from losszoo.contract import check_item_ids, check_number, check_shape, nan_where


def candidate_ranks(query_embeddings, true_ids, candidates, chunk_size: int = 65536):
    """Pessimistic rank of each query's true candidate among all ``N`` candidates.

    Args:
      query_embeddings: ``[B, D]`` float.
      true_ids: ``[B]`` integer ids; row ``i`` of ``candidates`` is the candidate with id ``i``.
      candidates: ``[N, D]`` embeddings of the whole catalogue (``N`` static).
      chunk_size: candidates scored at a time.

    Returns:
      float32 ``[B]``: ``#{j != t : s_j >= s_t}`` (NaN for invalid ids or NaN scores).

    Example:
      >>> import losszoo.retrieval
      >>> table = np.eye(4, dtype="float32")                 # 4 candidates, id = row
      >>> queries = np.array([[1, 0, 0, 0], [0, 1, 1, 0]], "float32")
      >>> ranks = losszoo.retrieval.candidate_ranks(queries, [0, 2], table)
      >>> keras.ops.convert_to_numpy(ranks)                  # a tie: rank 1
      array([0., 1.], dtype=float32)
    """
    chunk_size = check_number(chunk_size, "chunk_size", low=1, integer=True)
    q = ops.convert_to_tensor(query_embeddings)
    c = ops.convert_to_tensor(candidates)
    n = c.shape[0]
    if n is None:
        raise ValueError("`candidates` must have a static number of rows (the catalogue size).")
    c = check_shape(c, (n, q.shape[-1]), "candidates", " ([N, D], D of the queries)")
    true, bad = check_item_ids(true_ids, "true_ids", n)
    true = check_shape(true, (ops.shape(q)[0],), "true_ids", " ([B], one per query)")
    starts = range(0, n, chunk_size)

    def scores(start):
        stop = min(start + chunk_size, n)
        s = ops.matmul(q, ops.transpose(c[start:stop]))
        is_true = ops.equal(ops.arange(start, stop, dtype="int32")[None, :], true[:, None])
        return s, is_true

    true_score = 0.0
    for start in starts:  # pass 1: the true candidate's score, from the same matmul
        s, is_true = scores(start)
        true_score = true_score + ops.sum(ops.where(is_true, s, 0.0), axis=1)
    rank = 0.0
    row_nan = ops.isnan(true_score)
    for start in starts:  # pass 2: how many others score at least as high
        s, is_true = scores(start)
        ahead = ops.logical_and(ops.greater_equal(s, true_score[:, None]), ops.logical_not(is_true))
        rank = rank + ops.sum(ops.cast(ahead, "float32"), axis=1)
        row_nan = ops.logical_or(row_nan, ops.any(ops.isnan(s), axis=1))
    return nan_where(ops.logical_or(bad, row_nan), ops.cast(rank, "float32"))


@keras.saving.register_keras_serializable(package="losszoo")
class CatalogueTopK(keras.metrics.Metric):
    """Share of queries whose true candidate ranks in the top ``k`` of the whole catalogue.

    Streams over the catalogue (:func:`candidate_ranks`, pessimistic ties: an equal score
    ranks ahead of the true candidate) and over batches (weighted running means). The result
    is a dict ``{"<name>_<k>": hit rate}`` for each ``k`` in ``ks``; Keras shows each entry in
    ``fit`` / ``evaluate`` logs. A NaN rank (invalid id under XLA, NaN scores) makes the
    result NaN.

    Args:
      candidates: the catalogue embeddings ``[N, D]`` (row ``i`` = id ``i``), or a callable
        with no arguments returning them (read at every update, so it sees the current
        weights, e.g. ``lambda: model.items.embeddings``). Not part of the config: set it
        again after ``from_config``.
      ks: cut-offs, positive ints.
      chunk_size: candidates scored at a time.
      name: metric name, the prefix of the result keys.
      dtype: dtype of the state.

    Example:
      >>> import losszoo.retrieval
      >>> table = np.eye(4, dtype="float32")
      >>> metric = losszoo.retrieval.CatalogueTopK(table, ks=(1, 2))
      >>> metric.update_state(np.array([[1, 0, 0, 0], [0, 1, 1, 0]], "float32"), [0, 2])
      >>> {k: float(v) for k, v in metric.result().items()}
      {'top_1': 0.5, 'top_2': 1.0}
    """

    def __init__(
        self,
        candidates=None,
        ks=(1, 5, 10, 50, 100),
        chunk_size: int = 65536,
        name: str = "top",
        dtype=None,
    ):
        super().__init__(name=name, dtype=dtype)
        self.ks = tuple(check_number(k, "ks", low=1, integer=True) for k in ks)
        if not self.ks:
            raise ValueError("`ks` must name at least one cut-off.")
        self.chunk_size = check_number(chunk_size, "chunk_size", low=1, integer=True)
        self.candidates = candidates
        self.hits = self.add_variable((len(self.ks),), initializer="zeros", name="hits")
        self.count = self.add_variable((), initializer="zeros", name="count")

    def update_state(self, query_embeddings, true_ids, sample_weight=None):
        if self.candidates is None:
            raise ValueError(f"{self.name}: set `candidates` before updating the metric.")
        table = self.candidates() if callable(self.candidates) else self.candidates
        rank = candidate_ranks(query_embeddings, true_ids, table, self.chunk_size)
        ks = ops.convert_to_tensor(np.asarray(self.ks, np.float32))
        hit = ops.cast(ops.less(rank[:, None], ks[None, :]), "float32")
        hit = nan_where(ops.isnan(rank)[:, None], hit)
        w = ops.ones_like(rank) if sample_weight is None else ops.cast(sample_weight, "float32")
        w = ops.reshape(w, (-1,))
        self.hits.assign_add(ops.cast(ops.sum(hit * w[:, None], axis=0), self.hits.dtype))
        self.count.assign_add(ops.cast(ops.sum(w), self.count.dtype))

    def result(self):
        rates = ops.divide_no_nan(self.hits, self.count)
        return {f"{self.name}_{k}": rates[i] for i, k in enumerate(self.ks)}

    def get_config(self):
        return {**super().get_config(), "ks": list(self.ks), "chunk_size": self.chunk_size}
