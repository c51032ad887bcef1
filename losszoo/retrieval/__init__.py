"""Keras 3 retrieval: a task object (in-batch / sampled negatives, logQ, hard negatives, any
losszoo loss), candidate samplers with exact probabilities, catalogue top-k metrics.

Written with ``keras.ops``: runs on TensorFlow, JAX and PyTorch (``tests/backends``).

- :class:`Retrieval`: the task, used inside a model's ``compute_loss`` like
  ``tfrs.tasks.Retrieval``.
- :class:`UniformSampler`, :class:`UnigramSampler`, :class:`LogUniformSampler`: extra
  negatives drawn from the catalogue, each with its exact sampling probability.
- :class:`CatalogueTopK`, :func:`candidate_ranks`: top-k over the whole catalogue, streamed
  in chunks, pessimistic ties.
"""

from losszoo.retrieval.metrics import CatalogueTopK, candidate_ranks
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
    "LogUniformSampler",
    "Retrieval",
    "UniformSampler",
    "UnigramSampler",
    "candidate_ranks",
    "resolve_loss",
]
