"""Helpers shared by the kernels: dtype policy, argument validation and the fail-loud contract.

Every kernel computes in float32 or wider. Half-precision inputs are upcast here and
the result is cast back by the caller with the dtype this module returns.

The fail-loud contract (README, "Bad input"): bad input raises before any work, naming the
argument; under XLA, where assertions vanish, invalid values make the affected rows NaN
(:func:`nan_where`); NaN in never becomes a finite number out. Checks that cost time at run
time (host reads of eager values, graph assertions) can be switched off with
:func:`set_validation` / :func:`validation`; NaN poisoning folded into the kernels always stays.
"""

from __future__ import annotations

import contextlib
import math
import numbers

import numpy as np
import tensorflow as tf

_HALF = (tf.float16, tf.bfloat16)

# Process-wide (not thread-local): MirroredStrategy traces replica functions in threads.
_VALIDATION = {"enabled": True}


def validation_enabled() -> bool:
    """Whether run-time input checks (eager host reads, graph assertions) are on (default).

    Read at trace time: a ``tf.function`` traced with validation off keeps no assertions.
    """
    return _VALIDATION["enabled"]


def set_validation(enabled: bool) -> None:
    """Switch run-time input checks on or off (process-wide; read when ops are traced).

    Off, ops skip the eager value checks and graph assertions on their tensor inputs (labels,
    logits, bounds); invalid values then still make results NaN wherever the kernels can tell
    (as under XLA), but errors are no longer raised. Hyper-parameter checks (Python numbers at
    construction) always run: they cost nothing per step.

    Args:
      enabled: ``True`` (default state) to check, ``False`` to skip.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"`enabled` must be a bool, got {enabled!r}.")
    _VALIDATION["enabled"] = enabled


@contextlib.contextmanager
def validation(enabled: bool):
    """Context manager form of :func:`set_validation`; restores the previous state on exit.

    Example:
      >>> with losszoo.validation(False):      # trusted inputs: no host reads, no asserts
      ...     print(losszoo.validation_enabled())
      False
      >>> losszoo.validation_enabled()
      True
    """
    previous = validation_enabled()
    set_validation(enabled)
    try:
        yield
    finally:
        _VALIDATION["enabled"] = previous


def nan_where(invalid, x):
    """``x`` with NaN wherever ``invalid`` (broadcast against ``x``) is true.

    The XLA half of the contract: a kernel computes a boolean mask of inputs it cannot use
    (ids out of range, NaN labels, infeasible bounds) and poisons the affected rows with this,
    so ``TerminateOnNaN`` and NaN checks catch what assertions (dropped by XLA) would have.
    NaN also propagates through gradients that multiply the result.
    """
    x = tf.convert_to_tensor(x)
    invalid = tf.convert_to_tensor(invalid)
    return tf.where(invalid, tf.constant(np.nan, x.dtype), x)


def row_has_nan(x, axis: int = -1, keepdims: bool = False):
    """Boolean mask of the rows (reduced over ``axis``) of ``x`` that hold a NaN."""
    return tf.reduce_any(tf.math.is_nan(x), axis=axis, keepdims=keepdims)


def check_number(
    value,
    name: str,
    *,
    low=None,
    high=None,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
    allow_none: bool = False,
):
    """Validate a hyper-parameter given as a Python/numpy number; return it as int or float.

    Tensors and variables (e.g. a learned temperature) are returned unchanged: they are
    checked where the op reads them. Everything else must be a real, finite number within
    ``[low, high]`` (open ends with ``low_open`` / ``high_open``); ``integer=True`` also rejects
    non-integral values and booleans.

    Raises:
      TypeError / ValueError naming ``name`` and the rule broken.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return value
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        kind = "an integer" if integer else "a real number"
        raise TypeError(f"`{name}` must be {kind}, got {value!r} ({type(value).__name__}).")
    if integer:
        if not float(value).is_integer():
            raise ValueError(f"`{name}` must be an integer, got {value!r}.")
        value = int(value)
    else:
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"`{name}` must be a finite number, got {value!r}.")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"`{name}` must be {'>' if low_open else '>='} {low}, got {value!r}.")
    if high is not None and (value >= high if high_open else value > high):
        raise ValueError(f"`{name}` must be {'<' if high_open else '<='} {high}, got {value!r}.")
    return value


def check_choice(value, name: str, choices):
    """Raise ValueError unless ``value`` is one of ``choices`` (listed in the message)."""
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"`{name}` must be one of {listed}; got {value!r}.")
    return value


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
    if not validation_enabled():
        return x
    value = static_value(x)
    if value is not None:
        if not np.all(np.isfinite(value)):
            raise ValueError(f"`{name}` contains NaN or Inf values.")
        return x
    return tf.debugging.assert_all_finite(x, f"`{name}` contains NaN or Inf values.")


def check_not_nan(x, name: str):
    """Like :func:`check_finite` but allows +-Inf (e.g. -inf logits used as masks)."""
    if not validation_enabled():
        return x
    value = static_value(x)
    if value is not None:
        if np.any(np.isnan(value)):
            raise ValueError(f"`{name}` contains NaN values.")
        return x
    with tf.control_dependencies(
        [
            tf.debugging.Assert(
                tf.logical_not(tf.reduce_any(tf.math.is_nan(x))), [f"`{name}` contains NaN values."]
            )
        ]
    ):
        return tf.identity(x)


def _in_xla_context() -> bool:
    """Whether the function being traced will be compiled by XLA (``jit_compile=True``)."""
    from tensorflow.python.ops import control_flow_util  # no public equivalent

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def dense_labels(labels, name: str, *, sparse_fill=0, ragged_fill=None):
    """``labels`` as a dense tensor: the label forms that mean something, else a TypeError.

    A ``tf.SparseTensor`` is densified with ``sparse_fill`` in its absent entries (0 for
    multi-hot / dense targets, -1 for padded id lists). A ``tf.RaggedTensor`` (e.g. a list of
    positive ids per row) is padded with ``ragged_fill``; callers that have no padded form pass
    ``None`` and ragged labels raise ``TypeError`` naming ``name``. Anything else goes through
    ``tf.convert_to_tensor``. XLA cannot compile the sparse and ragged ops that densify, so
    under ``jit_compile=True`` both forms raise ``TypeError`` naming ``name`` (densify them in
    the input pipeline, or compile with ``jit_compile=False`` / ``"auto"``).
    """
    if isinstance(labels, (tf.SparseTensor, tf.RaggedTensor)) and _in_xla_context():
        raise TypeError(
            f"`{name}` is a {type(labels).__name__}, which XLA (jit_compile=True) cannot "
            "densify: densify it in the input pipeline, or compile with jit_compile=False "
            "or 'auto'."
        )
    if isinstance(labels, tf.SparseTensor):
        fill = tf.cast(sparse_fill, labels.dtype)
        return tf.sparse.to_dense(tf.sparse.reorder(labels), default_value=fill)
    if isinstance(labels, tf.RaggedTensor):
        if ragged_fill is None:
            raise TypeError(
                f"`{name}` must be a dense tensor or a tf.SparseTensor (multi-hot or dense "
                "targets), got a tf.RaggedTensor: convert it with `.to_tensor()` or build the "
                "targets it stands for."
            )
        return labels.to_tensor(default_value=tf.cast(ragged_fill, labels.dtype))
    return tf.convert_to_tensor(labels)


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
