"""Helpers shared by the kernels: dtype policy and argument validation.

Every kernel computes in float32 or wider. Half-precision inputs are upcast here and
the result is cast back by the caller with the dtype this module returns.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

_HALF = (tf.float16, tf.bfloat16)


def to_compute_dtype(x, name: str = "x"):
    """Convert ``x`` to a floating tensor in a dtype safe to compute in.

    Returns:
      ``(x, original_dtype)``: float16/bfloat16 become float32, float32/float64 are kept.
      Integer inputs are converted to float32 and reported as float32.
    """
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        if x.dtype.is_integer or x.dtype == tf.bool:
            x = tf.cast(x, tf.float32)
        else:
            raise TypeError(f"`{name}` must be a real floating tensor, got dtype {x.dtype.name}.")
    original = x.dtype
    if original in _HALF:
        x = tf.cast(x, tf.float32)
    return x, original


def check_static_rank(x: tf.Tensor, min_rank: int, name: str) -> None:
    """Raise ValueError if the static rank of ``x`` is known and below ``min_rank``."""
    rank = x.shape.rank
    if rank is not None and rank < min_rank:
        raise ValueError(
            f"`{name}` must have rank >= {min_rank}, got rank {rank} with shape {x.shape}."
        )


def static_value(x):
    """Return ``x`` as a numpy array when its value is known without running a graph, else None."""
    if isinstance(x, (int, float, np.ndarray, np.generic, list, tuple)):
        return np.asarray(x)
    if isinstance(x, tf.Tensor) and not tf.is_symbolic_tensor(x):
        return x.numpy()
    if isinstance(x, tf.Variable):
        return None
    try:
        return tf.get_static_value(x)
    except (TypeError, ValueError):
        return None


def check_finite(x, name: str):
    """Reject NaN/Inf early: eagerly with ValueError, in graphs with an assertion op.

    Returns ``x`` (with a control dependency on the check inside graphs), so callers write
    ``x = check_finite(x, "labels")``.
    """
    value = static_value(x)
    if value is not None:
        if not np.all(np.isfinite(value)):
            raise ValueError(f"`{name}` contains NaN or Inf values.")
        return x
    return tf.debugging.assert_all_finite(x, f"`{name}` contains NaN or Inf values.")


def check_not_nan(x, name: str):
    """Like :func:`check_finite` but allows +-Inf (e.g. -inf logits used as masks)."""
    value = static_value(x)
    if value is not None:
        if np.any(np.isnan(value)):
            raise ValueError(f"`{name}` contains NaN values.")
        return x
    with tf.control_dependencies(
        [tf.debugging.Assert(tf.logical_not(tf.reduce_any(tf.math.is_nan(x))),
                             [f"`{name}` contains NaN values."])]
    ):
        return tf.identity(x)


def move_axis_last(x: tf.Tensor, axis: int):
    """Transpose ``axis`` of ``x`` to the end. Returns ``(x_t, undo)`` with ``undo(y)``."""
    rank = x.shape.rank
    if rank is None:
        raise ValueError("The rank of the input must be known statically.")
    if not -rank <= axis < rank:
        raise ValueError(f"`axis`={axis} is out of range for a tensor of rank {rank}.")
    axis %= rank
    if axis == rank - 1:
        return x, lambda y: y
    perm = [i for i in range(rank) if i != axis] + [axis]
    inverse = np.argsort(perm).tolist()
    return tf.transpose(x, perm), lambda y: tf.transpose(y, inverse)
