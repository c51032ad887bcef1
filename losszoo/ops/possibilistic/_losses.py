"""KL losses ``KL(t || softmax(z))`` with the hand-derived gradient ``sum(t) softmax(z) - t``.

Model A (:func:`possibilistic_projection_loss`): ``t = p*``, the projection of ``softmax(z)``
held fixed (Danskin: the exact gradient, spec 4); Model B: the antipignistic target; Model
C: vote proportions. Every op takes ``(labels, logits, ...)`` and returns the loss per
example; labels may also be class ids (Keras' sparse form, one-hot rows). Contract rules:
``LOGITS`` (checked: raises, NaN rows where it cannot), ``CLASS_IDS``, ``POSSIBILITY`` and
``VOTES`` (:mod:`losszoo.contract`);
invalid rows give a NaN loss where no error can be raised (XLA, ``jax.jit``). Float64
inside: on JAX it needs ``jax_enable_x64``.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from losszoo import _backend
from losszoo._backend import maximum, no_autograph
from losszoo.contract import (
    LOGITS,
    POSSIBILITY,
    VOTES,
    check_number,
    dense_labels,
    is_class_ids,
    nan_where,
    one_hot_targets,
    row_has_nan,
    static_rank,
)
from losszoo.ops.possibilistic._config import F64, ProjectionConfig, _0, resolve_config
from losszoo.ops.possibilistic._constraints import _antipignistic_2d
from losszoo.ops.possibilistic._inputs import prepare
from losszoo.ops.possibilistic._projection import finish_info, projection_from_z

_LOG_Q_CLIP = np.log(1e-15)


def _keras_labels(labels, logits, name):
    """Keras' label forms: class ids ``[...]`` / ``[..., 1]`` become one-hot rows (all NaN for
    an id breaking ``CLASS_IDS``, which raises first where it can); dense labels (a
    ``tf.SparseTensor`` densified) pass as they are."""
    labels, logits = dense_labels(labels, name), ops.convert_to_tensor(logits)
    if static_rank(labels) is None or static_rank(logits) is None:  # dense, as before
        return labels
    return one_hot_targets(labels, logits, name) if is_class_ids(labels, logits) else labels


@_backend.custom_gradient
def _kl_from_logits(target, z):
    """``sum_k t_k (log t_k - max(log softmax(z)_k, log 1e-15))`` per row (0 log 0 = 0).

    float64. The clamp (the paper clips probabilities at 1e-15 wherever a log is taken)
    only matters when ``q_k < 1e-15`` while ``t_k > 0`` (e.g. a -inf logit on a possible
    class), where it keeps the value finite. Gradient: ``sum(t) softmax(z) - t`` for ``z``
    (exact for a constant target away from the clamp); none for the target (a label).
    """
    lq = ops.log_softmax(z, axis=-1)
    pos = target > 0.0
    lq_c = maximum(lq, _LOG_Q_CLIP)
    terms = ops.where(
        pos, target * (ops.log(ops.where(pos, target, 1.0)) - lq_c), ops.zeros_like(target)
    )
    # A NaN target (the projection of an invalid row) or q (+inf logits, every class of the
    # support masked) would drop out of the sum above: the row is NaN instead.
    loss = nan_where(row_has_nan(target) | row_has_nan(lq), ops.sum(terms, axis=-1))

    def grad(upstream):
        total = ops.sum(target, axis=-1, keepdims=True)
        return None, ops.cast(upstream, F64)[:, None] * (total * ops.exp(lq) - target)

    return loss, grad


@no_autograph
def possibilistic_projection_loss(
    labels,
    logits,
    config: ProjectionConfig | None = None,
    *,
    return_info: bool = False,
    labels_name: str = "labels",
    jit: bool = True,
    **options,
):
    """Per-example loss ``KL(p* || softmax(z))`` with ``p*`` the projection of ``softmax(z)``.

    ``p*`` (:func:`possibilistic_projection`) is recomputed from the current logits and held
    fixed; by Danskin's theorem the gradient ``softmax(z) - p*`` is the exact gradient of
    ``z -> min_{p in F(pi)} KL(p||q)`` (spec 4). In ``"restrict"`` mode ``q`` is
    renormalised on the support and classes outside it get zero gradient.

    Args:
      labels: ``[..., K]`` possibility distributions ``pi``; rows must keep
        ``contract.POSSIBILITY`` (values in ``[0, 1]``, maximum 1). Class ids (``[...]`` or
        ``[..., 1]``, Keras' sparse form) are one-hot ``pi``.
      logits: ``[..., K]`` logits (float16/bfloat16/float32/float64); rows must keep
        ``contract.LOGITS``.
      config: a :class:`ProjectionConfig`; default ``ProjectionConfig()``.
      return_info: also return the projection's :class:`ProjectionInfo` (no extra work).
      labels_name: the name ``labels`` goes by in error messages (``"y_true"`` in a loss).
      jit: as :func:`possibilistic_projection`.
      **options: instead of ``config``, its fields as keywords.

    Returns:
      The loss ``[...]`` in the logits' dtype; with ``return_info=True``, ``(loss, info)``.

    Raises:
      ValueError: naming ``labels`` (or ``labels_name``) / ``logits`` for rows breaking
        their rule (eagerly; a graph assertion in TensorFlow graphs; traced under XLA /
        ``jax.jit`` those rows' loss is NaN).
      RuntimeError: on JAX without ``jax_enable_x64``.

    Example:
      >>> loss = possibilistic_projection_loss([[0.3, 1.0, 0.2]], [[2.0, 0.0, -1.0]])
    """
    cfg = resolve_config(config, options)
    labels = _keras_labels(labels, logits, labels_name)
    z64, pi64, restore, dtype = prepare(
        "possibilistic_projection", logits, labels, labels_name, POSSIBILITY
    )
    p, info, zm = projection_from_z(z64, pi64, cfg, jit)
    loss = ops.cast(restore(_kl_from_logits(p, zm)), dtype)
    return (loss, finish_info(info, restore)) if return_info else loss


@no_autograph
def possibilistic_projection_info(labels, logits, config=None, **kwargs):
    """The :class:`ProjectionInfo` of ``p* = argmin_{p in F(pi)} KL(p || softmax(z))``.

    The diagnostics :func:`possibilistic_projection_loss` returns with ``return_info=True``
    (the same solve; the loss is dropped).

    Args:
      labels: ``[..., K]`` possibility distributions ``pi`` or class ids, as for
        :func:`possibilistic_projection_loss`.
      logits: ``[..., K]`` logits ``z``, as for :func:`possibilistic_projection_loss`.
      config: a :class:`ProjectionConfig`; default ``ProjectionConfig()``.
      **kwargs: ``labels_name`` and ``jit`` of :func:`possibilistic_projection_loss`, or,
        instead of ``config``, its fields as keywords.

    Returns:
      A :class:`ProjectionInfo` of per-example tensors (leading dims ``[...]``, no gradient).

    Raises:
      ValueError / RuntimeError: as :func:`possibilistic_projection_loss`.

    Example:
      >>> info = possibilistic_projection_info([[0.3, 1.0, 0.2]], [[2.0, 0.0, -1.0]])
      >>> bool(info.converged[0]), bool(info.valid[0])
      (True, True)
    """
    return possibilistic_projection_loss(labels, logits, config, return_info=True, **kwargs)[1]


@no_autograph
def antipignistic_kl_loss(labels, logits, floor: float = 0.0, *, labels_name: str = "labels"):
    """Model B of the paper: ``KL(pdot(pi) || softmax(z))`` with the antipignistic target.

    Gradient ``softmax(z) - pdot``. ``K`` may be unknown at trace time (TensorFlow).

    Args:
      labels: ``[..., K]`` possibility distributions; rows must keep
        ``contract.POSSIBILITY``. Class ids (``[...]`` or ``[..., 1]``) are one-hot.
      logits: ``[..., K]`` logits; rows must keep ``contract.LOGITS``.
      floor: floor applied to the normalised ``pi`` before the transform, in ``[0, 1)``.
      labels_name: the name ``labels`` goes by in error messages.

    Returns:
      ``[...]`` per-example loss in the logits' dtype (NaN for invalid rows where no error
      can be raised).

    Example:
      >>> keras.ops.convert_to_numpy(antipignistic_kl_loss([[1.0, 1.0]], [[0.0, 0.0]]))
      array([0.], dtype=float32)
    """
    floor = check_number(floor, "floor", low=0.0, high=1.0, high_open=True)
    target = _antipignistic_2d(ops.cast(floor, F64))
    op = "antipignistic_kl_loss"
    return _fixed_target_kl(op, logits, labels, labels_name, POSSIBILITY, target)


@no_autograph
def vote_kl_loss(labels, logits, *, labels_name: str = "labels"):
    """Model C of the paper: ``KL(v / sum(v) || softmax(z))`` with vote proportions.

    Gradient ``softmax(z) - v/sum(v)``. ``K`` may be unknown at trace time (TensorFlow).

    Args:
      labels: ``[..., K]`` vote counts (any scale); rows must keep ``VOTES`` (finite,
        non-negative, a positive sum). Class ids (``[...]`` or ``[..., 1]``) are one vote.
      logits: ``[..., K]`` logits; rows must keep ``contract.LOGITS``.
      labels_name: the name ``labels`` goes by in error messages.

    Returns:
      ``[...]`` per-example loss in the logits' dtype (NaN for invalid rows where no error
      can be raised).

    Example:
      >>> keras.ops.convert_to_numpy(vote_kl_loss([[5, 5]], [[0.0, 0.0]]))
      array([0.], dtype=float32)
    """

    def target(v2):
        v2 = ops.where(ops.isfinite(v2), maximum(v2, _0), ops.zeros_like(v2))
        total = ops.sum(v2, axis=-1, keepdims=True)
        return v2 / ops.where(total > 0.0, total, 1.0)

    return _fixed_target_kl("vote_kl_loss", logits, labels, labels_name, VOTES, target)


def _fixed_target_kl(op, logits, labels, labels_name, rule, make_target):
    """``KL(t || softmax(z))`` per row for a target ``t`` that does not depend on ``z``.

    ``make_target(labels [N, K] float64) -> t``; rows breaking ``rule`` or
    ``LOGITS`` get a NaN loss. Shared by the paper's fixed-target baselines (Models B, C).
    """
    labels = _keras_labels(labels, logits, labels_name)
    z64, y64, restore, dtype = prepare(op, logits, labels, labels_name, rule, static_k=False)
    target = make_target(y64)
    invalid = rule.invalid(y64) | LOGITS.invalid(z64)
    loss = nan_where(invalid, _kl_from_logits(ops.stop_gradient(target), z64))
    return ops.cast(restore(loss), dtype)
