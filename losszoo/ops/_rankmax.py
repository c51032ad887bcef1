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

Label formats. Integer ids ``[...]`` (one positive per row) or ``[..., M]`` (several
positives, ``-1`` pads) are handled by broadcasting each positive against the row:
O(M n) time and memory per row, O(n) for a single positive. Dense non-negative labels
``[..., n]`` (multi-hot, or per-positive weights such as TFRS's identity matrix) are handled
exactly for any number of positives by sorting each row once with the thresholds merged in
(spec A6 (ii), O(n log n); general k also needs O(n k) memory per row). When every row of
the batch has at most ``max_positives`` positives (default 1), dense labels are turned into
ids instead (O(M n), no sort), chosen at run time with ``tf.cond``. Rows
without a positive (all ids -1, or all-zero dense labels) contribute loss 0 and gradient 0.

Numerics: ties ``z_i = mu_y`` are outside the support (strict ``>``); ``z_y = z_[k]`` is case
A. ``-inf`` scores (masks) get weight 0; a positive whose score is ``-inf`` gives an infinite
loss. NaN scores are rejected. Half-precision inputs are computed in float32 and cast back;
float64 stays float64. Argument checks (k, margin, shapes) run at trace time; value checks on
labels and scores run eagerly or as graph assertions (XLA drops assertions, so under
``jit_compile=True`` out-of-range ids are clamped silently: validate before compiling).
"""

from __future__ import annotations

import numbers

import numpy as np
import tensorflow as tf

from losszoo.ops._common import check_not_nan, nan_where, static_value, to_compute_dtype

__all__ = ["rankmax", "rankmax_loss"]


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


def _prepare_scores(scores):
    z, dtype = to_compute_dtype(scores, "scores")
    if z.shape.rank is None or z.shape.rank < 1:
        raise ValueError(f"`scores` must have rank >= 1 with known rank, got shape {z.shape}.")
    z = check_not_nan(z, "scores")
    n = z.shape[-1]
    if n is None:  # e.g. in-batch scores [B, B] with an unknown batch size
        n = tf.shape(z)[-1]
    return z, dtype, n


def _static(n):
    return n if isinstance(n, int) else None


def _check_k_against(z, k, n):
    """k < n when n is only known at run time (graph assertion)."""
    if _static(n) is not None:
        return z
    with tf.control_dependencies(
        [tf.debugging.Assert(k < n, ["`k` must be smaller than the number of candidates n;",
                                     "k =", k, "n =", n])]
    ):
        return tf.identity(z)


def _ids_to_positives(labels, z, n):
    """Integer ids -> (ids [N, P] int32, weights [N, P]) with -1 padding mapped to weight 0."""
    lead = z.shape[:-1]
    if labels.shape.rank == z.shape.rank - 1:
        multi = False
        labels = labels[..., None]
    elif labels.shape.rank == z.shape.rank:
        multi = True
    else:
        raise ValueError(
            f"Integer `labels` must have shape scores.shape[:-1]={lead.as_list()} (one positive "
            f"per row) or scores.shape[:-1] + [M] (M positives, -1 pads); got {labels.shape} "
            f"for scores of shape {z.shape}."
        )
    if not lead.is_compatible_with(labels.shape[:-1]):
        raise ValueError(
            f"Leading dimensions of `labels` {labels.shape} do not match `scores` {z.shape}."
        )
    value = static_value(labels)
    if value is not None and _static(n) is not None:
        if value.size and (value.min() < -1 or value.max() >= n):
            raise ValueError(
                f"Integer `labels` must lie in [0, {n}) (or be -1 for padding); got values in "
                f"[{value.min()}, {value.max()}]."
            )
    else:
        labels = _assert_ids_in_range(labels, n)
    m = labels.shape[-1] if labels.shape[-1] is not None else tf.shape(labels)[-1]
    ids = tf.reshape(labels, [-1, m])
    # Under XLA the assertions above vanish: rows holding an id outside [-1, n) are poisoned
    # with NaN by the callers (a gather would clamp the id silently).
    invalid = tf.reduce_any((ids < -1) | (ids >= tf.cast(n, ids.dtype)), axis=-1)
    ids = tf.cast(tf.where(invalid[:, None], -tf.ones_like(ids), ids), tf.int32)
    valid = ids >= 0
    w = tf.cast(valid, z.dtype)
    ids = tf.where(valid, ids, tf.zeros_like(ids))
    return ids, w, multi, invalid


def _assert_ids_in_range(labels, n):
    ok = tf.logical_and(tf.reduce_all(labels >= -1), tf.reduce_all(labels < n))
    bound = n if _static(n) is not None else "n"
    with tf.control_dependencies(
        [tf.debugging.Assert(ok, [(f"Integer `labels` must lie in [0, {bound}) or be -1 "
                                  "(padding); n ="), n])]
    ):
        return tf.identity(labels)


def _check_dense_labels(labels, z):
    if not labels.shape.is_compatible_with(z.shape):
        raise ValueError(
            f"Dense (floating) `labels` must have the shape of `scores` {z.shape}, got "
            f"{labels.shape}. Pass integer ids for one positive per row."
        )
    value = static_value(labels)
    if value is not None:
        if not np.all(np.isfinite(value)) or np.any(value < 0):
            raise ValueError("Dense `labels` must be finite and >= 0 (multi-hot or weights).")
        return labels
    ok = tf.logical_and(tf.reduce_all(tf.math.is_finite(labels)), tf.reduce_all(labels >= 0))
    with tf.control_dependencies(
        [tf.debugging.Assert(ok, ["Dense `labels` must be finite and >= 0."])]
    ):
        return tf.identity(labels)


# --------------------------------------------------------------------------- shared pieces


def _row_index(ids):
    """[N, P] -> [N, P, 2] (row, id) index tuples for scatter/gather."""
    rows = tf.broadcast_to(tf.range(tf.shape(ids)[0], dtype=ids.dtype)[:, None], tf.shape(ids))
    return tf.stack([rows, ids], axis=-1)


def _scatter_add(base, ids, updates):
    """base [N, n] += updates [N, P] at columns ids [N, P]."""
    return tf.tensor_scatter_nd_add(base, _row_index(ids), updates)


def _thresholds(zy, top_v, k, eta):
    """mu [N, P] and case-B mask (y strictly inside the top k) -- eq. 11."""
    if k == 1:
        return zy - eta, None
    # reduce_min rather than top_v[:, k-1]: XLA:CPU lowers top_k to its fast kernel only when
    # the sorted values are consumed whole; a slice at k-1 turns it into a full sort (~100x).
    zk = tf.reduce_min(top_v, axis=-1, keepdims=True)
    # minimum(zy, zk) in this order: a tie z_y = z_[k] is case A (spec 2, TF/XLA notes).
    return tf.minimum(zy, zk) - eta, zy > zk


def _capped_count(D, top_v, mu, k):
    """t* [N, P] (int32) and R_{t*} [N, P] from A4/A5 steps 7-11."""
    dt = top_v[:, None, :] - mu[:, :, None]  # [N, P, k], each >= eta
    prefix = tf.math.cumsum(dt, axis=-1, exclusive=True)
    R = tf.maximum(D[:, :, None] - prefix, dt)
    remaining = tf.cast(k - tf.range(k), D.dtype)
    bad = tf.cast(R < remaining * dt, tf.int32)
    ts = tf.minimum(tf.reduce_sum(bad, axis=-1), k - 1)
    Rs = tf.gather(R, ts[..., None], batch_dims=2)[..., 0]
    return ts, Rs


def _loss_terms(zy, mu, D, k, eta, ts, Rs):
    if k == 1:
        return tf.nn.relu(tf.math.log(D) - np.log(eta))
    return tf.nn.relu(
        tf.math.log(Rs) - tf.math.log(tf.cast(k - ts, D.dtype)) - tf.math.log(zy - mu)
    )


def _grad_coefficients(v, zy, mu, s, k, ts, Rs, case_b):
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
    cap = tf.reduce_sum(
        a[:, :, None] * tf.cast(t[None, None, :] < ts[:, :, None], v.dtype), axis=1
    )
    gap = tf.where(v != 0, zy - mu, tf.ones_like(zy))
    b = v / gap
    zero = tf.zeros_like(a)
    gy = tf.where(case_b, -b, -a * c)
    gk = tf.reduce_sum(tf.where(case_b, b - a * c, zero), axis=1)
    return a, cap, gy, gk


def _add_topk_terms(g, top_i, cap, gk, k):
    """g -= cap at the top-k indices; g += gk at the k-th largest index (one scatter over the
    whole top_i, see the note in _thresholds)."""
    if k == 1:
        return g
    last = tf.range(k) == k - 1
    return _scatter_add(g, top_i, tf.where(last[None, :], gk[:, None] - cap, -cap))


# --------------------------------------------------------------------------- ids path


def _rankmax_loss_ids(z, ids, w, k, eta):
    """Loss per row, z [N, n], ids/w [N, P]. Custom gradient w.r.t. z."""

    @tf.custom_gradient
    def f(z):
        zy = tf.gather(z, ids, batch_dims=1)
        top_v, top_i = (None, None) if k == 1 else tf.math.top_k(z, k)
        mu, case_b = _thresholds(zy, top_v, k, eta)
        diff = z[:, None, :] - mu[:, :, None]  # [N, P, n]
        D = tf.reduce_sum(tf.nn.relu(diff), axis=-1)
        if k == 1:
            ts, Rs = None, D
        else:
            ts, Rs = _capped_count(D, top_v, mu, k)
        terms = _loss_terms(zy, mu, D, k, eta, ts, Rs)
        has = w > 0
        loss = tf.reduce_sum(tf.where(has, w * terms, tf.zeros_like(terms)), axis=1)

        def grad(upstream):
            v = tf.where(has & (terms > 0), w * upstream[:, None], tf.zeros_like(w))
            inside = z[:, None, :] > mu[:, :, None]
            s = tf.reduce_sum(tf.cast(inside, z.dtype), axis=-1)
            a, cap, gy, gk = _grad_coefficients(v, zy, mu, s, k, ts, Rs, case_b)
            g = tf.reduce_sum(tf.where(inside, a[:, :, None], tf.zeros_like(diff)), axis=1)
            g = _scatter_add(g, ids, gy)
            return _add_topk_terms(g, top_i, cap, gk, k)

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
    """Loss per row for dense non-negative label weights w [N, n]."""

    @tf.custom_gradient
    def f(z):
        # Shift by the row max so the prefix sums stay small (shift invariance, spec 1).
        zc = z - tf.reduce_max(z, axis=-1, keepdims=True)
        has = w > 0
        zy = tf.where(has, zc, tf.zeros_like(zc))  # keeps masked (-inf) non-positives finite
        top_v, top_i = (None, None) if k == 1 else tf.math.top_k(zc, k)
        mu, case_b = _thresholds(zy, top_v, k, eta)
        D, s, perm, is_z = _dense_D_s(zc, mu)
        D = tf.where(has, D, tf.ones_like(D))
        if k == 1:
            ts, Rs = None, D
        else:
            ts, Rs = _capped_count(D, top_v, mu, k)
        terms = _loss_terms(zy, mu, D, k, eta, ts, Rs)
        loss = tf.reduce_sum(tf.where(has, w * terms, tf.zeros_like(terms)), axis=1)

        def grad(upstream):
            v = tf.where(has & (terms > 0), w * upstream[:, None], tf.zeros_like(w))
            a, cap, gy, gk = _grad_coefficients(v, zy, mu, s, k, ts, Rs, case_b)
            g = _dense_indicator_sum(a, perm, is_z) + gy
            return _add_topk_terms(g, top_i, cap, gk, k)

        return loss, grad

    return f(z)


# --------------------------------------------------------------------------- public ops


def _check_max_positives(max_positives, n):
    if isinstance(max_positives, bool) or not isinstance(max_positives, numbers.Integral):
        raise TypeError(f"`max_positives` must be None or a Python int, got {max_positives!r}.")
    if max_positives < 1 or (_static(n) is not None and max_positives > n):
        raise ValueError(f"`max_positives` must be in [1, n={n}], got {max_positives}.")
    return int(max_positives)


def _dense_to_ids(w, m):
    """Dense weights [N, n] with <= m positives per row -> (ids [N, m], weights [N, m])."""
    if m == 1:  # argmax is cheaper than top_k(w, 1) under XLA
        return tf.argmax(w, axis=-1, output_type=tf.int32)[:, None], tf.reduce_max(w, -1)[:, None]
    wv, ids = tf.math.top_k(w, m)
    return ids, wv



def rankmax_loss(labels, scores, k: int = 1, margin: float = 1.0, max_positives=1):
    """Rankmax loss, ``-sum_{y in positives} log min(1, alpha_y (z_y - mu_y))`` per row.

    Args:
      labels: the positives of each row, in one of three forms. Integer ids with shape
        ``scores.shape[:-1]`` (one positive per row); integer ids with shape
        ``scores.shape[:-1] + [M]`` (several positives, ``-1`` pads); or a floating tensor
        with the shape of ``scores`` holding non-negative weights (multi-hot 0/1, or e.g.
        TFRS's identity matrix): each positive's loss is multiplied by its weight. A row
        without positives has loss 0.
      scores: ``[..., n]`` logits over n candidates (n may be dynamic, e.g. in-batch [B, B]).
      k: static int, ``1 <= k < n``; the projection puts mass k on the (n, k)-simplex.
      margin: ``eta > 0``; the threshold is ``min(z_y, z_[k]) - margin``. The paper uses 1.
      max_positives: only for dense labels; the result is exact either way. When every row
        of the batch has at most this many positives (default 1, e.g. TFRS's identity labels),
        the top entries of each row are taken as ids (O(M n), no sort); otherwise, and always
        when ``None``, one merged sort per row handles any number of positives (O(n log n),
        slow under XLA on CPU). Both branches are compiled (``tf.cond``).

    Returns:
      Per-row loss with shape ``scores.shape[:-1]`` and the dtype of ``scores``.

    Example:
      >>> rankmax_loss([0], [[2.0, 1.5, -3.0]]).numpy()  # log(1 + 0.5)
      array([0.4054651], dtype=float32)
    """
    z, dtype, n = _prepare_scores(scores)
    k, eta = _check_k_margin(k, margin, _static(n))
    z = _check_k_against(z, k, n)
    lead = tf.shape(z)[:-1]
    z2 = tf.reshape(z, [-1, n])
    labels = tf.convert_to_tensor(labels)
    if labels.dtype.is_integer:
        ids, w, _, invalid = _ids_to_positives(labels, z, n)
        loss = nan_where(invalid, _rankmax_loss_ids(z2, ids, w, k, eta))
    elif labels.dtype.is_floating:
        labels = _check_dense_labels(labels, z)
        w = tf.reshape(tf.cast(labels, z.dtype), [-1, n])
        if max_positives is None:
            loss = _rankmax_loss_dense(z2, w, k, eta)
        else:
            m = _check_max_positives(max_positives, n)
            fits = tf.reduce_all(tf.reduce_sum(tf.cast(w > 0, tf.int32), axis=-1) <= m)
            loss = tf.cond(
                fits,
                lambda: _rankmax_loss_ids(z2, *_dense_to_ids(w, m), k, eta),
                lambda: _rankmax_loss_dense(z2, w, k, eta),
            )
    else:
        raise TypeError(f"`labels` must be integer ids or floating weights, got {labels.dtype}.")
    return tf.cast(tf.reshape(loss, lead), dtype)


def _rankmax_projection_ids(z, ids, w, k, eta):
    """Projection [N, P, n] for ids [N, P]; padded positives give zero rows."""

    @tf.custom_gradient
    def f(z):
        zy = tf.gather(z, ids, batch_dims=1)
        top_v, top_i = (None, None) if k == 1 else tf.math.top_k(z, k)
        mu, case_b = _thresholds(zy, top_v, k, eta)
        d = tf.nn.relu(z[:, None, :] - mu[:, :, None])  # [N, P, n]
        D = tf.reduce_sum(d, axis=-1)
        if k == 1:
            ts, Rs = tf.zeros_like(ids), D
        else:
            ts, Rs = _capped_count(D, top_v, mu, k)
        alpha = tf.cast(k - ts, z.dtype) / Rs
        has = (w > 0)[:, :, None]
        p = tf.where(has, tf.minimum(1.0, alpha[:, :, None] * d), tf.zeros_like(d))

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


def rankmax(scores, labels, k: int = 1, margin: float = 1.0):
    """Rankmax projection ``min(1, alpha_y (z - mu_y)_+)`` of the scores, for each positive.

    Args:
      scores: ``[..., n]`` logits.
      labels: integer ids, shape ``scores.shape[:-1]`` (one positive per row; output
        ``[..., n]``) or ``scores.shape[:-1] + [M]`` (output ``[..., M, n]``, one projection per
        positive; ``-1`` pads and gives a zero row).
      k: static int, ``1 <= k < n``. Each projection lies in [0, 1] and sums to k.
      margin: ``eta > 0`` (paper: 1).

    Returns:
      The projection(s), dtype of ``scores``. The positive is always in the support; the
      projection preserves the order of the scores. Differentiable w.r.t. ``scores`` through
      ``alpha`` and ``mu`` (spec 3.4).

    Example:
      >>> rankmax([[2.0, 1.5, -3.0]], [0]).numpy()
      array([[0.6666667, 0.33333334, 0.       ]], dtype=float32)
    """
    z, dtype, n = _prepare_scores(scores)
    k, eta = _check_k_margin(k, margin, _static(n))
    z = _check_k_against(z, k, n)
    labels = tf.convert_to_tensor(labels)
    if not labels.dtype.is_integer:
        raise TypeError(
            "`labels` of `rankmax` must be integer ids (one projection per positive); got "
            f"dtype {labels.dtype.name}. Use rankmax_loss for dense multi-hot labels."
        )
    ids, w, multi, invalid = _ids_to_positives(labels, z, n)
    p = _rankmax_projection_ids(tf.reshape(z, [-1, n]), ids, w, k, eta)
    p = nan_where(invalid[:, None, None], p)
    lead = tf.shape(z)[:-1]
    if multi:
        shape = tf.concat([lead, tf.shape(ids)[-1:], tf.shape(z)[-1:]], 0)
    else:
        shape = tf.shape(z)
    return tf.cast(tf.reshape(p, shape), dtype)
