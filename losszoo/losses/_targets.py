"""Label handling shared by the losses: integer class ids or dense targets -> distributions.

The class count ``K`` is ``y_pred``'s last axis. It may be dynamic (in-batch retrieval
scores ``[B, B]`` with an unknown batch size): everything here then works with
``tf.shape(y_pred)[-1]``, eagerly, in graphs and under XLA.

Fail-loud rules (README, "Bad input"): class ids must be integral (float ids such as ``2.0``
are accepted, ``1.5`` or NaN are not) and lie in ``[0, K)``; dense targets must be finite
and non-negative. Eagerly and in graphs a violation raises naming the argument (skipped
with ``losszoo.set_validation(False)``). Under XLA, where assertions vanish, the helpers
return a per-row ``invalid`` mask (or NaN target rows) so the losses can make the affected
rows' loss NaN, never a clamped id or a zero row.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from losszoo.contract import (
    check_finite,
    nan_where,
    static_value,
    validation_enabled,
)


def is_sparse(y_true: tf.Tensor, y_pred: tf.Tensor) -> bool:
    """True when ``y_true`` holds class ids: one rank below ``y_pred``, or a trailing 1.

    This mirrors Keras: ``SparseCategoricalCrossentropy`` takes ids of shape ``[B]`` or
    ``[B, 1]``, ``CategoricalCrossentropy`` targets of shape ``[B, K]``. A ``y_true`` of
    ``y_pred``'s rank whose last axis has no static size is read as dense targets (that is
    what ``tfrs.tasks.Retrieval`` passes: ``tf.eye(B)`` with a dynamic ``B``).
    """
    if y_true.shape.rank is None or y_pred.shape.rank is None:
        raise ValueError("`y_true` and `y_pred` must have a known rank.")
    if y_true.shape.rank == y_pred.shape.rank - 1:
        return True
    return (
        y_true.shape.rank == y_pred.shape.rank and y_true.shape[-1] == 1 and y_pred.shape[-1] != 1
    )


def num_classes(y_pred):
    """The size of ``y_pred``'s last axis: a Python int when static, else a scalar tensor."""
    n = y_pred.shape[-1]
    return int(n) if n is not None else tf.shape(y_pred)[-1]


def check_class_ids(ids: tf.Tensor, num_classes, name: str = "y_true") -> tf.Tensor:
    """Reject class ids outside ``[0, num_classes)`` (eagerly, or with a graph assertion).

    ``num_classes`` is a Python int or a scalar int tensor (dynamic class count). Skipped
    when validation is off (``losszoo.set_validation(False)``).
    """
    if not validation_enabled():
        return ids
    value = static_value(ids)
    bound = static_value(num_classes)
    if value is not None and bound is not None:
        bound = int(bound)
        if value.size and (value.min() < 0 or value.max() >= bound):
            raise ValueError(
                f"`{name}` holds class ids that must lie in [0, {bound}); got values "
                f"in [{value.min()}, {value.max()}]."
            )
        return ids
    shown = bound if bound is not None else "K"
    message = f"`{name}` holds class ids that must lie in [0, {shown}) (K = y_pred's last axis)."
    with tf.control_dependencies(
        [
            tf.debugging.assert_non_negative(ids, message=message),
            tf.debugging.assert_less(ids, tf.cast(num_classes, ids.dtype), message=message),
        ]
    ):
        return tf.identity(ids)


def _check_integral(y_true, name):
    """Eager/graph check that floating ids are finite whole numbers."""
    if not validation_enabled():
        return y_true
    y_true = check_finite(y_true, name)
    value = static_value(y_true)
    message = f"`{name}` holds class ids, which must be whole numbers (e.g. 2.0, not 1.5)."
    if value is not None:
        if value.size and np.any(value != np.round(value)):
            raise ValueError(message)
        return y_true
    with tf.control_dependencies(
        [tf.debugging.Assert(tf.reduce_all(tf.equal(y_true, tf.round(y_true))), [message])]
    ):
        return tf.identity(y_true)


def class_ids_and_invalid(y_true, y_pred, name: str = "y_true"):
    """Class ids plus the mask of ids that cannot be used (for NaN poisoning under XLA).

    Args:
      y_true: ids of shape ``y_pred.shape[:-1]`` or with a trailing 1, integer or floating
        (whole numbers).
      y_pred: the scores ``[..., K]``; ``K`` may be dynamic.
      name: argument name for error messages.

    Returns:
      ``(ids, invalid)``: int32 ids of shape ``y_pred.shape[:-1]`` and a bool mask of the
      same shape, true where the id is NaN, not a whole number or outside ``[0, K)``. Invalid
      ids are replaced by 0 in ``ids`` (safe to gather); callers poison those rows with
      :func:`losszoo.contract.nan_where`. Eagerly and in graphs invalid ids raise first
      (unless validation is off).
    """
    y_true = tf.convert_to_tensor(y_true)
    if y_true.shape.rank is not None and y_true.shape.rank == y_pred.shape.rank:
        y_true = tf.squeeze(y_true, -1)
    n = num_classes(y_pred)
    if y_true.dtype.is_floating:
        y_true = _check_integral(y_true, name)
        bad = tf.logical_not(tf.math.is_finite(y_true)) | tf.not_equal(y_true, tf.round(y_true))
        # Range test in floating point, before the cast can wrap huge values into range.
        bad = bad | (y_true < 0) | (y_true >= tf.cast(n, y_true.dtype))
        ids = tf.cast(tf.where(bad, tf.zeros_like(y_true), y_true), tf.int32)
        if validation_enabled():
            value = static_value(y_true)
            bound = static_value(n)
            if value is not None and bound is not None and value.size:
                if value.min() < 0 or value.max() >= int(bound):
                    raise ValueError(
                        f"`{name}` holds class ids that must lie in [0, {int(bound)}); got "
                        f"values in [{value.min()}, {value.max()}]."
                    )
            elif value is None:
                message = (
                    f"`{name}` holds class ids that must lie in [0, K) (K = y_pred's last axis)."
                )
                with tf.control_dependencies(
                    [tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [message])]
                ):
                    ids = tf.identity(ids)
        return ids, bad
    if not y_true.dtype.is_integer:
        raise TypeError(f"`{name}` must hold integer or floating class ids, got {y_true.dtype}.")
    ids = check_class_ids(tf.cast(y_true, tf.int64), n, name)
    bad = (ids < 0) | (ids >= tf.cast(n, ids.dtype))
    ids = tf.cast(tf.where(bad, tf.zeros_like(ids), ids), tf.int32)
    return ids, bad


def class_ids(y_true, y_pred, name: str = "y_true") -> tf.Tensor:
    """Integer class ids of shape ``y_pred.shape[:-1]`` from ids given as ints or floats.

    ``K`` (``y_pred``'s last axis) may be dynamic. Invalid ids raise eagerly and in graphs;
    under XLA they come back as 0, so use :func:`class_ids_and_invalid` (or
    :func:`one_hot_targets`) when the loss must turn them into NaN.
    """
    return class_ids_and_invalid(y_true, y_pred, name)[0]


def _one_hot(ids, y_pred):
    """One-hot rows in ``y_pred``'s dtype; works for a dynamic class count under XLA."""
    classes = tf.range(num_classes(y_pred), dtype=ids.dtype)
    return tf.cast(tf.equal(ids[..., None], classes), y_pred.dtype)


def one_hot_targets(y_true, y_pred, name: str = "y_true"):
    """One-hot rows for class ids; rows of invalid ids are all NaN (the XLA contract)."""
    ids, invalid = class_ids_and_invalid(y_true, y_pred, name)
    return nan_where(invalid[..., None], _one_hot(ids, y_pred))


def target_distribution(y_true, y_pred, normalize: bool = True, name: str = "y_true"):
    """Turn ids or dense targets into distributions over the last axis of ``y_pred``.

    Args:
      y_true: class ids (``[B]`` or ``[B, 1]``) or dense non-negative targets ``[B, K]``.
        ``K`` may be dynamic.
      y_pred: the scores, used for shape and dtype.
      normalize: divide dense targets by their row sum, so a multi-hot row becomes the
        uniform distribution over its positives. Rows summing to 0 stay 0.
      name: argument name for error messages.

    Returns:
      ``(q, has_target)``: targets in ``y_pred``'s dtype and a float mask of rows with a
      positive total (rows without any target should get zero loss). Rows with an invalid
      id (NaN, not whole, out of range) or a NaN/inf/negative dense entry are all NaN in
      ``q`` and ``has_target`` (this is what survives under XLA; eagerly and in graphs such
      input raises first unless validation is off).
    """
    y_true = tf.convert_to_tensor(y_true)
    if is_sparse(y_true, y_pred):
        ids, invalid = class_ids_and_invalid(y_true, y_pred, name)
        q = nan_where(invalid[..., None], _one_hot(ids, y_pred))
        return q, nan_where(invalid, tf.ones(tf.shape(q)[:-1], y_pred.dtype))
    if not y_true.dtype.is_floating and not y_true.dtype.is_integer and y_true.dtype != tf.bool:
        raise TypeError(f"`{name}` must be numeric, got {y_true.dtype}.")
    q = tf.cast(y_true, y_pred.dtype)
    if not q.shape.is_compatible_with(y_pred.shape):
        raise ValueError(
            f"`{name}` must hold class ids of shape {y_pred.shape[:-1]} (or with a trailing 1) "
            f"or targets of the shape of `y_pred` {y_pred.shape}; got shape {y_true.shape}."
        )
    q = check_finite(q, name)
    if validation_enabled():
        value = static_value(q)
        message = f"`{name}` must be non-negative (dense targets)."
        if value is not None:
            if value.size and value.min() < 0:
                raise ValueError(f"{message[:-1]}; got a minimum of {value.min()}.")
        else:
            with tf.control_dependencies([tf.debugging.assert_non_negative(q, message=message)]):
                q = tf.identity(q)
    # Spelt out, not ~(q >= 0): Grappler rewrites that into q < 0, which is false for NaN.
    bad = tf.reduce_any(tf.math.is_nan(q) | (q < 0) | tf.math.is_inf(q), -1)
    total = tf.reduce_sum(q, -1, keepdims=True)
    has_target = nan_where(bad, tf.cast(total[..., 0] > 0, q.dtype))
    if normalize:
        q = tf.math.divide_no_nan(q, total)
    return nan_where(bad[..., None], q), has_target


def check_sample_weight(sample_weight, y_pred, name: str = "sample_weight"):
    """Reject ``sample_weight`` that does not fit the per-example losses of ``y_pred``.

    The losses have ``y_pred``'s shape without its class axis. ``sample_weight`` must
    broadcast to that shape after Keras' own alignment (a trailing 1 dropped, or one added
    when the losses end in 1), without growing it; e.g. ``[B]``, ``[B, 1]`` or a scalar for
    ``[B]`` losses. Static sizes are checked at once (eagerly and at trace time, raising
    ``ValueError`` naming ``name``); sizes known only at run time get a graph assertion
    (skipped with ``losszoo.set_validation(False)``; under XLA shapes are static).

    Returns:
      ``sample_weight`` (a tensor, with the assertion attached when one was needed), or None.
    """
    if sample_weight is None:
        return None
    sample_weight = tf.convert_to_tensor(sample_weight)
    scores = y_pred if isinstance(y_pred, tf.Tensor) else tf.convert_to_tensor(y_pred)
    weights, losses = sample_weight.shape, scores.shape[:-1]
    if weights.rank is None or losses.rank is None:
        return sample_weight
    w_dims, l_dims = list(range(weights.rank)), list(range(losses.rank))
    if weights.rank == losses.rank + 1 and weights[-1] == 1:
        w_dims = w_dims[:-1]
    elif losses.rank == weights.rank + 1 and losses[-1] == 1:
        l_dims = l_dims[:-1]
    message = (
        f"`{name}` of shape {weights} does not fit the per-example losses of shape "
        f"{losses} (`y_pred`'s shape {scores.shape} without the class axis)"
    )
    if len(w_dims) > len(l_dims):
        raise ValueError(message + ".")
    pairs = list(zip(reversed(w_dims), reversed(l_dims)))
    dynamic = []
    for i, j in pairs:
        w, n = weights[i], losses[j]
        if w is None or n is None:
            dynamic.append((i, j))
        elif w not in (1, n):
            raise ValueError(f"{message}: size {w} where the losses have {n}.")
    if not dynamic or not validation_enabled():
        return sample_weight
    w_shape, l_shape = tf.shape(sample_weight), tf.shape(scores)
    fits = tf.reduce_all([(w_shape[i] == 1) | (w_shape[i] == l_shape[j]) for i, j in dynamic])
    shapes = [message + "; got shapes", w_shape, "and", l_shape[:-1]]
    with tf.control_dependencies([tf.debugging.Assert(fits, shapes)]):
        return tf.identity(sample_weight)


class SampleWeightCheck:
    """Mixin for ``keras.losses.Loss`` subclasses: checks ``sample_weight`` by
    :func:`check_sample_weight` before Keras applies it (put it first in the bases)."""

    def __call__(self, y_true, y_pred, sample_weight=None):
        sample_weight = check_sample_weight(sample_weight, y_pred)
        return super().__call__(y_true, y_pred, sample_weight=sample_weight)
