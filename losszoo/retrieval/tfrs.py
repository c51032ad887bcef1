"""TFRS' names for losszoo's retrieval pieces: TFRS retrieval code ports by its import.

Replace ``import tensorflow_recommenders as tfrs`` by ``from losszoo.retrieval import tfrs``
and the code runs on Keras 3 (TensorFlow, and JAX or PyTorch where it uses no ``tf.data``
candidate dataset; ``examples/tfrs_tutorial_port.py`` is TFRS' basic-retrieval tutorial so
ported):

- ``tfrs.Model`` / ``tfrs.models.Model``: :class:`losszoo.retrieval.Model`
  (``compute_loss(inputs, training)``, regularization losses added);
- ``tfrs.tasks.Retrieval``: :class:`losszoo.retrieval.Retrieval` (``loss``, ``metrics``,
  ``batch_metrics``, ``loss_metrics``, ``temperature``, ``num_hard_negatives``,
  ``remove_accidental_hits``; ``call`` with ``sample_weight``,
  ``candidate_sampling_probability``, ``candidate_ids``, ``compute_metrics``,
  ``compute_batch_metrics``, ``score_mask``);
- ``tfrs.metrics.FactorizedTopK``: :class:`losszoo.retrieval.CatalogueTopK` (``candidates``:
  a ``tf.data`` dataset of embedding batches as in TFRS, or a table, a list of batches or a
  callable returning one; ``ks``).

What differs from TFRS: the default loss is losszoo's ``"softmax_cross_entropy"`` (TFRS'
``CategoricalCrossentropy(from_logits=True)`` with SUM reduction: the same values) and any
losszoo loss may be named; top-k counts ties pessimistically (TFRS' ``in_top_k`` counts them
as hits) and its results are named ``top_<k>`` (TFRS: ``factorized_top_k/top_<k>_categorical_
accuracy``); multi-head (3-D) query embeddings and TFRS' other tasks, layers and index
structures (``BruteForce``, ``ScaNN``) are not provided.

Example:
  >>> from losszoo.retrieval import tfrs
  >>> task = tfrs.tasks.Retrieval(metrics=tfrs.metrics.FactorizedTopK(np.eye(3, dtype="f4")))
  >>> type(task).__name__, issubclass(tfrs.Model, keras.Model)
  ('Retrieval', True)
"""

from __future__ import annotations

from types import SimpleNamespace

from losszoo.retrieval.metrics import CatalogueTopK
from losszoo.retrieval.model import Model
from losszoo.retrieval.task import Retrieval

__all__ = ["Model", "metrics", "models", "tasks"]

models = SimpleNamespace(Model=Model)
tasks = SimpleNamespace(Retrieval=Retrieval)
metrics = SimpleNamespace(FactorizedTopK=CatalogueTopK)
