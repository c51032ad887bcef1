"""The base loss of the DRO losses and metric: a Keras loss computed per example.

:func:`per_example_loss` (public as ``losszoo.losses.per_example_loss``) turns a name,
config, instance or function into ``fn(y_true, y_pred) -> per-example losses`` with the
fail-loud label checks, reading attached logits (a model ending in Keras' softmax or a
losszoo head) when the loss takes logits, and insisting on one value per example.
"""

from __future__ import annotations

import keras
from keras import ops

from losszoo import _logits
from losszoo.contract import (
    check_not_nan,
    dtype_name,
    is_floating,
    nan_where,
    shapes_compatible,
    static_rank,
)
from losszoo.losses._targets import class_ids_and_invalid

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
            ids, invalid = class_ids_and_invalid(y_true, ops.convert_to_tensor(y_pred))
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
