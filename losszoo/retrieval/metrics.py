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

from losszoo._backend import in_xla_context
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


def _is_dataset(x) -> bool:
    """A ``tf.data.Dataset`` (told by its interface: no TensorFlow import here)."""
    return hasattr(x, "element_spec") and callable(getattr(x, "reduce", None))


def _is_stream(x) -> bool:
    """A dataset, or a list / tuple of batches (arrays of rank 2 or ``(ids, embeddings)``)."""
    if _is_dataset(x):
        return True
    if not isinstance(x, (list, tuple)) or not x:
        return False
    return isinstance(x[0], tuple) or len(getattr(x[0], "shape", ())) == 2


def _fold(stream, initial, step):
    """``step(...step(initial, batch_0)..., batch_n)`` over a list or a ``tf.data.Dataset``."""
    if _is_dataset(stream):
        if in_xla_context():
            raise ValueError(
                "A tf.data.Dataset of candidates cannot be read under XLA (jit_compile=True): "
                "compile with jit_compile=False (or 'auto'), or pass a table or a list of "
                "batches."
            )
        return stream.reduce(initial, step)
    state = initial
    for batch in stream:
        state = step(state, batch)
    return state


def streamed_ranks(query_embeddings, candidates, true_ids=None, true_embeddings=None):
    """Pessimistic rank of each query's true candidate in a stream of candidate batches.

    Args:
      query_embeddings: ``[B, D]`` float.
      candidates: a list / tuple (or ``tf.data.Dataset``) of batches, each ``[n, D]``
        embeddings or an ``(ids [n], embeddings [n, D])`` pair; a batch without ids holds
        the positions that follow the previous batch's.
      true_ids: ``[B]`` ids of the true candidates: ``rank = #{j : id_j != t, s_j >= s_t}``
        with ``s_t`` the catalogue's own score of id ``t`` (NaN if ``t`` is found other
        than once).
      true_embeddings: ``[B, D]``, used without ``true_ids``: ``s_t = q . t`` and
        ``rank = #{j : s_j > s_t} + max(#{j : s_j = s_t} - 1, 0)`` (one tie is the true
        candidate itself), where a score within float32 rounding of ``s_t``
        (``2 D eps sum_d |q_d t_d|``) counts as equal.

    Returns:
      float32 ``[B]`` (NaN for NaN scores and, with ids, for ids not found once).

    Example:
      >>> import losszoo.retrieval
      >>> batches = [np.eye(4, dtype="float32")[:3], np.eye(4, dtype="float32")[3:]]
      >>> queries = np.array([[1, 0, 0, 0], [0, 1, 1, 0]], "float32")
      >>> ranks = losszoo.retrieval.streamed_ranks(queries, batches, true_ids=[0, 2])
      >>> keras.ops.convert_to_numpy(ranks)                  # as candidate_ranks
      array([0., 1.], dtype=float32)
    """
    q = ops.convert_to_tensor(query_embeddings)
    q = check_shape(q, (None, None), "query_embeddings", " ([B, D])")
    zeros = ops.zeros((ops.shape(q)[0],), "float32")
    no_nan = ops.zeros((ops.shape(q)[0],), "bool")
    start = ops.convert_to_tensor(0, "int32")

    def scores(offset, batch):
        ids, emb = batch if isinstance(batch, tuple) else (None, batch)
        emb = ops.cast(ops.convert_to_tensor(emb), q.dtype)
        size = ops.shape(emb)[0]
        if ids is None:
            ids = offset + ops.arange(size, dtype="int32")
        s = ops.cast(ops.matmul(q, ops.transpose(emb)), "float32")
        return offset + ops.cast(size, "int32"), ops.cast(ids, "int32"), s

    if true_ids is None:
        if true_embeddings is None:
            raise ValueError("Give `true_ids` or `true_embeddings` to rank the true candidates.")
        t = ops.cast(ops.convert_to_tensor(true_embeddings), q.dtype)
        t = check_shape(t, (ops.shape(q)[0], q.shape[-1]), "true_embeddings", " ([B, D])")
        true_score = ops.cast(ops.sum(q * t, axis=1), "float32")
        # Two float32 dot products of the same vectors differ by at most this (summation
        # order): within it, a score ties with s_t.
        eps = float(np.finfo(np.float32).eps)
        size = ops.cast(ops.shape(q)[1], "float32")
        tol = 2.0 * size * eps * ops.cast(ops.sum(ops.abs(q * t), axis=1), "float32")

        def count(state, batch):
            offset, above, ties, nan = state
            offset, _, s = scores(offset, batch)
            gap = s - true_score[:, None]
            above = above + ops.sum(ops.cast(gap > tol[:, None], "float32"), axis=1)
            tie = ops.less_equal(ops.abs(gap), tol[:, None])
            ties = ties + ops.sum(ops.cast(tie, "float32"), axis=1)
            return offset, above, ties, ops.logical_or(nan, ops.any(ops.isnan(s), axis=1))

        _, above, ties, nan = _fold(candidates, (start, zeros, zeros, no_nan), count)
        rank = above + ops.maximum(ties - 1.0, 0.0)
        return nan_where(ops.logical_or(nan, ops.isnan(true_score)), rank)

    true, bad = check_item_ids(true_ids, "true_ids")
    true = check_shape(true, (ops.shape(q)[0],), "true_ids", " ([B], one per query)")

    def find(state, batch):  # pass 1: the catalogue's own score of each true id
        offset, score, found = state
        offset, ids, s = scores(offset, batch)
        is_true = ops.equal(ids[None, :], true[:, None])
        score = score + ops.sum(ops.where(is_true, s, 0.0), axis=1)
        return offset, score, found + ops.sum(ops.cast(is_true, "float32"), axis=1)

    _, true_score, found = _fold(candidates, (start, zeros, zeros), find)

    def count(state, batch):  # pass 2: how many others score at least as high
        offset, rank, nan = state
        offset, ids, s = scores(offset, batch)
        others = ops.not_equal(ids[None, :], true[:, None])
        ahead = ops.logical_and(ops.greater_equal(s, true_score[:, None]), others)
        rank = rank + ops.sum(ops.cast(ahead, "float32"), axis=1)
        return offset, rank, ops.logical_or(nan, ops.any(ops.isnan(s), axis=1))

    _, rank, nan = _fold(candidates, (start, zeros, no_nan), count)
    invalid = ops.logical_or(ops.logical_or(bad, nan), ops.not_equal(found, 1.0))
    return nan_where(ops.logical_or(invalid, ops.isnan(true_score)), rank)


@keras.saving.register_keras_serializable(package="losszoo")
class CatalogueTopK(keras.metrics.Metric):
    """Share of queries whose true candidate ranks in the top ``k`` of the whole catalogue.

    Streams over the catalogue (:func:`candidate_ranks`, pessimistic ties: an equal score
    ranks ahead of the true candidate) and over batches (weighted running means). The result
    is a dict ``{"<name>_<k>": hit rate}`` for each ``k`` in ``ks``; Keras shows each entry in
    ``fit`` / ``evaluate`` logs. A NaN rank (invalid id under XLA, NaN scores) makes the
    result NaN.

    The catalogue (``candidates``) is a table, a stream of batches, or a callable returning
    either, read at every update (so it sees the current weights):

    - a table ``[N, D]`` of embeddings, row ``i`` = id ``i`` (e.g.
      ``lambda: model.items.embeddings``);
    - a list or tuple of batches, each ``[n, D]`` embeddings or an ``(ids [n], embeddings
      [n, D])`` pair (e.g. ``lambda: [model.items(b) for b in id_batches]``); a batch
      without ids holds the ids that follow the previous batch's (positions in the stream);
    - on TensorFlow, a ``tf.data.Dataset`` of such batches, as TFRS' ``FactorizedTopK``
      takes (``movies.batch(128).map(movie_model)``): read with ``Dataset.reduce`` in
      graphs, not under XLA (the task tells Keras, whose ``jit_compile="auto"`` then leaves
      XLA off).

    Without ``true_ids`` (a task called without ``candidate_ids``, as in TFRS' tutorial) the
    true candidate is known only by its score ``s_t = q . t`` from ``true_embeddings``:
    ``rank = #{j : s_j > s_t} + max(#{j : s_j = s_t} - 1, 0)``, with scores within float32
    rounding of ``s_t`` counted as equal: the pessimistic rank when the catalogue holds the
    true candidate (one tie is itself); a model scoring everything alike still gets no hits
    below ``N``. With ids on a stream, an id
    found other than once in the catalogue makes that query's rank NaN.

    Args:
      candidates: the catalogue (above). Not part of the config: set it again after
        ``from_config``.
      ks: cut-offs, positive ints.
      chunk_size: candidates scored at a time (tables; a stream is scored batch by batch).
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

    @property
    def reads_a_dataset(self) -> bool:
        """Whether ``candidates`` is a ``tf.data.Dataset`` (read in TensorFlow graphs, not
        under XLA: a task holding this metric tells Keras so through ``supports_jit``)."""
        return _is_dataset(self.candidates)

    def update_state(
        self, query_embeddings, true_ids=None, sample_weight=None, true_embeddings=None
    ):
        """Add a batch of queries.

        Args:
          query_embeddings: ``[B, D]``.
          true_ids: ``[B]`` ids of the true candidates (ids: rows of a table, or the ids of
            a candidate stream, or positions in it); ``None`` to find them by score.
          sample_weight: ``[B]`` query weights.
          true_embeddings: ``[B, D]`` embeddings of the true candidates (needed without
            ``true_ids``).
        """
        if self.candidates is None:
            raise ValueError(f"{self.name}: set `candidates` before updating the metric.")
        candidates = self.candidates
        if callable(candidates) and not _is_dataset(candidates):
            candidates = candidates()
        if true_ids is not None and not _is_stream(candidates):
            rank = candidate_ranks(query_embeddings, true_ids, candidates, self.chunk_size)
        else:
            stream = candidates if _is_stream(candidates) else [candidates]
            rank = streamed_ranks(query_embeddings, stream, true_ids, true_embeddings)
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
