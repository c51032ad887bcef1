"""Keras losses for possibilistic supervision (Baaj & Marquis, 2026).

* ``"possibilistic_projection"``: ``KL(p* || softmax(z))`` with ``p*`` the KL projection of the
  prediction onto the credal set of the label's possibility distribution (Model A).
* ``"antipignistic_kl"``: ``KL(pdot(pi) || softmax(z))``, fixed antipignistic target (Model B).
* ``"vote_kl"``: ``KL(v / sum v || softmax(z))`` with vote counts as labels (Model C).

The maths lives in :mod:`losszoo.ops.possibilistic`; these classes handle config and labels.
:class:`ProjectionDiagnostic` exposes the projection's convergence (mean / p90 cycles,
non-converged count) as Keras metrics, updated by the loss in its own call during
``fit`` / ``evaluate`` (``model.compile(..., metrics=loss.metrics)``). Every backend (float64
inside: on JAX with ``jax_enable_x64``).
"""

from __future__ import annotations

import dataclasses

import keras
from keras import ops as kops

from losszoo import _backend, _keras_hooks, _logits, ops
from losszoo.contract import check_choice, check_number, to_compute_dtype
from losszoo.losses._base_loss import OpLoss
from losszoo.ops.possibilistic import ProjectionConfig
from losszoo.registry import register


class _PossibilisticLoss(OpLoss):
    """The possibilistic losses' reading of ``y_pred``: by :func:`losszoo._logits.scores`
    from logits, else attached logits or the log of the probabilities (clipped at 1e-15)."""

    names = {"labels_name": "y_true"}

    def scores(self, y_pred):
        logits = _logits.scores(y_pred) if self.from_logits else _logits.attached_logits(y_pred)
        y_pred, from_logits = (y_pred, False) if logits is None else (logits, True)
        y_pred, _ = to_compute_dtype(y_pred, "y_pred")
        if not from_logits:
            y_pred = kops.log(kops.maximum(y_pred, kops.cast(1e-15, y_pred.dtype)))
        return y_pred


_STATS = ("mean_cycles", "p90_cycles", "nonconverged")


@register(
    "possibilistic_projection",
    kind="loss",
    aliases=("possibilistic_kl_projection",),
    description="KL(p*||softmax(z)), p* = KL projection onto a possibility credal set (certified)",
)
class PossibilisticProjectionLoss(_PossibilisticLoss):
    """KL projection loss for possibility-distribution labels (Baaj & Marquis, 2026).

    For logits ``z``, ``q = softmax(z)`` and a possibility label ``pi``::

        loss(z; pi) = min_{p in F(pi)} KL(p || q) = KL(p* || q),   d loss / dz = q - p*,

    where ``F(pi)`` is the set of distributions compatible with ``pi`` plus the order
    (shape) constraints of the paper, and ``p*`` is recomputed from the current prediction
    at every step (float64, XLA) and then held fixed: by default by an interior-point
    solver whose every row is certified by the exact duality gap (Dykstra's algorithm
    finishes the rare row it cannot certify; ``method="dykstra"`` and the ``"paper"`` /
    ``"fixed"`` rules use Dykstra alone). The gradient is exact (Danskin's theorem).
    ``loss >= 0`` with equality iff ``q`` is admissible, and it never exceeds the
    antipignistic loss ``KL(pdot || q)``. Batch sizes unknown at trace time (a dataset with
    a partial last batch) are supported.

    Labels are possibility degrees of shape ``[B, K]`` (they
    must hold values in ``[0, 1]`` with row maximum 1; integer class ids are read as one-hot
    ``pi``). Invalid labels (NaN, negative, > 1, maximum below 1, ids out of range) and
    invalid logits (NaN, +inf, a row of only -inf) raise naming the argument, eagerly and
    in graphs. Under XLA: assertions vanish,
    so the affected rows' loss is NaN instead (never a finite number).

    Diagnostics: ``model.compile(..., loss=loss, metrics=loss.metrics)`` logs
    ``projection_mean_cycles``, ``projection_p90_cycles`` and ``projection_nonconverged``
    (the mean and p90 solver work per example, interior-point iterations plus Dykstra
    cycles, and the count of non-certified projections; see :class:`ProjectionDiagnostic`).
    The loss updates them in its own call, from the projection it computes anyway: one
    projection per step on every backend. Any :class:`ProjectionDiagnostic` built on this
    loss and compiled into the same model is updated the same way.

    Args:
      tol: feasibility tolerance of the projection (max constraint violation).
      max_cycles: maximum Dykstra cycles (with the interior point: the budget of the
        Dykstra finish of rows it cannot certify).
      stopping: ``"certified"`` (default: feasibility and duality gap <= ``gap_tol``),
        ``"paper"`` (feasibility only, reproduces the paper) or ``"fixed"``.
      support_mode: ``"floor"`` (default: ``pi <- max(pi, floor)``) or ``"restrict"``
        (zero-``pi`` classes are excluded; no gradient reaches them).
      gap_tol: duality-gap tolerance of the certified rule.
      floor: ``rho`` of the floor mode.
      eps_cap: cap on the strict-order margin (1e-9 in the paper's synthetic study, 0.05
        for 3-class vote data).
      tie_tol: possibilities closer than this are treated as tied.
      gap_policy: ``"wide"`` (default) or ``"antipignistic_tight"``.
      q_clip: the prediction is clipped at this probability before projecting.
      from_logits: ``y_pred`` holds logits (default) or probabilities.
      method: ``None`` (interior point for the certified rule, Dykstra otherwise),
        ``"interior_point"`` or ``"dykstra"``.
      reduction, name, dtype: as for any Keras loss.

    Example:
      >>> loss = losszoo.losses.PossibilisticProjectionLoss()
      >>> model.compile("adam", loss=loss, metrics=loss.metrics)
      >>> abs(float(loss([[1.0, 0.5, 0.1]], [[2.0, 1.0, -1.0]]))) < 1e-12   # q admissible
      True
    """

    def __init__(
        self,
        tol: float = 1e-8,
        max_cycles: int = 2000,
        stopping: str = "certified",
        support_mode: str = "floor",
        gap_tol: float = 1e-10,
        floor: float = 1e-6,
        eps_cap: float = 1e-9,
        tie_tol: float = 0.0,
        gap_policy: str = "wide",
        q_clip: float = 1e-15,
        from_logits: bool = True,
        method: str | None = None,
        reduction="sum_over_batch_size",
        name: str = "possibilistic_projection",
        dtype=None,
    ):
        config = ProjectionConfig(
            tol=tol,
            max_cycles=max_cycles,
            stopping=stopping,
            support_mode=support_mode,
            gap_tol=gap_tol,
            floor=floor,
            eps_cap=eps_cap,
            tie_tol=tie_tol,
            gap_policy=gap_policy,
            q_clip=q_clip,
            method=method,
        )
        fields = dataclasses.asdict(config)
        op = ops.possibilistic_projection_loss
        super().__init__(op, reduction, name, dtype, **fields, from_logits=bool(from_logits))
        self.config, self.projection_config = config, fields
        self._metrics = None  # made on first use of `metrics`

    def compute(self, y_true, y_pred):
        """Per-example loss and the projection diagnostics (a ``ProjectionInfo``)."""
        z = self.scores(y_pred)
        op = ops.possibilistic_projection_loss  # looked up at each call (tests count it)
        return op(y_true, z, self.config, return_info=True, **self.names)

    def call(self, y_true, y_pred):
        loss, info = self.compute(y_true, y_pred)
        model, _ = _keras_hooks.current_trainer()
        if model is not None and not _backend.in_shape_inference():
            # Stateful updates in program order: TensorFlow's automatic control
            # dependencies, Keras' stateless scope on JAX (the metrics are model metrics),
            # eagerly on PyTorch.
            mine = [
                m
                for m in _keras_hooks.model_metrics(model)
                if isinstance(m, ProjectionDiagnostic) and m.loss is self
            ]
            if mine:
                work = _solver_work(info, self.config)
                for metric in mine:
                    metric._accumulate(work, info)
        return loss

    @property
    def metrics(self):
        """This loss's diagnostic metrics, ``projection_mean_cycles``,
        ``projection_p90_cycles`` and ``projection_nonconverged`` (the same objects at every
        access): pass them as ``model.compile(..., loss=loss, metrics=loss.metrics)``; the
        loss updates them in its own call."""
        if self._metrics is None:
            self._metrics = [ProjectionDiagnostic(self, stat) for stat in _STATS]
        return list(self._metrics)

    def diagnostic_metrics(self):
        """The same as :attr:`metrics`."""
        return self.metrics


def _solver_work(info, config):
    """Solver work per row, float64: interior-point iterations plus Dykstra (finishing)
    cycles; with Dykstra alone both fields hold the same cycles, so they count once."""
    if config.solver == "dykstra":
        return kops.cast(info.cycles, "float64")
    return kops.cast(info.iterations, "float64") + kops.cast(info.cycles, "float64")


@register(
    "possibilistic_projection_diagnostic",
    kind="metric",
    description="Mean/p90 solver iterations or non-certified count of the possibilistic projection",
)
class ProjectionDiagnostic(keras.metrics.Metric):
    """Convergence of a :class:`PossibilisticProjectionLoss`'s projections, as a metric.

    ``statistic``: ``"mean_cycles"`` (solver work per example, interior-point iterations
    plus Dykstra cycles, averaged over every example since the last reset), ``"p90_cycles"``
    (each batch's 90th percentile of that work, linear interpolation, averaged over the
    batches since the last reset with equal weight: a partial last batch counts as one
    batch) or ``"nonconverged"`` (number of valid examples whose projection is not
    certified, or for the paper rule stopped at ``max_cycles`` without meeting it, summed
    since the last reset). Sample weights are ignored.

    Where the values come from: during ``fit`` / ``evaluate`` of a model compiled with
    ``loss`` (the same object) the loss adds each step's values in its own call, from the
    projection it computes anyway, and :meth:`update_state` does nothing. Anywhere else
    (used on its own, or by name with a loss of its own) :meth:`update_state` computes the
    projection of ``(y_true, y_pred)`` itself.

    Args:
      loss: the :class:`PossibilisticProjectionLoss` (or its config dict); default: a new
        one with default settings.
      statistic: one of ``"mean_cycles"``, ``"p90_cycles"``, ``"nonconverged"``.
      name, dtype: as for any Keras metric (name defaults to ``"projection_<statistic>"``).

    Example:
      >>> loss = PossibilisticProjectionLoss()
      >>> model.compile("adam", loss=loss, metrics=loss.metrics)  # the loss updates them
      >>> metric = ProjectionDiagnostic(loss, "nonconverged")     # on its own: computes
      >>> metric.update_state([[1.0, 0.5, 0.1]], [[2.0, 1.0, -1.0]])
      >>> float(metric.result())
      0.0
    """

    def __init__(self, loss=None, statistic: str = "mean_cycles", name=None, dtype=None):
        check_choice(statistic, "statistic", _STATS)
        super().__init__(name=name or f"projection_{statistic}", dtype=dtype)
        if loss is None:
            loss = PossibilisticProjectionLoss()
        elif isinstance(loss, dict):
            loss = PossibilisticProjectionLoss.from_config(loss)
        if not isinstance(loss, PossibilisticProjectionLoss):
            raise TypeError(f"`loss` must be a PossibilisticProjectionLoss, got {type(loss)}.")
        self.loss = loss
        self.statistic = statistic
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        """Add the projection diagnostics of ``(y_true, y_pred)``; nothing where the loss
        adds them (a Keras step of a model compiled with it) or in Keras' shape build."""
        if _backend.in_shape_inference():
            return
        model, _ = _keras_hooks.current_trainer()
        if model is not None and any(x is self.loss for x in _keras_hooks.compiled_losses(model)):
            return
        _, info = self.loss.compute(y_true, y_pred)
        self._accumulate(_solver_work(info, self.loss.config), info)

    def _accumulate(self, work, info):
        """Add one batch: ``work`` from :func:`_solver_work`, ``info`` its ProjectionInfo."""
        if self.statistic == "mean_cycles":
            value, count = kops.sum(work), kops.cast(kops.size(work), "float64")
        elif self.statistic == "p90_cycles":
            value, count = kops.quantile(work, 0.9), 1.0
        else:
            value, count = kops.sum(kops.cast(info.valid & ~info.converged, "float64")), 0.0
        self.total.assign_add(kops.cast(value, self.dtype))
        self.count.assign_add(kops.cast(count, self.dtype))

    def result(self):
        total = kops.convert_to_tensor(self.total)  # a tensor, never the variable (JAX)
        if self.statistic == "nonconverged":
            return total
        return kops.divide_no_nan(total, kops.convert_to_tensor(self.count))

    def get_config(self):
        return {**super().get_config(), "loss": self.loss.get_config(), "statistic": self.statistic}


@register(
    "antipignistic_kl",
    kind="loss",
    description="KL(pdot(pi)||softmax(z)) with the fixed antipignistic target (paper's Model B)",
)
class AntipignisticKLLoss(_PossibilisticLoss):
    """KL to the antipignistic probability of a possibility label (the paper's Model B).

        loss(z; pi) = KL(pdot(pi) || softmax(z)),
        pdot_sigma(r) = sum_{j>=r} (pt_j - pt_{j+1}) / j,

    with ``pt`` the sorted, max-normalised possibilities; gradient ``softmax(z) - pdot``.
    ``pdot`` is the centre of gravity of the credal set and is always admissible, so this
    upper-bounds :class:`PossibilisticProjectionLoss`. Labels are validated like those of
    :class:`PossibilisticProjectionLoss` (integer ids are one-hot ``pi``); invalid labels or
    logits raise naming the argument, eagerly and in graphs, and give a NaN loss under XLA.

    Args:
      floor: floor applied to the normalised ``pi`` before the transform (0: none).
      from_logits: ``y_pred`` holds logits (default) or probabilities.
      reduction, name, dtype: as for any Keras loss.

    Example:
      >>> float(losszoo.losses.AntipignisticKLLoss()([[1.0, 1.0]], [[0.0, 0.0]]))
      0.0
    """

    def __init__(
        self,
        floor: float = 0.0,
        from_logits: bool = True,
        reduction="sum_over_batch_size",
        name: str = "antipignistic_kl",
        dtype=None,
    ):
        floor = check_number(floor, "floor", low=0.0, high=1.0, high_open=True)
        op = ops.antipignistic_kl_loss
        super().__init__(op, reduction, name, dtype, floor=floor, from_logits=bool(from_logits))


@register(
    "vote_kl",
    kind="loss",
    description="KL(v/sum(v)||softmax(z)) with vote-count labels (paper's Model C)",
)
class VoteKLLoss(_PossibilisticLoss):
    """KL to the vote proportions (the paper's Model C): labels are vote counts.

        loss(z; v) = KL(v / sum(v) || softmax(z)),   gradient softmax(z) - v / sum(v).

    Counts must be finite and non-negative with a positive row sum (integer class ids are
    one vote); other rows, and NaN, +inf or all -inf logits, raise naming the argument,
    eagerly and in graphs, and give a NaN loss under XLA.

    Args:
      from_logits: ``y_pred`` holds logits (default) or probabilities.
      reduction, name, dtype: as for any Keras loss.

    Example:
      >>> loss = losszoo.losses.VoteKLLoss()([[3, 1, 0]], [[1.0, 0.0, -2.0]])
      >>> bool(loss >= 0.0)
      True
    """

    def __init__(
        self,
        from_logits: bool = True,
        reduction="sum_over_batch_size",
        name: str = "vote_kl",
        dtype=None,
    ):
        op = ops.vote_kl_loss
        super().__init__(op, reduction, name, dtype, from_logits=bool(from_logits))
