"""The base of losszoo's Keras losses: one class over an op, and the DRO per-example loss.

:class:`OpLoss` holds an op and its config and does, once for every loss, what Keras needs
around it: the sample-weight and array-form checks, the attached logits
(:func:`losszoo._logits.scores`) and the compute dtype; the op reads and checks the labels
(ids ``[B]`` / ``[B, 1]`` or dense ``[B, K]``). :func:`per_example_loss` (public as
``losszoo.losses.per_example_loss``) turns a name, config, instance or function into
``fn(y_true, y_pred) -> per-example losses`` with the fail-loud label checks, for the DRO
losses and metric.
"""

from __future__ import annotations

import keras
from keras import ops

from losszoo import _backend, _logits
from losszoo.contract import (
    check_array_form,
    check_not_nan,
    class_ids_and_invalid,
    dtype_name,
    is_floating,
    nan_where,
    shapes_compatible,
    static_rank,
    to_compute_dtype,
    validation_enabled,
)

# Base losses on logits invariant to a per-row shift of them (see losszoo._logits.scores).
_SHIFT_INVARIANT = (
    keras.losses.SparseCategoricalCrossentropy,
    keras.losses.CategoricalCrossentropy,
    keras.losses.CategoricalFocalCrossentropy,
)


def per_example_loss(base_loss=None):
    """A Keras loss computed per example, as the DRO losses and metric use it.

    Instances are re-created with ``reduction=None``. Fail-loud labels: class ids in
    ``[0, K)`` for sparse categorical cross-entropy, no NaN in a floating ``y_true``
    (eagerly a ``ValueError`` naming ``y_true``, in a graph an assertion, under XLA NaN
    losses for the examples concerned). A loss on logits (``from_logits=True``) reads the
    logits attached to ``y_pred`` (a model ending in Keras' softmax or a losszoo head).

    Args:
      base_loss: Keras loss name, config, instance or function; ``None`` (default): sparse
        categorical cross-entropy on logits.

    Returns:
      ``(fn, config)``: ``fn(y_true, y_pred)`` gives one loss per example (shape
      ``[batch, ...]``, float32, or float64 if the loss gives float64; a scalar raises
      ``ValueError``), ``config`` is ``base_loss`` serialized (a name stays a name).

    Example:
      >>> fn, config = losszoo.losses.per_example_loss("mse")
      >>> [float(v) for v in fn(np.zeros((2, 3)), np.ones((2, 3)))], config
      ([1.0, 1.0], 'mse')
    """
    if base_loss is None:
        base_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    obj = keras.losses.get(base_loss) if isinstance(base_loss, (str, dict)) else base_loss
    if not callable(obj):
        raise TypeError(
            f"`base_loss` must be a Keras loss name, instance or callable, got {base_loss!r}."
        )
    config = base_loss if isinstance(base_loss, str) else keras.losses.serialize(obj)
    if isinstance(obj, keras.losses.Loss):
        cfg = obj.get_config()
        takes_logits = cfg.get("from_logits") is True
        sparse = isinstance(obj, keras.losses.SparseCategoricalCrossentropy)
        sparse = sparse and cfg.get("ignore_class") is None
        if "reduction" in cfg:
            cfg["reduction"] = None
            obj = obj.__class__.from_config(cfg)
        else:  # pragma: no cover - exotic losses without reduction in their config
            obj = obj.call
        if takes_logits:
            _logits.track_models()
            takes_logits = "shift" if isinstance(obj, _SHIFT_INVARIANT) else True
        return _checked_base(obj, takes_logits, sparse), config
    sparse = obj is keras.losses.sparse_categorical_crossentropy
    return _checked_base(obj, False, sparse), config


def _checked_base(fn, takes_logits, sparse_ids):
    """``fn`` with the fail-loud label checks, reading attached logits if it takes logits.

    * ``takes_logits`` (a Keras loss with ``from_logits=True``, the default base loss): a
      ``y_pred`` is replaced by the scores :func:`losszoo._logits.scores` finds (attached
      logits, or the log of a Keras softmax output for Keras' categorical cross-entropies),
      so a model ending in a softmax trains on its logits on every backend.
    * ``sparse_ids`` (sparse categorical cross-entropy without ``ignore_class``): ``y_true``
      must hold class ids in ``[0, K)``, whole numbers if floating (Keras would cast NaN or
      1.5 to some id, and XLA gives any id a finite loss).
    * otherwise a floating ``y_true`` must not hold NaN.

    Eagerly and in graphs a violation raises naming ``y_true`` (skipped with
    ``losszoo.set_validation(False)``); under XLA the affected examples' losses are NaN, so a
    positive weight makes the risk NaN.
    """

    def losses(y_true, y_pred):
        if takes_logits:  # "shift": the loss is invariant to a per-row shift of the logits
            y_pred = _logits.scores(y_pred, takes_logits == "shift", "this `base_loss`")
        if sparse_ids:
            ids, invalid = class_ids_and_invalid(y_true, ops.convert_to_tensor(y_pred), "y_true")
            return nan_where(invalid, fn(ids, y_pred))
        y_true = ops.convert_to_tensor(y_true)
        if not is_floating(y_true):
            return fn(y_true, y_pred)
        y_true = check_not_nan(y_true, "y_true")
        values = ops.convert_to_tensor(fn(y_true, y_pred))
        return nan_where(_per_row(ops.isnan(y_true), values), values)

    def checked(y_true, y_pred):
        values = ops.convert_to_tensor(losses(y_true, y_pred))
        if static_rank(values) == 0:
            raise ValueError(
                "`base_loss` returned a scalar; the DRO risk needs per-example losses. Pass a "
                "Keras loss that reduces over the batch only via its `reduction` (instances "
                "are re-created with reduction=None) or a function returning shape [batch, ...]."
            )
        wide = dtype_name(values) in ("float32", "float64")  # else computed in float32
        return values if wide else ops.cast(values, "float32")

    return checked


def _per_row(flags, values):
    """``flags`` (``y_true``'s shape) reduced to ``values``' shape: per example when
    ``y_true``'s leading axes are the losses' axes, else one flag for the whole batch."""
    r, k = static_rank(values), static_rank(flags)
    if r is None or k is None or k < r or not shapes_compatible(flags.shape[:r], values.shape):
        return ops.any(flags)
    return ops.any(flags, axis=tuple(range(r, k))) if k > r else flags


def check_sample_weight(sample_weight, y_pred, name: str = "sample_weight"):
    """Reject ``sample_weight`` that does not fit the per-example losses of ``y_pred``.

    The losses have ``y_pred``'s shape without its class axis. ``sample_weight`` must
    broadcast to that shape after Keras' own alignment (a trailing 1 dropped, or one added
    when the losses end in 1), without growing it; e.g. ``[B]``, ``[B, 1]`` or a scalar for
    ``[B]`` losses. Static sizes are checked at once (eagerly and at trace time, raising
    ``ValueError`` naming ``name``); sizes known only at run time (TensorFlow graphs) get a
    graph assertion (skipped with ``losszoo.set_validation(False)``).

    Returns:
      ``sample_weight`` (a tensor, with the assertion attached when one was needed), or None.
    """
    if sample_weight is None:
        return None
    sample_weight = ops.convert_to_tensor(sample_weight)
    scores = ops.convert_to_tensor(y_pred)
    w_rank, l_rank = static_rank(sample_weight), static_rank(scores)
    if w_rank is None or l_rank is None:
        return sample_weight
    weights, losses = tuple(sample_weight.shape), tuple(scores.shape)[:-1]
    w_dims, l_dims = list(range(len(weights))), list(range(len(losses)))
    if len(weights) == len(losses) + 1 and weights[-1] == 1:
        w_dims = w_dims[:-1]
    elif len(losses) == len(weights) + 1 and losses[-1] == 1:
        l_dims = l_dims[:-1]
    message = (
        f"`{name}` of shape {weights} does not fit the per-example losses of shape "
        f"{losses} (`y_pred`'s shape {tuple(scores.shape)} without the class axis)"
    )
    if len(w_dims) > len(l_dims):
        raise ValueError(message + ".")
    dynamic = []
    for i, j in zip(reversed(w_dims), reversed(l_dims)):
        w, n = weights[i], losses[j]
        if w is None or n is None:
            dynamic.append((i, j))
        elif w not in (1, n):
            raise ValueError(f"{message}: size {w} where the losses have {n}.")
    if not dynamic or not validation_enabled():
        return sample_weight
    w_shape, l_shape = ops.shape(sample_weight), ops.shape(scores)
    fits = [ops.equal(w_shape[i], 1) | ops.equal(w_shape[i], l_shape[j]) for i, j in dynamic]
    return _backend.assert_all(ops.stack(fits), message + ".", sample_weight)


class SampleWeightCheck:
    """Mixin for ``keras.losses.Loss`` subclasses: checks ``sample_weight`` by
    :func:`check_sample_weight` before Keras applies it (put it first in the bases), and
    rejects label and score forms Keras would fail to convert, or convert with its own less
    clear message (:func:`losszoo.contract.check_array_form`)."""

    def __call__(self, y_true, y_pred, sample_weight=None):
        check_array_form(y_true, "y_true")
        check_array_form(y_pred, "y_pred")
        sample_weight = check_sample_weight(sample_weight, y_pred)
        return super().__call__(y_true, y_pred, sample_weight=sample_weight)


class OpLoss(SampleWeightCheck, keras.losses.Loss):
    """A Keras loss over an op ``op(labels, logits, **config)``, as Keras'
    ``LossFunctionWrapper`` holds a function: the op computes the per-example loss and
    checks the labels, this class the rest, once for every loss.

    * ``sample_weight`` and the array forms of ``y_true`` / ``y_pred`` are checked
      (:class:`SampleWeightCheck`);
    * ``y_pred`` is replaced by the scores :func:`losszoo._logits.scores` finds (attached
      logits, or the log of a Keras softmax's output), in float32 or float64
      (:func:`losszoo.contract.to_compute_dtype`), so the loss is float32 under a
      mixed-precision policy;
    * the op is called with ``config`` (the loss' own arguments, which are also its
      ``get_config``, and attributes of the loss) and the argument names ``y_true`` /
      ``y_pred`` for its error messages.

    A subclass states its ``__init__`` (signature, defaults, checks, docstring) and passes
    its op and checked arguments here; ``call`` needs no override. ``op_config`` is what
    reaches the op: ``config`` without ``from_logits`` (a loss-side setting), unless
    overridden.

    Args:
      op: ``op(labels, logits, **op_config, labels_name=..., logits_name=...)`` returning the
        loss per example.
      reduction, name, dtype: as for any Keras loss.
      **config: the loss' arguments, serialized by ``get_config``.
    """

    names = {"labels_name": "y_true", "logits_name": "y_pred"}

    def __init__(self, op, reduction, name, dtype, **config):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        self.op, self._config = op, config
        for key, value in config.items():
            setattr(self, key, value)
        _logits.track_models()

    @property
    def op_config(self):
        return {k: v for k, v in self._config.items() if k != "from_logits"}

    def scores(self, y_pred):
        """The scores the op trains on, in float32 or float64; with ``from_logits=False``
        (a loss on scores that takes it) ``y_pred`` must carry its logits."""
        logits = _logits.scores(y_pred, loss_name=type(self).__name__)
        if logits is y_pred and self._config.get("from_logits", True) is False:
            raise ValueError(
                f"{type(self).__name__}(from_logits=False) needs `y_pred` to carry its logits "
                "(the output of a losszoo head or of Keras' softmax); this `y_pred` has none "
                "attached. Pass logits with from_logits=True instead."
            )
        return to_compute_dtype(logits, "y_pred")[0]

    def call(self, y_true, y_pred):
        return self.op(y_true, self.scores(y_pred), **self.op_config, **self.names)

    def get_config(self):
        return {**super().get_config(), **self._config}
