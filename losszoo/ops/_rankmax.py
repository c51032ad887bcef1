"""Rankmax: adaptive projection onto the (n, k)-simplex and the Rankmax loss.

Kong, Krichene, Mayoraz, Rendle, Zhang, "Rankmax: An Adaptive Projection Alternative to the
Softmax Function", NeurIPS 2020. Spec: ``shared/specs/rankmax_sparsemax.md``; the closed forms,
the gradients (erratum E1 corrected) and the numerics: ``docs/design/rankmax.md``. Written once
with ``keras.ops``; runs on TensorFlow, JAX and PyTorch.

For one row of logits ``z`` in R^n, a positive label ``y``, an integer ``1 <= k < n`` and a
margin ``eta > 0`` (the paper fixes ``eta = 1``): the threshold is
``mu_y = min(z_y, z_[k]) - eta`` (``z_[k]`` the k-th largest score), ``d = (z - mu_y)_+``, and
``alpha_y > 0`` solves ``sum_i min(1, alpha_y d_i) = k`` (closed form, eq. 12). Then
``Rankmax(z, y) = min(1, alpha_y d)`` (entries in [0, 1] summing to k, ``y`` in the support) and
the loss is ``-log min(1, alpha_y (z_y - mu_y))`` (eq. 14), summed over the positives of a row;
for ``k = 1`` it is ``log sum_i (z_i - z_y + eta)_+ - log eta`` (eq. 15), O(n) with no sort;
general k takes one ``top_k``, O(n log k). Gradients are hand-derived, through ``alpha_y`` and
``mu_y``.

Labels (``label_format``; the rules are in :func:`rankmax_loss`): ids, padded ids (``-1``
pads) or dense non-negative weights; one-hot dense rows take the ids kernel, other dense rows
an exact merged sort per row. Rows without a positive contribute loss 0 and gradient 0.
``-inf`` logits are masked; a positive scored ``-inf`` gives loss ``+inf`` with a zero gradient.
Differences are formed against ``min(z_y, z_[k])`` before the margin is added, so offsets of
1e8 keep the positive's margin term exact. Half precision is computed in float32.

Fail-loud contract (README, "Bad input"; ``losszoo.contract``): ``k``, ``margin``,
``max_positives`` and ``label_format`` are checked when called, naming the argument. The
logits keep ``LOGITS`` (no NaN or ``+inf``, no row all ``-inf``), ids keep
:data:`PADDED_CLASS_IDS`, dense labels keep ``NON_NEGATIVE``: broken eagerly they raise
``ValueError``, in TensorFlow graphs an assertion fails (both skipped with
``losszoo.set_validation(False)``). Traced for XLA (``jit_compile=True``, ``jax.jit``) the
affected rows' loss (and projection) is NaN (the loss of a row holding ``+inf`` or only
``-inf`` may be ``+inf`` instead): invalid ids are never clamped.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from keras import ops

from losszoo import _backend
from losszoo._backend import custom_gradient, take_along_axis
from losszoo.contract import (
    LOGITS,
    NON_NEGATIVE,
    PADDED_CLASS_IDS,
    check_choice,
    check_number,
    check_real,
    dense_labels,
    dtype_name,
    is_floating,
    nan_where,
    row_has_nan,
    shapes_compatible,
    static_rank,
    to_compute_dtype,
    validation_enabled,
)

LABEL_FORMATS = ("auto", "keras", "ids", "dense")


# --------------------------------------------------------------------------- arguments


def check_rankmax_arguments(k, margin, max_positives=1, n=None):
    """``(k, margin, max_positives)`` of :func:`rankmax_loss` checked by its rules.

    ``k`` is a Python int >= 1, ``margin`` a finite number > 0, ``max_positives`` None or an
    int >= 1. ``n`` (the number of candidates, when known) also bounds ``k < n`` and
    ``max_positives <= n``. Keras losses call it at construction, with ``n=None``.

    Args:
      k: the mass ``k`` of the ``(n, k)``-simplex: an integer (a numpy integer too, not a
        bool or a float), ``1 <= k`` (``< n`` when ``n`` is given).
      margin: ``eta``, a finite Python number > 0 (not a tensor).
      max_positives: ``None`` or a whole number >= 1 (``<= n`` when ``n`` is given), not a
        tensor; default 1.
      n: ``None`` (default) or the number of candidates.

    Returns:
      ``(k, margin, max_positives)`` as ``(int, float, int or None)``.

    Raises:
      ValueError: (or TypeError) naming the argument.

    Example:
      >>> losszoo.ops.check_rankmax_arguments(2, 1, n=5)
      (2, 1.0, 1)
    """
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"`k` must be a Python int, got {k!r}.")
    k = check_number(k, "k", low=1, integer=True)
    if n is not None and k >= n:
        raise ValueError(
            f"`k` must be smaller than the number of candidates n={n} (k >= n makes the "
            f"projection all ones and the loss 0), got k={k}."
        )
    margin = check_number(margin, "margin", low=0.0, low_open=True, tensor_ok=False)
    max_positives = check_number(
        max_positives,
        "max_positives",
        low=1,
        high=n,
        integer=True,
        allow_none=True,
        tensor_ok=False,
    )
    return k, margin, max_positives


def _static(n):
    return n if isinstance(n, int) else None


def _prepare_logits(logits, name, k, margin, max_positives=None):
    """The logits checked by ``LOGITS`` in the compute dtype, and the checked arguments.

    Returns ``(z, dtype, n, k, eta, max_positives)``. ``n`` is a tensor when it is only
    known at run time, and then ``k < n`` is a graph assertion (NaN under XLA, see callers).
    """
    z, dtype = to_compute_dtype(logits, name)
    rank = static_rank(z)
    if rank is None or rank < 1:
        raise ValueError(f"`{name}` must have rank >= 1 with known rank, got shape {z.shape}.")
    z = LOGITS.check(z, name)
    n = z.shape[-1]
    if n is None:  # e.g. in-batch logits [B, B] with an unknown batch size (TensorFlow)
        n = ops.shape(z)[-1]
    k, eta, max_positives = check_rankmax_arguments(k, margin, max_positives, _static(n))
    if _static(n) is None and validation_enabled():
        message = (
            f"`k` must be smaller than the number of candidates n (the logits' last axis); k={k}"
        )
        z = _backend.assert_all(k < n, message, z)
    return z, dtype, n, k, eta, max_positives


# --------------------------------------------------------------------------- labels


def _ids_to_positives(labels, z, n, name):
    """Ids (integer or whole floats) -> (ids [N, P] int32, weights [N, P], multi, invalid [N]).

    ``-1`` pads (weight 0). ``invalid`` marks rows breaking :data:`PADDED_CLASS_IDS`: eagerly
    and in graphs they raise first (when validation is on); under XLA the callers make those
    rows NaN (a gather would clamp the id silently).
    """
    rank, zrank = static_rank(labels), static_rank(z)
    multi = rank == zrank
    if rank == zrank - 1:
        labels = labels[..., None]
    elif not multi:
        raise ValueError(
            f"`{name}` as ids must have the logits' shape without the last axis "
            f"{list(z.shape[:-1])} (one positive per row) or with a last axis of M positives "
            f"(-1 pads); got shape {list(labels.shape)} for logits of shape {list(z.shape)}."
        )
    if not shapes_compatible(labels.shape[:-1], z.shape[:-1]):
        raise ValueError(
            f"Leading dimensions of `{name}` {list(labels.shape)} do not match the logits' "
            f"{list(z.shape)}."
        )
    kind = check_real(labels, name, bool_ok=False)
    if not is_floating(labels) and kind != "int64":
        labels = ops.cast(labels, "int32")
    m = labels.shape[-1] if labels.shape[-1] is not None else ops.shape(labels)[-1]
    flat = PADDED_CLASS_IDS.check(ops.reshape(labels, (-1, m)), name, n)
    bad = PADDED_CLASS_IDS.invalid(flat, n)
    ids = ops.cast(ops.where(bad, 0, flat), "int32")
    valid = (ids >= 0) & ~bad
    ids = ops.where(valid, ids, 0)
    return ids, ops.cast(valid, z.dtype), multi, ops.any(bad, axis=-1)


def _dense_weights(labels, z, name):
    """Dense weights with the shape of the logits, checked by ``NON_NEGATIVE``."""
    if not shapes_compatible(labels.shape, z.shape):
        raise ValueError(
            f"Dense `{name}` must have the shape of the logits {list(z.shape)}, got "
            f"{list(labels.shape)}. Pass ids (label_format='ids') for one positive per row."
        )
    check_real(labels, name)
    return NON_NEGATIVE.check(ops.cast(labels, z.dtype), name)


def _read_labels(labels, z, label_format, name):
    """``labels`` as a dense tensor and the format they are read in (:func:`_resolve_format`).

    On TensorFlow a ``tf.RaggedTensor`` is a list of positive ids per row, read as ids and
    padded with -1 to at least one column (``label_format="dense"`` cannot read it:
    TypeError); a ``tf.SparseTensor``'s absent entries are padding (-1) for ids, weight 0
    for dense labels.
    """
    check_choice(label_format, "label_format", LABEL_FORMATS)
    if _backend.TENSORFLOW:
        import tensorflow as tf

        if isinstance(labels, tf.RaggedTensor):
            if label_format == "dense":
                raise TypeError(
                    f"`{name}` is a tf.RaggedTensor (lists of positive ids per row), which "
                    "label_format='dense' cannot read: use label_format='ids' or 'auto'."
                )
            ids = dense_labels(labels, name, ragged_fill=-1)
            short = tf.maximum(1 - tf.shape(ids)[-1], 0)
            pad = tf.concat([tf.zeros([ids.shape.rank - 1, 2], tf.int32), [[0, short]]], 0)
            return tf.pad(ids, pad, constant_values=-1), "ids"
    labels = ops.convert_to_tensor(labels)  # a tf.SparseTensor stays sparse here
    label_format = _resolve_format(labels, z, label_format, name)
    fill = -1 if label_format == "ids" else 0
    return dense_labels(labels, name, sparse_fill=fill), label_format


def _resolve_format(labels, z, label_format, name):
    """The label rule of ``label_format="auto"`` / ``"keras"`` (see :func:`rankmax_loss`).

    Shared by :func:`rankmax_loss` and :func:`rankmax`, so both read (or reject) the same
    labels the same way.
    """
    if label_format in ("ids", "dense"):
        return label_format
    rank, zrank = static_rank(labels), static_rank(z)
    if rank is None:
        raise ValueError(f"`{name}` must have a known rank.")
    if rank == zrank - 1:
        return "ids"
    m, n = (labels.shape[-1] if rank == zrank else None), z.shape[-1]
    if label_format == "keras":  # shapes only: Keras 3 casts y_true to float
        ids = m is not None and (m == 1 or n is not None) and m != n
        return "ids" if ids else "dense"
    if rank == zrank:
        if is_floating(labels) or dtype_name(labels) == "bool":
            return "dense"
        if m is not None and n is not None and m != n:
            return "ids"
        raise ValueError(
            f"`{name}` is ambiguous: integer labels of shape {list(labels.shape)} could be "
            f"one-hot / multi-hot rows over the n={n} candidates or lists of M={m} ids. Pass "
            "`label_format`='dense' or 'ids' (or floating labels for dense weights)."
        )
    raise ValueError(
        f"`{name}` must have the rank of the logits (dense weights or padded ids) or one less "
        f"(ids); got shape {list(labels.shape)} for logits of shape {list(z.shape)}."
    )


# --------------------------------------------------------------------------- shared pieces


def _top_k(x, k):
    """``ops.top_k(x, k)`` with equal values in index order on every backend.

    TensorFlow's and JAX's top_k put the lower index first; ``torch.topk`` orders ties
    arbitrarily, so PyTorch takes a stable argsort (the merged order below relies on ties).
    """
    if _backend.NAME != "torch":
        return ops.top_k(x, k)
    order = ops.argsort(-x, axis=-1)[..., :k]
    return take_along_axis(x, order, axis=-1), order


def _row_index(ids):
    """[N, P] -> [N * P, 2] (row, id) index pairs for scatter."""
    rows = ops.arange(ops.shape(ids)[0], dtype=dtype_name(ids))[:, None]
    return ops.reshape(ops.stack([ops.broadcast_to(rows, ops.shape(ids)), ids], axis=-1), (-1, 2))


def _scatter_add(base, ids, updates):
    """base [N, n] += updates [N, P] at columns ids [N, P]."""
    return ops.scatter_update(base, _row_index(ids), ops.reshape(updates, (-1,)), reduction="add")


def _anchor(zy, top_v, k):
    """Anchor ``m = min(z_y, z_[k])`` [N, P] (``mu = m - eta``, eq. 11) and the case-B mask.

    Differences are formed against ``m`` before the margin is added, so ``z_y - mu`` is
    exactly ``eta`` (case A) whatever the magnitude of the scores.
    """
    if k == 1:
        return zy, None
    # min rather than top_v[:, k-1]: XLA:CPU lowers top_k to its fast kernel only when the
    # sorted values are consumed whole; a slice at k-1 turns it into a full sort (~100x).
    zk = _backend.reduce_min(top_v, axis=-1, keepdims=True)
    # minimum(zy, zk) in this order: a tie z_y = z_[k] is case A (spec 2, TF/XLA notes).
    return _backend.minimum(zy, zk), zy > zk


def _capped_count(D, top_v, m, k, eta):
    """t* [N, P] (int32) and R_{t*} [N, P] from A4/A5 steps 7-11."""
    dt = (top_v[:, None, :] - m[:, :, None]) + eta  # [N, P, k], each >= eta
    # exclusive prefix sums
    prefix = ops.concatenate([ops.zeros_like(dt[..., :1]), _backend.cumsum(dt[..., :-1], -1)], -1)
    R = _backend.maximum(D[:, :, None] - prefix, dt)
    remaining = ops.cast(k - ops.arange(k), D.dtype)
    bad = ops.cast(R < remaining * dt, "int32")
    ts = ops.minimum(ops.sum(bad, axis=-1), k - 1)
    Rs = take_along_axis(R, ts[..., None], axis=-1)[..., 0]
    return ts, Rs


def _positive_terms(zy, m, D, top_v, masked, k, eta):
    """``gap = z_y - mu_y``, the capped count ``ts`` / tail sum ``Rs`` (k > 1) and the
    per-positive loss terms (``+inf`` for a positive masked by ``-inf``; NaN propagates, as
    there is no relu on a NaN)."""
    gap = (zy - m) + eta
    if k == 1:
        ts, Rs = None, D
        raw = ops.log(D) - math.log(eta)
    else:
        ts, Rs = _capped_count(D, top_v, m, k, eta)
        raw = ops.log(Rs) - ops.log(ops.cast(k - ts, D.dtype)) - ops.log(gap)
    terms = ops.where(masked, np.inf, ops.where(raw < 0, 0.0, raw))
    return gap, ts, Rs, terms


def _grad_coefficients(v, gap, s, k, ts, Rs, case_b):
    """Per-positive gradient pieces (spec 3.3).

    Returns a [N,P] (weight of 1[z > mu]), cap [N,k] or None (subtracted at top_i),
    gy [N,P] (added at y) and gk [N] or None (added at the k-th largest index).
    """
    a = v / ops.where(v != 0, Rs, 1.0)
    if k == 1:
        return a, None, -a * s, None
    c = s - ops.cast(ts, v.dtype)  # |U|
    capped = ops.cast(ops.arange(k)[None, None, :] < ts[:, :, None], v.dtype)
    cap = ops.sum(a[:, :, None] * capped, axis=1)
    b = v / ops.where(v != 0, gap, 1.0)
    gy = ops.where(case_b, -b, -a * c)
    gk = ops.sum(ops.where(case_b, b - a * c, 0.0), axis=1)
    return a, cap, gy, gk


def _add_topk_terms(g, top_i, cap, gk, k):
    """g -= cap at the top-k indices; g += gk at the k-th largest index (one scatter over the
    whole top_i, see the note in _anchor)."""
    if k == 1:
        return g
    last = ops.arange(k) == k - 1
    return _scatter_add(g, top_i, ops.where(last[None, :], gk[:, None] - cap, -cap))


# --------------------------------------------------------------------------- ids path


def _positives_forward(z, w, ids, k, eta, consistent=None):
    """Loss per row for the P positives ``ids`` [N, P] of each row, weighted by ``w`` [N, P].

    Returns ``(loss [N], D [N, P], grad)``: ``grad(upstream [N])`` is d loss / d z (spec 3.3).
    It keeps only the small per-positive quantities (O(N P) or O(N k)) and re-forms the
    differences, so no [N, P, n] tensor is stored for the backward pass.

    ``consistent`` (optional, boolean [N, n], built inline so XLA fuses it into the D pass):
    where it is False the summand of ``D`` is NaN, so ``D`` is NaN exactly for the rows that
    contain such an entry (a NaN survives any summation order).
    """
    zy = take_along_axis(z, ids, axis=-1)
    masked = zy == -np.inf  # a positive masked by -inf: loss +inf
    zy = ops.where(masked, 0.0, zy)
    top_v, top_i = (None, None) if k == 1 else _top_k(z, k)
    m, case_b = _anchor(zy, top_v, k)
    diff = (z[:, None, :] - m[:, :, None]) + eta  # z_i - mu_y, [N, P, n]
    relu = ops.relu(diff)
    if consistent is not None:
        relu = ops.where(consistent[:, None, :], relu, np.nan)
    D = ops.sum(relu, axis=-1)
    s = ops.sum(ops.cast(diff > 0, z.dtype), axis=-1)
    gap, ts, Rs, terms = _positive_terms(zy, m, D, top_v, masked, k, eta)
    # w != 0 (not w > 0): a NaN weight (invalid dense labels, see below) must reach the loss.
    loss = ops.sum(ops.where(w != 0, w * terms, 0.0), axis=1)

    def grad(upstream):
        has = (w > 0) & ~masked
        # NaN terms are kept, so NaN logits give NaN gradients too (isnan spelt out: Grappler
        # rewrites ~(t <= 0) into t > 0, which drops them).
        live = (terms > 0) | ops.isnan(terms)
        v = ops.where(has & live, w * upstream[:, None], 0.0)
        a, cap, gy, gk = _grad_coefficients(v, gap, s, k, ts, Rs, case_b)
        inside = (z[:, None, :] - m[:, :, None]) + eta > 0
        g = ops.sum(ops.where(inside, a[:, :, None], 0.0), axis=1)
        g = _scatter_add(g, ids, gy)
        return _add_topk_terms(g, top_i, cap, gk, k)

    return loss, D, grad


def _rankmax_loss_ids(z, ids, w, k, eta):
    """Loss per row for ids [N, P] (weights w [N, P]); custom gradient w.r.t. z."""

    @custom_gradient
    def f(z, ids, w):
        loss, _, grad = _positives_forward(z, w, ids, k, eta)
        return loss, lambda upstream: (grad(upstream), None, None)

    return f(z, ids, w)


def _one_hot_ids(w):
    """Dense weights [N, n] -> the index of each row's positive [N, 1] (int32), read as if
    the row had at most one positive; the caller verifies that reading.

    One pass over ``w``: a matmul with the columns ``1, c_0, c_1, c_2`` where ``c_j(i)`` is
    the j-th base-256 digit of the column index i, giving ``S = sum_i w_i`` and
    ``I_j = sum_i c_j(i) w_i``. For a row whose only positive is ``y``, every other product
    is an exact 0, so ``S = w_y`` and ``I_j = c_j(y) w_y`` up to one rounding whatever the
    summation order, and ``I_j / S`` rounds to the digit ``c_j(y)``. Digits below 256 stay
    exact when an accelerator rounds matmul inputs to TF32 or bfloat16 (w rounds the same
    way in ``S`` and ``I_j``). Any other row (several positives, none, NaN or negative
    weights, n > 2^24) reads some index in ``[0, 2^24)``, which the caller's check rejects:
    a wrong reading only sends the batch to the exact path, it never changes a loss.
    """
    col = ops.arange(ops.shape(w)[-1])
    digits = [ops.ones_like(col)] + [(col // 256**j) % 256 for j in range(3)]
    sums = _backend.matmul(w, ops.cast(ops.stack(digits, axis=1), w.dtype))  # [N, 4]: S, I_0..I_2
    q = _backend.divide_no_nan(sums[:, 1:], sums[:, :1])
    # Comparisons are false for NaN: such digits (and out-of-range ones) read 0. The range is
    # the digits' rounding range: XLA:CPU divides as a multiply by the reciprocal, so
    # 1785 / 7 is 255.00002 there.
    q = ops.where((q >= -0.5) & (q < 255.5), ops.round(q), 0.0)
    y = q[:, :1] + 256 * q[:, 1:2] + 256**2 * q[:, 2:]  # exact: an integer below 2^24
    return ops.cast(y, "int32")


def _rankmax_loss_one_hot_or_dense(z, w, k, eta):
    """Dense weights [N, n]: the one-hot fast path when every row has <= 1 positive, else the
    exact merged sort (both exact).

    Fast path, the cost of ids plus two reads of the labels: :func:`_one_hot_ids` reads a
    candidate positive ``y`` per row with one matmul, then the ids kernel runs on it (one
    gather of ``z_y`` and ``w_y``, one scatter into the gradient). The check that ``y`` is
    the row's only positive and that the weights are valid (``w_y`` finite and >= 0, every
    other ``w_i`` exactly 0) is fused into the pass that forms ``D = sum_i (z_i - mu_y)_+``:
    an entry that fails it adds NaN, so ``D`` is NaN exactly on the rows the fast path
    cannot take (and on rows with NaN logits), and ``fits`` = no NaN in ``D`` is a reduction
    over N numbers. Under XLA:CPU every row reduction materialises its [N, n] summand, so
    a separate "count the positives" pass would cost a full write and read of [N, n].

    The branch is chosen with ``ops.cond`` inside one custom gradient: autodiff through a
    cond would make the taken branch materialise zero-filled copies of the other branch's
    [N, 2n] intermediates. Every [N, n] intermediate is formed inline from the inputs (no
    captured masks): a mask materialised as an operand of the cond costs a full extra
    write and read. On PyTorch (eager) ``fits`` is read on the host once, for the forward
    and the backward pass.
    """
    ids = _one_hot_ids(w)
    weight = take_along_axis(w, ids, axis=-1)  # [N, 1]; 0 for a row without positives

    @custom_gradient
    def f(z, w, ids, weight):
        at_y = ops.arange(ops.shape(z)[-1])[None, :] == ids
        consistent = ops.where(at_y, (w >= 0) & (w < np.inf), w == 0)
        fast, D, fast_grad = _positives_forward(z, weight, ids, k, eta, consistent)
        fits = ~ops.any(ops.isnan(D))
        if _backend.LOOPS_READ_HOST and _backend.is_concrete(D):
            fits = bool(fits)  # PyTorch: one host read for the forward and the backward

        def slow():
            bad = ops.any(NON_NEGATIVE.invalid(w), axis=-1)
            return nan_where(bad, _dense_forward(z, w, k, eta)[0])

        loss = ops.cond(fits, lambda: fast, slow)

        def grad(upstream):
            def dense_grad():
                return _dense_forward(z, w, k, eta)[1](upstream)

            return ops.cond(fits, lambda: fast_grad(upstream), dense_grad), None, None, None

        return loss, grad

    return f(z, w, ids, weight)


# --------------------------------------------------------------------------- dense path


def _unsort(sorted_vals, perm):
    """Inverse of gathering by perm: out[b, perm[b, r]] = sorted_vals[b, r] (extra trailing
    axes of sorted_vals are carried along)."""
    index = _row_index(perm)
    updates = ops.reshape(sorted_vals, (-1, *ops.shape(sorted_vals)[2:]))
    return ops.scatter_update(ops.zeros_like(sorted_vals), index, updates, reduction="add")


def _dense_D_s(z, mu):
    """D_i = sum_j (z_j - mu_i)_+ and s_i = #{j : z_j > mu_i} for every column i. [N, n] each."""
    n = ops.shape(z)[-1]
    # Sort [mu, z] per row, descending; ties put the thresholds first (top_k puts the lower
    # index first), so z_i = mu is outside.
    vals, perm = _top_k(ops.concatenate([mu, z], axis=-1), 2 * n)
    is_z = perm >= n
    count = _backend.cumsum(ops.cast(is_z, z.dtype), axis=-1)
    total = _backend.cumsum(ops.where(is_z, vals, 0.0), axis=-1)
    # At a threshold entry: the z's sorted before it are exactly those > mu.
    D_sorted = ops.where(is_z, 0.0, total - count * vals)
    s_sorted = ops.where(is_z, 0.0, count)
    both = _unsort(ops.stack([D_sorted, s_sorted], axis=-1), perm)
    return both[:, :n, 0], both[:, :n, 1], perm, is_z


def _dense_indicator_sum(a, perm, is_z):
    """sum_i a_i 1[z_j > mu_i] for every column j, via the merged order. a [N, n]."""
    # n from a local tensor: a shape captured from the forward pass of a cond branch is
    # not a compile-time constant in the XLA-compiled gradient of that branch.
    n = ops.shape(a)[-1]
    a_sorted = take_along_axis(a, ops.where(is_z, 0, perm), axis=-1)
    a_sorted = ops.where(is_z, 0.0, a_sorted)
    after = ops.sum(a_sorted, axis=-1, keepdims=True) - _backend.cumsum(a_sorted, axis=-1)
    return _unsort(ops.where(is_z, after, 0.0), perm)[:, n:]


def _dense_forward(z, w, k, eta):
    """Loss per row for dense non-negative label weights w [N, n] (any number of positives),
    and its gradient function (upstream [N] -> d loss / d z)."""
    # Shift by the row max so the prefix sums stay small (shift invariance, spec 1).
    zc = z - _backend.reduce_max(z, axis=-1, keepdims=True)
    masked = (w > 0) & (z == -np.inf)
    has = (w > 0) & ~masked
    zy = ops.where(has, zc, 0.0)  # keeps masked (-inf) non-positives finite
    top_v, top_i = (None, None) if k == 1 else _top_k(zc, k)
    m, case_b = _anchor(zy, top_v, k)
    D, s, perm, is_z = _dense_D_s(zc, m - eta)
    D = ops.where(has, D, 1.0)
    gap, ts, Rs, terms = _positive_terms(zy, m, D, top_v, masked, k, eta)
    loss = ops.sum(ops.where(w > 0, w * terms, 0.0), axis=1)

    def grad(upstream):
        live = (terms > 0) | ops.isnan(terms)
        v = ops.where(has & live, w * upstream[:, None], 0.0)
        a, cap, gy, gk = _grad_coefficients(v, gap, s, k, ts, Rs, case_b)
        g = _dense_indicator_sum(a, perm, is_z) + gy
        return _add_topk_terms(g, top_i, cap, gk, k)

    return loss, grad


def _rankmax_loss_dense(z, w, k, eta):
    """Loss per row for dense weights w [N, n] by the merged sort; custom gradient w.r.t. z."""

    @custom_gradient
    def f(z, w):
        loss, grad = _dense_forward(z, w, k, eta)
        return loss, lambda upstream: (grad(upstream), None)

    return f(z, w)


# --------------------------------------------------------------------------- public ops


def rankmax_loss(
    labels,
    logits,
    k: int = 1,
    margin: float = 1.0,
    max_positives=1,
    label_format: str = "auto",
    *,
    labels_name: str = "labels",
    logits_name: str = "logits",
):
    """Rankmax loss, ``-sum_{y in positives} w_y log min(1, alpha_y (z_y - mu_y))`` per row.

    For k = 1: ``w_y (log sum_i (z_i - z_y + margin)_+ - log margin)``.

    Args:
      labels: the positives of each row, read according to ``label_format``. Ids: shape
        ``logits.shape[:-1]`` (one positive per row) or ``logits.shape[:-1] + [M]`` (several
        positives, ``-1`` pads), integer or whole-number floats. Dense: non-negative weights
        with the shape of ``logits`` (multi-hot 0/1, or e.g. TFRS's identity matrix); each
        positive's loss is multiplied by its weight. A row without positives has loss 0.
      logits: ``[..., n]`` scores of n candidates (n may be dynamic on TensorFlow, e.g.
        in-batch [B, B]). ``-inf`` masks a candidate; a masked positive gives loss ``+inf``.
      k: static int, ``1 <= k < n``; the projection puts mass k on the (n, k)-simplex.
      margin: ``eta > 0``; the threshold is ``min(z_y, z_[k]) - margin``. The paper uses 1.
      max_positives: dense labels only; the result is exact either way. When every row of
        the batch has at most this many positives (default 1: one-hot or identity labels),
        a fast O(M n) path runs (for 1: the ids kernel on the read-off index); otherwise, and
        always when ``None``, one merged sort per row handles any number of positives
        (O(n log n), slow under XLA on CPU). Both branches are compiled (``ops.cond``).
      label_format: ``"auto"`` (default), ``"keras"``, ``"ids"`` or ``"dense"``. On
        TensorFlow a ``tf.RaggedTensor`` of positive ids per row is read as ids (-1 pads); a
        ``tf.SparseTensor`` is densified (absent entries -1 for ids, 0 for dense). Auto:
        floating labels of the logits' shape are dense; labels one rank lower are ids; integer
        ``[..., M]`` with a static ``M != n`` are padded ids; integer ``[..., n]`` (or an
        unknown last axis) is ambiguous and raises, so ``np.eye(3, dtype=int)`` needs
        ``label_format="dense"``. Keras (what :class:`losszoo.losses.RankmaxLoss` passes, as
        Keras 3 casts ``y_true`` to float): shapes only, never the dtype: ids one rank lower
        or with a last axis of 1 (``n != 1``); padded ids ``[..., M]`` when ``M`` and ``n`` are
        static and differ; otherwise (also when a size is unknown) dense.
      labels_name: the name ``labels`` goes by in error messages (``"y_true"`` in a loss).
      logits_name: the name ``logits`` goes by in error messages (``"y_pred"`` in a loss).

    Returns:
      Per-row loss with shape ``logits.shape[:-1]`` and the dtype of ``logits``.

    Raises:
      ValueError: (or TypeError) naming the argument: logits breaking ``contract.LOGITS``,
        ids breaking :data:`PADDED_CLASS_IDS`, dense labels breaking
        ``contract.NON_NEGATIVE``, ambiguous labels, bad ``k`` / ``margin`` /
        ``max_positives`` / ``label_format``. Value checks are skipped with
        ``losszoo.set_validation(False)``.

    Traced for XLA (``jit_compile=True``, ``jax.jit``): rows with NaN logits or invalid labels
    get a NaN loss (and NaN gradients for NaN logits); ids are never clamped.

    Example:
      >>> keras.ops.convert_to_numpy(rankmax_loss([0], [[2.0, 1.5, -3.0]]))  # log(1 + 0.5)
      array([0.4054651], dtype=float32)
    """
    z, dtype, n, k, eta, max_positives = _prepare_logits(
        logits, logits_name, k, margin, max_positives
    )
    z2 = ops.reshape(z, (-1, n))
    labels, label_format = _read_labels(labels, z, label_format, labels_name)
    invalid = None
    if label_format == "ids":
        ids, w, _, invalid = _ids_to_positives(labels, z, n, labels_name)
        loss = _rankmax_loss_ids(z2, ids, w, k, eta)
    else:
        w = ops.reshape(_dense_weights(labels, z, labels_name), (-1, n))
        if max_positives == 1:  # invalid weights are folded into the kernel
            loss = _rankmax_loss_one_hot_or_dense(z2, w, k, eta)
        else:
            invalid = ops.any(NON_NEGATIVE.invalid(w), axis=-1)
            if max_positives is None:
                loss = _rankmax_loss_dense(z2, w, k, eta)
            else:
                counts = ops.sum(ops.cast(w > 0, "int32"), axis=-1)
                loss = ops.cond(
                    ops.all(counts <= max_positives),
                    lambda: _rankmax_loss_ids(z2, *_dense_to_ids(w, max_positives), k, eta),
                    lambda: _rankmax_loss_dense(z2, w, k, eta),
                )
    # NaN logits need no extra pass: (z - m) + eta feeds a relu sum, which propagates NaN
    # (also under XLA), and the gradient keeps NaN terms.
    if invalid is not None:
        loss = nan_where(invalid, loss)
    if _static(n) is None:
        loss = nan_where(k >= n, loss)  # XLA: the graph assertion on k < n is gone
    return ops.cast(ops.reshape(loss, ops.shape(z)[:-1]), dtype)


def _dense_to_ids(w, m):
    """Dense weights [N, n] with <= m positives per row -> (ids [N, m], weights [N, m])."""
    wv, ids = _top_k(w, m)
    return ids, wv


def _rankmax_projection_ids(z, ids, w, k, eta):
    """Projection [N, P, n] for ids [N, P]; padded positives give zero rows."""

    @custom_gradient
    def f(z, ids, w):
        zy = take_along_axis(z, ids, axis=-1)
        top_v, top_i = (None, None) if k == 1 else _top_k(z, k)
        m, case_b = _anchor(zy, top_v, k)
        d = ops.relu((z[:, None, :] - m[:, :, None]) + eta)  # [N, P, n]
        D = ops.sum(d, axis=-1)
        if k == 1:
            ts, Rs = ops.zeros_like(ids), D
        else:
            ts, Rs = _capped_count(D, top_v, m, k, eta)
        alpha = ops.cast(k - ts, z.dtype) / Rs
        has = (w > 0)[:, :, None]
        p = ops.where(has, _backend.minimum(alpha[:, :, None] * d, 1.0), 0.0)

        def grad(u):
            inside = d > 0
            if k > 1:
                # Capped entries: the top t* indices of the row (matches the forward exactly).
                upd = ops.cast(ops.arange(k)[None, None, :] < ts[:, :, None], z.dtype)
                shape = ops.shape(upd)  # [N, P, k]
                batch, positive = ops.shape(ids)[0], ops.shape(ids)[1]
                index = [
                    ops.broadcast_to(ops.arange(batch)[:, None, None], shape),
                    ops.broadcast_to(ops.arange(positive)[None, :, None], shape),
                    ops.broadcast_to(ops.cast(top_i, "int32")[:, None, :], shape),
                ]
                index = ops.reshape(ops.stack(index, -1), (-1, 3))
                capped = ops.scatter_update(
                    ops.zeros_like(d), index, ops.reshape(upd, (-1,)), reduction="add"
                )
                inside = inside & (capped <= 0)
            U = ops.cast(has & inside, d.dtype)
            c = ops.sum(U, axis=-1)
            su = ops.sum(u * U, axis=-1)
            sud = ops.sum(u * U * d, axis=-1)
            coef = alpha / Rs * sud  # alpha^2 / (k - t*) = alpha / R_{t*}
            g = ops.sum(alpha[:, :, None] * u * U - coef[:, :, None] * U, axis=1)
            at_j = -alpha * su + coef * c  # [N, P], added at j
            if k == 1:
                return _scatter_add(g, ids, at_j), None, None
            g = _scatter_add(g, ids, ops.where(case_b, 0.0, at_j))
            gk = ops.sum(ops.where(case_b, at_j, 0.0), axis=1)
            return _add_topk_terms(g, top_i, ops.zeros_like(top_v), gk, k), None, None

        return p, grad

    return f(z, ids, w)


def rankmax(labels, logits, k: int = 1, margin: float = 1.0, label_format: str = "auto"):
    """Rankmax projection ``min(1, alpha_y (z - mu_y)_+)`` of the logits, for each positive.

    Arguments in Keras' order, ``(labels, logits)``, as :func:`rankmax_loss` and every loss.

    ``mu_y = min(z_y, z_[k]) - margin`` and ``alpha_y`` makes the projection sum to k.

    Args:
      labels: ids (integer or whole-number floats), shape ``logits.shape[:-1]`` (one positive
        per row; output ``[..., n]``) or ``logits.shape[:-1] + [M]`` (output ``[..., M, n]``,
        one projection per positive; ``-1`` pads and gives a zero row). On TensorFlow a
        ``tf.RaggedTensor`` of ids per row is padded with -1 (to the longest row); a
        ``tf.SparseTensor``'s absent entries are -1. Read by the same rule as
        :func:`rankmax_loss`: integer labels ``[..., n]`` (one-hot rows or n ids?) are
        ambiguous and raise unless ``label_format="ids"``; floating labels of the logits'
        rank are dense weights, which have no projection (TypeError: use ``rankmax_loss``).
      logits: ``[..., n]`` scores; ``-inf`` masks a candidate (projection 0).
      k: static int, ``1 <= k < n``. Each projection lies in [0, 1] and sums to k.
      margin: ``eta > 0`` (paper: 1).
      label_format: ``"auto"`` (default), ``"keras"`` or ``"ids"`` (see :func:`rankmax_loss`;
        labels read as dense raise TypeError).

    Returns:
      The projection(s), dtype of ``logits``. The positive is always in the support; the
      projection preserves the order of the logits. Differentiable w.r.t. ``logits`` through
      ``alpha`` and ``mu`` (spec 3.4). A positive masked by ``-inf`` has no projection: its
      row is NaN.

    Raises:
      ValueError: (or TypeError) naming the argument: logits breaking ``contract.LOGITS``,
        ids breaking :data:`PADDED_CLASS_IDS`, ambiguous or dense labels, bad ``k`` /
        ``margin`` / ``label_format`` (value checks are skipped with
        ``losszoo.set_validation(False)``).

    Traced for XLA (``jit_compile=True``, ``jax.jit``): rows with NaN logits or invalid ids
    come back all NaN.

    Example:
      >>> keras.ops.convert_to_numpy(rankmax([0], [[2.0, 1.5, -3.0]]))
      array([[0.6666667 , 0.33333334, 0.        ]], dtype=float32)
    """
    z, dtype, n, k, eta, _ = _prepare_logits(logits, "logits", k, margin)
    labels, label_format = _read_labels(labels, z, label_format, "labels")
    if label_format == "dense":
        raise TypeError(
            "`labels` of `rankmax` must be integer ids (one projection per positive); got "
            f"{dtype_name(labels)} labels of the logits' rank, which read as dense weights. "
            "Use rankmax_loss for dense multi-hot labels, or label_format='ids' for lists of "
            "ids."
        )
    ids, w, multi, invalid = _ids_to_positives(labels, z, n, "labels")
    z2 = ops.reshape(z, (-1, n))
    p = _rankmax_projection_ids(z2, ids, w, k, eta)
    zy = take_along_axis(z2, ids, axis=-1)
    bad = invalid[:, None] | ((w > 0) & (zy == -np.inf)) | row_has_nan(z2, keepdims=True)
    if _static(n) is None:
        bad = bad | (k >= n)
    p = nan_where(bad[:, :, None], p)
    shape = ops.shape(z)
    if multi:
        shape = (*shape[:-1], ops.shape(ids)[-1], shape[-1])
    return ops.cast(ops.reshape(p, shape), dtype)
