"""Label handling shared by the losses: integer class ids or dense targets -> distributions.

The class count ``K`` is ``y_pred``'s last axis. It may be dynamic (in-batch retrieval
scores ``[B, B]`` with an unknown batch size on TensorFlow): everything here then works with
``keras.ops.shape(y_pred)[-1]``, eagerly, in graphs and under XLA.

Contract rules (:mod:`losszoo.contract`): class ids keep ``CLASS_IDS`` (whole numbers in
``[0, K)``; float ids such as ``2.0`` are accepted, ``1.5`` or NaN are not); dense targets
keep ``NON_NEGATIVE`` (finite, ``>= 0``). Eagerly a violation raises ``ValueError`` naming the
argument, in a TensorFlow graph an assertion does (both skipped with
``losszoo.set_validation(False)``); traced for XLA / ``jax.jit`` the helpers return a per-row
``invalid`` mask (or NaN target rows) so the losses make the affected rows' loss NaN, never a
clamped id or a zero row.
"""

from __future__ import annotations

from keras import ops

from losszoo import _backend
from losszoo.contract import (
    CLASS_IDS,
    NON_NEGATIVE,
    check_array_form,
    check_real,
    dense_labels,
    nan_where,
    shapes_compatible,
    static_rank,
    validation_enabled,
)


def is_sparse(y_true, y_pred) -> bool:
    """True when ``y_true`` holds class ids: one rank below ``y_pred``, or a trailing 1.

    This mirrors Keras: ``SparseCategoricalCrossentropy`` takes ids of shape ``[B]`` or
    ``[B, 1]``, ``CategoricalCrossentropy`` targets of shape ``[B, K]``. A ``y_true`` of
    ``y_pred``'s rank whose last axis has no static size is read as dense targets (that is
    what ``tfrs.tasks.Retrieval`` passes: ``tf.eye(B)`` with a dynamic ``B``).
    """
    true_rank, pred_rank = static_rank(y_true), static_rank(y_pred)
    if true_rank is None or pred_rank is None:
        raise ValueError("`y_true` and `y_pred` must have a known rank.")
    if true_rank == pred_rank - 1:
        return True
    return true_rank == pred_rank and y_true.shape[-1] == 1 and y_pred.shape[-1] != 1


def num_classes(y_pred):
    """The size of ``y_pred``'s last axis: a Python int when static, else a scalar tensor."""
    n = y_pred.shape[-1]
    return int(n) if n is not None else ops.shape(y_pred)[-1]


def class_ids_and_invalid(y_true, y_pred, name: str = "y_true"):
    """Class ids plus the mask of ids that cannot be used (for NaN poisoning under XLA).

    Args:
      y_true: ids of shape ``y_pred.shape[:-1]`` or with a trailing 1, integer or floating
        (whole numbers).
      y_pred: the scores ``[..., K]``; ``K`` may be dynamic.
      name: argument name for error messages.

    Returns:
      ``(ids, invalid)``: int32 ids of shape ``y_pred.shape[:-1]`` and a bool mask of the
      same shape, true where the id breaks ``contract.CLASS_IDS`` (NaN, not a whole number,
      outside ``[0, K)``; tested in the ids' own dtype, before a cast could wrap it). Invalid
      ids are replaced by 0 in ``ids`` (safe to gather); callers poison those rows with
      :func:`losszoo.contract.nan_where`. Eagerly and in graphs invalid ids raise first
      (unless validation is off).
    """
    y_true = ops.convert_to_tensor(y_true)
    if static_rank(y_true) is not None and static_rank(y_true) == static_rank(y_pred):
        y_true = ops.squeeze(y_true, -1)
    check_real(y_true, name, bool_ok=False)
    n = num_classes(y_pred)
    if not isinstance(n, int):  # a tensor must match the ids' dtype
        n = ops.cast(n, y_true.dtype)
    y_true = CLASS_IDS.check(y_true, name, n)
    bad = CLASS_IDS.invalid(y_true, n)
    return ops.cast(ops.where(bad, ops.zeros_like(y_true), y_true), "int32"), bad


def one_hot_targets(y_true, y_pred, name: str = "y_true"):
    """One-hot rows in ``y_pred``'s dtype for class ids (a dynamic class count works under
    XLA); rows of invalid ids are all NaN (the XLA contract)."""
    ids, invalid = class_ids_and_invalid(y_true, y_pred, name)
    classes = ops.arange(num_classes(y_pred), dtype=ids.dtype)
    one_hot = ops.cast(ops.equal(ids[..., None], classes), y_pred.dtype)
    return nan_where(invalid[..., None], one_hot)


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
      id (``contract.CLASS_IDS``) or a dense entry breaking ``contract.NON_NEGATIVE`` are all
      NaN in ``q`` and ``has_target`` (this is what survives under XLA; eagerly and in graphs
      such input raises first unless validation is off). A ``tf.SparseTensor`` is densified
      (:func:`losszoo.contract.dense_labels`).
    """
    y_true = dense_labels(y_true, name)
    if is_sparse(y_true, y_pred):
        q = one_hot_targets(y_true, y_pred, name)
        return q, ops.sum(q, axis=-1)  # 1, or NaN for an invalid id
    check_real(y_true, name)
    if not shapes_compatible(tuple(y_true.shape), tuple(y_pred.shape)):
        raise ValueError(
            f"`{name}` must hold class ids of shape {tuple(y_pred.shape[:-1])} (or with a "
            f"trailing 1) or targets of the shape of `y_pred` {tuple(y_pred.shape)}; got shape "
            f"{tuple(y_true.shape)}."
        )
    q = NON_NEGATIVE.check(ops.cast(y_true, y_pred.dtype), name)
    bad = ops.any(NON_NEGATIVE.invalid(q), axis=-1)
    total = ops.sum(q, axis=-1, keepdims=True)
    has_target = nan_where(bad, ops.cast(total[..., 0] > 0, q.dtype))
    if normalize:
        q = ops.divide_no_nan(q, total)
    return nan_where(bad[..., None], q), has_target


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
