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
``tau <- (sum_{z_i > tau} z_i - 1) / |{z_i > tau}|``. From any start ``tau_0 <= tau`` every
iterate stays below the root, the support only shrinks, and the iteration stops exactly
when the support stops changing, at which point ``tau`` is the exact threshold (the spec's
A2 refinement run to convergence). It needs no sort; the loop is a ``keras.ops.while_loop``
over static shapes, so it compiles under XLA. Each step costs two passes over the row (the
sum over the support, then its new size), so the start matters: the threshold of any subset
of the scores is a lower bound of the full one (dropping scores can only lower
``sum_i (z_i - tau)_+``). The start is the threshold of the chunk maxima (the row cut into
chunks of up to 32 classes, at least 16 chunks; found the same way, recursively), which is
exact when no two support entries share a chunk: 1 to 3 full steps instead of 5 to 6 from
``tau_0 = max(z) - 1 = -1`` (measured at K = 1000 to 100000, Gaussian scores).

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
from keras import ops

from losszoo._backend import custom_gradient
from losszoo.contract import (
    TARGETS,
    check_number,
    check_static_rank,
    dense_labels,
    dtype_name,
    move_axis_last,
    nan_where,
    shapes_compatible,
    static_rank,
    to_compute_dtype,
)

# Chunks for the start of the threshold search: the largest of these sizes that divides the
# class axis and leaves at least _MIN_CHUNKS chunks (fewer would make the start no cheaper
# than a full step).
_CHUNK_SIZES = (32, 16, 8, 4, 2)
_MIN_CHUNKS = 16


def _chunk_size(num_classes) -> int:
    """The chunk size for ``num_classes`` classes: 1 (no chunks) when no size of
    ``_CHUNK_SIZES`` fits or the size is unknown."""
    if num_classes is None:
        return 1
    fits = (c for c in _CHUNK_SIZES if num_classes % c == 0 and num_classes // c >= _MIN_CHUNKS)
    return next(fits, 1)


def _threshold(z):
    """Exact sparsemax threshold of each row of ``z`` (last axis) whose maximum is 0.

    Returns ``tau`` with shape ``z.shape[:-1] + [1]``, without gradient.
    """

    def support_size(tau):
        return ops.sum(ops.cast(z > tau, "int32"), axis=-1, keepdims=True)

    def newton_step(tau, count, changed):
        in_support = z > tau
        # NaN entries are summed too, so a row holding a NaN gets a NaN threshold and comes
        # out entirely NaN (XLA's reduce_max skips NaNs, so nothing else would spread it);
        # folded into the pass the step makes anyway.
        keep = in_support | ops.isnan(z)
        total = ops.sum(ops.where(keep, z, 0.0), -1, keepdims=True)
        # max() keeps the iterates monotone even under rounding, so the support can only
        # shrink and the loop cannot cycle.
        candidate = (total - 1.0) / ops.cast(count, z.dtype)
        new_tau = ops.where(ops.isnan(candidate), candidate, ops.maximum(tau, candidate))
        new_count = support_size(new_tau)
        return new_tau, new_count, ops.any(ops.not_equal(new_count, count))

    tau0 = -ops.ones_like(z[..., :1])  # f(-1) >= 0 because max(z) = 0
    num_classes = z.shape[-1]
    chunk = _chunk_size(num_classes)
    if chunk > 1:  # the chunk maxima's threshold: a lower bound (module docstring)
        lead = list(ops.shape(z)[:-1])
        maxima = ops.max(ops.reshape(z, [*lead, num_classes // chunk, chunk]), -1)
        tau0 = ops.maximum(tau0, _threshold(maxima))
    tau, _, _ = ops.while_loop(
        lambda tau, count, changed: changed,
        newton_step,
        (tau0, support_size(tau0), ops.convert_to_tensor(True)),
        maximum_iterations=num_classes if num_classes is not None else ops.shape(z)[-1],
    )
    return ops.stop_gradient(tau)


def _shifted(z):
    """``z - max(z)`` per row. An all ``-inf`` row becomes NaN (``-inf - (-inf)``), as in
    softmax; a ``+inf`` entry makes a NaN entry, which :func:`_threshold` spreads to the row."""
    return z - ops.stop_gradient(ops.max(z, axis=-1, keepdims=True))


def _prepare(logits, axis: int, name: str):
    axis = check_number(axis, "axis", integer=True)
    z, dtype = to_compute_dtype(logits, name)
    check_static_rank(z, 1, name)
    z, undo = move_axis_last(z, axis)
    if z.shape[-1] == 0:
        raise ValueError(f"`{name}` must have at least one class along `axis`={axis}.")
    return z, dtype, undo


@custom_gradient
def _sparsemax_last_axis(z):
    z = _shifted(z)
    p = ops.relu(z - _threshold(z))

    def grad(upstream):
        upstream = ops.cast(upstream, p.dtype)
        support = ops.cast(p > 0, p.dtype)
        mean = ops.sum(support * upstream, -1, keepdims=True) / ops.sum(support, -1, keepdims=True)
        # A NaN row (see _shifted) has an empty support; keep its gradient NaN explicitly,
        # XLA would otherwise turn 0 * NaN into 0.
        return ops.where(ops.isnan(p), p, support * (upstream - mean))

    return p, grad


def sparsemax(logits, axis: int = -1):
    """Sparsemax: the Euclidean projection of ``logits`` onto the probability simplex.

    ``sparsemax(z) = (z - tau(z))_+`` with ``tau`` such that the output sums to 1. Unlike
    softmax it gives exact zeros to scores more than ``tau`` below the top.

    Args:
      logits: float tensor of rank >= 1. float16/bfloat16 are computed in float32.
      axis: the class axis.

    Returns:
      A tensor of ``logits``' shape and dtype: non-negative, summing to 1 along ``axis``.

    Example:
      >>> keras.ops.convert_to_numpy(losszoo.ops.sparsemax([0.0, 0.5, 1.0]))
      array([0.  , 0.25, 0.75], dtype=float32)
    """
    z, dtype, undo = _prepare(logits, axis, "logits")
    return ops.cast(undo(_sparsemax_last_axis(z)), dtype)


# Machine epsilon per floating dtype (np.finfo does not know bfloat16).
_EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}


def _sum_tolerance(label_dtype: str, dtype: str) -> float:
    """How far a target row's sum may stray from 1: sqrt(eps) of the coarser of the labels'
    own dtype and the compute dtype (3.5e-4 in float32; one-hot rows are exact)."""
    eps = max(_EPS[dtype], _EPS.get(label_dtype, 0.0))
    return float(np.sqrt(eps))


def _sparsemax_loss_last_axis(q, z, tol: float, threshold=_threshold):
    """The loss on the last axis; ``q`` is a constant (no gradient). ``threshold`` maps the
    shifted scores to ``tau`` (the benchmarks' floor rows pass a precomputed one)."""

    @custom_gradient
    def f(z, q):
        z = _shifted(z)
        tau = threshold(z)
        p = ops.relu(z - tau)
        # <z - tau, q> over the classes that carry target mass; written with where() so that
        # a -inf score with q = 0 contributes 0 rather than NaN.
        margin = ops.where(q > 0, (z - tau) * q, 0.0)
        # Targets breaking TARGETS poison the row: the XLA half of the label check, folded
        # into the sums (NaN squares; not ~(q >= 0), see losses/_targets).
        bad = ops.isnan(q) | (q < 0) | ops.equal(q, np.inf)
        square = ops.where(bad, np.nan, q * q)
        loss = 0.5 * ops.sum(p * p + square, -1) - ops.sum(margin, -1)
        loss = ops.relu(loss)  # L >= 0 exactly; removes round-off below zero.
        loss = nan_where(ops.abs(ops.sum(q, -1) - 1.0) > tol, loss)

        def grad(upstream):
            g = ops.cast(upstream, p.dtype)[..., None] * (p - q)
            return nan_where(ops.isnan(loss)[..., None], g), None

        return loss, grad

    return f(z, q)


def sparsemax_loss(labels, logits, axis: int = -1, *, labels_name: str = "labels"):
    """Per-example sparsemax loss ``L(z; q) = 1/2||p||^2 + 1/2||q||^2 - <z - tau, q>``.

    ``p = sparsemax(z)``. The gradient with respect to the logits is ``p - q``; the labels
    are treated as constants. ``L >= 0`` and ``L = 0`` exactly when ``p = q``; for one-hot
    targets that means the true class leads every other by a margin of at least 1.

    Args:
      labels: target distributions ``q`` with the shape of ``logits``: one-hot, soft, or a
        normalised multi-label vector, dense or (TensorFlow) a ``tf.SparseTensor`` (absent
        entries are 0; not under ``jit_compile=True``, where XLA cannot densify it).
        Rows must keep the rule ``contract.TARGETS``: non-negative, summing to 1 within
        ``sqrt(eps)`` of the coarser of the labels' and the compute dtype (3.5e-4 in float32);
        the loss is shift-invariant in the logits only then.
      logits: float tensor of rank >= 1.
      axis: the class axis.
      labels_name: the name ``labels`` goes by in error messages (``"y_true"`` in a loss).

    Returns:
      The loss per example: ``logits``' shape without ``axis``, in ``logits``' dtype.

    Raises:
      ValueError: naming ``labels`` (or ``labels_name``; eagerly; a graph assertion in a
        TensorFlow graph) for rows breaking ``contract.TARGETS`` (skipped with
        ``losszoo.set_validation(False)``; under XLA those rows' loss and gradient are NaN).
        TypeError for ``tf.RaggedTensor`` labels.

    Example:
      >>> keras.ops.convert_to_numpy(losszoo.ops.sparsemax_loss([[0.0, 1.0]], [[0.0, 2.0]]))
      array([0.], dtype=float32)
    """
    z, dtype, _ = _prepare(logits, axis, "logits")
    labels = dense_labels(labels, labels_name)
    q = ops.cast(labels, z.dtype)
    if static_rank(q) is not None:  # z's rank is known: _prepare moved its axis
        q_last = move_axis_last(q, axis)[0] if static_rank(q) == len(z.shape) else q
        if not shapes_compatible(q_last.shape, z.shape):
            raise ValueError(
                f"`{labels_name}` must have the shape of `logits` {list(z.shape)} (class axis "
                f"last), got {list(q.shape)}."
            )
        q = q_last
    tol = _sum_tolerance(dtype_name(labels), dtype_name(z))
    q = TARGETS.check(q, labels_name, tol)
    return ops.cast(_sparsemax_loss_last_axis(q, z, tol), dtype)
