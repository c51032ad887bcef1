"""Sparsemax and the sparsemax loss (Martins & Astudillo, 2016).

Spec: ``shared/specs/rankmax_sparsemax.md`` sections 2 (A1, A2), 3.1, 3.2, 4 and 8.

Definitions, for scores ``z`` in R^K and ``(a)_+ = max(a, 0)``:

* ``sparsemax(z) = argmin_{p in simplex} ||p - z||^2 = (z - tau)_+`` where the threshold
  ``tau`` solves ``sum_i (z_i - tau)_+ = 1``. The support is ``S = {i : z_i > tau}``.
* Jacobian ``J = diag(s) - s s^T / |S|`` with ``s = 1[z > tau]``; it is symmetric, so the
  vector-Jacobian product is ``s * (v - sum_S v / |S|)``.
* Sparsemax loss for a target distribution ``q`` (Fenchel-Young loss of ``1/2 ||.||^2``),
  in the stable form that touches only the support and ``q``:
  ``L(z; q) = 1/2 ||p||^2 + 1/2 ||q||^2 - <z - tau, q>`` with gradient ``p - q``.
  ``L >= 0``, convex in ``z``, and ``L = 0`` iff ``p = q``.

The threshold is found by Newton's method on the convex, piecewise-linear, decreasing
``f(tau) = sum_i (z_i - tau)_+ - 1`` started left of the root (Michelot's algorithm):
``tau <- (sum_{z_i > tau} z_i - 1) / |{z_i > tau}|``. From ``tau_0 = max(z) - 1`` every
iterate stays below the root, the support only shrinks, and the iteration stops exactly
when the support stops changing, at which point ``tau`` is the exact threshold (the spec's
A2 refinement run to convergence). It needs no sort: each step is one fused pass over
the row, typically 4 to 13 steps for K from 10 to 10^5, and never more than K. The loop
is a ``tf.while_loop`` over static shapes, so it compiles under XLA. For K >= 32768 the
start is the exact threshold of the top 128 scores (a lower bound of the true one, and
equal to it when the support is smaller than 128), which usually leaves one confirming
pass; this is the spec's top-K shortcut with Newton instead of bisection as the fallback.

Numerics: the maximum is subtracted first (without it float32 loses the support at large
K, spec section 4); ``-inf`` scores get probability 0; ``+inf`` or all ``-inf`` rows give NaN,
as softmax does. Half-precision inputs are computed in float32 and cast back.

Fail-loud contract (README, "Bad input"): a row holding a NaN or ``+inf`` score, or only
``-inf``, comes back entirely NaN (output, loss and gradient) in every mode, eager, graph and
XLA alike, and the other rows are unaffected (folded into the threshold's Newton passes).
Sparsemax is
shift-invariant: offsets of 1e8 give the same output up to float32 rounding of the inputs.
``sparsemax_loss`` also rejects NaN/inf or negative ``labels`` and label rows that do not sum
to 1 eagerly and in graphs (skipped with ``losszoo.set_validation(False)``); under XLA such a
row's loss and gradient are NaN.
``axis`` must be an integer.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from losszoo.ops._common import (
    check_finite,
    check_number,
    check_static_rank,
    dense_labels,
    move_axis_last,
    nan_where,
    static_value,
    to_compute_dtype,
    validation_enabled,
)

# Above this many classes, Newton starts from the exact threshold of the top
# _WARM_START_TOP scores instead of from -1; below it a top-k costs more than it saves.
_WARM_START_MIN_CLASSES = 32768
_WARM_START_TOP = 128


def _top_scores_threshold(z: tf.Tensor, m: int) -> tf.Tensor:
    """Sparsemax threshold of the ``m`` largest scores of each row (spec A1 on top-k).

    Adding scores can only push ``sum_i (z_i - tau)_+`` up, so this is a lower bound of the
    full threshold, and it is the exact threshold whenever the support has fewer than ``m``
    entries (the usual case at large K).
    """
    top = tf.math.top_k(z, m, sorted=True).values
    cumulative = tf.cumsum(top, axis=-1)
    rank = tf.range(1, m + 1, dtype=z.dtype)
    size = tf.reduce_sum(tf.cast(1.0 + rank * top > cumulative, tf.int32), -1, keepdims=True)
    # A NaN row (see _shifted) counts no entry; 1 keeps the gather in range (the row stays NaN).
    size = tf.maximum(size, 1)
    return (tf.gather(cumulative, size - 1, batch_dims=z.shape.rank - 1) - 1.0) / tf.cast(
        size, z.dtype
    )


def _threshold(z: tf.Tensor) -> tf.Tensor:
    """Exact sparsemax threshold of each row of ``z`` (last axis) whose maximum is 0.

    Returns ``tau`` with shape ``z.shape[:-1] + [1]``, without gradient.
    """

    def support_size(tau):
        return tf.reduce_sum(tf.cast(z > tau, tf.int32), axis=-1, keepdims=True)

    def newton_step(tau, count, changed):
        in_support = z > tau
        # NaN entries are summed too, so a row holding a NaN gets a NaN threshold and comes
        # out entirely NaN (XLA's reduce_max skips NaNs, so nothing else would spread it);
        # folded into the pass the step makes anyway.
        keep = in_support | tf.math.is_nan(z)
        total = tf.reduce_sum(tf.where(keep, z, tf.zeros_like(z)), -1, keepdims=True)
        # max() keeps the iterates monotone even under rounding, so the support can only
        # shrink and the loop cannot cycle.
        candidate = (total - 1.0) / tf.cast(count, z.dtype)
        new_tau = tf.where(tf.math.is_nan(candidate), candidate, tf.maximum(tau, candidate))
        new_count = support_size(new_tau)
        return new_tau, new_count, tf.reduce_any(new_count != count)

    tau0 = -tf.ones_like(z[..., :1])  # f(-1) >= 0 because max(z) = 0
    num_classes = z.shape[-1]
    if num_classes is not None and num_classes >= _WARM_START_MIN_CLASSES:
        tau0 = tf.maximum(tau0, _top_scores_threshold(z, _WARM_START_TOP))
    tau, _, _ = tf.while_loop(
        lambda tau, count, changed: changed,
        newton_step,
        (tau0, support_size(tau0), tf.constant(True)),
        maximum_iterations=tf.shape(z)[-1],
    )
    return tf.stop_gradient(tau)


def _shifted(z: tf.Tensor) -> tf.Tensor:
    """``z - max(z)`` per row. An all ``-inf`` row becomes NaN (``-inf - (-inf)``), as in
    softmax; a ``+inf`` entry makes a NaN entry, which :func:`_threshold` spreads to the row."""
    return z - tf.stop_gradient(tf.reduce_max(z, axis=-1, keepdims=True))


def _prepare(logits, axis: int, name: str):
    axis = check_number(axis, "axis", integer=True)
    z, dtype = to_compute_dtype(logits, name)
    check_static_rank(z, 1, name)
    z, undo = move_axis_last(z, axis)
    if z.shape[-1] == 0:
        raise ValueError(f"`{name}` must have at least one class along `axis`={axis}.")
    return z, dtype, undo


@tf.custom_gradient
def _sparsemax_last_axis(z):
    z = _shifted(z)
    p = tf.nn.relu(z - _threshold(z))

    def grad(upstream):
        upstream = tf.cast(upstream, p.dtype)
        support = tf.cast(p > 0, p.dtype)
        mean = tf.reduce_sum(support * upstream, -1, keepdims=True) / tf.reduce_sum(
            support, -1, keepdims=True
        )
        # A NaN row (see _shifted) has an empty support; keep its gradient NaN explicitly,
        # XLA would otherwise turn 0 * NaN into 0.
        return tf.where(tf.math.is_nan(p), p, support * (upstream - mean))

    return p, grad


def sparsemax(logits, axis: int = -1, name: str | None = None) -> tf.Tensor:
    """Sparsemax: the Euclidean projection of ``logits`` onto the probability simplex.

    ``sparsemax(z) = (z - tau(z))_+`` with ``tau`` such that the output sums to 1. Unlike
    softmax it gives exact zeros to scores more than ``tau`` below the top.

    Args:
      logits: float tensor of rank >= 1. float16/bfloat16 are computed in float32.
      axis: the class axis.
      name: optional name scope.

    Returns:
      A tensor of ``logits``' shape and dtype: non-negative, summing to 1 along ``axis``.

    Example:
      >>> losszoo.ops.sparsemax([0.0, 0.5, 1.0]).numpy()
      array([0.  , 0.25, 0.75], dtype=float32)
    """
    with tf.name_scope(name or "sparsemax"):
        z, dtype, undo = _prepare(logits, axis, "logits")
        return tf.cast(undo(_sparsemax_last_axis(z)), dtype)


# Machine epsilon per floating dtype (np.finfo does not know bfloat16).
_EPS = {tf.float16: 2.0**-10, tf.bfloat16: 2.0**-7, tf.float32: 2.0**-23, tf.float64: 2.0**-52}


def _sum_tolerance(label_dtype, dtype) -> float:
    """How far a target row's sum may stray from 1: sqrt(eps) of the coarser of the labels'
    own dtype and the compute dtype (3.5e-4 in float32; one-hot rows are exact)."""
    eps = _EPS[dtype]
    if label_dtype in _EPS:
        eps = max(eps, _EPS[label_dtype])
    return float(np.sqrt(eps))


def _check_labels(q, tol: float, name: str):
    """Targets must be finite, >= 0 and sum to 1 per row within ``tol`` (eagerly or with a
    graph assertion, naming ``name``; skippable)."""
    q = check_finite(q, name)
    if not validation_enabled():
        return q
    negative = f"`{name}` must be non-negative (target distributions)."
    unnormalised = f"`{name}` rows must sum to 1 (target distributions; tolerance {tol:.1e})."
    value = static_value(q)
    if value is not None:
        if value.size and value.min() < 0:
            raise ValueError(f"{negative[:-1]}; got a minimum of {value.min()}.")
        sums = value.sum(-1)
        if sums.size and np.any(np.abs(sums - 1.0) > tol):
            worst = sums.reshape(-1)[np.argmax(np.abs(sums - 1.0))]
            raise ValueError(f"{unnormalised[:-2]}); got a row summing to {worst}.")
        return q
    checks = [
        tf.debugging.assert_non_negative(q, message=negative),
        tf.debugging.Assert(
            tf.reduce_all(tf.abs(tf.reduce_sum(q, -1) - 1.0) <= tol), [unnormalised]
        ),
    ]
    with tf.control_dependencies(checks):
        return tf.identity(q)


def _sparsemax_loss_last_axis(q, z, tol: float):
    """The loss on the last axis; ``q`` is a constant (no gradient)."""

    @tf.custom_gradient
    def f(z):
        z = _shifted(z)
        tau = _threshold(z)
        p = tf.nn.relu(z - tau)
        # <z - tau, q> over the classes that carry target mass; written with where() so that
        # a -inf score with q = 0 contributes 0 rather than NaN.
        margin = tf.where(q > 0, (z - tau) * q, tf.zeros_like(q))
        # Negative, NaN or infinite targets, or a row not summing to 1, poison the row: the
        # XLA half of the label check, folded into the sums.
        bad = tf.math.is_nan(q) | (q < 0) | tf.equal(q, np.inf)  # not ~(q >= 0): see _targets
        square = tf.where(bad, tf.fill(tf.shape(q), tf.constant(np.nan, q.dtype)), q * q)
        loss = 0.5 * tf.reduce_sum(p * p + square, -1) - tf.reduce_sum(margin, -1)
        loss = tf.nn.relu(loss)  # L >= 0 exactly; removes round-off below zero.
        loss = nan_where(tf.abs(tf.reduce_sum(q, -1) - 1.0) > tol, loss)

        def grad(upstream):
            g = tf.cast(upstream, p.dtype)[..., None] * (p - q)
            return nan_where(tf.math.is_nan(loss)[..., None], g)

        return loss, grad

    return f(z)


def sparsemax_loss(
    labels, logits, axis: int = -1, name: str | None = None, *, labels_name: str = "labels"
) -> tf.Tensor:
    """Per-example sparsemax loss ``L(z; q) = 1/2||p||^2 + 1/2||q||^2 - <z - tau, q>``.

    ``p = sparsemax(z)``. The gradient with respect to the logits is ``p - q``; the labels
    are treated as constants. ``L >= 0`` and ``L = 0`` exactly when ``p = q``; for one-hot
    targets that means the true class leads every other by a margin of at least 1.

    Args:
      labels: target distributions ``q`` with the shape of ``logits``: one-hot, soft, or a
        normalised multi-label vector, dense or a ``tf.SparseTensor`` (absent entries are 0;
        not under ``jit_compile=True``, where XLA cannot densify it).
        Rows must be non-negative and sum to 1 within ``sqrt(eps)`` of the coarser of the
        labels' and the compute dtype (3.5e-4 in float32); the loss is shift-invariant in the
        logits only then.
      logits: float tensor of rank >= 1.
      axis: the class axis.
      name: optional name scope.
      labels_name: the name ``labels`` goes by in error messages (``"y_true"`` in a loss).

    Returns:
      The loss per example: ``logits``' shape without ``axis``, in ``logits``' dtype.

    Raises:
      ValueError: naming ``labels`` (or ``labels_name``; eagerly; a graph assertion in
        ``tf.function``) for NaN, inf or negative targets or rows that do not sum to 1 (skipped with
        ``losszoo.set_validation(False)``; under XLA those rows' loss and gradient are NaN).
        TypeError for ``tf.RaggedTensor`` labels.

    Example:
      >>> losszoo.ops.sparsemax_loss([[0.0, 1.0]], [[0.0, 2.0]]).numpy()
      array([0.], dtype=float32)
    """
    with tf.name_scope(name or "sparsemax_loss"):
        z, dtype, _ = _prepare(logits, axis, "logits")
        labels = dense_labels(labels, labels_name)
        q = tf.cast(labels, z.dtype)
        if q.shape.rank is not None and z.shape.rank is not None:
            q_last, _ = move_axis_last(q, axis) if q.shape.rank == z.shape.rank else (q, None)
            if not q_last.shape.is_compatible_with(z.shape):
                raise ValueError(
                    f"`{labels_name}` must have the shape of `logits` {list(z.shape)} (class axis "
                    f"last), got {list(q.shape)}."
                )
            q = q_last
        tol = _sum_tolerance(labels.dtype, z.dtype)
        q = _check_labels(q, tol, labels_name)
        return tf.cast(_sparsemax_loss_last_axis(q, z, tol), dtype)
