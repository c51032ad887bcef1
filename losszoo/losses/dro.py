"""Keras losses: the safe-KL DRO risk (trains its own dual scalar alpha) and its baselines.

Maths: :mod:`losszoo.ops._dro` (spec ``shared/specs/safe_kl_dro.md``). This module only
handles configuration, the base loss, sample weights, and the state of alpha.

How alpha is trained under ``model.compile(loss="safe_kl_dro")`` + plain ``model.fit``
----------------------------------------------------------------------------------------
Keras 3 does not track variables owned by a loss passed to ``compile`` (they are never in
``model.trainable_variables``), so the optimiser cannot train alpha. Instead the loss owns
alpha (in one **non-trainable float32 state variable** ``[alpha, initialised, m, v, t]``,
one read and one write per step) and moves it itself, inside the training step, from the
exact statistics of the same fused pass as the risk (``sum pi w`` and the curvature
``sum pi w (1 - rho w)``):

* ``alpha_optimizer="newton"`` (default): a damped Newton step on the stationarity equation
  in log form, ``log sum pi w = 0``, with the exact curvature:
  ``alpha += alpha_damping * lam * log(mean_w) * clip(mean_w / curvature, 1, 1/rho)``.
  Scale-free (loss units via lam, independent of the model's learning rate), exact in one
  step in the KL regime (rho w << 1), bounded per step. It removes the alpha lag of
  gradient steps (which move alpha by at most ~lr per step, so when the losses fall fast
  alpha stays far above them, every w ~ 0 and the model stops training; spec 2.6). Caveat:
  its fixed point is ``E[log mean_w] = 0`` rather than ``E[mean_w] = 1``; when the batch
  weights are very heavy-tailed (loss spread >> lam) the logged mean w stays below 1.
  ``alpha_damping`` (default 0.1) is the fraction of the step taken.
* ``alpha_optimizer="auto"`` mirrors the model's optimiser family: SGD (with the model's
  momentum / Nesterov flag) when the compiled optimiser is ``keras.optimizers.SGD``, else
  Adam (beta 0.9 / 0.999). Explicit ``"sgd"`` / ``"adam"`` are accepted.
* The step size is ``alpha_lr_multiplier * lr`` where ``lr`` is the compiled optimiser's
  *current* learning rate (schedules included) when ``alpha_learning_rate is None``
  (default), or ``alpha_learning_rate``. This is the spec's reparametrisation
  ``alpha = kappa * alpha_raw`` made explicit (spec 2.6): under Adam a multiplier kappa gives
  about ``kappa * lr`` per step.
* ``init_alpha_from_batch=True`` (default) sets alpha on the first training batch to the
  batch's optimal alpha (bisection of ``sum pi w = 1``, spec 7 C0), inside the compiled
  step behind a ``tf.cond`` on the flag in the state variable; until then evaluation uses the batch
  solution without storing it.

**When does alpha move?** Only in a training step. ``import losszoo`` changes nothing in
Keras. The first :class:`SafeKLDRORisk` built in a process wraps Keras 3's private
``Trainer._compute_loss`` (the single entry point that ``train_step`` and ``test_step``
call, with ``training=True`` / ``False``) so that it publishes ``(model, training)`` to a
thread-local context during the call; the loss reads it at trace time. Hence ``fit`` moves
alpha; ``evaluate``, the validation pass of ``fit``, ``predict`` and the symbolic build never
do. Outside a Keras 3 trainer (custom loops, tf_keras / TFRS) the loss falls back to "a
GradientTape is recording", i.e. alpha moves exactly when you are computing gradients of the
loss (tf_keras' ``train_step`` records, its ``test_step`` does not). If a Keras release
moves the private method, the loss warns once and uses the tape rule everywhere.
``update_alpha=True`` / ``False`` overrides both rules, and the context manager
:func:`alpha_updates` overrides them temporarily.

**Distribution.** Every DRO loss here has global-batch semantics: under
``MirroredStrategy`` (or any strategy with a replica context) N replicas give the same loss,
gradients and alpha as one device with the same global batch. For the safe-KL risk the
variables are mirrored with ``ONLY_FIRST_REPLICA`` aggregation and every replica applies the
identical update computed from all-reduced sums (``sum s w``, ``sum s``), so alpha is one
value across replicas and the update uses the exact global-batch gradient; the value is
normalised by the global ``sum s`` so that Keras' sum over replicas gives the exact
global-batch risk. The baselines compute the global risk with collectives in the forward
pass only (``kl_dro_batch_lse``: shared max shift and all-reduced sums; ``kl_dro_sumexp``:
global ``sum s``; ``cvar``: all-gathered losses, each replica keeping its slice of the tail
masses); each replica returns ``risk / N`` with the exact gradient of the global risk for its
own examples. Uneven splits (a ragged last batch) are exact too. Under a single-process
``MirroredStrategy`` these cross-replica sums and gathers are plain copies inside
``merge_call``, not collective ops: TF starts every ``MirroredStrategy``'s collective keys at
the same numbers, so a loss's collectives under a second strategy in the same process met the
first strategy's gradient all-reduce at the same keys and aborted (issue 19 item 15); other
strategies (multi-worker) use collectives. Create the safe-KL loss (or compile with the
string name) inside ``strategy.scope()``; an instance created outside the scope raises a
clear error when used under a multi-replica strategy.

**tf_keras and TFRS.** ``losszoo.tf_keras_loss("safe_kl_dro", ...)`` (and
``compile(loss="safe_kl_dro")`` in a tf_keras model, ``TF_USE_LEGACY_KERAS=1`` for TFRS)
computes the same risk and trains alpha: tf_keras' and TFRS' ``train_step`` record a
GradientTape, so alpha moves there (same update as under Keras 3), and their
``test_step`` / ``evaluate`` never move it. Differences from Keras 3: the diagnostics are not
added to tf_keras' logs (read ``adapter.losszoo_loss.alpha``), and with
``alpha_optimizer="auto" | "sgd" | "adam"`` and no ``alpha_learning_rate`` the step size is
1e-3 (the model's optimiser is not visible), so prefer the default ``"newton"``. The same
adapter makes the baselines (``cvar``, ``kl_dro_batch_lse``, ``kl_dro_sumexp``) compute their
batch risk under tf_keras (before, tf_keras averaged the per-example base losses: plain ERM).

**Diagnostics in the logs.** The loss owns one Keras metric (one vector variable) whose
dict result gives ``<name>_alpha``, ``<name>_mean_w`` (-> 1 at equilibrium) and
``<name>_saturation``
(``rho * max w``; near 1 means the weight cap binds, CVaR regime). On its first call inside a
Keras train/test step it appends them to the model's metrics, so they appear in ``fit`` /
``evaluate`` logs (epoch averages, reset with the other metrics; ``val_`` versions in
validation). The current alpha is also ``loss.alpha`` (a float32 tensor read from the state;
set it with ``loss.reset_alpha(value)``).

**Cost.** On a small MLP (64-256-10, batch 256, Adam, CPU) a full ``fit`` step costs about
1.04-1.13x the ERM step (``benchmarks/bench_dro.py``, interleaved medians on a noisy shared
machine); the first-batch ``tf.cond`` accounts for a few percent in graph mode
(``init_alpha_from_batch=False`` removes it).

**MirroredStrategy + jit_compile=True.** Not supported by Keras 3 / TF here even for plain
ERM with 2 logical CPU devices (variable placed on the wrong device); use
``jit_compile=False`` under MirroredStrategy.

**Saving.** ``get_config`` stores the *current* alpha as ``alpha_init`` (and turns off the
first-batch init once alpha has been initialised), so a model saved and loaded resumes with
the same alpha (optimiser state of alpha is reset). Keras saves the ``loss`` given to
``compile``; for a model compiled with the *string* ``"safe_kl_dro"`` that would be the
name, and loading would build a fresh loss (alpha re-solved from the first batch). So the
loss, when it first runs in that model's train/test step, puts itself in place of the name
in the model's compile config (a single loss given by name; in a nested ``loss`` structure
the names stay).
"""

from __future__ import annotations

import contextlib
import threading
import warnings

import keras
import tensorflow as tf
from tensorflow.python.eager import record as _tf_record

from losszoo import ops
from losszoo._logits import attached_logits
from losszoo.losses._targets import SampleWeightCheck, class_ids_and_invalid
from losszoo.ops import _common as ops_common
from losszoo.ops import _dro as dro_ops
from losszoo.ops._dro import _prepare, check_lam, check_rho
from losszoo.registry import register

__all__ = [
    "CVaRLoss",
    "KLDROBatchLSE",
    "KLDROSumExp",
    "SafeKLDRORisk",
    "alpha_updates",
    "find_dro_losses",
]

# ----------------------------------------------------------------------------- training flag
_state = threading.local()


def _stack(name):
    if not hasattr(_state, name):
        setattr(_state, name, [])
    return getattr(_state, name)


@contextlib.contextmanager
def alpha_updates(enabled: bool):
    """Force (``True``) or forbid (``False``) alpha updates of safe-KL losses in this block.

    The decision is taken when a step is traced, so use it around the first call of a
    ``tf.function`` (or around eager code).
    """
    _stack("override").append(bool(enabled))
    try:
        yield
    finally:
        _stack("override").pop()


def _install_trainer_hook():
    """Wrap ``keras.src.trainers.trainer.Trainer._compute_loss`` to publish the training flag.

    Called by :class:`SafeKLDRORisk` when one is built, never at import: Keras stays
    untouched for users who do not use a DRO loss. Idempotent. The wrapper only pushes
    ``(model, training)`` to a thread-local stack around the original call. Returns whether
    the hook is in place; if this Keras has no such method, the loss falls back to the
    tape rule (alpha moves when a ``GradientTape`` records) and warns once.
    """
    try:
        from keras.src.trainers import trainer as trainer_module

        cls = trainer_module.Trainer
    except (ImportError, AttributeError):  # pragma: no cover - Keras layout changed
        cls = None
    original = None if cls is None else cls.__dict__.get("_compute_loss")
    if original is None:  # pragma: no cover - Keras layout changed
        if not _HOOK["warned"]:
            _HOOK["warned"] = True
            warnings.warn(
                "losszoo.SafeKLDRORisk could not find Keras' Trainer._compute_loss in this "
                f"Keras ({keras.__version__}); it tells training from evaluation by the "
                "GradientTape rule instead and cannot add its diagnostics to the logs.",
                RuntimeWarning,
                stacklevel=3,
            )
        return False
    if getattr(original, "_losszoo_dro_hook", False):
        return True

    def _compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        _stack("trainer").append((self, bool(training)))
        try:
            return original(self, x, y, y_pred, sample_weight=sample_weight, training=training)
        finally:
            _stack("trainer").pop()

    _compute_loss._losszoo_dro_hook = True
    _compute_loss.__wrapped__ = original
    _compute_loss.__doc__ = original.__doc__
    cls._compute_loss = _compute_loss
    return True


_HOOK = {"warned": False}


def _current_trainer():
    st = _stack("trainer")
    return st[-1] if st else (None, None)


# ----------------------------------------------------------------------------- helpers
def _python_number(value, name, **rules):
    """A hyper-parameter given as a Python number (never a tensor), checked by ``rules``."""
    if isinstance(value, (tf.Tensor, tf.Variable)):
        raise TypeError(f"`{name}` must be a Python number, not a tensor.")
    return ops_common.check_number(value, name, **rules)


def _resolve_base_loss(base_loss):
    """Return ``(fn, config)`` where ``fn(y_true, y_pred)`` gives per-example losses.

    ``None`` is the default: sparse categorical cross-entropy on logits. ``fn`` checks the
    labels and uses attached logits as :func:`_checked_base` describes.
    """
    if base_loss is None:
        base_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if isinstance(base_loss, dict):
        base_loss = keras.losses.deserialize(base_loss)
    obj = keras.losses.get(base_loss) if isinstance(base_loss, str) else base_loss
    if obj is None:
        raise ValueError("`base_loss` must be a Keras loss (name, instance or function), got None.")
    if isinstance(obj, keras.losses.Loss):
        config = base_loss if isinstance(base_loss, str) else keras.losses.serialize(obj)
        cfg = obj.get_config()
        takes_logits = cfg.get("from_logits") is True
        sparse = isinstance(obj, keras.losses.SparseCategoricalCrossentropy)
        sparse = sparse and cfg.get("ignore_class") is None
        if "reduction" in cfg:
            cfg["reduction"] = None
            obj = obj.__class__.from_config(cfg)
        else:  # pragma: no cover - exotic losses without reduction in their config
            inner = obj

            def obj(y_true, y_pred):
                return inner.call(y_true, y_pred)

        return _checked_base(obj, takes_logits, sparse), config
    if callable(obj):
        config = base_loss if isinstance(base_loss, str) else keras.losses.serialize(obj)
        sparse = obj is keras.losses.sparse_categorical_crossentropy
        return _checked_base(obj, False, sparse), config
    raise TypeError(
        f"`base_loss` must be a Keras loss name, instance or callable, got {base_loss!r}."
    )


def _checked_base(fn, takes_logits, sparse_ids):
    """``fn`` with the fail-loud label checks, reading attached logits if it takes logits.

    * ``takes_logits`` (a Keras loss with ``from_logits=True``, the default base loss): a
      ``y_pred`` that carries its logits (Keras' softmax, ``_keras_logits``, or a losszoo
      head) is replaced by them, so a model ending in a softmax trains on its logits.
    * ``sparse_ids`` (sparse categorical cross-entropy without ``ignore_class``): ``y_true``
      must hold class ids in ``[0, K)``, whole numbers if floating (Keras would cast NaN or
      1.5 to some id, and XLA gives any id a finite loss).
    * otherwise a floating ``y_true`` must not hold NaN.

    Eagerly and in graphs a violation raises naming ``y_true`` (skipped with
    ``losszoo.set_validation(False)``); under XLA the affected examples' losses are NaN, so a
    positive weight makes the risk NaN.
    """

    def per_example(y_true, y_pred):
        logits = attached_logits(y_pred) if takes_logits else None
        if logits is not None:
            y_pred = logits
        if sparse_ids:
            ids, invalid = class_ids_and_invalid(y_true, tf.convert_to_tensor(y_pred))
            return ops_common.nan_where(invalid, fn(ids, y_pred))
        y_true = tf.convert_to_tensor(y_true)
        if not y_true.dtype.is_floating:
            return fn(y_true, y_pred)
        y_true = ops_common.check_not_nan(y_true, "y_true")
        values = tf.convert_to_tensor(fn(y_true, y_pred))
        return ops_common.nan_where(_per_row(tf.math.is_nan(y_true), values), values)

    return per_example


def _per_row(flags, values):
    """``flags`` (``y_true``'s shape) reduced to ``values``' shape: per example when
    ``y_true``'s leading axes are the losses' axes, else one flag for the whole batch."""
    r, k = values.shape.rank, flags.shape.rank
    if (
        r is not None
        and k is not None
        and k >= r
        and flags.shape[:r].is_compatible_with(values.shape)
    ):
        return tf.reduce_any(flags, axis=list(range(r, k)))
    return tf.reduce_any(flags)


def _per_example(fn, y_true, y_pred):
    values = fn(y_true, y_pred)
    values = tf.convert_to_tensor(values)
    if values.shape.rank == 0:
        raise ValueError(
            "`base_loss` returned a scalar; the DRO risk needs per-example losses. Pass a "
            "Keras loss that reduces over the batch only via its `reduction` (instances are "
            "re-created with reduction=None) or a function returning shape [batch, ...]."
        )
    return tf.cast(values, tf.float32) if values.dtype != tf.float64 else values


def _keras_mask(y_pred):
    return getattr(y_pred, "_keras_mask", None)


def _weights_with_mask(sample_weight, y_pred, shape_ref):
    mask = _keras_mask(y_pred)
    if mask is None:
        return sample_weight
    mask = tf.cast(mask, shape_ref.dtype)
    if sample_weight is None:
        return mask
    sw = tf.cast(sample_weight, shape_ref.dtype)
    while sw.shape.rank is not None and sw.shape.rank < mask.shape.rank:
        sw = sw[..., None]
    return sw * mask


def _num_replicas():
    return tf.distribute.get_strategy().num_replicas_in_sync


def _cross_replica(values, combine, collective):
    """Combine a list of per-replica tensors across replicas (identity without distribution).

    Under a single-process ``MirroredStrategy`` the per-replica values are combined by
    ``combine`` on the local copies inside ``merge_call`` (plain copies, no collective ops):
    every ``MirroredStrategy`` in a process starts its collective group and instance keys at
    the same numbers, so collectives of a strategy built after another one, with other
    shapes at the same keys, abort the process' collective executor (a second strategy in a
    notebook or a sweep). Other strategies (multi-worker) use ``collective(ctx, values)``.
    """
    ctx = tf.distribute.get_replica_context()
    if _num_replicas() == 1 or ctx is None:  # cross-replica context (e.g. symbolic build)
        return values
    strategy = tf.distribute.get_strategy()
    use_merge = getattr(strategy.extended, "_use_merge_call", lambda: True)()
    if isinstance(strategy, tf.distribute.MirroredStrategy) and use_merge:
        return ctx.merge_call(
            lambda s, *vs: [combine(list(s.experimental_local_results(v))) for v in vs],
            args=tuple(values),
        )
    return collective(ctx, values)


def _replica_sum(values):
    """All-reduce SUM a list of scalars across replicas (identity without distribution)."""
    return _cross_replica(
        values, tf.add_n, lambda ctx, vs: ctx.all_reduce(tf.distribute.ReduceOp.SUM, vs)
    )


def _replica_gather(values):
    """All-gather a tensor (or a list of tensors) along axis 0, in replica order."""
    flat = values if isinstance(values, list) else [values]
    out = _cross_replica(
        flat,
        lambda parts: tf.concat(parts, 0),
        lambda ctx, vs: [ctx.all_gather(v, axis=0) for v in vs],
    )
    return out if isinstance(values, list) else out[0]


def _replica_max(value):
    return tf.reduce_max(_replica_gather(tf.reshape(value, [1])))


# ----------------------------------------------------------------------------- base class
class _BatchRiskLoss(SampleWeightCheck, keras.losses.Loss):
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
        self._base_fn, self._base_config = _resolve_base_loss(base_loss)

    def per_example_losses(self, y_true, y_pred):
        """The base loss per example (float32 or float64), shape ``[batch, ...]``."""
        return _per_example(self._base_fn, y_true, y_pred)

    def __call__(self, y_true, y_pred, sample_weight=None):
        with tf.name_scope(self.name):
            l = self.per_example_losses(y_true, y_pred)
            s = _weights_with_mask(sample_weight, y_pred, l)
            value = self._risk(l, s)
            return keras.ops.cast(value, self.dtype)

    def call(self, y_true, y_pred):
        """Per-example base losses (Keras' ``Loss.call`` contract; the risk is ``__call__``)."""
        return self.per_example_losses(y_true, y_pred)

    def _risk(self, l, s):  # pragma: no cover - abstract
        raise NotImplementedError

    @staticmethod
    def _refine_tf_keras_adapter(adapter):
        """tf_keras (and so TFRS) adapter that computes the batch risk, not a mean.

        The generic adapter reduces what ``call`` returns per example, which for a batch
        risk would silently be plain ERM. This one calls the Keras 3 loss's ``__call__``
        (the whole risk, sample weights as reference probabilities; safe-KL alpha moves in
        training steps by the GradientTape rule, as tf_keras' and TFRS' ``train_step``
        record a tape and their ``test_step`` does not). Its ``reduction`` is ``SUM``
        whatever is asked: the risk is not a per-example mean, and tf_keras then counts
        the replicas' shares of the global-batch risk correctly in its loss metric.
        """
        import tf_keras

        class BatchRiskAdapter(adapter):
            def __init__(self, reduction=None, name=None, **config):
                del reduction  # ignored, see above
                super().__init__(reduction=tf_keras.losses.Reduction.SUM, name=name, **config)

            def __call__(self, y_true, y_pred, sample_weight=None):
                return self.losszoo_loss(y_true, y_pred, sample_weight=sample_weight)

            def get_config(self):
                inner = {
                    k: v
                    for k, v in self.losszoo_loss.get_config().items()
                    if k not in ("name", "reduction", "dtype")
                }
                return {**super().get_config(), **inner}

        return BatchRiskAdapter

    def get_config(self):
        return {**super().get_config(), "base_loss": self._base_config}


def _multi_replica():
    return _num_replicas() > 1 and tf.distribute.get_replica_context() is not None


def _global_flag(flag, dtype):
    """A scalar bool that is true on every replica if it is true on any."""
    if flag is None:
        return None
    return _replica_sum([tf.cast(flag, dtype)])[0] > 0


def _global_share(fn, l):
    """Global-batch value under a multi-replica strategy.

    ``fn(l)`` returns ``(V, g)``: the global-batch risk ``V`` (computed with collectives, the
    same on every replica) and its exact gradient ``g = dV/dl`` for this replica's losses.
    Each replica returns ``V / n_replicas`` with the gradient ``g``: Keras sums the replicas'
    losses and gradients, so the model gets exactly the global-batch value and gradient of
    one device, and Keras' logged loss (replica values unscaled by ``n`` and averaged) is
    ``V`` however unevenly the batch was split. No collective runs in the backward pass.
    """
    inv_n = 1.0 / _num_replicas()

    @tf.custom_gradient
    def share(l):
        value, g = fn(l)

        def grad(dv):
            return dv * g

        return value * tf.constant(inv_n, value.dtype), grad

    return share(l)


def _shown_as(x, shown):
    """``shown`` as the value, with the gradient of ``x`` (``shown`` gets none)."""
    shown = tf.stop_gradient(tf.cast(shown, x.dtype))

    @tf.custom_gradient
    def f(x):
        return tf.identity(shown), lambda dv: dv

    return f(x)


def _global_batch_lse(l, s, lam):
    """``kl_dro_batch_lse`` over the global batch (shared max shift, all-reduced sums)."""
    l, s, _, bad = _prepare(l, s)
    bad = _global_flag(dro_ops._any(bad, dro_ops._live_nan(l, s)), l.dtype)

    def fn(l):
        a, m = dro_ops._batch_lse_parts(l, s, lam)
        ex, m_safe, m_inf = dro_ops._batch_lse_exp(a, s, _replica_max(m))
        tot, s_sum = _replica_sum([tf.reduce_sum(ex), tf.reduce_sum(s)])
        val = dro_ops._batch_lse_value(lam, m_safe, m_inf, tot, s_sum)
        return (dro_ops._poison(bad, val), dro_ops._poison(bad, tf.math.divide_no_nan(ex, tot)))

    return _global_share(fn, l)


def _global_sumexp(l, s, lam):
    """``kl_dro_sumexp`` over the global batch (pi normalised by the global weight sum)."""
    l, s, _, bad = _prepare(l, s)
    bad = _global_flag(bad, l.dtype)

    def fn(l):
        (s_sum,) = _replica_sum([tf.reduce_sum(s)])
        live = s > 0
        pi = tf.where(live, tf.math.divide_no_nan(s, s_sum), tf.zeros_like(s))
        ex = tf.where(live, tf.exp(l * tf.constant(1.0 / lam, l.dtype)), tf.zeros_like(l))
        (val,) = _replica_sum([tf.reduce_sum(pi * ex)])
        return (
            dro_ops._poison(bad, val),
            dro_ops._poison(bad, pi * ex * tf.constant(1.0 / lam, l.dtype)),
        )

    return _global_share(fn, l)


def _global_cvar(l, s, rho):
    """``cvar_risk`` over the global batch: the tail masses come from the all-gathered
    losses in replica order (what one device sees), each replica keeps its own slice."""
    l, s, _, bad = _prepare(l, s)
    bad = _global_flag(dro_ops._any(bad, dro_ops._live_nan(l, s)), l.dtype)
    ctx = tf.distribute.get_replica_context()
    n_local = tf.shape(l)[:1]
    sizes, l_all, s_all = _replica_gather([n_local, tf.stop_gradient(l), s])
    offset = tf.reduce_sum(sizes[: ctx.replica_id_in_sync_group])
    q = tf.slice(dro_ops._cvar_tail_mass(l_all, s_all, rho), offset[None], n_local)
    q = tf.stop_gradient(q)

    def fn(l):
        dt = l.dtype
        (val,) = _replica_sum([tf.reduce_sum(tf.where(q > 0, q * l, tf.zeros_like(l)))])
        val = val * tf.constant(1.0 / rho, dt)
        return dro_ops._poison(bad, val), dro_ops._poison(bad, q * tf.constant(1.0 / rho, dt))

    return _global_share(fn, l)


class _DRODiagnostics(keras.metrics.Metric):
    """Running means of alpha, mean w and saturation in ONE variable (one update per step).

    ``result()`` is a dict, which Keras' ``get_metrics_result`` spreads into the logs as
    ``<prefix>_alpha``, ``<prefix>_mean_w`` and ``<prefix>_saturation``. One vector variable
    instead of three ``Mean`` trackers (six variables) keeps the training step lean.
    """

    def __init__(self, prefix, name=None, dtype=None):
        super().__init__(name=name or f"{prefix}_diagnostics", dtype=dtype)
        self.prefix = prefix
        self.totals = self.add_variable(
            shape=(4,), initializer="zeros", dtype="float32", aggregation="sum", name="totals"
        )

    def update_state(self, alpha, mean_w, saturation):
        row = tf.stack(
            [
                tf.cast(alpha, tf.float32),
                tf.cast(mean_w, tf.float32),
                tf.cast(saturation, tf.float32),
                tf.ones([], tf.float32),
            ]
        )
        return self.totals.assign_add(row)

    def result(self):
        t = tf.convert_to_tensor(self.totals)
        mean = tf.math.divide_no_nan(t[:3], t[3])
        return {
            f"{self.prefix}_alpha": mean[0],
            f"{self.prefix}_mean_w": mean[1],
            f"{self.prefix}_saturation": mean[2],
        }

    def get_config(self):
        return {"prefix": self.prefix, "name": self.name, "dtype": self.dtype}


# ----------------------------------------------------------------------------- safe-KL
@register(
    "safe_kl_dro",
    kind="loss",
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
    trained by the loss itself during ``fit`` (see the module docstring for the design);
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
        see the module docstring; ``alpha_learning_rate`` / ``alpha_lr_multiplier`` are
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
        self.lam = check_lam(lam)
        self.rho = check_rho(rho)
        self.alpha_init = _python_number(alpha_init, "alpha_init")
        self.init_alpha_from_batch = dro_ops._check_bool(
            init_alpha_from_batch, "init_alpha_from_batch"
        )
        self.alpha_learning_rate = _python_number(
            alpha_learning_rate, "alpha_learning_rate", low=0.0, allow_none=True
        )
        self.alpha_lr_multiplier = _python_number(
            alpha_lr_multiplier, "alpha_lr_multiplier", low=0.0
        )
        ops_common.check_choice(
            alpha_optimizer, "alpha_optimizer", ("newton", "auto", "sgd", "adam")
        )
        self.alpha_optimizer = alpha_optimizer
        self.alpha_damping = _python_number(
            alpha_damping, "alpha_damping", low=0.0, low_open=True, high=1.0
        )
        if not any(update_alpha is v for v in ("auto", True, False)) and update_alpha != "auto":
            raise ValueError(f"`update_alpha` must be 'auto', True or False, got {update_alpha!r}.")
        self.update_alpha = update_alpha
        self.calibrate = dro_ops._check_bool(calibrate, "calibrate")
        _install_trainer_hook()  # first SafeKLDRORisk only: Keras is untouched until then
        self._strategy = tf.distribute.get_strategy()
        with tf.init_scope():
            kw = {
                "trainable": False,
                "dtype": tf.float32,
                "synchronization": tf.VariableSynchronization.ON_WRITE,
                "aggregation": tf.VariableAggregation.ONLY_FIRST_REPLICA,
            }
            # [alpha, initialized, m, v, t]: alpha, the first-batch flag and alpha's optimiser
            # state in ONE variable: one read and one write per training step.
            self._state = tf.Variable(self._initial_state(None), name=f"{name}_alpha_state", **kw)
            self._diagnostics = _DRODiagnostics(name)

    # ---------------------------------------------------------------- public helpers
    @property
    def metrics(self):
        """The diagnostics metric (its result spreads into alpha, mean weight, saturation)."""
        return [self._diagnostics]

    @property
    def alpha(self):
        """The current alpha (float32 scalar tensor, read from the loss's state variable)."""
        return tf.convert_to_tensor(self._state)[0]

    @property
    def initialized(self):
        """Whether alpha has been set (from the first training batch, a load or by hand)."""
        return tf.convert_to_tensor(self._state)[1] > 0.5

    def _initial_state(self, value):
        flag = 1.0 if (value is not None or not self.init_alpha_from_batch) else 0.0
        return [self.alpha_init if value is None else float(value), flag, 0.0, 0.0, 0.0]

    def reset_alpha(self, value=None):
        """Set alpha (default ``alpha_init``), clear its optimiser state and the init flag."""
        self._state.assign(self._initial_state(value))

    def weights_of(self, y_true, y_pred):
        """Per-example weights ``w_i`` at the current alpha (no update)."""
        return ops.safe_kl_dro_weights(
            self.per_example_losses(y_true, y_pred), self.alpha, self.lam, self.rho
        )

    # ---------------------------------------------------------------- training logic
    def _is_training(self):
        override = _stack("override")
        if override:
            return override[-1], None
        trainer, training = _current_trainer()
        if self.update_alpha is not True and self.update_alpha is not False:
            if trainer is not None:
                return training, trainer
            return bool(_tf_record.could_possibly_record()), None
        return bool(self.update_alpha), trainer

    def _attach_metrics(self, trainer):
        if trainer is None:
            return
        own = getattr(trainer, "_metrics", None)
        if own is None:
            return
        for m in self.metrics:
            if not any(x is m for x in own):
                own.append(m)

    def _replace_name_in_compile_config(self, trainer):
        """Make ``model.save`` store this instance (with its alpha), not the name it was
        compiled with: Keras serialises ``compile(loss=...)`` as given."""
        compiled = getattr(getattr(trainer, "_compile_config", None), "config", None)
        if not isinstance(compiled, dict) or not isinstance(compiled.get("loss"), str):
            return
        entries = getattr(getattr(trainer, "_compile_loss", None), "_flat_losses", None) or []
        if any(entry.loss is self for entry in entries):
            compiled["loss"] = self

    def _learning_rate(self, trainer):
        if self.alpha_learning_rate is not None:
            lr = tf.constant(self.alpha_learning_rate, tf.float32)
        else:
            opt = getattr(trainer, "optimizer", None) if trainer is not None else None
            if opt is not None:
                lr = tf.cast(tf.convert_to_tensor(opt.learning_rate), tf.float32)
            else:
                lr = tf.constant(1e-3, tf.float32)
        return lr * tf.constant(self.alpha_lr_multiplier, tf.float32)

    def _optimizer_kind(self, trainer):
        if self.alpha_optimizer != "auto":
            return self.alpha_optimizer, 0.0, False
        opt = getattr(trainer, "optimizer", None) if trainer is not None else None
        opt = getattr(opt, "inner_optimizer", opt)
        if isinstance(opt, keras.optimizers.SGD):
            return "sgd", float(opt.momentum), bool(opt.nesterov)
        return "adam", 0.0, False

    def _newton_step(self, mean_w, curvature, nonempty):
        """Damped Newton step on ``log(sum pi w) = 0`` with the exact curvature (spec 2.6, 3.1).

        ``f(alpha) = log mean_w`` is decreasing with ``f' = -curvature / (lam mean_w)``, so the
        Newton step is ``lam log(mean_w) mean_w / curvature``: exactly ``lam log mean_w`` in
        the KL regime (rho w << 1, one step solves the batch), larger where the cap binds.
        The ratio ``mean_w / curvature`` is clipped to ``[1, 1/rho]`` (it diverges when every
        weight is saturated) and ``mean_w`` floored at 1e-30 (underflow), so a step is at most
        ``lam * 69`` down and ``lam log(1/rho) / rho`` up, before the damping.
        """
        tiny = tf.constant(1e-30, tf.float32)
        ratio = tf.clip_by_value(
            tf.math.divide_no_nan(mean_w, tf.maximum(curvature, tiny)), 1.0, 1.0 / self.rho
        )
        step = (self.alpha_damping * self.lam) * tf.math.log(tf.maximum(mean_w, tiny)) * ratio
        return tf.where(nonempty, step, tf.zeros_like(step))

    def _apply_update(self, alpha_used, state, mean_w, curvature, nonempty, trainer):
        one = tf.ones([], tf.float32)
        if self.alpha_optimizer == "newton":
            step = self._newton_step(mean_w, curvature, nonempty)
            return [
                self._state.assign(tf.stack([alpha_used + step, one, state[2], state[3], state[4]]))
            ]
        grad = tf.where(nonempty, 1.0 - mean_w, tf.zeros_like(mean_w))
        lr = self._learning_rate(trainer)
        kind, momentum, nesterov = self._optimizer_kind(trainer)
        m, v, t = state[2], state[3], state[4]
        if kind == "sgd":
            if momentum > 0.0:
                m = momentum * m - lr * grad
                step = momentum * m - lr * grad if nesterov else m
            else:
                step = -lr * grad
        else:
            b1, b2, eps = 0.9, 0.999, 1e-7
            t = t + 1.0
            m = b1 * m + (1.0 - b1) * grad
            v = b2 * v + (1.0 - b2) * grad * grad
            m_hat = m / (1.0 - tf.pow(b1, t))
            v_hat = v / (1.0 - tf.pow(b2, t))
            step = -lr * m_hat / (tf.sqrt(v_hat) + eps)
        return [self._state.assign(tf.stack([alpha_used + step, one, m, v, t]))]

    def _check_distribution(self):
        if _num_replicas() > 1 and not isinstance(self._state, tf.distribute.DistributedValues):
            raise ValueError(
                "SafeKLDRORisk was created outside the active tf.distribute strategy's scope, "
                "so its alpha cannot be kept in sync across replicas. Create the loss (or "
                "compile with loss='safe_kl_dro') inside `strategy.scope()`."
            )

    def _risk(self, l, s):
        self._check_distribution()
        training, trainer = self._is_training()
        if trainer is not None:
            self._attach_metrics(trainer)
        self._replace_name_in_compile_config(_current_trainer()[0])
        multi = _num_replicas() > 1
        if s is None:  # lean path: no weight vector at all (the common case in fit)
            l32, _ = ops_common.to_compute_dtype(l, "losses")
            l32, s32 = tf.reshape(l32, [-1]), None
        else:
            l32, s32, _, s_bad = _prepare(l, s)
        state = self._state.read_value()
        alpha_var = state[0]
        if self.init_alpha_from_batch:
            # Bisection only runs (tf.cond) until alpha has been initialised. No cross-replica
            # synchronisation is allowed inside the cond, so under a multi-replica strategy
            # the global batch is all-gathered before it (every replica then solves the same
            # global problem, exactly as one device would).
            init = state[1] > 0.5
            l_all, s_all = tf.stop_gradient(l32), s32
            if multi:
                # exact global-batch solution: gather the (few) losses of all replicas
                l_all = _replica_gather(l32)
                s_all = None if s32 is None else _replica_gather(s32)
            with _tf_record.stop_recording():  # no gradient: keeps XLA free of cond grads
                solved = tf.cond(
                    init,
                    lambda: tf.zeros([], tf.float32),
                    lambda: tf.cast(
                        ops.safe_kl_dro_solve_alpha(l_all, self.lam, self.rho, s_all), tf.float32
                    ),
                )
            alpha_used = tf.where(init, alpha_var, solved)
        else:
            alpha_used = alpha_var
        value, stats = ops.safe_kl_dro_risk_and_stats(
            l32,
            tf.cast(alpha_used, l32.dtype),
            self.lam,
            self.rho,
            s32,
            calibrate=self.calibrate,
            _validate_alpha=False,
            _prepared_bad=False if s32 is None else s_bad,
        )
        mean_w, sat, curv = stats["mean_w"], stats["saturation"], stats["curvature"]
        if multi:
            s_local = tf.cast(tf.size(l32), l32.dtype) if s32 is None else tf.reduce_sum(s32)
            share = value * s_local  # this replica's part of sum_i s_i g_i
            sw_glob, s_glob, sc_glob, v_glob = _replica_sum(
                [mean_w * s_local, s_local, curv * s_local, tf.where(s_local > 0, share, 0.0)]
            )
            sat = _replica_max(sat)
            # Gradient: this replica's share of the global weighted mean (Keras sums the
            # replicas' gradients). Value: global risk / N, as the baselines (Keras' logged
            # loss is then exact however unevenly the batch is split).
            value = _shown_as(
                value * tf.math.divide_no_nan(s_local, s_glob),
                tf.math.divide_no_nan(v_glob, s_glob) / _num_replicas(),
            )
            mean_w = tf.math.divide_no_nan(sw_glob, s_glob)
            curv = tf.math.divide_no_nan(sc_glob, s_glob)
            nonempty = s_glob > 0
        else:
            nonempty = (tf.size(l32) > 0) if s32 is None else (tf.reduce_sum(s32) > 0)
        mean_w, sat, curv = (tf.cast(x, tf.float32) for x in (mean_w, sat, curv))
        deps = [self._diagnostics.update_state(alpha_used, mean_w, sat)]
        if training:
            deps += self._apply_update(
                tf.cast(alpha_used, tf.float32), state, mean_w, curv, nonempty, trainer
            )
        deps = [d for d in deps if d is not None]
        with tf.control_dependencies(deps):
            return tf.identity(value)

    def call(self, y_true, y_pred):
        """Per-example terms ``alpha - lam + (lam/rho) softplus(z_i)`` at the current alpha.

        Their mean is the risk (without sample weights). Keras' ``Loss.call`` contract only:
        training goes through ``__call__``, in Keras 3 and in tf_keras / TFRS alike (see
        "tf_keras and TFRS" in the module docstring); this method never moves alpha.
        """
        l = self.per_example_losses(y_true, y_pred)
        a = tf.cast(self.alpha, l.dtype)
        z = (l - a) / self.lam + tf.math.log(tf.constant(self.rho, l.dtype))
        terms = a + (self.lam / self.rho) * tf.math.softplus(z)
        return terms - self.lam if self.calibrate else terms

    def get_config(self):
        alpha = float(self.alpha.numpy()) if tf.executing_eagerly() else self.alpha_init
        initialized = bool(self.initialized.numpy()) if tf.executing_eagerly() else False
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
    """A batch risk with a temperature ``lam``, computed by the op in ``_op(l, lam, s)``."""

    _op = None
    _global_op = None

    def __init__(self, base_loss, lam, name, reduction, dtype):
        super().__init__(base_loss=base_loss, name=name, reduction=reduction, dtype=dtype)
        self.lam = check_lam(lam)

    def _risk(self, l, s):
        if _multi_replica():
            return type(self)._global_op(l, s, self.lam)
        return self._op(l, self.lam, s)

    def get_config(self):
        return {**super().get_config(), "lam": self.lam}


@register(
    "kl_dro_batch_lse",
    kind="loss",
    description=(
        "Naive mini-batch KL-DRO risk lam*log mean exp(l/lam) over the batch (biased baseline)"
    ),
)
class KLDROBatchLSE(_TemperedBatchRiskLoss):
    """Mini-batch LogSumExp KL-DRO risk ``lam log sum_i pi_i exp(l_i/lam)`` (biased baseline).

    The exact KL-DRO risk of the batch (Levy et al. 2020); its expectation underestimates the
    full-data risk and its gradient is biased unless the batch is the whole data set. Under a
    multi-replica strategy the risk is that of the global batch (see the module docstring,
    "Distribution"). Fail-loud behaviour as :func:`losszoo.ops.kl_dro_batch_lse`.

    Args:
      base_loss: Keras loss computed per example; ``None`` (default): sparse categorical
        cross-entropy on logits.
      lam: temperature (> 0).

    Example:
      >>> model.compile("sgd", loss=losszoo.losses.KLDROBatchLSE("mse", lam=2.0))
    """

    _op = staticmethod(ops.kl_dro_batch_lse)
    _global_op = staticmethod(_global_batch_lse)

    def __init__(
        self,
        base_loss=None,
        lam: float = 1.0,
        name: str = "kl_dro_batch_lse",
        reduction="sum_over_batch_size",
        dtype=None,
    ):
        super().__init__(base_loss=base_loss, lam=lam, name=name, reduction=reduction, dtype=dtype)


@register(
    "kl_dro_sumexp",
    kind="loss",
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

    _op = staticmethod(ops.kl_dro_sumexp)
    _global_op = staticmethod(_global_sumexp)

    def __init__(
        self,
        base_loss=None,
        lam: float = 1.0,
        name: str = "kl_dro_sumexp",
        reduction="sum_over_batch_size",
        dtype=None,
    ):
        super().__init__(base_loss=base_loss, lam=lam, name=name, reduction=reduction, dtype=dtype)


@register(
    "cvar",
    kind="loss",
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
        self.rho = check_rho(rho)

    def _risk(self, l, s):
        if _multi_replica():
            return _global_cvar(l, s, self.rho)
        return ops.cvar_risk(l, self.rho, s)

    def get_config(self):
        return {**super().get_config(), "rho": self.rho}


def find_dro_losses(model):
    """The :class:`SafeKLDRORisk` instances a compiled Keras 3 model uses (after its first
    train/evaluate call when compiled by name)."""
    found = []
    cl = getattr(model, "_compile_loss", None)
    for entry in getattr(cl, "_flat_losses", None) or []:
        if isinstance(entry.loss, SafeKLDRORisk):
            found.append(entry.loss)
    if not found:
        user = getattr(model, "loss", None)
        for obj in tf.nest.flatten(user) if user is not None else []:
            if isinstance(obj, SafeKLDRORisk):
                found.append(obj)
    return found
