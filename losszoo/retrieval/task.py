"""The Keras 3 retrieval task: in-batch and sampled negatives, logQ, hard negatives, any loss."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from losszoo import registry
from losszoo.contract import (
    check_bool,
    check_item_ids,
    check_number,
    check_shape,
    dtype_name,
    nan_where,
)
from losszoo.retrieval.logits import (
    hard_negative_mining,
    in_batch_logits,
    logq_correction,
    remove_accidental_hits,
    sampled_logits,
)
from losszoo.retrieval.sampling import CandidateSampler

#: Masked logits as a loss other than losszoo's sees them (TFRS' value): Keras' own losses
#: and metrics turn -inf into NaN (0 * -inf) or a miss.
MIN_FLOAT = float(np.finfo(np.float32).min / 100.0)


def resolve_loss(loss, loss_config=None, reduction="sum"):
    """A Keras 3 loss object from a registry name, a serialized dict or a loss/callable.

    A name is looked up with :func:`losszoo.get_class` and built with ``loss_config`` and
    ``reduction``. A batch risk (the DRO losses) given by name is built over
    ``"softmax_cross_entropy"`` on the scores unless ``loss_config`` names a ``base_loss``
    (the baseline's own loss, which reads ``-inf`` as "not a candidate"); batch risks
    ignore ``reduction``.

    Args:
      loss: a registered loss name, a serialized Keras loss (a dict, deserialized with
        ``keras.losses.deserialize``), or a Keras loss / callable (returned as it is).
      loss_config: constructor arguments for a named loss (default none).
      reduction: the reduction of a named loss unless ``loss_config`` sets one (default
        ``"sum"``, the retrieval task's and TFRS' reduction).

    Returns:
      The loss object (or the callable given).

    Raises:
      KeyError: an unknown name (as :func:`losszoo.get_class`).
      ValueError: ``loss_config`` given with a loss that is not a name.
      TypeError: ``loss`` is none of the above.

    Example:
      >>> loss = losszoo.retrieval.resolve_loss("rankmax", {"k": 2})
      >>> type(loss).__name__, loss.reduction
      ('RankmaxLoss', 'sum')
      >>> losszoo.retrieval.resolve_loss("cvar").get_config()["base_loss"]
      'softmax_cross_entropy'
    """
    if isinstance(loss, str):
        cls = registry.get_class(loss, "loss")
        config = dict(loss_config or {})
        if getattr(registry.entry_of(cls, "loss"), "batch_risk", False):
            config.setdefault("base_loss", "softmax_cross_entropy")
        config.setdefault("reduction", reduction)
        return cls(**config)
    if loss_config:
        raise ValueError("`loss_config` applies only when `loss` is a registered name.")
    if isinstance(loss, dict):
        return keras.losses.deserialize(loss)
    if callable(loss):
        return loss
    raise TypeError(
        f"`loss` must be a registered loss name, a Keras loss or a callable; got {loss!r}."
    )


@keras.saving.register_keras_serializable(package="losszoo")
class Retrieval(keras.layers.Layer):
    """Retrieval task: scores queries against candidates and returns a losszoo loss.

    The Keras 3 counterpart of ``tfrs.tasks.Retrieval`` (same argument names where they mean
    the same thing), usable inside a model's ``compute_loss`` or ``call``. For ``B`` queries
    ``u_i``, ``C >= B`` in-batch candidates ``v_j`` (query ``i``'s positive is candidate ``i``;
    the others are its negatives) and, optionally, ``S`` extra negatives ``w_s`` drawn from
    the catalogue by ``sampler`` (*mixed negative sampling*), the logits of row ``i`` are

        z_ij = u_i . v_j / T - log q_j                          (in-batch column j)
        z_is = u_i . w_s / T - log(S p(s) / C)                  (sampled column s)

    then ``-inf`` for accidental hits (a column holding row ``i``'s own item, other than its
    positive) and where ``score_mask`` is false; with ``num_hard_negatives = n`` only the
    positive and the ``n`` highest other logits of each row are kept. The loss is
    ``loss(y_true = positive column, y_pred = z, sample_weight)``.

    The logQ terms: ``q_j`` is ``candidate_sampling_probability`` (the probability that an
    in-batch candidate is item ``j``, as in TFRS; no correction when it is not given), and
    ``p(s)`` the sampler's exact per-draw probability (:mod:`losszoo.retrieval.sampling`).
    Both are each column's expected count among the candidates (``C q_j``, ``S p(s)``)
    divided by ``C``, a per-row constant that no loss sees (every losszoo loss is
    invariant to adding a constant to a row). With ``in_batch_negatives=False`` (plain
    sampled softmax) row ``i`` holds its positive and the ``S`` sampled columns, all
    corrected by ``log p`` of their item under the sampler, as TensorFlow's
    ``sampled_softmax_loss`` does.

    Losses (``loss``): any registered loss name (``losszoo.names("loss")``; plugins
    included) or a Keras loss. ``"softmax_cross_entropy"`` (default) is TFRS' loss;
    ``"rankmax"``, ``"sparsemax"`` and the DRO risks (``"cvar"``, ``"kl_dro_batch_lse"``,
    ``"kl_dro_sumexp"``, ``"safe_kl_dro"``, built over softmax cross-entropy) work as they
    are; the possibilistic losses need a static class axis and do not fit. ``-inf`` means
    "not a candidate" for all of them, and they get class ids (``labels``). Any other loss
    (a Keras loss such as TFRS users pass, ``keras.losses.CategoricalCrossentropy(
    from_logits=True)``, or a callable) gets what TFRS gives it: one-hot labels ``[B,
    columns]``, and ``float32.min / 100`` instead of ``-inf`` in masked columns.

    Metrics, as TFRS': ``metrics`` (catalogue top-k, :class:`~losszoo.retrieval.CatalogueTopK`)
    get the queries and the true candidates: ``candidate_ids[:B]`` when given, else their
    embeddings ``candidate_embeddings[:B]`` (found by score); ``batch_metrics`` (Keras
    metrics) get the one-hot labels and the logits as a non-losszoo loss does;
    ``loss_metrics`` get the loss. A ``tf.data`` candidate dataset in ``metrics`` cannot run
    under XLA: the task then reports ``supports_jit = False`` (Keras' ``jit_compile="auto"``
    leaves XLA off).

    Temperature ``T`` (scores divided by ``T`` before the logQ term): for softmax it sets
    how peaked the distribution is (smaller ``T``: harder negatives dominate the
    gradient); for rankmax, ``T`` is exactly the margin scaled, ``rankmax(z/T, margin=m) =
    rankmax(z, margin=T m)``; for sparsemax a smaller ``T`` makes the projection sparser
    (fewer negatives get a gradient at all) and larger ``T`` spreads it. With SUM
    reduction it also scales the gradient, so ``T`` and the learning rate interact.

    Learning rates, measured (MovieLens 100K, TFRS' basic-retrieval recipe: Adagrad,
    batch 8192, 3 epochs, embedding 32, in-batch negatives, SUM reduction, one seed; test
    top-100 over all movies; ``benchmarks/bench_retrieval.py``, BENCHMARKS.md): softmax
    0.242 / 0.177 / 0.126 at Adagrad 0.1 / 0.3 / 1.0 (TFRS' own task: 0.242 at 0.1);
    rankmax 0.217 / 0.138 / 0.129; sparsemax 0.099 / 0.111 / 0.115. So 0.1 for softmax and
    rankmax; sparsemax learns slowly in-batch at any of these rates, and logQ helps it most
    (0.237 with logQ, 0.296 with mixed negatives at 0.1). logQ raised every loss (softmax
    0.389, rankmax 0.334). The batch risks are on the scale of a mean whatever
    ``reduction`` says: multiply the rate by about the batch size.

    Fail loud: a ``candidate_sampling_probability`` outside ``(0, 1]`` (NaN included), an id
    below 0 or outside the sampler's catalogue, a ``score_mask`` or argument of the wrong
    shape raise naming the argument, eagerly and in graphs (``losszoo.set_validation(False)``
    skips the value checks); under XLA the affected columns, hence the loss, are NaN.

    Args:
      loss: registered loss name, serialized loss dict, or a Keras loss / callable
        ``(y_true, y_pred, sample_weight=None) -> scalar``.
      loss_config: constructor arguments when ``loss`` is a name, e.g. ``{"k": 2}``.
      temperature: ``T > 0`` dividing the scores; ``None`` for 1.
      remove_accidental_hits: mask accidental hits with ``-inf`` (needs ``candidate_ids``).
      num_hard_negatives: keep only the positive and the ``n`` hardest negatives per row.
      sampler: a :class:`~losszoo.retrieval.sampling.CandidateSampler` (or its serialized
        dict) drawing ``num_sampled_negatives`` extra negatives per batch, shared by the
        batch's queries; ``call`` then needs ``candidate_model``.
      num_sampled_negatives: ``S``, the number of ids drawn per batch.
      in_batch_negatives: ``False`` drops the other in-batch candidates: plain sampled
        softmax (needs a sampler and ``candidate_ids``).
      sampled_logq_correction: subtract ``log(S p / C)`` from the sampled columns (default).
      metrics: :class:`~losszoo.retrieval.metrics.CatalogueTopK` metric(s) updated with the
        queries and the true candidates when ``compute_metrics`` (not in the config).
      batch_metrics: Keras metrics of the in-batch logits, updated with ``(one-hot labels,
        logits, sample_weight)`` when ``compute_batch_metrics`` (not in the config).
      loss_metrics: Keras metrics updated with the loss (e.g. ``keras.metrics.Mean``).
      reduction: reduction of a loss given by name; ``"sum"`` (default) as TFRS' loss.
      seed: seed of the sampler's ``keras.random.SeedGenerator``.
      name: layer name.

    Example:
      >>> import losszoo.retrieval
      >>> task = losszoo.retrieval.Retrieval(loss="rankmax", remove_accidental_hits=True)
      >>> queries = np.array([[1, 0], [0, 1], [1, 1]], "float32")
      >>> candidates = np.array([[2, 0], [0, 2], [1, 0]], "float32")
      >>> # rows 0 and 2 hold item 7: each is masked (-inf) in the other's row
      >>> round(float(task(queries, candidates, candidate_ids=[7, 8, 7])), 4)   # log 3
      1.0986

      In a two-tower model (``docs/api/retrieval.md`` has the whole example)::

          def compute_loss(self, x, y=None, y_pred=None, sample_weight=None, training=True):
              return self.task(
                  self.users(x["user"]), self.items(x["item"]),
                  candidate_ids=x["item"], candidate_model=self.items,
              ) + sum(self.losses)
    """

    def __init__(
        self,
        loss="softmax_cross_entropy",
        loss_config: dict | None = None,
        temperature: float | None = None,
        remove_accidental_hits: bool = False,
        num_hard_negatives: int | None = None,
        sampler=None,
        num_sampled_negatives: int = 0,
        in_batch_negatives: bool = True,
        sampled_logq_correction: bool = True,
        metrics=None,
        batch_metrics=None,
        loss_metrics=None,
        reduction="sum",
        seed: int | None = None,
        name: str | None = None,
        **kwargs,
    ):
        super().__init__(name=name, **kwargs)
        self.remove_accidental_hits = check_bool(remove_accidental_hits, "remove_accidental_hits")
        self.in_batch_negatives = check_bool(in_batch_negatives, "in_batch_negatives")
        self.sampled_logq_correction = check_bool(
            sampled_logq_correction, "sampled_logq_correction"
        )
        self.loss_spec = loss if isinstance(loss, str) else None
        self.loss_config = dict(loss_config or {})
        self.reduction = reduction
        self.loss = resolve_loss(loss, loss_config, reduction)
        self.takes_class_ids = registry.entry_of(type(self.loss), "loss") is not None
        self.temperature = check_number(
            temperature, "temperature", low=0, low_open=True, allow_none=True
        )
        self.num_hard_negatives = check_number(
            num_hard_negatives, "num_hard_negatives", low=1, integer=True, allow_none=True
        )
        if isinstance(sampler, dict):
            sampler = keras.saving.deserialize_keras_object(sampler)
        if sampler is not None and not isinstance(sampler, CandidateSampler):
            raise TypeError(f"`sampler` must be a CandidateSampler or None, got {sampler!r}.")
        self.sampler = sampler
        self.num_sampled_negatives = check_number(
            num_sampled_negatives, "num_sampled_negatives", low=0, integer=True
        )
        if (sampler is None) != (self.num_sampled_negatives == 0):
            raise ValueError(
                "`sampler` and `num_sampled_negatives` go together: give a sampler and a "
                f"positive count, or neither; got sampler={sampler!r}, "
                f"num_sampled_negatives={num_sampled_negatives!r}."
            )
        if not in_batch_negatives and sampler is None:
            raise ValueError("`in_batch_negatives=False` needs a `sampler` (sampled softmax).")
        self.task_metrics = _as_list(metrics)
        self.batch_metrics = _as_list(batch_metrics)
        self.loss_metrics = _as_list(loss_metrics)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed) if sampler is not None else None
        self.built = True  # no weights: nothing to build (models holding it build cleanly)

    # ------------------------------------------------------------------ logits

    def logits_and_labels(
        self,
        query_embeddings,
        candidate_embeddings,
        candidate_sampling_probability=None,
        candidate_ids=None,
        score_mask=None,
        candidate_model=None,
    ):
        """The logits the loss sees and each row's positive column (see the class doc).

        Composed of :mod:`losszoo.retrieval.logits`' functions: the in-batch columns (or the
        sampled-softmax positive), the sampled columns, then hard-negative mining.

        Returns:
          ``(logits, labels)``: float ``[B, columns]`` and int32 ``[B]``. Columns: the ``C``
          in-batch candidates then the ``S`` sampled ones (``1 + S`` without in-batch
          negatives); ``1 + n`` with hard-negative mining, the positive first.
        """
        q = ops.convert_to_tensor(query_embeddings)
        q = check_shape(q, (None, None), "query_embeddings", " ([B, D])")
        c = ops.convert_to_tensor(candidate_embeddings)
        c = check_shape(c, (None, q.shape[-1]), "candidate_embeddings", " ([C, D])")
        num_q, num_c = ops.shape(q)[0], ops.shape(c)[0]
        if isinstance(num_q, int) and isinstance(num_c, int) and num_c < num_q:
            raise ValueError(
                f"`candidate_embeddings` must have at least as many rows as "
                f"`query_embeddings` (row i is query i's positive); got {num_c} < {num_q}."
            )
        ids, bad_ids = self._checked_ids(candidate_ids, num_c)
        labels = ops.arange(num_q, dtype="int32")
        if self.in_batch_negatives:
            logits = self._in_batch(q, c, ids, bad_ids, candidate_sampling_probability, score_mask)
        else:
            if candidate_sampling_probability is not None or score_mask is not None:
                raise ValueError(
                    "`candidate_sampling_probability` and `score_mask` concern in-batch "
                    "columns; with in_batch_negatives=False the positive is corrected by the "
                    "sampler's probability."
                )
            logits = self._sampled_softmax_positive(q, c, ids, bad_ids)
            labels = ops.zeros_like(labels)
        if self.sampler is not None:
            sampled, drawn = sampled_logits(
                q,
                self.sampler,
                self.num_sampled_negatives,
                candidate_model,
                temperature=self.temperature,
                logq=self.sampled_logq_correction,
                num_in_batch=num_c if self.in_batch_negatives else None,
                seed=self.seed_generator,
            )
            if self.remove_accidental_hits:
                sampled = remove_accidental_hits(sampled, ids[:num_q], drawn)
            logits = ops.concatenate([logits, sampled], axis=1)
        if self.num_hard_negatives is not None:
            logits, labels = hard_negative_mining(logits, labels, self.num_hard_negatives)
        return logits, labels

    def _checked_ids(self, candidate_ids, num_c):
        """``(ids, bad)`` of ``candidate_ids`` (``(None, None)`` when not given)."""
        needs_ids = self.remove_accidental_hits or (
            not self.in_batch_negatives and self.sampled_logq_correction
        )
        if candidate_ids is None:
            if needs_ids:
                raise ValueError(
                    "`candidate_ids` is required with remove_accidental_hits=True or "
                    "in_batch_negatives=False."
                )
            return None, None
        num_items = None if self.sampler is None else self.sampler.num_items
        ids, bad = check_item_ids(candidate_ids, "candidate_ids", num_items)
        return check_shape(ids, (num_c,), "candidate_ids", " ([C], one per candidate)"), bad

    def _in_batch(self, q, c, ids, bad_ids, candidate_sampling_probability, score_mask):
        """The ``[B, C]`` in-batch columns: scores, logQ, accidental hits, ``score_mask``."""
        logits = in_batch_logits(q, c, self.temperature)
        if candidate_sampling_probability is not None:
            logits = logq_correction(logits, candidate_sampling_probability)
        if bad_ids is not None:
            logits = nan_where(bad_ids[None, :], logits)
        num_q = ops.shape(q)[0]
        if self.remove_accidental_hits:
            rows = ops.arange(num_q, dtype="int32")
            logits = remove_accidental_hits(logits, ids[:num_q], ids, labels=rows)
        if score_mask is not None:
            mask = ops.convert_to_tensor(score_mask)
            if dtype_name(mask) != "bool":
                raise TypeError(f"`score_mask` must be boolean, got dtype {dtype_name(mask)}.")
            mask = check_shape(mask, (num_q, ops.shape(c)[0]), "score_mask", " ([B, C])")
            logits = ops.where(mask, logits, ops.cast(-np.inf, logits.dtype))
        return logits

    def _sampled_softmax_positive(self, q, c, ids, bad_ids):
        """``[B, 1]``: each query's positive score, less ``log p`` of its item (sampled
        softmax: the positive is corrected by the sampler's probability, as the negatives)."""
        num_q = ops.shape(q)[0]
        scale = 1.0 if self.temperature is None else 1.0 / self.temperature
        positive = ops.sum(q * c[:num_q], axis=1, keepdims=True) * ops.cast(scale, q.dtype)
        if self.sampled_logq_correction:
            positive = positive - ops.log(self.sampler.probability(ids[:num_q]))[:, None]
        if bad_ids is not None:
            positive = nan_where(bad_ids[:num_q, None], positive)
        return positive

    @property
    def supports_jit(self) -> bool:
        """False while a metric reads a ``tf.data`` candidate dataset (no XLA for it)."""
        metrics = self.__dict__.get("task_metrics", ())
        reads_data = any(getattr(m, "reads_a_dataset", False) for m in metrics)
        return self.__dict__.get("_supports_jit", True) and not reads_data

    @supports_jit.setter
    def supports_jit(self, value):
        self.__dict__["_supports_jit"] = value

    # ------------------------------------------------------------------ call

    def call(
        self,
        query_embeddings,
        candidate_embeddings,
        sample_weight=None,
        candidate_sampling_probability=None,
        candidate_ids=None,
        score_mask=None,
        candidate_model=None,
        compute_metrics: bool = True,
        compute_batch_metrics: bool = True,
    ):
        """The loss of one batch (a scalar); updates the metrics (see the class doc).

        Args:
          query_embeddings: ``[B, D]``.
          candidate_embeddings: ``[C, D]``, ``C >= B``; row ``i`` is query ``i``'s positive.
          sample_weight: ``[B]`` per-query weights, passed to the loss.
          candidate_sampling_probability: ``[C]`` in ``(0, 1]``: logQ of in-batch columns.
          candidate_ids: ``[C]`` integer ids (accidental hits, sampled softmax, metrics).
          score_mask: ``[B, C]`` bool; false sets the in-batch logit to ``-inf``.
          candidate_model: callable mapping int32 ids ``[S]`` to embeddings ``[S, D]``
            (required with a sampler).
          compute_metrics: update ``metrics`` (catalogue top-k: slow; TFRS' advice is
            ``compute_metrics=not training``).
          compute_batch_metrics: update ``batch_metrics``.
        """
        logits, labels = self.logits_and_labels(
            query_embeddings,
            candidate_embeddings,
            candidate_sampling_probability=candidate_sampling_probability,
            candidate_ids=candidate_ids,
            score_mask=score_mask,
            candidate_model=candidate_model,
        )
        if self.takes_class_ids:
            loss = self.loss(labels, logits, sample_weight=sample_weight)
        else:
            loss = self.loss(*one_hot_form(logits, labels), sample_weight=sample_weight)
        num_q = ops.shape(query_embeddings)[0]
        if compute_metrics and self.task_metrics:
            if candidate_ids is None:  # found by score, as TFRS does without ids
                true = ops.convert_to_tensor(candidate_embeddings)[:num_q]
                for metric in self.task_metrics:
                    metric.update_state(
                        query_embeddings, None, sample_weight=sample_weight, true_embeddings=true
                    )
            else:
                true = ops.convert_to_tensor(candidate_ids)[:num_q]
                for metric in self.task_metrics:
                    metric.update_state(query_embeddings, true, sample_weight=sample_weight)
        if compute_batch_metrics and self.batch_metrics:
            targets, finite = one_hot_form(logits, labels)
            for metric in self.batch_metrics:
                metric.update_state(targets, finite, sample_weight=sample_weight)
        for metric in self.loss_metrics:
            metric.update_state(loss)
        return loss

    def compute_output_shape(self, *args, **kwargs):
        return ()

    def get_config(self):
        return {
            **super().get_config(),
            "loss": self.loss_spec or keras.losses.serialize(self.loss),
            "loss_config": self.loss_config if self.loss_spec is not None else None,
            "temperature": self.temperature,
            "remove_accidental_hits": self.remove_accidental_hits,
            "num_hard_negatives": self.num_hard_negatives,
            "sampler": keras.saving.serialize_keras_object(self.sampler),
            "num_sampled_negatives": self.num_sampled_negatives,
            "in_batch_negatives": self.in_batch_negatives,
            "sampled_logq_correction": self.sampled_logq_correction,
            "reduction": self.reduction,
            "seed": self.seed,
        }


def _as_list(metrics) -> list:
    if metrics is None:
        return []
    return list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]


def one_hot_form(logits, labels):
    """``(one-hot labels [B, columns], logits with -inf as float32.min / 100)``: the form
    TFRS gives its loss and batch metrics (Keras' losses read -inf as NaN)."""
    targets = ops.one_hot(labels, ops.shape(logits)[1], dtype=logits.dtype)
    finite = ops.where(ops.isneginf(logits), ops.cast(MIN_FLOAT, logits.dtype), logits)
    return targets, finite
