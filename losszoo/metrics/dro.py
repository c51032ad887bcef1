"""Streaming exact KL-DRO risk over a whole evaluation pass (spec safe_kl_dro.md 2.5)."""

from __future__ import annotations

import keras
from keras import ops

from losszoo.losses import per_example_loss
from losszoo.ops import (
    kl_dro_exact_batch_max,
    kl_dro_exact_state_result,
    kl_dro_exact_state_update,
)
from losszoo.ops.dro.distribute import check_lam, replica_max
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
    strategy (``tf.distribute``) the replicas share the shift ``m`` (all-gathered batch
    maxima), so the per-replica sums add up exactly; under ``keras.distribution`` (JAX) one
    program sees the global batch. On JAX the state is float64 only with
    ``jax_enable_x64`` (else float32: exact up to float32 rounding of the sums).

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
        self._base_fn, self._base_config = per_example_loss(base_loss)
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
        l = self._base_fn(y_true, y_pred)
        batch_max = replica_max(kl_dro_exact_batch_max(l, self.lam, sample_weight))
        m, acc, n = kl_dro_exact_state_update(
            self.m, self.acc, self.n, l, self.lam, sample_weight, batch_max=batch_max
        )
        self.m.assign(m)
        self.acc.assign(acc)
        self.n.assign(n)

    def result(self):
        val = kl_dro_exact_state_result(self.m, self.acc, self.n, self.lam)
        return ops.cast(val, self.dtype)

    def get_config(self):
        return {**super().get_config(), "base_loss": self._base_config, "lam": self.lam}
