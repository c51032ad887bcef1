"""Rankmax: adaptive projection onto the (n, k)-simplex and the Rankmax loss.

Kong, Krichene, Mayoraz, Rendle, Zhang, "Rankmax: An Adaptive Projection Alternative to the
Softmax Function", NeurIPS 2020. Spec: ``shared/specs/rankmax_sparsemax.md`` sections 1.1
(definition), 2 (A4, A5, A6), 3.3 and 3.4 (gradients, with erratum E1 corrected) and 4
(numerics).

For one row of scores ``z`` in R^n, a positive label ``y``, an integer ``1 <= k < n`` and a
margin ``eta > 0`` (the paper fixes ``eta = 1``):

* threshold ``mu_y = min(z_y, z_[k]) - eta`` (eq. 11; ``z_[k]`` is the k-th largest score);
* ``d = (z - mu_y)_+`` and ``alpha_y > 0`` with ``sum_i min(1, alpha_y d_i) = k``. In closed
  form ``alpha_y = (k - t*) / R_{t*}`` (eq. 12) where ``R_t = sum_{rank > t} d`` and ``t*``,
  the number of entries capped at 1, is the count of ``t in {0..k-1}`` with
  ``R_t < (k - t) d_(t+1)`` (spec A4; clamped to ``k - 1`` against round-off);
* ``Rankmax(z, y) = min(1, alpha_y d)``: entries in [0, 1] summing to k, ``y`` always in the
  support (Definition 4);
* loss ``l(z, y) = -log min(1, alpha_y (z_y - mu_y))`` (eq. 14, without the constant 1/k),
  summed over the positives of the row. For ``k = 1`` this is the closed form (eq. 15)
  ``log sum_i (z_i - z_y + eta)_+ - log eta``: one gather, one relu pass and one sum, O(n), no
  sort. General k uses one ``top_k(z, k)``: O(n log k).

Gradient of the loss (spec 3.3), through ``alpha_y`` and ``mu_y`` (never stopped): with ``U``
the uncapped support (ranks ``t*+1..s``), ``c = |U|``, ``D_U = R_{t*}``, ``j = y`` when
``z_y <= z_[k]`` (case A) and ``j`` = index of the k-th largest otherwise (case B),
``dl/dz = (1_U - c e_j) / D_U - (e_y - e_j) / (z_y - mu_y)``, and 0 when ``y`` is capped.
For k = 1: ``alpha`` on ``{i != y : z_i > z_y - eta}`` and ``-(s - 1) alpha`` at ``y``
(erratum E1: the paper prints ``-s alpha``). The projection's VJP (spec 3.4) is
``alpha (u 1_U - (sum_U u) e_j) - (alpha / D_U) (sum_U u d) (1_U - c e_j)``.

Label formats (``label_format``). ``"ids"``: class ids ``[...]`` (one positive per row) or
``[..., M]`` (several positives, ``-1`` pads), integer or whole-number floats; each positive is
broadcast against the row: O(M n) time and memory per row, O(n) for a single positive.
``"dense"``: non-negative weights of the shape of the scores (multi-hot, or TFRS's identity
matrix); each positive's loss is multiplied by its weight. When every row of the batch has at
most one positive (one-hot, identity; ``max_positives=1``, the default), the positive's index
is read with one matmul over the labels (``sum_i i w_i / sum_i w_i``) and the ids kernel runs
on it; the check that the reading is right (every other weight exactly 0) is fused into the
kernel's relu-sum pass: the O(n) cost of ids plus two reads of the labels. Otherwise an
exact merged sort per row runs (spec A6 (ii), O(n log n)); the choice is made at run time
with ``tf.cond``. ``"auto"`` (default): floating labels of the scores' shape are dense,
labels one rank lower are ids, integer labels ``[..., M]`` with a static ``M != n`` are padded
ids; integer labels ``[..., n]`` (or with an unknown last axis) are ambiguous (a one-hot row or
n padded ids?) and are rejected: pass ``label_format``. ``"keras"`` (the rule of
``RankmaxLoss``, as Keras 3 casts ``y_true`` to float) reads shapes only: ids one rank lower or
with a last axis of 1, padded ids ``[..., M]`` when ``M`` and ``n`` are static and differ,
dense otherwise. ``rankmax`` (the projection) reads labels by the same rules and rejects dense
ones. A ``tf.RaggedTensor`` (positive ids per row) is read as ids padded with -1; a
``tf.SparseTensor`` is densified, its absent entries -1 for ids, 0 for dense
weights (both raise ``TypeError`` under ``jit_compile=True``, where XLA cannot densify them).
Rows without a positive (all ids -1, or all-zero dense labels) contribute loss 0 and
gradient 0.

Numerics: every difference is taken against the anchor ``m = min(z_y, z_[k])`` before the
margin is added (``z_i - mu_y = (z_i - m) + eta``), so offsets and scales of 1e8 keep the
positive's own margin term exact (``rankmax_loss([0], [[1e8, 1e8, 1e8]]) = log 3``). Ties
``z_i = mu_y`` are outside the support (strict ``>``); ``z_y = z_[k]`` is case A. ``-inf``
scores are masked (weight 0); a positive whose score is ``-inf`` gives loss ``+inf`` with a
zero gradient (and a NaN projection row). ``+inf`` scores give a NaN or ``+inf`` loss.
Half-precision inputs are computed in float32 and cast back; float64 stays float64.

Fail-loud contract (README, "Bad input"): ``k``, ``margin``, ``max_positives`` and
``label_format`` are checked when called, naming the argument. NaN scores, ids outside
``[0, n)`` (or ``-1``), non-whole, NaN or negative labels raise eagerly and in graphs (skipped
with ``losszoo.set_validation(False)``). Under XLA, where assertions vanish, the affected
rows' loss (and projection) is NaN: invalid ids are never clamped.
"""

from __future__ import annotations

import numbers

import numpy as np
import tensorflow as tf

from losszoo.contract import (
    check_choice,
    check_not_nan,
    dense_labels,
    nan_where,
    static_value,
    to_compute_dtype,
    validation_enabled,
)

__all__ = ["rankmax", "rankmax_loss"]

LABEL_FORMATS = ("auto", "keras", "ids", "dense")


# --------------------------------------------------------------------------- validation


def _check_k_margin(k, margin, n):
    if isinstance(k, bool) or not isinstance(k, (numbers.Integral,)):
        raise TypeError(f"`k` must be a Python int, got {k!r}.")
    k = int(k)
    if k < 1:
        raise ValueError(f"`k` must be >= 1, got k={k}.")
    if n is not None and k >= n:
        raise ValueError(
            f"`k` must be smaller than the number of candidates n={n} (k >= n makes the "
            f"projection all ones and the loss 0), got k={k}."
        )
    if not isinstance(margin, numbers.Real) or isinstance(margin, bool):
        raise TypeError(f"`margin` must be a Python float, got {margin!r}.")
    margin = float(margin)
    if not margin > 0 or not np.isfinite(margin):
        raise ValueError(f"`margin` must be a finite number > 0, got margin={margin}.")
    return k, margin


def _prepare_scores(scores, name="scores"):
    z, dtype = to_compute_dtype(scores, name)
    if z.shape.rank is None or z.shape.rank < 1:
        raise ValueError(f"`{name}` must have rank >= 1 with known rank, got shape {z.shape}.")
    z = check_not_nan(z, name)
    n = z.shape[-1]
    if n is None:  # e.g. in-batch scores [B, B] with an unknown batch size
        n = tf.shape(z)[-1]
    return z, dtype, n


def _static(n):
    return n if isinstance(n, int) else None


def _check_k_against(z, k, n):
    """k < n when n is only known at run time (graph assertion; NaN under XLA, see callers)."""
    if _static(n) is not None or not validation_enabled():
        return z
    with tf.control_dependencies(
        [
            tf.debugging.Assert(
                k < n, ["`k` must be smaller than the number of candidates n;", "k =", k, "n =", n]
            )
        ]
    ):
        return tf.identity(z)


def _assert(ok, message):
    with tf.control_dependencies([tf.debugging.Assert(ok, [message])]):
        return tf.identity(ok)


def _ids_to_positives(labels, z, n, name="labels"):
    """Ids (integer or whole floats) -> (ids [N, P] int32, weights [N, P], multi, invalid [N]).

    ``-1`` pads (weight 0). ``invalid`` marks rows holding an id outside ``[-1, n)``, a NaN or
    a non-whole value: eagerly and in graphs they raise first (when validation is on); under
    XLA the callers make those rows NaN (a gather would clamp the id silently).
    """
    lead = z.shape[:-1]
    if labels.shape.rank == z.shape.rank - 1:
        multi = False
        labels = labels[..., None]
    elif labels.shape.rank == z.shape.rank:
        multi = True
    else:
        raise ValueError(
            f"`{name}` as ids must have shape scores.shape[:-1]={lead.as_list()} (one positive "
            f"per row) or scores.shape[:-1] + [M] (M positives, -1 pads); got {labels.shape} "
            f"for scores of shape {z.shape}."
        )
    if not lead.is_compatible_with(labels.shape[:-1]):
        raise ValueError(
            f"Leading dimensions of `{name}` {labels.shape} do not match `scores` {z.shape}."
        )
    if not (labels.dtype.is_integer or labels.dtype.is_floating):
        raise TypeError(f"`{name}` as ids must be integer or floating, got {labels.dtype.name}.")
    m = labels.shape[-1] if labels.shape[-1] is not None else tf.shape(labels)[-1]
    flat = tf.reshape(labels, [-1, m])
    if flat.dtype.is_floating:
        whole = tf.math.is_finite(flat) & tf.equal(flat, tf.round(flat))
    else:
        flat = tf.cast(flat, tf.int64)
        whole = tf.ones_like(flat, tf.bool)
    bad = ~whole | (flat < -1) | (flat >= tf.cast(n, flat.dtype))
    invalid = tf.reduce_any(bad, axis=-1)
    bound = _static(n) if _static(n) is not None else "n"
    message = (
        f"`{name}` must hold whole-number ids in [0, {bound}) (n = the scores' last "
        "axis) or -1 for padding."
    )
    if validation_enabled():
        value = static_value(labels)
        if value is not None and _static(n) is not None:
            value = np.asarray(value, np.float64)
            if value.size and (
                not np.all(np.isfinite(value))
                or np.any(value != np.round(value))
                or value.min() < -1
                or value.max() >= n
            ):
                raise ValueError(
                    f"{message} Got values in [{np.nanmin(value)}, "
                    f"{np.nanmax(value)}]" + (" and NaN." if np.isnan(value).any() else ".")
                )
        else:
            with tf.control_dependencies([_assert(~tf.reduce_any(invalid), message)]):
                invalid = tf.identity(invalid)
    ids = tf.cast(tf.where(bad, tf.zeros_like(flat), flat), tf.int32)
    valid = (ids >= 0) & ~bad
    w = tf.cast(valid, z.dtype)
    ids = tf.where(valid, ids, tf.zeros_like(ids))
    return ids, w, multi, invalid


def _check_dense_labels(labels, z, name="labels"):
    """Dense weights: shape of the scores, finite, >= 0. Returns (weights, invalid rows [...])."""
    if not labels.shape.is_compatible_with(z.shape):
        raise ValueError(
            f"Dense `{name}` must have the shape of `scores` {z.shape}, got {labels.shape}. "
            "Pass ids (label_format='ids') for one positive per row."
        )
    if not (labels.dtype.is_integer or labels.dtype.is_floating or labels.dtype == tf.bool):
        raise TypeError(f"Dense `{name}` must be numeric, got {labels.dtype.name}.")
    w = tf.cast(labels, z.dtype)
    # Not ~(w >= 0): Grappler rewrites that into w < 0, which is false for NaN.
    invalid = tf.reduce_any(tf.math.is_nan(w) | (w < 0) | tf.math.is_inf(w), axis=-1)
    message = f"Dense `{name}` must be finite and >= 0 (multi-hot or weights)."
    if validation_enabled():
        value = static_value(labels)
        if value is not None:
            value = np.asarray(value, np.float64)
            if not np.all(np.isfinite(value)) or np.any(value < 0):
                raise ValueError(message)
        else:
            with tf.control_dependencies([_assert(~tf.reduce_any(invalid), message)]):
                w = tf.identity(w)
    return w, invalid


def _labels_and_format(labels, label_format, name):
    """``labels`` as a tensor and the format it forces (``label_format`` otherwise).

    A ``tf.RaggedTensor`` is a list of positive ids per row: padded with -1 (to at least one
    column, so rows may all be empty) and read as ids; ``label_format="dense"`` cannot read
    it (TypeError). A ``tf.SparseTensor`` stays sparse until the format is resolved (see
    :func:`_densify`).
    """
    check_choice(label_format, "label_format", LABEL_FORMATS)
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
    if isinstance(labels, tf.SparseTensor):
        return labels, label_format
    return tf.convert_to_tensor(labels), label_format


def _densify(labels, label_format, name):
    """A ``tf.SparseTensor``'s absent entries are padding (-1) for ids, weight 0 for dense."""
    return dense_labels(labels, name, sparse_fill=-1 if label_format == "ids" else 0)


def _resolve_format(labels, z, label_format, name):
    """The label rule of ``label_format="auto"`` (see the module docstring).

    Shared by :func:`rankmax_loss` and :func:`rankmax`, so both read (or reject) the same
    labels the same way.
    """
    check_choice(label_format, "label_format", LABEL_FORMATS)
    if label_format in ("ids", "dense"):
        return label_format
    rank, zrank = labels.shape.rank, z.shape.rank
    if rank is None:
        raise ValueError(f"`{name}` must have a known rank.")
    if rank == zrank - 1:
        return "ids"
    if label_format == "keras":  # shapes only: Keras 3 casts y_true to float
        m, n = labels.shape[-1] if rank == zrank else None, z.shape[-1]
        ids = m is not None and (m == 1 or n is not None) and m != n
        return "ids" if ids else "dense"
    if rank == zrank:
        if labels.dtype.is_floating or labels.dtype == tf.bool:
            return "dense"
        m, n = labels.shape[-1], z.shape[-1]
        if m is not None and n is not None and m != n:
            return "ids"
        raise ValueError(
            f"`{name}` is ambiguous: integer labels of shape {labels.shape} could be one-hot / "
            f"multi-hot rows over the n={n} candidates or lists of M={m} ids. Pass "
            "`label_format`='dense' or 'ids' (or floating labels for dense weights)."
        )
    raise ValueError(
        f"`{name}` must have the rank of `scores` (dense weights or padded ids) or one less "
        f"(ids); got shape {labels.shape} for scores of shape {z.shape}."
    )


# --------------------------------------------------------------------------- shared pieces


def _row_index(ids):
    """[N, P] -> [N, P, 2] (row, id) index tuples for scatter/gather."""
    rows = tf.broadcast_to(tf.range(tf.shape(ids)[0], dtype=ids.dtype)[:, None], tf.shape(ids))
    return tf.stack([rows, ids], axis=-1)


def _scatter_add(base, ids, updates):
    """base [N, n] += updates [N, P] at columns ids [N, P]."""
    return tf.tensor_scatter_nd_add(base, _row_index(ids), updates)


def _anchor(zy, top_v, k):
    """Anchor ``m = min(z_y, z_[k])`` [N, P] (``mu = m - eta``, eq. 11) and the case-B mask.

    Differences are formed against ``m`` before the margin is added, so ``z_y - mu`` is
    exactly ``eta`` (case A) whatever the magnitude of the scores.
    """
    if k == 1:
        return zy, None
    # reduce_min rather than top_v[:, k-1]: XLA:CPU lowers top_k to its fast kernel only when
    # the sorted values are consumed whole; a slice at k-1 turns it into a full sort (~100x).
    zk = tf.reduce_min(top_v, axis=-1, keepdims=True)
    # minimum(zy, zk) in this order: a tie z_y = z_[k] is case A (spec 2, TF/XLA notes).
    return tf.minimum(zy, zk), zy > zk


def _capped_count(D, top_v, m, k, eta):
    """t* [N, P] (int32) and R_{t*} [N, P] from A4/A5 steps 7-11."""
    dt = (top_v[:, None, :] - m[:, :, None]) + eta  # [N, P, k], each >= eta
    prefix = tf.math.cumsum(dt, axis=-1, exclusive=True)
    R = tf.maximum(D[:, :, None] - prefix, dt)
    remaining = tf.cast(k - tf.range(k), D.dtype)
    bad = tf.cast(R < remaining * dt, tf.int32)
    ts = tf.minimum(tf.reduce_sum(bad, axis=-1), k - 1)
    Rs = tf.gather(R, ts[..., None], batch_dims=2)[..., 0]
    return ts, Rs


def _loss_terms(gap, D, k, eta, ts, Rs):
    """Per-positive loss; ``gap = z_y - mu_y``. NaN propagates (no relu on a NaN)."""
    if k == 1:
        raw = tf.math.log(D) - np.log(eta)
    else:
        raw = tf.math.log(Rs) - tf.math.log(tf.cast(k - ts, D.dtype)) - tf.math.log(gap)
    return tf.where(raw < 0, tf.zeros_like(raw), raw)


def _positive_terms(zy, m, D, top_v, masked, k, eta):
    """``gap = z_y - mu_y``, the capped count ``ts`` / tail sum ``Rs`` (k > 1) and the
    per-positive loss terms (``+inf`` for a positive masked by ``-inf``)."""
    gap = (zy - m) + eta
    if k == 1:
        ts, Rs = None, D
    else:
        ts, Rs = _capped_count(D, top_v, m, k, eta)
    terms = _loss_terms(gap, D, k, eta, ts, Rs)
    terms = tf.where(masked, tf.fill(tf.shape(terms), tf.constant(np.inf, D.dtype)), terms)
    return gap, ts, Rs, terms


def _grad_coefficients(v, gap, s, k, ts, Rs, case_b):
    """Per-positive gradient pieces (spec 3.3).

    Returns a [N,P] (weight of 1[z > mu]), cap [N,k] or None (subtracted at top_i),
    gy [N,P] (added at y) and gk [N] or None (added at the k-th largest index).
    """
    safe_R = tf.where(v != 0, Rs, tf.ones_like(Rs))
    a = v / safe_R
    if k == 1:
        return a, None, -a * s, None
    c = s - tf.cast(ts, v.dtype)  # |U|
    t = tf.range(k)
    cap = tf.reduce_sum(a[:, :, None] * tf.cast(t[None, None, :] < ts[:, :, None], v.dtype), axis=1)
    b = v / tf.where(v != 0, gap, tf.ones_like(gap))
    zero = tf.zeros_like(a)
    gy = tf.where(case_b, -b, -a * c)
    gk = tf.reduce_sum(tf.where(case_b, b - a * c, zero), axis=1)
    return a, cap, gy, gk


def _add_topk_terms(g, top_i, cap, gk, k):
    """g -= cap at the top-k indices; g += gk at the k-th largest index (one scatter over the
    whole top_i, see the note in _anchor)."""
    if k == 1:
        return g
    last = tf.range(k) == k - 1
    return _scatter_add(g, top_i, tf.where(last[None, :], gk[:, None] - cap, -cap))


# --------------------------------------------------------------------------- ids path


def _positives_forward(z, w, zy, k, eta, consistent=None):
    """Loss per row for P positives per row with scores ``zy`` [N, P] and weights ``w`` [N, P].

    Returns ``(loss [N], saved)``; ``saved`` holds the small per-positive quantities (O(N P)
    or O(N k)) that :func:`_positives_backward` needs, so the backward pass re-forms the
    differences without storing an [N, P, n] tensor.

    ``consistent`` (optional, boolean [N, n], built inline so XLA fuses it into the D pass):
    where it is False the summand of ``D`` is NaN, so ``D`` (and ``saved["D"]``) is NaN
    exactly for the rows that contain such an entry (a NaN survives any summation order).
    """
    masked = tf.equal(zy, -np.inf)  # a positive masked by -inf: loss +inf
    zy = tf.where(masked, tf.zeros_like(zy), zy)
    top_v, top_i = (None, None) if k == 1 else tf.math.top_k(z, k)
    m, case_b = _anchor(zy, top_v, k)
    diff = (z[:, None, :] - m[:, :, None]) + eta  # z_i - mu_y, [N, P, n]
    relu = tf.nn.relu(diff)
    if consistent is not None:
        relu = tf.where(consistent[:, None, :], relu, tf.constant(np.nan, z.dtype))
    D = tf.reduce_sum(relu, axis=-1)
    s = tf.reduce_sum(tf.cast(diff > 0, z.dtype), axis=-1)
    gap, ts, Rs, terms = _positive_terms(zy, m, D, top_v, masked, k, eta)
    # w != 0 (not w > 0): a NaN weight (invalid dense labels, see below) must reach the loss.
    loss = tf.reduce_sum(tf.where(tf.not_equal(w, 0.0), w * terms, tf.zeros_like(terms)), axis=1)
    saved = {
        "masked": masked,
        "m": m,
        "s": s,
        "gap": gap,
        "Rs": Rs,
        "terms": terms,
        "ts": ts,
        "case_b": case_b,
        "top_i": top_i,
        "D": D,
    }
    return loss, saved


def _positives_backward(z, w, k, eta, saved, upstream, add_at_positives):
    """Gradient of :func:`_positives_forward`'s loss w.r.t. z (spec 3.3)."""
    has = (w > 0) & ~saved["masked"]
    # NaN terms are kept, so NaN scores give NaN gradients too (is_nan spelt out: Grappler
    # rewrites ~(t <= 0) into t > 0, which drops them).
    live = (saved["terms"] > 0) | tf.math.is_nan(saved["terms"])
    v = tf.where(has & live, w * upstream[:, None], tf.zeros_like(w))
    a, cap, gy, gk = _grad_coefficients(
        v, saved["gap"], saved["s"], k, saved["ts"], saved["Rs"], saved["case_b"]
    )
    inside = (z[:, None, :] - saved["m"][:, :, None]) + eta > 0
    g = tf.reduce_sum(tf.where(inside, a[:, :, None], tf.zeros_like(inside, z.dtype)), axis=1)
    g = add_at_positives(g, gy)
    return _add_topk_terms(g, saved["top_i"], cap, gk, k)


def _rankmax_loss_ids(z, ids, w, k, eta):
    """Loss per row for ids [N, P] (weights w [N, P]); custom gradient w.r.t. z."""

    @tf.custom_gradient
    def f(z):
        loss, saved = _positives_forward(z, w, tf.gather(z, ids, batch_dims=1), k, eta)

        def grad(upstream):
            return _positives_backward(
                z, w, k, eta, saved, upstream, lambda g, gy: _scatter_add(g, ids, gy)
            )

        return loss, grad

    return f(z)


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
    n = tf.shape(w)[-1]
    col = tf.range(n)
    digits = [tf.ones_like(col)] + [(col // 256**j) % 256 for j in range(3)]
    sums = tf.matmul(w, tf.cast(tf.stack(digits, axis=1), w.dtype))  # [N, 4]: S, I_0..I_2
    q = tf.math.divide_no_nan(sums[:, 1:], sums[:, :1])
    # Comparisons are false for NaN: such digits (and out-of-range ones) read 0.
    q = tf.where((q >= 0) & (q <= 255), tf.round(q), tf.zeros_like(q))
    y = q[:, :1] + 256 * q[:, 1:2] + 256**2 * q[:, 2:]  # exact: an integer below 2^24
    return tf.cast(y, tf.int32)


def _rankmax_loss_one_hot_or_dense(z, w, k, eta):
    """Dense weights [N, n]: the one-hot fast path when every row has <= 1 positive, else the
    exact merged sort (both exact).

    Fast path, the cost of ids plus two reads of the labels: :func:`_one_hot_ids` reads a
    candidate positive ``y`` per row with one matmul, then the ids kernel runs on it (one
    gather of ``z_y`` and ``w_y``, one scatter into the gradient). The check that ``y`` is
    the row's only positive and that the weights are valid (``w_y`` finite and >= 0, every
    other ``w_i`` exactly 0) is fused into the pass that forms ``D = sum_i (z_i - mu_y)_+``:
    an entry that fails it adds NaN, so ``D`` is NaN exactly on the rows the fast path
    cannot take (and on rows with NaN scores), and ``fits`` = no NaN in ``D`` is a reduction
    over N numbers. Under XLA:CPU every row reduction materialises its [N, n] summand, so
    a separate "count the positives" pass would cost a full write and read of [N, n].

    The branch is chosen with ``tf.cond`` inside one custom gradient: autodiff through a
    ``tf.cond`` would make the taken branch materialise zero-filled copies of the other
    branch's [N, 2n] intermediates. Every [N, n] intermediate is formed inline from the
    inputs (no captured masks): a mask materialised as an operand of the tf.cond costs a
    full extra write and read.
    """
    ids = _one_hot_ids(w)
    weight = tf.gather(w, ids, batch_dims=1)  # [N, 1]; 0 for a row without positives

    @tf.custom_gradient
    def f(z):
        n = tf.shape(z)[-1]
        at_y = tf.equal(tf.range(n)[None, :], ids)
        consistent = tf.where(at_y, (w >= 0) & (w < np.inf), tf.equal(w, 0.0))
        zy = tf.gather(z, ids, batch_dims=1)
        fast, saved = _positives_forward(z, weight, zy, k, eta, consistent)
        fits = ~tf.reduce_any(tf.math.is_nan(saved["D"]))

        def slow():
            bad = tf.math.is_nan(w) | (w < 0) | tf.math.is_inf(w)
            return nan_where(tf.reduce_any(bad, axis=-1), _rankmax_loss_dense(z, w, k, eta))

        loss = tf.cond(fits, lambda: tf.identity(fast), slow)

        def grad(upstream):
            def fast_grad():
                return _positives_backward(
                    z, weight, k, eta, saved, upstream, lambda g, gy: _scatter_add(g, ids, gy)
                )

            def dense_grad():
                with tf.GradientTape() as tape:
                    tape.watch(z)
                    value = _rankmax_loss_dense(z, w, k, eta)
                return tape.gradient(value, z, output_gradients=upstream)

            return tf.cond(fits, fast_grad, dense_grad)

        return loss, grad

    return f(z)


# --------------------------------------------------------------------------- dense path


def _merged_order(z, mu):
    """Sort [mu, z] per row, descending; ties put thresholds first (so z_i = mu is outside).

    Returns sorted values, permutation, z-indicator (all [N, 2n]).
    """
    n = tf.shape(z)[-1]
    vals, perm = tf.math.top_k(tf.concat([mu, z], axis=-1), 2 * n)  # ties: lower index first
    return vals, perm, perm >= n


def _unsort(sorted_vals, perm):
    """Inverse of gathering by perm: out[b, perm[b, r]] = sorted_vals[b, r] (extra trailing
    axes of sorted_vals are carried along)."""
    return tf.scatter_nd(_row_index(perm), sorted_vals, tf.shape(sorted_vals))


def _dense_D_s(z, mu):
    """D_i = sum_j (z_j - mu_i)_+ and s_i = #{j : z_j > mu_i} for every column i. [N, n] each."""
    n = tf.shape(z)[-1]
    vals, perm, is_z = _merged_order(z, mu)
    zero = tf.zeros_like(vals)
    count = tf.math.cumsum(tf.cast(is_z, z.dtype), axis=-1)
    total = tf.math.cumsum(tf.where(is_z, vals, zero), axis=-1)
    # At a threshold entry: the z's sorted before it are exactly those > mu.
    D_sorted = tf.where(is_z, zero, total - count * vals)
    s_sorted = tf.where(is_z, zero, count)
    both = _unsort(tf.stack([D_sorted, s_sorted], axis=-1), perm)
    return both[:, :n, 0], both[:, :n, 1], perm, is_z


def _dense_indicator_sum(a, perm, is_z):
    """sum_i a_i 1[z_j > mu_i] for every column j, via the merged order. a [N, n]."""
    # n from a local tensor: a shape captured from the forward pass of a tf.cond branch is
    # not a compile-time constant in the XLA-compiled gradient of that branch.
    n = tf.shape(a)[-1]
    a_sorted = tf.gather(a, tf.where(is_z, tf.zeros_like(perm), perm), batch_dims=1)
    a_sorted = tf.where(is_z, tf.zeros_like(a_sorted), a_sorted)
    after = tf.reduce_sum(a_sorted, axis=-1, keepdims=True) - tf.math.cumsum(a_sorted, axis=-1)
    return _unsort(tf.where(is_z, after, tf.zeros_like(after)), perm)[:, n:]


def _rankmax_loss_dense(z, w, k, eta):
    """Loss per row for dense non-negative label weights w [N, n] (any number of positives)."""

    @tf.custom_gradient
    def f(z):
        # Shift by the row max so the prefix sums stay small (shift invariance, spec 1).
        zc = z - tf.reduce_max(z, axis=-1, keepdims=True)
        masked = (w > 0) & tf.equal(z, -np.inf)
        has = (w > 0) & ~masked
        zy = tf.where(has, zc, tf.zeros_like(zc))  # keeps masked (-inf) non-positives finite
        top_v, top_i = (None, None) if k == 1 else tf.math.top_k(zc, k)
        m, case_b = _anchor(zy, top_v, k)
        D, s, perm, is_z = _dense_D_s(zc, m - eta)
        D = tf.where(has, D, tf.ones_like(D))
        gap, ts, Rs, terms = _positive_terms(zy, m, D, top_v, masked, k, eta)
        loss = tf.reduce_sum(tf.where(w > 0, w * terms, tf.zeros_like(terms)), axis=1)

        def grad(upstream):
            live = (terms > 0) | tf.math.is_nan(terms)
            v = tf.where(has & live, w * upstream[:, None], tf.zeros_like(w))
            a, cap, gy, gk = _grad_coefficients(v, gap, s, k, ts, Rs, case_b)
            g = _dense_indicator_sum(a, perm, is_z) + gy
            return _add_topk_terms(g, top_i, cap, gk, k)

        return loss, grad

    return f(z)


# --------------------------------------------------------------------------- public ops


def _check_max_positives(max_positives, n):
    if max_positives is None:
        return None
    if isinstance(max_positives, bool) or not isinstance(max_positives, numbers.Integral):
        raise TypeError(f"`max_positives` must be None or a Python int, got {max_positives!r}.")
    if max_positives < 1 or (_static(n) is not None and max_positives > n):
        raise ValueError(f"`max_positives` must be in [1, n={n}], got {max_positives}.")
    return int(max_positives)


def check_loss_arguments(k, margin, max_positives, n=None):
    """``(k, margin, max_positives)`` of :func:`rankmax_loss` checked by its rules.

    ``n`` (the number of candidates, when known) also bounds ``k`` and ``max_positives``.
    Keras losses call it at construction, with ``n=None``.

    Raises:
      ValueError: (or TypeError) naming the argument.
    """
    k, margin = _check_k_margin(k, margin, n)
    return k, margin, _check_max_positives(max_positives, n)


def _dense_to_ids(w, m):
    """Dense weights [N, n] with <= m positives per row -> (ids [N, m], weights [N, m])."""
    wv, ids = tf.math.top_k(w, m)
    return ids, wv


def rankmax_loss(
    labels,
    scores,
    k: int = 1,
    margin: float = 1.0,
    max_positives=1,
    label_format: str = "auto",
    *,
    labels_name: str = "labels",
    scores_name: str = "scores",
):
    """Rankmax loss, ``-sum_{y in positives} w_y log min(1, alpha_y (z_y - mu_y))`` per row.

    For k = 1: ``w_y (log sum_i (z_i - z_y + margin)_+ - log margin)``.

    Args:
      labels: the positives of each row, read according to ``label_format``. Ids: shape
        ``scores.shape[:-1]`` (one positive per row) or ``scores.shape[:-1] + [M]`` (several
        positives, ``-1`` pads), integer or whole-number floats. Dense: non-negative weights
        with the shape of ``scores`` (multi-hot 0/1, or e.g. TFRS's identity matrix); each
        positive's loss is multiplied by its weight. A row without positives has loss 0.
      scores: ``[..., n]`` logits over n candidates (n may be dynamic, e.g. in-batch [B, B]).
        ``-inf`` masks a candidate; a masked positive gives loss ``+inf``.
      k: static int, ``1 <= k < n``; the projection puts mass k on the (n, k)-simplex.
      margin: ``eta > 0``; the threshold is ``min(z_y, z_[k]) - margin``. The paper uses 1.
      max_positives: dense labels only; the result is exact either way. When every row of
        the batch has at most this many positives (default 1: one-hot or identity labels),
        a fast O(M n) path runs (for 1: the ids kernel on the read-off index); otherwise, and
        always when ``None``, one merged sort per row handles any number of positives
        (O(n log n), slow under XLA on CPU). Both branches are compiled (``tf.cond``).
      label_format: ``"auto"`` (default), ``"keras"``, ``"ids"`` or ``"dense"``. A
        ``tf.RaggedTensor`` of positive ids per row is read as ids (-1 pads); a
        ``tf.SparseTensor`` is densified (absent entries -1 for ids, 0 for dense). Auto:
        floating labels of the scores' shape are dense; labels one rank lower are ids; integer
        ``[..., M]`` with a static ``M != n`` are padded ids; integer ``[..., n]`` (or an
        unknown last axis) is ambiguous and raises, so ``np.eye(3, dtype=int)`` needs
        ``label_format="dense"``. Keras (what :class:`losszoo.losses.RankmaxLoss` passes, as
        Keras 3 casts ``y_true`` to float): shapes only, never the dtype: ids one rank lower
        or with a last axis of 1 (``n != 1``); padded ids ``[..., M]`` when ``M`` and ``n`` are
        static and differ; otherwise (also when a size is unknown) dense.
      labels_name: the name ``labels`` goes by in error messages (``"y_true"`` in a loss).
      scores_name: the name ``scores`` goes by in error messages (``"y_pred"`` in a loss).

    Returns:
      Per-row loss with shape ``scores.shape[:-1]`` and the dtype of ``scores``.

    Raises:
      ValueError: (or TypeError) naming the argument: NaN scores, ids outside ``[0, n)`` other
        than -1 padding, non-whole or NaN ids, negative/NaN/inf dense weights, ambiguous
        labels, bad ``k`` / ``margin`` / ``max_positives`` / ``label_format``. Value checks
        are skipped with ``losszoo.set_validation(False)``.

    Under XLA: assertions vanish; rows with NaN scores or invalid labels get a NaN loss (and
    NaN gradients for NaN scores); ids are never clamped.

    Example:
      >>> rankmax_loss([0], [[2.0, 1.5, -3.0]]).numpy()  # log(1 + 0.5)
      array([0.4054651], dtype=float32)
    """
    z, dtype, n = _prepare_scores(scores, scores_name)
    k, eta, max_positives = check_loss_arguments(k, margin, max_positives, _static(n))
    z = _check_k_against(z, k, n)
    lead = tf.shape(z)[:-1]
    z2 = tf.reshape(z, [-1, n])
    labels, label_format = _labels_and_format(labels, label_format, labels_name)
    label_format = _resolve_format(labels, z, label_format, labels_name)
    labels = _densify(labels, label_format, labels_name)
    if label_format == "ids":
        ids, w, _, invalid = _ids_to_positives(labels, z, n, labels_name)
        loss = _rankmax_loss_ids(z2, ids, w, k, eta)
    else:
        w, invalid = _check_dense_labels(labels, z, labels_name)
        w = tf.reshape(w, [-1, n])
        invalid = tf.reshape(invalid, [-1])
        if max_positives is None:
            loss = _rankmax_loss_dense(z2, w, k, eta)
        else:
            if max_positives == 1:
                loss = _rankmax_loss_one_hot_or_dense(z2, w, k, eta)
                invalid = None  # folded into the kernel's weights
            else:
                counts = tf.reduce_sum(tf.cast(w > 0, tf.int32), axis=-1)
                loss = tf.cond(
                    tf.reduce_all(counts <= max_positives),
                    lambda: _rankmax_loss_ids(z2, *_dense_to_ids(w, max_positives), k, eta),
                    lambda: _rankmax_loss_dense(z2, w, k, eta),
                )
    # NaN scores need no extra pass: (z - m) + eta feeds a relu sum, which propagates NaN
    # (also under XLA), and the gradient keeps NaN terms.
    if invalid is not None:
        loss = nan_where(invalid, loss)
    if _static(n) is None:
        loss = nan_where(k >= n, loss)  # XLA: the graph assertion on k < n is gone
    return tf.cast(tf.reshape(loss, lead), dtype)


def _rankmax_projection_ids(z, ids, w, k, eta):
    """Projection [N, P, n] for ids [N, P]; padded positives give zero rows."""

    @tf.custom_gradient
    def f(z):
        zy = tf.gather(z, ids, batch_dims=1)
        top_v, top_i = (None, None) if k == 1 else tf.math.top_k(z, k)
        m, case_b = _anchor(zy, top_v, k)
        d = tf.nn.relu((z[:, None, :] - m[:, :, None]) + eta)  # [N, P, n]
        D = tf.reduce_sum(d, axis=-1)
        if k == 1:
            ts, Rs = tf.zeros_like(ids), D
        else:
            ts, Rs = _capped_count(D, top_v, m, k, eta)
        alpha = tf.cast(k - ts, z.dtype) / Rs
        has = (w > 0)[:, :, None]
        p = tf.where(has, tf.minimum(alpha[:, :, None] * d, 1.0), tf.zeros_like(d))

        def grad(u):
            inside = d > 0
            if k > 1:
                # Capped entries: the top t* indices of the row (matches the forward exactly).
                t = tf.range(k)
                capped_upd = tf.cast(t[None, None, :] < ts[:, :, None], z.dtype)  # [N, P, k]
                nb, npos = tf.shape(ids)[0], tf.shape(ids)[1]
                bi = tf.broadcast_to(tf.range(nb)[:, None, None], tf.shape(capped_upd))
                pi = tf.broadcast_to(tf.range(npos)[None, :, None], tf.shape(capped_upd))
                ti = tf.broadcast_to(top_i[:, None, :], tf.shape(capped_upd))
                capped = tf.scatter_nd(tf.stack([bi, pi, ti], -1), capped_upd, tf.shape(d))
                inside = inside & (capped <= 0)
            U = tf.where(has & inside, tf.ones_like(d), tf.zeros_like(d))
            c = tf.reduce_sum(U, axis=-1)
            su = tf.reduce_sum(u * U, axis=-1)
            sud = tf.reduce_sum(u * U * d, axis=-1)
            coef = alpha / Rs * sud  # alpha^2 / (k - t*) = alpha / R_{t*}
            g = tf.reduce_sum(alpha[:, :, None] * u * U - coef[:, :, None] * U, axis=1)
            at_j = -alpha * su + coef * c  # [N, P], added at j
            if k == 1:
                return _scatter_add(g, ids, at_j)
            g = _scatter_add(g, ids, tf.where(case_b, tf.zeros_like(at_j), at_j))
            gk = tf.reduce_sum(tf.where(case_b, at_j, tf.zeros_like(at_j)), axis=1)
            return _add_topk_terms(g, top_i, tf.zeros_like(top_i, z.dtype), gk, k)

        return p, grad

    return f(z)


def rankmax(scores, labels, k: int = 1, margin: float = 1.0, label_format: str = "auto"):
    """Rankmax projection ``min(1, alpha_y (z - mu_y)_+)`` of the scores, for each positive.

    ``mu_y = min(z_y, z_[k]) - margin`` and ``alpha_y`` makes the projection sum to k.

    Args:
      scores: ``[..., n]`` logits; ``-inf`` masks a candidate (projection 0).
      labels: ids (integer or whole-number floats), shape ``scores.shape[:-1]`` (one positive
        per row; output ``[..., n]``) or ``scores.shape[:-1] + [M]`` (output ``[..., M, n]``,
        one projection per positive; ``-1`` pads and gives a zero row). A ``tf.RaggedTensor``
        of ids per row is padded with -1 (to the longest row); a ``tf.SparseTensor``'s
        absent entries are -1. Read by the same rule as :func:`rankmax_loss`: integer labels
        ``[..., n]`` (one-hot rows or n ids?) are ambiguous and raise unless
        ``label_format="ids"``; floating labels of the scores' rank are dense weights, which
        have no projection (TypeError: use ``rankmax_loss``).
      k: static int, ``1 <= k < n``. Each projection lies in [0, 1] and sums to k.
      margin: ``eta > 0`` (paper: 1).
      label_format: ``"auto"`` (default), ``"keras"`` or ``"ids"`` (see :func:`rankmax_loss`;
        labels read as dense raise TypeError).

    Returns:
      The projection(s), dtype of ``scores``. The positive is always in the support; the
      projection preserves the order of the scores. Differentiable w.r.t. ``scores`` through
      ``alpha`` and ``mu`` (spec 3.4). A positive masked by ``-inf`` has no projection: its
      row is NaN.

    Raises:
      ValueError: (or TypeError) naming the argument: NaN scores, ids outside ``[0, n)`` other
        than -1, non-whole or NaN ids, ambiguous or dense labels, bad ``k`` / ``margin`` /
        ``label_format`` (value checks are skipped with ``losszoo.set_validation(False)``).

    Under XLA: assertions vanish; rows with NaN scores or invalid ids come back all NaN.

    Example:
      >>> rankmax([[2.0, 1.5, -3.0]], [0]).numpy()
      array([[0.6666667 , 0.33333334, 0.        ]], dtype=float32)
    """
    z, dtype, n = _prepare_scores(scores)
    k, eta = _check_k_margin(k, margin, _static(n))
    z = _check_k_against(z, k, n)
    labels, label_format = _labels_and_format(labels, label_format, "labels")
    if _resolve_format(labels, z, label_format, "labels") == "dense":
        raise TypeError(
            "`labels` of `rankmax` must be integer ids (one projection per positive); got "
            f"{labels.dtype.name} labels of the scores' rank, which read as dense weights. Use "
            "rankmax_loss for dense multi-hot labels, or label_format='ids' for lists of ids."
        )
    labels = _densify(labels, "ids", "labels")
    ids, w, multi, invalid = _ids_to_positives(labels, z, n)
    z2 = tf.reshape(z, [-1, n])
    p = _rankmax_projection_ids(z2, ids, w, k, eta)
    zy = tf.gather(z2, ids, batch_dims=1)
    bad = invalid[:, None] | ((w > 0) & tf.equal(zy, -np.inf))  # [N, P]
    bad = bad | tf.reduce_any(tf.math.is_nan(z2), axis=-1, keepdims=True)
    if _static(n) is None:
        bad = bad | (k >= n)
    p = nan_where(bad[:, :, None], p)
    lead = tf.shape(z)[:-1]
    if multi:
        shape = tf.concat([lead, tf.shape(ids)[-1:], tf.shape(z)[-1:]], 0)
    else:
        shape = tf.shape(z)
    return tf.cast(tf.reshape(p, shape), dtype)
