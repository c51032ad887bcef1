"""Keras 3 retrieval: a task object (in-batch / sampled negatives, logQ, hard negatives, any
losszoo loss) built from small public functions, candidate samplers with exact probabilities,
catalogue top-k metrics.

Written with ``keras.ops``: runs on TensorFlow, JAX and PyTorch
(``tests/retrieval/test_two_tower.py``).

- :class:`Retrieval`: the task, used inside a model's ``compute_loss`` like
  ``tfrs.tasks.Retrieval``.
- :func:`in_batch_logits`, :func:`logq_correction`, :func:`remove_accidental_hits`,
  :func:`sampled_logits`, :func:`hard_negative_mining`: the task's steps, each usable alone
  (:mod:`losszoo.retrieval.logits`).
- :class:`FullCatalogueRetrieval`: the task with every catalogue item a negative, exact and
  streamed over chunks (:func:`losszoo.ops.catalogue_loss`), no sampling.
- :class:`Model`: a base model whose ``compute_loss(inputs, training)`` is written by hand,
  as ``tfrs.Model``; :mod:`losszoo.retrieval.tfrs` gives TFRS' names for porting TFRS code.
- :class:`UniformSampler`, :class:`UnigramSampler`, :class:`LogUniformSampler`: extra
  negatives drawn from the catalogue, each with its exact sampling probability.
- :class:`CatalogueTopK`, :func:`candidate_ranks`, :func:`streamed_ranks`: top-k over the
  whole catalogue (a table, a list of batches or a ``tf.data`` dataset), streamed in chunks,
  pessimistic ties.
"""

from losszoo.retrieval.full_catalogue import FullCatalogueRetrieval
from losszoo.retrieval.logits import (
    hard_negative_mining,
    in_batch_logits,
    logq_correction,
    remove_accidental_hits,
    sampled_logits,
)
from losszoo.retrieval.metrics import CatalogueTopK, candidate_ranks, streamed_ranks
from losszoo.retrieval.model import Model
from losszoo.retrieval.sampling import (
    CandidateSampler,
    LogUniformSampler,
    UniformSampler,
    UnigramSampler,
)
from losszoo.retrieval.task import Retrieval, resolve_loss

__all__ = [
    "CandidateSampler",
    "CatalogueTopK",
    "FullCatalogueRetrieval",
    "LogUniformSampler",
    "Model",
    "Retrieval",
    "UniformSampler",
    "UnigramSampler",
    "candidate_ranks",
    "hard_negative_mining",
    "in_batch_logits",
    "logq_correction",
    "remove_accidental_hits",
    "resolve_loss",
    "sampled_logits",
    "streamed_ranks",
]
