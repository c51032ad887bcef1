"""Label handling shared by the losses: integer class ids or dense targets -> distributions."""

from __future__ import annotations

import tensorflow as tf

from losszoo.ops._common import check_finite, static_value


def is_sparse(y_true: tf.Tensor, y_pred: tf.Tensor) -> bool:
    """True when ``y_true`` holds class ids: one rank below ``y_pred``, or a trailing 1.

    This mirrors Keras: ``SparseCategoricalCrossentropy`` takes ids of shape ``[B]`` or
    ``[B, 1]``, ``CategoricalCrossentropy`` targets of shape ``[B, K]``.
    """
    if y_true.shape.rank is None or y_pred.shape.rank is None:
        raise ValueError("`y_true` and `y_pred` must have a known rank.")
    if y_true.shape.rank == y_pred.shape.rank - 1:
        return True
    return (
        y_true.shape.rank == y_pred.shape.rank
        and y_true.shape[-1] == 1
        and y_pred.shape[-1] != 1
    )


def check_class_ids(ids: tf.Tensor, num_classes: int, name: str = "y_true") -> tf.Tensor:
    """Reject class ids outside ``[0, num_classes)`` (eagerly, or with a graph assertion)."""
    value = static_value(ids)
    if value is not None:
        if value.size and (value.min() < 0 or value.max() >= num_classes):
            raise ValueError(
                f"`{name}` holds class ids that must lie in [0, {num_classes}); got values "
                f"in [{value.min()}, {value.max()}]."
            )
        return ids
    message = f"`{name}` holds class ids that must lie in [0, {num_classes})."
    with tf.control_dependencies(
        [
            tf.debugging.assert_non_negative(ids, message=message),
            tf.debugging.assert_less(ids, tf.cast(num_classes, ids.dtype), message=message),
        ]
    ):
        return tf.identity(ids)


def class_ids(y_true, y_pred, name: str = "y_true") -> tf.Tensor:
    """Integer class ids of shape ``y_pred.shape[:-1]`` from ids given as ints or floats."""
    y_true = tf.convert_to_tensor(y_true)
    if y_true.dtype.is_floating:
        y_true = check_finite(y_true, name)
        rounded = tf.round(y_true)
        y_true = tf.cast(rounded, tf.int32)
    if y_true.shape.rank == y_pred.shape.rank:
        y_true = tf.squeeze(y_true, -1)
    num_classes = y_pred.shape[-1]
    if num_classes is None:
        raise ValueError("The class axis of `y_pred` must have a static size.")
    return check_class_ids(tf.cast(y_true, tf.int32), num_classes, name)


def target_distribution(y_true, y_pred, normalize: bool = True, name: str = "y_true"):
    """Turn ids or dense targets into distributions over the last axis of ``y_pred``.

    Args:
      y_true: class ids (``[B]`` or ``[B, 1]``) or dense non-negative targets ``[B, K]``.
      y_pred: the scores, used for shape and dtype.
      normalize: divide dense targets by their row sum, so a multi-hot row becomes the
        uniform distribution over its positives. Rows summing to 0 stay 0.
      name: argument name for error messages.

    Returns:
      ``(q, has_target)``: targets in ``y_pred``'s dtype and a float mask of rows with a
      positive total (rows without any target should get zero loss).
    """
    y_true = tf.convert_to_tensor(y_true)
    if is_sparse(y_true, y_pred):
        ids = class_ids(y_true, y_pred, name)
        q = tf.one_hot(ids, y_pred.shape[-1], dtype=y_pred.dtype)
        return q, tf.ones(tf.shape(q)[:-1], y_pred.dtype)
    q = tf.cast(y_true, y_pred.dtype)
    if not q.shape.is_compatible_with(y_pred.shape):
        raise ValueError(
            f"`{name}` must hold class ids of shape {y_pred.shape[:-1]} (or with a trailing 1) "
            f"or targets of the shape of `y_pred` {y_pred.shape}; got shape {y_true.shape}."
        )
    q = check_finite(q, name)
    value = static_value(q)
    if value is not None and value.size and value.min() < 0:
        raise ValueError(f"`{name}` must be non-negative; got a minimum of {value.min()}.")
    total = tf.reduce_sum(q, -1, keepdims=True)
    has_target = tf.cast(total[..., 0] > 0, q.dtype)
    if normalize:
        q = tf.math.divide_no_nan(q, total)
    return q, has_target
