"""KL losses ``KL(t || softmax(z))`` with the hand-derived gradient ``sum(t) softmax(z) - t``.

Model A (:func:`possibilistic_projection_loss`): ``t = p*``, the projection of ``softmax(z)``
held fixed (Danskin: the exact gradient, spec 4); Model B: the antipignistic target; Model
C: vote proportions. Contract rules: logits, possibility rows, vote counts (:mod:`._inputs`);
invalid rows give a NaN loss under XLA.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from losszoo.contract import nan_where, row_has_nan
from losszoo.ops.possibilistic._config import _F64, ProjectionConfig, _check_compute_dtype
from losszoo.ops.possibilistic._constraints import _antipignistic_2d, _sanitize
from losszoo.ops.possibilistic._inputs import (
    _as_float,
    _check_same_shape,
    _flatten,
    _logits_invalid,
    _possibility_invalid,
    _validate_logits,
    _validate_possibility,
    _validate_votes,
)
from losszoo.ops.possibilistic._projection import _finish_info, _prepare, _projection_from_z

_LOG_Q_CLIP = float(np.log(1e-15))


@tf.custom_gradient
def _kl_from_logits(target, z):
    """``sum_k t_k (log t_k - max(log softmax(z)_k, log 1e-15))`` per row (0 log 0 = 0).

    float64. The clamp (the paper clips probabilities at 1e-15 wherever a log is taken)
    only matters when ``q_k < 1e-15`` while ``t_k > 0`` (e.g. a -inf logit on a possible
    class), where it keeps the value finite. Gradient: ``sum(t) softmax(z) - t`` for ``z``
    (exact for a constant target away from the clamp); none for the target (a label).
    """
    lq = tf.nn.log_softmax(z, axis=-1)
    pos = target > 0.0
    lq_c = tf.maximum(lq, _LOG_Q_CLIP)
    terms = tf.where(
        pos, target * (tf.math.log(tf.where(pos, target, 1.0)) - lq_c), tf.zeros_like(target)
    )
    # A NaN target (the projection of an invalid row) or q (+inf logits, every class of the
    # support masked) would drop out of the sum above: the row is NaN instead.
    loss = nan_where(row_has_nan(target) | row_has_nan(lq), tf.reduce_sum(terms, axis=-1))

    def grad(upstream):
        q = tf.exp(lq)
        total = tf.reduce_sum(target, axis=-1, keepdims=True)
        return None, upstream[:, None] * (total * q - target)

    return loss, grad


def possibilistic_projection_loss(
    logits,
    possibility,
    tol: float = 1e-8,
    max_cycles: int = 2000,
    stopping: str = "certified",
    support_mode: str = "floor",
    gap_tol: float = 1e-10,
    floor: float = 1e-6,
    eps_cap: float = 1e-9,
    tie_tol: float = 0.0,
    gap_policy: str = "wide",
    q_clip: float = 1e-15,
    compute_dtype: str = "float64",
    unroll_max_k: int = 8,
    jit: bool = True,
    method: str | None = None,
    name: str | None = None,
):
    """Per-example loss ``KL(p* || softmax(z))`` with ``p*`` the projection of ``softmax(z)``.

    ``p*`` is recomputed from the current logits and held fixed; by Danskin's theorem the
    gradient ``softmax(z) - p*`` is the exact gradient of ``z -> min_{p in F} KL(p||q)``
    (spec 4). In ``"restrict"`` mode ``q`` is renormalised on the support and classes
    outside it get zero gradient. Invalid rows (``possibility`` not finite in ``[0, 1]``
    with row maximum 1; NaN, +inf or all -inf logits) raise eagerly and in graphs, naming the
    argument, and give a NaN loss under XLA (and with validation off).

    Args:
      logits: ``[..., K]`` logits (float16/bfloat16/float32/float64).
      possibility: ``[..., K]`` possibility degrees.
      Other arguments: as :func:`possibilistic_projection`.

    Returns:
      ``(loss, info)``: ``loss`` ``[...]`` in the logits' dtype; ``info`` as
      :func:`possibilistic_projection` (float64 / int / bool, no gradient).

    Example:
      >>> loss, info = possibilistic_projection_loss([[2.0, 0.0, -1.0]], [[0.3, 1.0, 0.2]])
    """
    cfg = ProjectionConfig(
        tol=tol,
        max_cycles=max_cycles,
        stopping=stopping,
        support_mode=support_mode,
        gap_tol=gap_tol,
        floor=floor,
        eps_cap=eps_cap,
        tie_tol=tie_tol,
        gap_policy=gap_policy,
        q_clip=q_clip,
        method=method,
    )
    _check_compute_dtype(compute_dtype, cfg)
    with tf.name_scope(name or "possibilistic_projection_loss"):
        z, z2, pi2, restore = _prepare(logits, possibility)
        dtype = z.dtype if z.dtype.is_floating else tf.float32
        z64 = tf.cast(z2, _F64)
        p, info, zm, lq = _projection_from_z(z64, pi2, cfg, unroll_max_k, jit)
        loss = _kl_from_logits(p, zm)
        invalid = _possibility_invalid(pi2) | _logits_invalid(z64) | row_has_nan(lq)
        loss = nan_where(invalid, loss)
        info = _finish_info(info, invalid, restore)
        return tf.cast(restore(loss), dtype), info


def antipignistic_kl_loss(logits, possibility, floor: float = 0.0, name: str | None = None):
    """Model B of the paper: ``KL(pdot(pi) || softmax(z))`` with the antipignistic target.

    Gradient ``softmax(z) - pdot``. Invalid rows (``possibility`` outside ``[0, 1]``, not
    max-normalised or with NaN/Inf; NaN, +inf or all -inf logits) raise eagerly and in
    graphs, naming the argument, and give a NaN loss under XLA. ``K`` may be unknown at
    trace time.

    Args:
      logits: ``[..., K]`` logits.
      possibility: ``[..., K]`` possibility degrees.
      floor: floor applied to the normalised ``pi`` before the transform (0: none).
      name: optional name scope.

    Returns:
      ``[...]`` per-example loss in the logits' dtype.

    Example:
      >>> antipignistic_kl_loss([[0.0, 0.0]], [[1.0, 1.0]]).numpy()
      array([0.], dtype=float32)
    """
    if not 0.0 <= floor < 1.0:
        raise ValueError(f"`floor` must be in [0, 1), got {floor!r}.")

    def target(pi2):
        _, valid = _sanitize(pi2)
        return _antipignistic_2d(pi2, tf.constant(floor, _F64)), valid

    with tf.name_scope(name or "antipignistic_kl_loss"):
        return _fixed_target_kl(logits, possibility, "possibility", target)


def vote_kl_loss(logits, votes, name: str | None = None):
    """Model C of the paper: ``KL(v / sum(v) || softmax(z))`` with vote proportions.

    Negative or non-finite counts, rows without a positive count and NaN, +inf or all -inf
    logits are invalid: they raise eagerly and in graphs, naming the argument, and give a
    NaN loss under XLA. Gradient ``softmax(z) - v/sum(v)``. ``K`` may be unknown at trace
    time.

    Args:
      logits: ``[..., K]`` logits.
      votes: ``[..., K]`` non-negative vote counts (any scale).
      name: optional name scope.

    Returns:
      ``[...]`` per-example loss in the logits' dtype.

    Example:
      >>> vote_kl_loss([[0.0, 0.0]], [[5, 5]]).numpy()
      array([0.], dtype=float32)
    """

    def target(v2):
        finite = tf.reduce_all(tf.math.is_finite(v2), axis=-1)
        v2 = tf.where(tf.math.is_finite(v2), tf.maximum(v2, 0.0), tf.zeros_like(v2))
        total = tf.reduce_sum(v2, axis=-1, keepdims=True)
        valid = finite & (total[:, 0] > 0.0)
        return tf.where(
            valid[:, None], v2 / tf.where(total > 0.0, total, 1.0), tf.zeros_like(v2)
        ), valid

    with tf.name_scope(name or "vote_kl_loss"):
        return _fixed_target_kl(logits, votes, "votes", target)


def _fixed_target_kl(logits, labels, labels_name, make_target):
    """``KL(t || softmax(z))`` per row for a target ``t`` that does not depend on ``z``.

    ``make_target(labels [N, K] float64) -> (t, valid [N])``; invalid rows get a NaN loss.
    Shared by the paper's fixed-target baselines (Models B and C).
    """
    z = _as_float(logits, "logits")
    y = tf.stop_gradient(_as_float(labels, labels_name))
    _check_same_shape(z, y, "logits", labels_name)
    dtype = z.dtype if z.dtype.is_floating else tf.float32
    z2, restore = _flatten(z, "logits", static_k=False)
    y2, _ = _flatten(y, labels_name, k=z2.shape[-1], static_k=False)
    z2 = _validate_logits(z2, "logits")
    if labels_name == "possibility":
        y2 = _validate_possibility(y2, labels_name)
    else:
        y2 = _validate_votes(y2, labels_name)
    target, valid = make_target(tf.cast(y2, _F64))
    y64 = tf.cast(y2, _F64)
    invalid = ~valid | _logits_invalid(tf.cast(z2, _F64)) | tf.reduce_any(y64 < 0.0, axis=-1)
    if labels_name == "possibility":
        invalid |= _possibility_invalid(y64)
    loss = _kl_from_logits(tf.stop_gradient(target), tf.cast(z2, _F64))
    loss = nan_where(invalid, loss)
    return tf.cast(restore(loss), dtype)
