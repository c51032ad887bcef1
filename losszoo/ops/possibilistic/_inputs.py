"""Shapes, dtypes and contract checks of the possibilistic ops' inputs.

The input rules are :data:`losszoo.contract.LOGITS`, :data:`~losszoo.contract.POSSIBILITY`,
:data:`~losszoo.contract.SCALED_POSSIBILITY` and :data:`~losszoo.contract.VOTES`: each gives
the eager ``ValueError`` / graph assertion naming the argument and the per-row NaN mask.
"""

from __future__ import annotations

from keras import ops

from losszoo import _backend
from losszoo.contract import (
    LOGITS,
    check_static_rank,
    shapes_compatible,
    static_rank,
    to_compute_dtype,
)
from losszoo.ops.possibilistic._config import F64


def flatten(x, name, k=None, static_k=True):
    """Reshape ``[..., K]`` to ``[B, K]``; returns ``(x2d, restore)`` (``restore`` maps
    ``[B, ...]`` back to the leading dims).

    ``k`` overrides the class count (static); without it an unknown ``K`` raises, unless
    ``static_k=False`` (ops whose kernels read ``K`` at run time).
    """
    check_static_rank(x, 1, name)
    k = x.shape[-1] if k is None else k
    if k is None:
        if static_k:
            raise ValueError(f"The class axis (last) of `{name}` must have a static size.")
        k = ops.shape(x)[-1]
    lead = tuple(ops.shape(x)[:-1])

    def restore(y):
        return ops.reshape(y, lead + tuple(ops.shape(y)[1:]))

    return ops.reshape(x, (-1, k)), restore


def prepare(op, logits, labels, labels_name, rule, static_k=True):
    """Checked ``[B, K]`` float64 logits and labels (the labels without gradient), the
    ``restore`` of the leading dims and the output dtype (the logits').

    ``op`` names the op in the error without float64 (JAX without ``jax_enable_x64``).
    Labels of another static shape than the logits raise ``ValueError`` naming
    ``labels_name``; the logits keep ``LOGITS`` and the labels ``rule``. ``static_k=False``
    lets ``K`` be unknown at trace time.
    """
    _backend.require_float64(op)
    z, dtype = to_compute_dtype(logits, "logits")
    y, _ = to_compute_dtype(labels, labels_name)
    known = static_rank(z) is not None and static_rank(y) is not None
    if known and not shapes_compatible(z.shape, y.shape):
        raise ValueError(
            f"`{labels_name}` must have the shape of `logits` {list(z.shape)}, got {list(y.shape)}."
        )
    z2, restore = flatten(z, "logits", static_k=static_k)
    y2, _ = flatten(ops.stop_gradient(y), labels_name, k=z2.shape[-1], static_k=static_k)
    z64 = ops.cast(LOGITS.check(z2, "logits"), F64)
    y64 = ops.cast(rule.check(y2, labels_name), F64)
    return z64, y64, restore, dtype
