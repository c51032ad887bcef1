"""Shapes and dtypes of the possibilistic ops' inputs.

The input rules are :data:`losszoo.contract.LOGITS`, :data:`~losszoo.contract.POSSIBILITY`,
:data:`~losszoo.contract.SCALED_POSSIBILITY` and :data:`~losszoo.contract.VOTES`: each gives
the eager ``ValueError`` / graph assertion naming the argument and the per-row NaN mask.
"""

from __future__ import annotations

from keras import ops

from losszoo.contract import check_static_rank, static_rank, to_compute_dtype


def as_float(x, name):
    """``(x, dtype)``: ``x`` as a float tensor (half precision in float32; ints and bools as
    float32) and the dtype results are returned in."""
    return to_compute_dtype(x, name)


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


def check_same_shape(a, b, name_a, name_b):
    """ValueError naming ``name_b`` when the static shapes of ``a`` and ``b`` differ."""
    if static_rank(a) is None or static_rank(b) is None:
        return
    same = len(a.shape) == len(b.shape) and all(
        x is None or y is None or x == y for x, y in zip(a.shape, b.shape)
    )
    if not same:
        raise ValueError(
            f"`{name_b}` must have the shape of `{name_a}` {list(a.shape)}, got {list(b.shape)}."
        )
