"""Streaming exact KL-DRO risk over a whole evaluation pass (spec safe_kl_dro.md 2.5)."""

from __future__ import annotations

import keras
import tensorflow as tf

from losszoo import ops
from losszoo.losses._base_loss import per_example, resolve_base_loss
from losszoo.ops._dro import check_lam
from losszoo.ops.distribute import replica_max
from losszoo.registry import register


@register(
    "exact_kl_dro_risk",
    kind="metric",
    aliases=("kl_dro_risk",),
    description="Streaming exact full-data KL-DRO risk lam*log mean exp(l/lam)",
)
class ExactKLDRORisk(keras.metrics.Metric):
    """Exact KL-DRO risk of all examples seen since the last reset.

        R = lam * log( sum_i s_i exp(l_i/lam) / sum_i s_i )

    over every batch of the pass (train epoch or evaluation), with the base loss computed
    per example. This is the objective KL-DRO training is meant to minimise (the mini-batch
    risks only estimate it). Accumulated stably in float64 as a running max ``m`` of
    ``l/lam``, ``acc = sum s exp(l/lam - m)`` and ``n = sum s``. Under a multi-replica
    strategy the replicas share the shift ``m`` (all-gathered batch maxima), so the
    per-replica sums add up exactly.

    Fail-loud: NaN, Inf or negative sample weights raise (eagerly, or through a graph
    assertion; skippable with ``losszoo.set_validation(False)``); a NaN per-example loss
    with positive weight makes the result NaN until the next reset. Under XLA: invalid
    sample weights make the result NaN.

    Args:
      base_loss: Keras loss computed per example (name, instance or function); ``None``
        (default): sparse categorical cross-entropy on logits. Labels are checked and
        attached logits used as by the DRO losses (:mod:`losszoo.losses.dro`).
      lam: temperature (> 0, finite).
      name, dtype: as for Keras metrics.

    Example:
      >>> model.compile("adam", loss="safe_kl_dro",
      ...               metrics=[losszoo.metrics.ExactKLDRORisk(lam=1.0)])
    """

    def __init__(
        self,
        base_loss=None,
        lam: float = 1.0,
        name: str = "exact_kl_dro_risk",
        dtype=None,
    ):
        super().__init__(name=name, dtype=dtype)
        self.lam = check_lam(lam)
        self._base_fn, self._base_config = resolve_base_loss(base_loss)
        # Under a multi-replica strategy every replica uses the same shift m (the
        # all-gathered batch maximum), so m is identical across replicas
        # ("only_first_replica") and acc, n are plain sums ("sum").
        self.m = self.add_variable(
            shape=(),
            initializer=keras.initializers.Constant(-float("inf")),
            dtype="float64",
            name="max",
            aggregation="only_first_replica",
        )
        self.acc = self.add_variable(
            shape=(), initializer="zeros", dtype="float64", name="acc", aggregation="sum"
        )
        self.n = self.add_variable(
            shape=(), initializer="zeros", dtype="float64", name="n", aggregation="sum"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        l = per_example(self._base_fn, y_true, y_pred)
        batch_max = replica_max(ops.kl_dro_exact_batch_max(l, self.lam, sample_weight))
        m, acc, n = ops.kl_dro_exact_state_update(
            tf.convert_to_tensor(self.m),
            tf.convert_to_tensor(self.acc),
            tf.convert_to_tensor(self.n),
            l,
            self.lam,
            sample_weight,
            batch_max=batch_max,
        )
        self.m.assign(m)
        self.acc.assign(acc)
        self.n.assign(n)

    def result(self):
        val = ops.kl_dro_exact_state_result(
            tf.convert_to_tensor(self.m),
            tf.convert_to_tensor(self.acc),
            tf.convert_to_tensor(self.n),
            self.lam,
        )
        return tf.cast(val, self.dtype)

    def get_config(self):
        return {**super().get_config(), "base_loss": self._base_config, "lam": self.lam}
