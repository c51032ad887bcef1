"""Softmax cross-entropy on logits, with ``-inf`` read as "not a candidate".

For logits ``z`` and targets ``q``: ``L(z; q) = -sum_{j: q_j > 0} q_j log softmax(z)_j`` with
the hand-derived gradient ``sum(q) softmax(z) - q``. Only the target classes enter the sum,
so a ``-inf`` logit of a non-target class (an accidental hit masked in retrieval) gives a
finite loss, where Keras' ``CategoricalCrossentropy(from_logits=True)`` gives NaN.

Fail-loud contract (README, "Bad input"; :mod:`losszoo.contract`): labels as in
:func:`losszoo.contract.target_distribution` (``CLASS_IDS`` or ``NON_NEGATIVE``); the
logits keep ``LOGITS`` by its cheaper form (NaN raises, ``+inf`` and all ``-inf`` rows are
poisoned only: see :func:`softmax_cross_entropy`).
"""

from __future__ import annotations

from keras import ops

from losszoo._backend import custom_gradient, jit_on_jax, take_along_axis
from losszoo.contract import (
    check_not_nan,
    check_static_rank,
    class_ids_and_invalid,
    dense_labels,
    is_class_ids,
    nan_where,
    target_distribution,
    to_compute_dtype,
)


@jit_on_jax
@custom_gradient
def _cross_entropy(q, z):
    """``-sum_{q > 0} q log softmax(z)`` per row (``q`` constant), gradient
    ``sum(q) softmax(z) - q``; a NaN in ``z`` gives a NaN row and gradient (rows of NaN
    targets are poisoned by the caller's ``has_target``)."""
    log_p = ops.log_softmax(z, axis=-1)
    loss = -ops.sum(ops.where(q > 0, q * log_p, 0.0), axis=-1)

    def grad(upstream):
        total = ops.sum(q, axis=-1, keepdims=True)
        return None, ops.cast(upstream, z.dtype)[..., None] * (total * ops.exp(log_p) - q)

    return loss, grad


@jit_on_jax
def _cross_entropy_ids(ids, invalid, z):
    """``logsumexp(z) - z_y`` per row for class ids (int32; ``invalid`` rows NaN), gradient
    ``softmax(z) - onehot(y)``: :func:`_cross_entropy` for a one-hot ``q`` without forming
    ``q`` (no pass over targets; the one-hot only inside the gradient's subtraction)."""

    @custom_gradient
    def f(z, ids, invalid):  # ids and invalid as arguments: JAX's custom VJP closes over none
        log_p = ops.log_softmax(z, axis=-1)
        loss = nan_where(invalid, -take_along_axis(log_p, ids[..., None], axis=-1)[..., 0])

        def grad(upstream):
            target = ops.one_hot(ids, z.shape[-1], dtype=z.dtype)
            g = ops.cast(upstream, z.dtype)[..., None] * (ops.exp(log_p) - target)
            return nan_where(ops.isnan(loss)[..., None], g), None, None

        return loss, grad

    return f(z, ids, invalid)


def softmax_cross_entropy(
    labels,
    logits,
    normalize_labels: bool = True,
    *,
    labels_name: str = "labels",
    logits_name: str = "logits",
):
    """Per-example softmax cross-entropy ``-sum_{j: q_j > 0} q_j log softmax(z)_j``.

    The gradient with respect to the logits is ``sum(q) softmax(z) - q`` (``softmax(z) - q``
    for a distribution); the labels are constants.

    Args:
      labels: class ids of shape ``logits.shape[:-1]`` or with a trailing 1 (integer or
        whole-number floats, rule ``contract.CLASS_IDS``), or dense non-negative targets of
        the shape of ``logits`` (``contract.NON_NEGATIVE``; on TensorFlow also a
        ``tf.SparseTensor``): Keras' label forms, read by shape
        (:func:`losszoo.contract.is_class_ids`). A row without any target has loss 0.
      logits: ``[..., K]`` scores (``K`` may be dynamic); ``-inf`` means "not a candidate".
        Logits policy: ``contract.LOGITS`` in its cheaper form, kept for speed: a NaN raises
        naming ``logits_name`` (eagerly and in graphs); a row holding ``+inf`` or only
        ``-inf`` has a NaN loss in every mode; a target class at ``-inf`` gives ``+inf``.
      normalize_labels: divide dense rows by their sum (a multi-hot row becomes the uniform
        distribution over its positives); ``False`` uses them as given.
      labels_name: the name ``labels`` goes by in error messages (``"y_true"`` in a loss).
      logits_name: the name ``logits`` goes by in error messages (``"y_pred"`` in a loss).

    Returns:
      The loss per example, ``logits.shape[:-1]``, float32 or float64 (half precision is
      computed and returned in float32).

    Raises:
      ValueError: naming the argument (eagerly; a graph assertion in TensorFlow graphs) for
        ids outside ``[0, K)``, NaN or non-whole ids, NaN/inf or negative dense targets and
        NaN logits (skipped with ``losszoo.set_validation(False)``). Traced for XLA /
        ``jax.jit`` those rows' loss and gradient are NaN instead, never a clamped id.

    Example:
      >>> keras.ops.convert_to_numpy(softmax_cross_entropy([0], [[0.0, 0.0, float("-inf")]]))
      array([0.6931472], dtype=float32)
    """
    z, _ = to_compute_dtype(logits, logits_name)
    check_static_rank(z, 1, logits_name)
    z = check_not_nan(z, logits_name)
    labels = dense_labels(labels, labels_name)
    if is_class_ids(labels, z) and z.shape[-1] is not None:
        return _cross_entropy_ids(*class_ids_and_invalid(labels, z, labels_name), z)
    q, has_target = target_distribution(labels, z, normalize_labels, labels_name)
    return _cross_entropy(ops.stop_gradient(q), z) * has_target
