"""Fail-loud input rules of the possibilistic ops and their shape handling.

Rules: possibility rows (finite, in ``[0, 1]``, row maximum 1; or any positive scale for
:func:`~losszoo.ops.antipignistic`), logits (no NaN / +inf, not all -inf), vote counts
(finite, non-negative, positive sum). Each gives the eager ``ValueError`` / graph assertion
naming the argument (``_validate_*``) and the per-row mask that the ops turn into NaN
(``*_invalid``).
"""

import numpy as np
import tensorflow as tf

from losszoo.contract import check_static_rank, row_has_nan, static_value, validation_enabled
from losszoo.ops.possibilistic._config import _F64

_POSSIBILITY_RULE = (
    "must hold finite possibility degrees in [0, 1] with row maximum 1 "
    "(a normalised possibility distribution)"
)
_SCALED_POSSIBILITY_RULE = (
    "must hold finite, non-negative possibility degrees with a positive row maximum"
)
_MAX_ONE_TOL = 1e-6


def _possibility_invalid(pi2, normalised=True):
    """Rows of ``pi2`` [B, K] that break the possibility rule (bool [B]).

    ``normalised``: entries in [0, 1] with row maximum 1 (:data:`_POSSIBILITY_RULE`); else
    any scale: finite, non-negative entries with a positive maximum.
    """
    pi2 = tf.cast(pi2, _F64)
    ok = tf.math.is_finite(pi2) & (pi2 >= 0.0)
    if normalised:
        ok &= pi2 <= 1.0
    top = tf.reduce_max(tf.where(tf.math.is_finite(pi2), pi2, 0.0), axis=-1)
    low_top = top < 1.0 - _MAX_ONE_TOL if normalised else top <= 0.0
    return ~tf.reduce_all(ok, axis=-1) | low_top


def _validate_possibility(pi, name, normalised=True):
    """Eager ValueError / graph assertion naming ``name`` for rows that
    :func:`_possibility_invalid` flags."""
    if not validation_enabled():
        return pi
    rule = _POSSIBILITY_RULE if normalised else _SCALED_POSSIBILITY_RULE
    message = f"`{name}` {rule}."
    value = static_value(pi)
    if value is not None:
        v = np.asarray(value, np.float64)
        if v.size == 0:
            return pi
        v2 = v.reshape(-1, v.shape[-1])
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(v2) & (v2 >= 0)
            if normalised:
                ok &= v2 <= 1
            top = np.max(np.where(np.isfinite(v2), v2, 0.0), axis=-1)
            bad = ~np.all(ok, axis=-1) | (top < 1.0 - _MAX_ONE_TOL if normalised else top <= 0)
        if bad.any():
            rows = np.flatnonzero(bad)[:5].tolist()
            raise ValueError(f"{message[:-1]}; rows {rows} are not.")
        return pi
    pi2 = tf.reshape(pi, [-1, tf.shape(pi)[-1]])
    check = tf.debugging.Assert(~tf.reduce_any(_possibility_invalid(pi2, normalised)), [message])
    with tf.control_dependencies([check]):
        return tf.identity(pi)


_LOGITS_RULE = "must not hold NaN or +inf, nor rows that are all -inf (-inf masks a class)"


def _logits_invalid(z2):
    """Rows of ``z2`` [B, K] with NaN, +inf or no class above -inf (bool [B])."""
    inf = tf.constant(np.inf, z2.dtype)
    return row_has_nan(z2) | tf.reduce_any(tf.equal(z2, inf), -1) | tf.reduce_all(z2 <= -inf, -1)


def _validate_logits(z, name):
    """Eager ValueError / graph assertion naming ``name`` for the rows that
    :func:`_logits_invalid` flags (a -inf logit alone means the class is masked)."""
    if not validation_enabled():
        return z
    message = f"`{name}` {_LOGITS_RULE}."
    value = static_value(z)
    if value is not None:
        v = np.asarray(value, np.float64)
        v2 = v.reshape(-1, v.shape[-1]) if v.size else v
        if v.size and (np.isnan(v).any() or np.isposinf(v).any() or np.isneginf(v2).all(-1).any()):
            raise ValueError(message)
        return z
    check = tf.debugging.Assert(~tf.reduce_any(_logits_invalid(z)), [message])
    with tf.control_dependencies([check]):
        return tf.identity(z)


def _as_float(x, name):
    x = tf.convert_to_tensor(x)
    if not (x.dtype.is_floating or x.dtype.is_integer or x.dtype == tf.bool):
        raise TypeError(f"`{name}` must be a real tensor, got dtype {x.dtype.name}.")
    return x


def _flatten(x, name, k=None, static_k=True):
    """Reshape ``[..., K]`` to ``[B, K]``; returns (x2d, restore_fn for [B, ...] tensors).

    ``k`` overrides the class count (static); without it an unknown ``K`` raises, unless
    ``static_k=False`` (ops whose kernels read ``K`` at run time).
    """
    check_static_rank(x, 1, name)
    k = x.shape[-1] if k is None else k
    if k is None:
        if static_k:
            raise ValueError(f"The class axis (last) of `{name}` must have a static size.")
        k = tf.shape(x)[-1]
    lead = tf.shape(x)[:-1]
    lead_static = x.shape[:-1]

    def restore(y):
        tail = y.shape[1:]
        out = tf.reshape(y, tf.concat([lead, tf.shape(y)[1:]], 0))
        return tf.ensure_shape(out, lead_static.concatenate(tail))

    return tf.reshape(x, [-1, k]), restore


def _check_same_shape(a, b, name_a, name_b):
    if a.shape.rank is not None and b.shape.rank is not None:
        if not a.shape.is_compatible_with(b.shape):
            raise ValueError(
                f"`{name_b}` must have the shape of `{name_a}` {list(a.shape)}, got "
                f"{list(b.shape)}."
            )


def _validate_votes(v, name):
    """Eager ValueError / graph assertion: finite, non-negative counts with a positive sum."""
    if not validation_enabled():
        return v
    message = f"`{name}` must hold finite, non-negative vote counts with a positive row sum."
    value = static_value(v)
    if value is not None:
        a = np.asarray(value, np.float64)
        with np.errstate(invalid="ignore"):
            ok = np.all(np.isfinite(a) & (a >= 0)) and np.all(a.sum(-1) > 0)
        if a.size and not ok:
            raise ValueError(message)
        return v
    v64 = tf.cast(v, _F64)
    ok = tf.reduce_all(tf.math.is_finite(v64) & (v64 >= 0.0)) & tf.reduce_all(
        tf.reduce_sum(v64, -1) > 0.0
    )
    with tf.control_dependencies([tf.debugging.Assert(ok, [message])]):
        return tf.identity(v)
