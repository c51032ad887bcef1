"""The retrieval task's pieces as plain ``keras.ops`` functions, usable one by one.

Each takes and returns tensors (any backend) and is what :class:`losszoo.retrieval.Retrieval`
composes, in this order: :func:`in_batch_logits`, :func:`logq_correction`,
:func:`remove_accidental_hits`, :func:`sampled_logits` (extra columns), then
:func:`hard_negative_mining`. ``-inf`` marks a column that is not a candidate of its row (every
losszoo loss reads it so).

Fail loud: tensor arguments are checked with :mod:`losszoo.contract`'s rules (an error naming
the argument eagerly and in TensorFlow graphs; NaN in the affected columns under XLA /
``jax.jit``); hyper-parameters with :func:`~losszoo.contract.check_number`.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from losszoo.contract import (
    SAMPLING_PROBABILITY,
    check_number,
    check_shape,
    nan_where,
)

__all__ = [
    "hard_negative_mining",
    "in_batch_logits",
    "logq_correction",
    "remove_accidental_hits",
    "sampled_logits",
]


def _scale(temperature):
    temperature = check_number(temperature, "temperature", low=0, low_open=True, allow_none=True)
    return 1.0 if temperature is None else 1.0 / temperature


def in_batch_logits(query_embeddings, candidate_embeddings, temperature=None):
    """Dot-product scores of every query against every candidate, divided by ``T``:

        z_ij = u_i . v_j / T.

    Args:
      query_embeddings: ``[B, D]`` float.
      candidate_embeddings: ``[C, D]`` float (same ``D``).
      temperature: ``T > 0`` (a number or a scalar tensor); ``None`` for 1.

    Returns:
      ``[B, C]`` in the queries' dtype.

    Example:
      >>> from losszoo.retrieval import in_batch_logits
      >>> z = in_batch_logits(np.eye(2, dtype="float32"), [[1.0, 2.0]], temperature=0.5)
      >>> keras.ops.convert_to_numpy(z)
      array([[2.],
             [4.]], dtype=float32)
    """
    scale = _scale(temperature)
    q = ops.convert_to_tensor(query_embeddings)
    q = check_shape(q, (None, None), "query_embeddings", " ([B, D])")
    c = ops.convert_to_tensor(candidate_embeddings)
    c = check_shape(c, (None, q.shape[-1]), "candidate_embeddings", " ([C, D])")
    return ops.matmul(q, ops.transpose(c)) * ops.cast(scale, q.dtype)


def logq_correction(logits, candidate_sampling_probability):
    """Subtract each column's log sampling probability (logQ correction):

        z_ij <- z_ij - log q_j.

    Corrects the bias of in-batch negatives towards popular items: ``q_j`` is the probability
    that a batch's candidate is item ``j`` (e.g. its share of the training pairs).

    Args:
      logits: ``[B, C]`` float.
      candidate_sampling_probability: ``[C]`` in ``(0, 1]``.

    Returns:
      ``[B, C]``. A probability outside ``(0, 1]`` (NaN included) raises naming
      ``candidate_sampling_probability`` (eagerly and in TensorFlow graphs); under XLA /
      ``jax.jit`` its column is NaN.

    Example:
      >>> from losszoo.retrieval import logq_correction
      >>> z = logq_correction(np.zeros((1, 2), "float32"), [0.5, 1.0])
      >>> keras.ops.convert_to_numpy(z).round(4)    # log 2, log 1
      array([[0.6931, 0.    ]], dtype=float32)
    """
    logits = ops.convert_to_tensor(logits)
    p = ops.cast(ops.convert_to_tensor(candidate_sampling_probability), logits.dtype)
    name = "candidate_sampling_probability"
    p = check_shape(p, (ops.shape(logits)[1],), name, " ([C])")
    p = SAMPLING_PROBABILITY.check(p, name)
    bad = SAMPLING_PROBABILITY.invalid(p)
    return nan_where(bad[None, :], logits - ops.log(ops.where(bad, 1.0, p)))


def remove_accidental_hits(logits, query_ids, candidate_ids, labels=None):
    """``-inf`` where a column holds the row's own item, except the row's positive column:

        z_ij <- -inf  where  candidate_ids[j] == query_ids[i]  and  j != labels[i].

    Args:
      logits: ``[B, C]`` float.
      query_ids: ``[B]`` integer id of each row's positive item.
      candidate_ids: ``[C]`` integer id of each column's item.
      labels: ``[B]`` int column of each row's positive (kept), or ``None`` when no column
        is a positive (e.g. sampled columns).

    Returns:
      ``[B, C]``.

    Example:
      >>> from losszoo.retrieval import remove_accidental_hits
      >>> z = remove_accidental_hits(np.zeros((2, 3), "float32"), [7, 8], [7, 8, 7], [0, 1])
      >>> keras.ops.convert_to_numpy(z)                     # row 0: column 2 is item 7 too
      array([[  0.,   0., -inf],
             [  0.,   0.,   0.]], dtype=float32)
    """
    logits = ops.convert_to_tensor(logits)
    query_ids = ops.convert_to_tensor(query_ids)
    candidate_ids = ops.convert_to_tensor(candidate_ids)
    hit = ops.equal(candidate_ids[None, :], query_ids[:, None])
    if labels is not None:
        columns = ops.arange(ops.shape(logits)[1], dtype="int32")
        own = ops.equal(columns[None, :], ops.convert_to_tensor(labels)[:, None])
        hit = ops.logical_and(hit, ops.logical_not(own))
    return ops.where(hit, ops.cast(-np.inf, logits.dtype), logits)


def sampled_logits(
    query_embeddings,
    sampler,
    num_samples: int,
    candidate_model,
    temperature=None,
    logq: bool = True,
    num_in_batch=None,
    seed=None,
):
    """Scores against ``S`` negatives drawn from the catalogue, logQ-corrected:

        z_is = u_i . w_s / T - log(S p(s) / C)     (mixed with C in-batch columns)
        z_is = u_i . w_s / T - log p(s)             (``num_in_batch=None``: sampled softmax)

    ``p(s)`` is the sampler's exact probability of drawing item ``s``; ``S p(s) / C`` is its
    expected count among the ``S`` draws over ``C`` (see :class:`~losszoo.retrieval.Retrieval`).

    Args:
      query_embeddings: ``[B, D]`` float.
      sampler: a :class:`~losszoo.retrieval.CandidateSampler`.
      num_samples: ``S``, ids drawn (with replacement, shared by all rows).
      candidate_model: callable mapping int32 ids ``[S]`` to embeddings ``[S, D]``.
      temperature: ``T > 0``; ``None`` for 1.
      logq: subtract the log term (default).
      num_in_batch: ``C`` when these columns join ``C`` in-batch ones, else ``None``.
      seed: a ``keras.random.SeedGenerator``, an int or ``None``.

    Returns:
      ``(logits [B, S], ids [S])``: the scores and the ids drawn (int32).

    Example:
      >>> import losszoo.retrieval as R
      >>> table = np.eye(4, dtype="float32")
      >>> z, ids = R.sampled_logits(
      ...     table[:2], R.UniformSampler(4), 3, lambda i: keras.ops.take(table, i, axis=0),
      ...     logq=False, seed=0)
      >>> tuple(z.shape), tuple(ids.shape)
      ((2, 3), (3,))
    """
    if candidate_model is None:
        raise ValueError(
            "`candidate_model` (a callable mapping int ids [S] to embeddings [S, D]) is "
            "required when the task has a sampler."
        )
    q = ops.convert_to_tensor(query_embeddings)
    ids = sampler.sample(num_samples, seed=seed)
    w = ops.convert_to_tensor(candidate_model(ids))
    w = check_shape(w, (num_samples, q.shape[-1]), "candidate_model(ids)", " ([S, D])")
    logits = in_batch_logits(q, ops.cast(w, q.dtype), temperature)
    if logq:
        p = ops.cast(sampler.probability(ids), q.dtype)
        if num_in_batch is not None:
            p = p * ops.cast(num_samples, q.dtype) / ops.cast(num_in_batch, q.dtype)
        logits = logits - ops.log(p)[None, :]
    return logits, ids


def hard_negative_mining(logits, labels, num_hard_negatives: int):
    """Keep each row's positive and its ``n`` highest other logits, the positive first:

        [z_{i, y_i}, n largest of {z_ij : j != y_i}]     (ties: the lower column first)

    Rows with fewer than ``n`` other columns are padded with ``-inf`` (not a candidate); a
    row holding NaN keeps a NaN positive.

    Args:
      logits: ``[B, C]`` float.
      labels: ``[B]`` int, each row's positive column.
      num_hard_negatives: ``n >= 1``.

    Returns:
      ``(logits [B, 1 + n], labels [B])``: the new labels are all 0 (the positive's column).

    Example:
      >>> from losszoo.retrieval import hard_negative_mining
      >>> z, y = hard_negative_mining([[1.0, 5.0, 3.0, 4.0]], [0], 2)
      >>> keras.ops.convert_to_numpy(z), keras.ops.convert_to_numpy(y)
      (array([[1., 5., 4.]], dtype=float32), array([0], dtype=int32))
    """
    n = check_number(num_hard_negatives, "num_hard_negatives", low=1, integer=True)
    logits = ops.convert_to_tensor(logits)
    labels = ops.convert_to_tensor(labels)
    columns = ops.arange(ops.shape(logits)[1], dtype="int32")
    is_positive = ops.equal(columns[None, :], labels[:, None])
    positive = ops.sum(ops.where(is_positive, logits, 0.0), axis=1, keepdims=True)
    positive = nan_where(ops.any(ops.isnan(logits), axis=1, keepdims=True), positive)
    negatives = ops.where(is_positive, ops.cast(-np.inf, logits.dtype), logits)
    # n padding columns of -inf ("not a candidate") make k = n valid for any width.
    padding = ops.full((ops.shape(logits)[0], n), -np.inf, dtype=logits.dtype)
    top, _ = ops.top_k(ops.concatenate([negatives, padding], axis=1), n, sorted=True)
    return ops.concatenate([positive, top], axis=1), ops.zeros_like(labels)
