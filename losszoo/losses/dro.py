"""Keras losses: the safe-KL DRO risk (trains its own dual scalar alpha) and its baselines.

The design (how and when alpha is trained, distribution, tf_keras and TFRS, diagnostics in
the logs, saving, where the code is) is ``docs/design/dro.md``; the maths is in
:mod:`losszoo.ops.dro` and spec ``shared/specs/safe_kl_dro.md``.
"""

from __future__ import annotations

import contextlib

import keras
from keras import ops

from losszoo import _backend, _keras_hooks, contract
from losszoo.losses import _dro_alpha
from losszoo.losses._base_loss import per_example_loss
from losszoo.ops.dro import distribute
from losszoo.registry import register

__all__ = [
    "CVaRLoss",
    "KLDROBatchLSE",
    "KLDROSumExp",
    "SafeKLDRORisk",
    "alpha_updates",
    "find_dro_losses",
]


# ----------------------------------------------------------------------------- helpers
def alpha_updates(enabled: bool):
    """Force (``True``) or forbid (``False``) alpha updates of safe-KL losses in this block.

    The decision is taken when a step is traced, so use it around the first call of a
    ``tf.function`` (or around eager code).
    """
    return _keras_hooks.pushed("alpha_override", bool(enabled))


def _training_flag(update_alpha, losses=None):
    """``(training, trainer)``: whether alpha moves in the step being traced, and the Keras 3
    model computing the loss (``None`` outside one, or under :func:`alpha_updates`).

    ``update_alpha`` is ``"auto"`` (a Keras 3 train step; outside a trainer,
    :func:`losszoo._keras_hooks.recording_gradients` of ``losses``), ``True`` or ``False``;
    :func:`alpha_updates` overrides all three.
    """
    override = _keras_hooks.thread_stack("alpha_override")
    if override:
        return override[-1], None
    trainer, training = _keras_hooks.current_trainer()
    if update_alpha is not True and update_alpha is not False:
        if trainer is not None:
            return training, trainer
        return _keras_hooks.recording_gradients(losses), None
    return bool(update_alpha), trainer


def _weights_with_mask(sample_weight, y_pred, shape_ref):
    mask = getattr(y_pred, "_keras_mask", None)
    if mask is None:
        return sample_weight
    dt = contract.dtype_name(shape_ref)
    mask = ops.cast(mask, dt)
    if sample_weight is None:
        return mask
    sw = ops.cast(sample_weight, dt)
    rank = contract.static_rank(sw)
    while rank is not None and rank < contract.static_rank(mask):
        sw, rank = sw[..., None], rank + 1
    return sw * mask


def _init_scope():
    """TensorFlow: build state outside any graph being traced (``tf.init_scope``)."""
    return _backend.tf.init_scope() if _backend.TENSORFLOW else contextlib.nullcontext()


# ----------------------------------------------------------------------------- base class
class _BatchRiskLoss(keras.losses.Loss):
    """A risk over the per-example values of ``base_loss`` on the whole batch.

    ``__call__(y_true, y_pred, sample_weight)`` returns the scalar risk with the sample
    weights as reference probabilities ``pi_i = s_i / sum s`` (Keras masks multiply them).
    The ``reduction`` argument is accepted for API compatibility and ignored: the risk is
    not a per-example mean.

    The default base loss (``base_loss=None``, also what ``compile(loss="safe_kl_dro")`` and
    the other names use) is sparse categorical cross-entropy on logits, as every losszoo
    name takes logits. A ``y_pred`` carrying its logits (a model ending in Keras' softmax,
    ``_keras_logits``, or in a losszoo head) trains on those logits whenever the base loss
    takes logits (``from_logits=True``), as Keras' own cross-entropies do.

    Fail-loud: hyper-parameters are checked at construction (the error names the argument);
    NaN, Inf or negative sample weights and invalid labels (NaN in a floating ``y_true``;
    for a sparse categorical cross-entropy base loss, ids that are not whole numbers in
    ``[0, K)``) raise naming the argument, eagerly and through a graph assertion in ``fit``
    (skippable with ``losszoo.set_validation(False)``); a NaN per-example loss with positive
    weight makes the risk NaN (pair with ``keras.callbacks.TerminateOnNaN``). Under XLA:
    invalid sample weights make the risk and its gradients NaN, invalid labels make their
    examples' losses NaN and so the risk (zero-weight examples are ignored).
    """

    def __init__(
        self,
        base_loss=None,
        name=None,
        reduction="sum_over_batch_size",
        dtype=None,
    ):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self._base_fn, self._base_config = per_example_loss(base_loss)

    def per_example_losses(self, y_true, y_pred):
        """The base loss per example (float32 or float64), shape ``[batch, ...]``."""
        return self._base_fn(y_true, y_pred)

    def __call__(self, y_true, y_pred, sample_weight=None):
        # Keras' Loss.__call__ is bypassed (the risk is not a weighted mean): check the array
        # forms here, before the base loss converts them less clearly.
        contract.check_array_form(y_true, "y_true")
        contract.check_array_form(y_pred, "y_pred")
        with keras.name_scope(self.name):
            l = self.per_example_losses(y_true, y_pred)
            s = _weights_with_mask(sample_weight, y_pred, l)
            return ops.cast(self._risk(l, s), self.dtype)

    def call(self, y_true, y_pred):
        """Per-example base losses (Keras' ``Loss.call`` contract; the risk is ``__call__``)."""
        return self.per_example_losses(y_true, y_pred)

    def get_config(self):
        return {**super().get_config(), "base_loss": self._base_config}


class _DRODiagnostics(keras.metrics.Metric):
    """Running means of alpha, mean w and saturation in ONE variable (one update per step).

    This metric is ``<prefix>_alpha``; :meth:`views` gives it and two scalar metrics that
    read the same variable, ``<prefix>_mean_w`` and ``<prefix>_saturation``, so that each
    logged value has its own metric name (``model.metrics_names`` lists what ``evaluate``
    returns). One vector variable instead of three ``Mean`` trackers (six variables) keeps
    the training step lean.

    It also carries the loss's alpha state (``state``, given by the loss): as a metric
    variable of the model it is part of the training state Keras' JAX trainer passes in and
    out of its pure step. :meth:`reset_state` (every epoch) leaves it alone.
    """

    def __init__(self, prefix, name=None, dtype=None, state=None):
        super().__init__(name=name or f"{prefix}_alpha", dtype=dtype)
        self.prefix = prefix
        self.totals = self.add_variable(
            shape=(4,), initializer="zeros", dtype="float32", aggregation="sum", name="totals"
        )
        if state is not None:
            self.state = state  # tracked: one of this metric's variables
        # sub-metrics without variables of their own
        self._others = [
            _DRODiagnosticView(self._mean, i, f"{prefix}_{n}")
            for i, n in ((1, "mean_w"), (2, "saturation"))
        ]

    def views(self):
        """``[<prefix>_alpha (this metric), <prefix>_mean_w, <prefix>_saturation]``."""
        return [self, *self._others]

    def update_state(self, alpha, mean_w, saturation):
        row = [ops.cast(x, "float32") for x in (alpha, mean_w, saturation, 1.0)]
        return self.totals.assign_add(ops.stack(row))

    def reset_state(self):
        self.totals.assign(ops.zeros((4,), "float32"))

    def _mean(self, i):
        t = ops.convert_to_tensor(self.totals)
        return ops.divide_no_nan(t[i], t[3])

    def result(self):
        return self._mean(0)

    def get_config(self):
        return {"prefix": self.prefix, "name": self.name, "dtype": self.dtype}


class _DRODiagnosticView(keras.metrics.Metric):
    """Entry ``index`` of a :class:`_DRODiagnostics`' running means (no state of its own: it
    is updated and reset with that metric; ``read`` is the owner's bound ``_mean``, which
    Keras does not track, so the owner's variables are listed once in the model)."""

    def __init__(self, read, index, name):
        super().__init__(name=name)
        self._read, self._index = read, index

    def update_state(self, *args, **kwargs):
        """Nothing: the loss updates the owner metric."""

    def reset_state(self):
        """Nothing: the owner metric is reset with the model's metrics."""

    def result(self):
        return self._read(self._index)


# ----------------------------------------------------------------------------- safe-KL
@register(
    "safe_kl_dro",
    kind="loss",
    batch_risk=True,
    aliases=("safe_kl_dro_risk",),
    description=(
        "Safe-KL DRO risk (Gladin et al.): unbiased stochastic KL-DRO, trains its dual alpha"
    ),
)
class SafeKLDRORisk(_BatchRiskLoss):
    """Safe-KL distributionally robust risk of any per-example Keras loss.

    For per-example base losses ``l_i``, sample weights ``pi_i = s_i / sum s``, temperature
    ``lam`` and accuracy ``rho``::

        V = sum_i pi_i [alpha - lam + (lam/rho) softplus((l_i - alpha)/lam + log rho)]

    The model gets the reweighted ERM gradient ``sum_i pi_i w_i grad l_i`` with
    ``w_i = sigmoid(.)/rho in (0, 1/rho)``, an unbiased estimate of the gradient of the
    full-data objective, whose minimum over alpha is within ``lam rho n max p*`` of the
    KL-DRO risk ``R = lam log mean exp(l/lam)`` (and tends to CVaR_rho as lam -> 0). alpha is
    trained by the loss itself during ``fit`` (see ``docs/design/dro.md`` for the design);
    evaluation and prediction never move it.

    Args:
      base_loss: Keras loss (name, instance or function) computed per example; instances
        are re-created with ``reduction=None``. ``None`` (default): sparse categorical
        cross-entropy on logits (see the class docstring of ``_BatchRiskLoss``).
      lam: temperature (> 0, finite). Large lam -> ERM, small lam -> worst case.
      rho: accuracy in (0, 1); weights are capped at 1/rho. Smaller rho is closer to KL-DRO
        but stiffer (the model's step size should scale roughly with rho).
      alpha_init: initial alpha (loss units).
      init_alpha_from_batch: set alpha to the optimal value of the first training batch.
      alpha_learning_rate: fixed step size for alpha, or None to follow the compiled
        optimiser's current learning rate (fallback 1e-3 outside a Keras trainer).
      alpha_lr_multiplier: multiplies the step size above.
      alpha_optimizer: ``"newton"`` (default; damped Newton step with the exact curvature,
        see ``docs/design/dro.md``; ``alpha_learning_rate`` / ``alpha_lr_multiplier`` are
        ignored), ``"auto"`` (SGD if the model's optimiser is SGD, else Adam), ``"sgd"`` or
        ``"adam"``.
      alpha_damping: fraction of the Newton step taken per training step, in (0, 1].
      update_alpha: ``"auto"`` (train step / recording tape), ``True`` or ``False``.
      calibrate: report ``V`` (True) or the paper's ``G = V + lam`` (False).
      name, reduction, dtype: as for Keras losses (``reduction`` is ignored).

    Example:
      >>> x = np.random.default_rng(0).normal(size=(64, 16)).astype("float32")
      >>> y = np.random.default_rng(1).integers(0, 10, size=64)
      >>> model.compile(optimizer="adam", loss="safe_kl_dro")     # after `import losszoo`
      >>> loss = losszoo.losses.SafeKLDRORisk("mse", lam=2.0, rho=0.01)
      >>> model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
      >>> history = model.fit(x, np.eye(10)[y], verbose=0)   # logs safe_kl_dro_alpha, ...
      >>> bool(np.isfinite(float(loss.alpha)))
      True
    """

    def __init__(
        self,
        base_loss=None,
        lam: float = 1.0,
        rho: float = 0.1,
        alpha_init: float = 0.0,
        init_alpha_from_batch: bool = True,
        alpha_learning_rate=None,
        alpha_lr_multiplier: float = 1.0,
        alpha_optimizer: str = "newton",
        alpha_damping: float = 0.1,
        update_alpha="auto",
        calibrate: bool = True,
        name: str = "safe_kl_dro",
        reduction="sum_over_batch_size",
        dtype=None,
    ):
        super().__init__(base_loss=base_loss, name=name, reduction=reduction, dtype=dtype)
        self.lam = distribute.check_lam(lam)
        self.rho = distribute.check_rho(rho)
        self.alpha_init = contract.check_number(alpha_init, "alpha_init", tensor_ok=False)
        self.init_alpha_from_batch = contract.check_bool(
            init_alpha_from_batch, "init_alpha_from_batch"
        )
        self.alpha_learning_rate = contract.check_number(
            alpha_learning_rate, "alpha_learning_rate", low=0.0, allow_none=True, tensor_ok=False
        )
        self.alpha_lr_multiplier = contract.check_number(
            alpha_lr_multiplier, "alpha_lr_multiplier", low=0.0, tensor_ok=False
        )
        self.alpha_optimizer = contract.check_choice(
            alpha_optimizer, "alpha_optimizer", _dro_alpha.RULES
        )
        self.alpha_damping = contract.check_number(
            alpha_damping, "alpha_damping", low=0.0, low_open=True, high=1.0, tensor_ok=False
        )
        if not (isinstance(update_alpha, bool) or update_alpha == "auto"):
            raise ValueError(f"`update_alpha` must be 'auto', True or False, got {update_alpha!r}.")
        self.update_alpha = update_alpha
        self.calibrate = contract.check_bool(calibrate, "calibrate")
        _keras_hooks.install_trainer_hook()  # the first SafeKLDRORisk: Keras untouched till then
        with _init_scope():
            # [alpha, initialized, m, v, t]: alpha, the first-batch flag and alpha's optimiser
            # state in ONE variable: one read and one write per training step. Mirrored with
            # ONLY_FIRST_REPLICA under tf.distribute (every replica writes the same value).
            initial = self._initial_state(None)
            self._state = keras.Variable(
                # a callable: Keras defers it when the loss is built inside a stateless scope
                # (compile by name, resolved during the model's symbolic build on JAX)
                lambda shape, dtype: ops.convert_to_tensor(initial, dtype),
                shape=(5,),
                dtype="float32",
                trainable=False,
                autocast=False,
                aggregation="only_first_replica",
                synchronization="on_write",
                name=f"{name}_alpha_state",
            )
            self._diagnostics = _DRODiagnostics(name, state=self._state)

    # ---------------------------------------------------------------- public helpers
    @property
    def metrics(self):
        """The diagnostics metrics: ``<name>_alpha``, ``<name>_mean_w``, ``<name>_saturation``
        (running means over the steps since the last reset; one shared variable)."""
        return self._diagnostics.views()

    @property
    def alpha(self):
        """The current alpha (float32 scalar tensor, read from the loss's state variable)."""
        return ops.convert_to_tensor(self._state)[0]

    @property
    def initialized(self):
        """Whether alpha has been set (from the first training batch, a load or by hand)."""
        return ops.convert_to_tensor(self._state)[1] > 0.5

    def _initial_state(self, value):
        flag = 1.0 if (value is not None or not self.init_alpha_from_batch) else 0.0
        return [self.alpha_init if value is None else float(value), flag, 0.0, 0.0, 0.0]

    def reset_alpha(self, value=None):
        """Set alpha (default ``alpha_init``), clear its optimiser state and the init flag."""
        self._state.assign(self._initial_state(value))

    # ---------------------------------------------------------------- training logic
    def _check_distribution(self):
        if distribute.num_replicas() == 1:
            return
        tf = _backend.tf  # only tf.distribute has replicas
        value = self._state.value
        # Not a tf.Variable yet: created deferred in Keras' symbolic build (compile by name),
        # it is made when that build ends, inside the strategy's scope that Keras entered.
        if isinstance(value, tf.Variable) and not isinstance(
            value, tf.distribute.DistributedValues
        ):
            raise ValueError(
                "SafeKLDRORisk was created outside the active tf.distribute strategy's scope, "
                "so its alpha cannot be kept in sync across replicas. Create the loss (or "
                "compile with loss='safe_kl_dro') inside `strategy.scope()`."
            )

    def _risk(self, l, s):
        self._check_distribution()
        training, trainer = _training_flag(self.update_alpha, l)
        attached = _keras_hooks.add_metrics(trainer, self.metrics)
        _keras_hooks.store_loss_in_compile_config(_keras_hooks.current_trainer()[0], self)
        state = ops.convert_to_tensor(self._state)
        if attached and _backend.NAME == "jax":
            # Attached inside this step (a loss compiled by name is made inside Keras' first
            # loss computation): Keras' JAX trainer returns the value each metric variable has
            # in the step, so the state needs one.
            self._state.assign(state)
        # Bisection runs (ops.cond) only until alpha has been initialised.
        solve = ops.logical_not(state[1] > 0.5) if self.init_alpha_from_batch else None
        value, stats = distribute.safe_kl_dro_risk_and_stats_global(
            l, state[0], self.lam, self.rho, s, self.calibrate, solve_alpha=solve
        )
        alpha, mean_w, sat, curv = (
            ops.cast(stats[k], "float32") for k in ("alpha", "mean_w", "saturation", "curvature")
        )
        # Stateful updates: run in program order (TensorFlow's automatic control
        # dependencies; Keras' stateless scope on JAX; eagerly on PyTorch).
        self._diagnostics.update_state(alpha, mean_w, sat)
        if training:
            opt = getattr(trainer, "optimizer", None)
            nonempty = stats["total_weight"] > 0
            new_state = _dro_alpha.next_state(state, alpha, mean_w, curv, nonempty, self, opt)
            self._state.assign(new_state)
        return value

    def call(self, y_true, y_pred):
        """Per-example terms ``alpha - lam + (lam/rho) softplus(z_i)`` at the current alpha.

        Their mean is the risk (without sample weights). Keras' ``Loss.call`` contract only:
        training goes through ``__call__``, in Keras 3 and in tf_keras / TFRS alike (see
        "tf_keras and TFRS" in ``docs/design/dro.md``); this method never moves alpha.
        """
        l = self.per_example_losses(y_true, y_pred)
        a = ops.cast(self.alpha, contract.dtype_name(l))
        z = (l - a) / self.lam + ops.log(ops.convert_to_tensor(self.rho, contract.dtype_name(l)))
        terms = a + (self.lam / self.rho) * ops.softplus(z)
        return terms - self.lam if self.calibrate else terms

    def get_config(self):
        state = _backend.static_value(ops.copy(self._state))  # None when traced
        alpha = self.alpha_init if state is None else float(state[0])
        initialized = state is not None and bool(state[1] > 0.5)
        return {
            **super().get_config(),
            "lam": self.lam,
            "rho": self.rho,
            "alpha_init": alpha,
            "init_alpha_from_batch": self.init_alpha_from_batch and not initialized,
            "alpha_learning_rate": self.alpha_learning_rate,
            "alpha_lr_multiplier": self.alpha_lr_multiplier,
            "alpha_optimizer": self.alpha_optimizer,
            "alpha_damping": self.alpha_damping,
            "update_alpha": self.update_alpha,
            "calibrate": self.calibrate,
        }


# ----------------------------------------------------------------------------- baselines
class _TemperedBatchRiskLoss(_BatchRiskLoss):
    """A batch risk with a temperature ``lam``, computed by the op in ``_op(l, lam, s)``;
    ``name`` defaults to the subclass's registered name, ``_default_name``."""

    _op = None
    _default_name = None

    def __init__(
        self,
        base_loss=None,
        lam: float = 1.0,
        name: str | None = None,
        reduction="sum_over_batch_size",
        dtype=None,
    ):
        name = self._default_name if name is None else name
        super().__init__(base_loss=base_loss, name=name, reduction=reduction, dtype=dtype)
        self.lam = distribute.check_lam(lam)

    def _risk(self, l, s):
        return self._op(l, self.lam, s)

    def get_config(self):
        return {**super().get_config(), "lam": self.lam}


@register(
    "kl_dro_batch_lse",
    kind="loss",
    batch_risk=True,
    description=(
        "Naive mini-batch KL-DRO risk lam*log mean exp(l/lam) over the batch (biased baseline)"
    ),
)
class KLDROBatchLSE(_TemperedBatchRiskLoss):
    """Mini-batch LogSumExp KL-DRO risk ``lam log sum_i pi_i exp(l_i/lam)`` (biased baseline).

    The exact KL-DRO risk of the batch (Levy et al. 2020); its expectation underestimates the
    full-data risk and its gradient is biased unless the batch is the whole data set. Under a
    multi-replica strategy the risk is that of the global batch (see ``docs/design/dro.md``,
    "Distribution"). Fail-loud behaviour as :func:`losszoo.ops.kl_dro_batch_lse`.

    Args:
      base_loss: Keras loss computed per example; ``None`` (default): sparse categorical
        cross-entropy on logits.
      lam: temperature (> 0).

    Example:
      >>> model.compile("sgd", loss=losszoo.losses.KLDROBatchLSE("mse", lam=2.0))
    """

    _op = staticmethod(distribute.kl_dro_batch_lse_global)
    _default_name = "kl_dro_batch_lse"


@register(
    "kl_dro_sumexp",
    kind="loss",
    batch_risk=True,
    description="Sum-of-exp KL-DRO objective mean exp(l/lam) (unbiased, overflow-prone baseline)",
)
class KLDROSumExp(_TemperedBatchRiskLoss):
    """Sum-of-exp KL-DRO objective ``sum_i pi_i exp(l_i/lam)`` (paper eq. 21 baseline).

    Same minimisers as the KL-DRO risk and unbiased, but overflows for ``l/lam > 88`` in
    float32 and has large gradient variance; use small step sizes. Global-batch semantics
    under a multi-replica strategy, as every DRO loss here.

    Args:
      base_loss: Keras loss computed per example; ``None`` (default): sparse categorical
        cross-entropy on logits.
      lam: temperature (> 0).

    Example:
      >>> model.compile("sgd", loss=losszoo.losses.KLDROSumExp(lam=1.0))
    """

    _op = staticmethod(distribute.kl_dro_sumexp_global)
    _default_name = "kl_dro_sumexp"


@register(
    "cvar",
    kind="loss",
    batch_risk=True,
    aliases=("cvar_risk",),
    description="CVaR at level rho of the per-example losses (mean of the worst rho fraction)",
)
class CVaRLoss(_BatchRiskLoss):
    """Conditional value at risk at level rho of the batch's per-example losses.

    ``CVaR_rho = min_a a + (1/rho) sum_i pi_i (l_i - a)_+``, the mean of the worst ``rho``
    fraction (computed exactly); the limit of the safe-KL risk as ``lam -> 0``. Under a
    multi-replica strategy the tail is that of the global batch (all-gathered losses in
    replica order, ties split as on one device). A NaN loss makes the value NaN.

    Args:
      base_loss: Keras loss computed per example; ``None`` (default): sparse categorical
        cross-entropy on logits.
      rho: level in (0, 1).

    Example:
      >>> model.compile("adam", loss=losszoo.losses.CVaRLoss(rho=0.2))
    """

    def __init__(
        self,
        base_loss=None,
        rho: float = 0.1,
        name: str = "cvar",
        reduction="sum_over_batch_size",
        dtype=None,
    ):
        super().__init__(base_loss=base_loss, name=name, reduction=reduction, dtype=dtype)
        self.rho = distribute.check_rho(rho)

    def _risk(self, l, s):
        return distribute.cvar_risk_global(l, self.rho, s)

    def get_config(self):
        return {**super().get_config(), "rho": self.rho}


def find_dro_losses(model):
    """The :class:`SafeKLDRORisk` instances a compiled Keras 3 model uses (after its first
    train/evaluate call when compiled by name)."""
    found = [x for x in _keras_hooks.compiled_losses(model) if isinstance(x, SafeKLDRORisk)]
    user = keras.tree.flatten(getattr(model, "loss", None))
    return found or [x for x in user if isinstance(x, SafeKLDRORisk)]
