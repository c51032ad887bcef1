"""Exact full-catalogue losses streamed over candidate chunks (issue 34).

For queries ``u_i`` (``[B, d]``), a candidate table ``v_j`` (``[N, d]``), positives ``y_i`` and a
temperature ``T``, the scores are ``z_ij = u_i . v_j / T``, with ``-inf`` for the ids that
``exclude`` lists for row ``i``. :func:`catalogue_loss` returns, per row, the loss of one of

* softmax cross-entropy: ``log sum_j exp(z_ij) - z_iy``;
* Rankmax, ``k = 1`` (spec A5): ``log sum_j (z_ij - z_iy + margin)_+ - log margin``;
* sparsemax (spec section 3.2, one-hot target): ``1/2 ||p||^2 + 1/2 - (z_iy - tau_i)`` with
  ``p = (z_i - tau_i)_+`` and ``sum_j p_j = 1``,

over all ``N`` candidates, without ever holding the ``[B, N]`` scores: the table is cut into
chunks of ``chunk_size`` rows (the last one padded with ``-inf`` columns) and every pass over
the catalogue recomputes one chunk's ``[B, chunk_size]`` scores at a time
(``keras.ops.scan``), as Cut Cross-Entropy does for softmax.

Passes over the catalogue (each one a matmul of the queries with every chunk):

* softmax: 1 forward (online maximum and log-sum-exp, and the positive's score), 1 backward;
* Rankmax ``k = 1``: the threshold ``mu_i = z_iy - margin`` is known before the pass (the
  positive's score from a gather), so 1 forward (``D_i = sum_j (z_ij - mu_i)_+`` and the
  support size ``s_i``), 1 backward;
* sparsemax: 1 forward pass keeps, per chunk, the 8 groups of 32 scores with the largest
  maxima (256 candidates per chunk, ``N / 16`` per row in all) and the largest 8th group
  maximum over the chunks (the *spill*); the exact threshold of the candidates
  (:func:`losszoo.ops._sparsemax._threshold`: chunk maxima and candidate search) is a lower
  bound of the catalogue's, and it *is* the catalogue's when the spill is at or below it
  (every score left out lies at or below the spill). When some row's support reaches beyond
  the candidates (the whole catalogue at initialisation, when every score is near 0), the
  batch goes on with Michelot's Newton steps on the whole catalogue from there, one pass each
  (2 or more: exact once the support stops changing). 1 backward pass.

Gradients (``losszoo._backend.custom_gradient``): with ``g_ij = dloss_i / dz_ij``,
``d/du_i = sum_j g_ij v_j / T`` and ``d/dv_j = sum_i g_ij u_i / T``, accumulated chunk by chunk
in the backward pass from the recomputed scores: ``softmax(z_i) - e_y`` (softmax),
``(1[z_i > mu_i] - s_i e_y) / D_i`` (Rankmax, spec 3.3 with ``k = 1``; erratum E1),
``p_i - e_y`` (sparsemax). The table's gradient is dense ``[N, d]``.

Fail-loud contract (README, "Bad input"; :mod:`losszoo.contract`): NaN or infinite
``queries`` / ``table`` (``contract.check_finite``), ``positive_ids`` outside ``[0, N)``
(``CLASS_IDS``), ``exclude`` ids outside ``[-1, N)`` (``PADDED_CLASS_IDS``) and an ``exclude``
row that lists its own positive (:data:`EXCLUSIONS`) raise naming the argument, eagerly and
in TensorFlow graphs (skipped with ``losszoo.set_validation(False)``). Traced for XLA
(``jit_compile=True``, ``jax.jit``) the affected rows' loss and gradients are NaN (a
non-finite table entry reaches every row that scores it: all of them); ids are clamped only
to gather, never to give a number.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from losszoo import _backend
from losszoo._backend import custom_gradient
from losszoo.contract import (
    CLASS_IDS,
    PADDED_CLASS_IDS,
    Rule,
    check_choice,
    check_finite,
    check_number,
    check_static_rank,
    nan_where,
    to_compute_dtype,
)
from losszoo.ops._sparsemax import _threshold

LOSSES = ("softmax", "sparsemax", "rankmax")

EXCLUSIONS = Rule(
    "must not list the row's own positive id (it would remove the positive from the row)",
    lambda xp, excl, pos: xp.any(xp.equal(excl, pos[:, None]), axis=-1),
)
"""Per-row exclusion lists ``[B, M]`` against the positives ``[B]`` (per row): an exclusion
list must not hold its row's positive."""

# Sparsemax's candidates: per chunk, the _KEEP groups of _GROUP scores with the largest maxima.
_GROUP = 32
_KEEP = 8
_CHUNK_MULTIPLE = _GROUP * _KEEP


def _mask_chunk(raw, offset, pos, excl, num_items, padded):
    """The scores of one chunk as the losses see them: excluded ids and padding columns
    ``-inf``. Also returns ``cols`` (the chunk's ids, ``[C]``) and the row's bad flag (a
    non-finite raw score: NaN or infinite embeddings)."""
    size = raw.shape[-1]
    cols = offset + ops.arange(size, dtype="int32")
    bad = ops.logical_not(ops.all(ops.isfinite(raw), axis=-1))
    z = raw
    if excl is not None:
        # Scatter -inf at the row's excluded ids of this chunk; ids outside it (and the -1
        # padding) land in an extra column that is dropped.
        local = excl - offset
        inside = ops.logical_and(local >= 0, local < size)
        local = ops.where(inside, local, size)
        rows = ops.broadcast_to(
            ops.arange(ops.shape(excl)[0], dtype="int32")[:, None], ops.shape(excl)
        )
        index = ops.reshape(ops.stack([rows, local], axis=-1), (-1, 2))
        base = ops.concatenate([ops.zeros_like(raw), ops.zeros_like(raw[:, :1])], axis=1)
        neg = ops.full(ops.shape(index)[:1], -np.inf, dtype=raw.dtype)
        z = z + ops.scatter_update(base, index, neg)[:, :size]
    if padded:
        z = ops.where((cols < num_items)[None, :], z, -np.inf)
    return z, cols, bad


def _sweep(qs, table3, pos, excl, num_items, padded, step, init, outputs=None):
    """One pass over the catalogue: ``carry = step(carry, z, cols, bad, chunk)`` per chunk;
    with ``outputs`` (a zero ``[chunks, ...]`` buffer) ``step`` returns ``(carry, y)`` and the
    ``y`` are stacked: ``(carry, ys)``.

    ``keras.ops.scan`` on JAX and PyTorch; on TensorFlow (whose Keras scan wants outputs shaped
    like the carry) a ``fori_loop`` writing the outputs with ``slice_update`` (in place under
    XLA)."""
    chunk = table3.shape[1]

    def body(carry, tc, offset):
        raw = ops.matmul(qs, ops.transpose(tc))
        z, cols, bad = _mask_chunk(raw, offset, pos, excl, num_items, padded)
        out = step(carry, z, cols, bad, tc)
        return out if outputs is not None else (out, None)

    if not _backend.TENSORFLOW:
        offsets = ops.arange(table3.shape[0], dtype="int32") * chunk
        carry, ys = ops.scan(lambda c, xs: body(c, *xs), init, (table3, offsets))
        return (carry, ys) if outputs is not None else carry

    def loop(i, state):
        carry, buf = state
        carry, y = body(carry, _backend.take(table3, i, axis=0), i * chunk)
        if outputs is not None:
            buf = ops.slice_update(buf, [i] + [0] * (len(buf.shape) - 1), y[None])
        return carry, buf

    buf = outputs if outputs is not None else ops.zeros((), qs.dtype)
    carry, buf = ops.fori_loop(0, table3.shape[0], loop, (init, buf))
    return (carry, buf) if outputs is not None else carry


def _positive_scores(qs, table3, pos):
    """``z_iy`` from a gather of the positives' rows (no ``[B, chunk]`` pass)."""
    flat = ops.reshape(table3, (-1, table3.shape[-1]))
    return ops.sum(qs * _backend.take(flat, pos, axis=0), axis=-1)


def _softmax_forward(qs, table3, pos, excl, num_items, padded):
    zy = _positive_scores(qs, table3, pos)
    zero = ops.zeros_like(zy)

    def step(carry, z, cols, bad, tc):
        m, s, any_bad = carry
        new_m = ops.maximum(m, ops.max(z, axis=-1))
        safe = ops.where(ops.isfinite(new_m), new_m, 0.0)  # all -inf so far: no shift
        s = s * ops.exp(m - safe) + ops.sum(ops.exp(z - safe[:, None]), axis=-1)
        return new_m, s, any_bad | bad

    init = (zero - np.inf, zero, ops.cast(zero, "bool"))
    (m, s, bad) = _sweep(qs, table3, pos, excl, num_items, padded, step, init)
    lse = m + ops.log(s)
    return nan_where(bad, lse - zy), (lse,)


def _rankmax_forward(qs, table3, pos, excl, num_items, padded, margin):
    mu = _positive_scores(qs, table3, pos) - margin
    zero = ops.zeros_like(mu)

    def step(carry, z, cols, bad, tc):
        d, s, any_bad = carry
        d = d + ops.sum(ops.relu(z - mu[:, None]), axis=-1)
        s = s + ops.sum(ops.cast(z > mu[:, None], d.dtype), axis=-1)
        return d, s, any_bad | bad

    init = (zero, zero, ops.cast(zero, "bool"))
    (d, s, bad) = _sweep(qs, table3, pos, excl, num_items, padded, step, init)
    loss = ops.log(d) - float(np.log(margin))
    return nan_where(bad, loss), (mu, d, s)


def _sparsemax_forward(qs, table3, pos, excl, num_items, padded):
    chunk = table3.shape[1]
    groups = chunk // _GROUP
    zy = _positive_scores(qs, table3, pos)
    zero = ops.zeros_like(zy)

    def step(carry, z, cols, bad, tc):
        spill, any_bad = carry
        if groups > _KEEP:
            g = ops.reshape(z, (-1, groups, _GROUP))
            top, index = ops.top_k(ops.max(g, axis=-1), _KEEP, sorted=True)
            kept = _backend.take_along_axis(g, index[:, :, None], axis=1)
            kept = ops.reshape(kept, (-1, _KEEP * _GROUP))
            spill = ops.maximum(spill, top[:, -1])
        else:
            kept = z
        return (spill, any_bad | bad), kept

    init = (zero - np.inf, ops.cast(zero, "bool"))
    width = _KEEP * _GROUP if groups > _KEEP else chunk
    buffer = ops.zeros((table3.shape[0], ops.shape(qs)[0], width), qs.dtype)
    (spill, bad), kept = _sweep(
        qs, table3, pos, excl, num_items, padded, step, init, outputs=buffer
    )
    # [chunks, B, k] -> [B, chunks * k]
    cand = ops.reshape(ops.transpose(kept, (1, 0, 2)), (-1, kept.shape[0] * kept.shape[2]))
    # NaN rows are poisoned below; keep their threshold search finite.
    cand = ops.where(bad[:, None], 0.0, cand)
    top = ops.max(cand, axis=-1, keepdims=True)
    tau = _threshold(cand, top)  # shifted by `top`, [B, 1]
    square = ops.sum(ops.square(ops.relu(cand - top - tau)), axis=-1)
    top, tau = top[:, 0], tau[:, 0]
    covered = ops.logical_or(spill - top <= tau, bad)

    def full_search():
        return _michelot_sweeps(qs, table3, pos, excl, num_items, padded, top, tau, bad)

    tau, square = ops.cond(ops.all(covered), lambda: (tau, square), full_search)
    loss = ops.relu(0.5 * square + 0.5 - ((zy - top) - tau))
    return nan_where(bad, loss), (top + tau,)


def _michelot_sweeps(qs, table3, pos, excl, num_items, padded, top, tau, bad):
    """Newton (Michelot) steps on ``sum_j (z_j - top - t)_+ = 1`` from ``tau`` (a lower bound)
    over the whole catalogue, one pass per step: ``(t, sum_j (z_j - top - t)_+^2)`` at the
    exact threshold ``t`` (the support stopped changing)."""
    zero = ops.zeros_like(tau)

    def stats(t):
        def step(carry, z, cols, _bad, tc):
            count, first, second = carry
            x = z - (top + t)[:, None]
            inside = x > 0
            count = count + ops.sum(ops.cast(inside, count.dtype), axis=-1)
            first = first + ops.sum(ops.where(inside, x, 0.0), axis=-1)
            second = second + ops.sum(ops.square(ops.relu(x)), axis=-1)
            return count, first, second

        return _sweep(qs, table3, pos, excl, num_items, padded, step, (zero, zero, zero))

    def newton(t, count, first, second, changed):
        # first = sum over the support at t of (z - top - t): the step is t + (first - 1) / count
        new_t = ops.maximum(t, t + (first - 1.0) / ops.maximum(count, 1.0))
        new_t = ops.where(bad, t, new_t)
        new_count, new_first, new_second = stats(new_t)
        moved = ops.logical_and(ops.not_equal(new_count, count), ops.logical_not(bad))
        return new_t, new_count, new_first, new_second, ops.any(moved)

    t, count, first, second, _ = ops.while_loop(
        lambda t, count, first, second, changed: changed,
        newton,
        (tau, *stats(tau), ops.convert_to_tensor(True)),
        maximum_iterations=int(table3.shape[0] * table3.shape[1]),
    )
    return t, second


def _backward(loss, kind, qs, table3, pos, excl, num_items, padded, saved, upstream):
    """``(d/dqs, d/dtable3)`` from one pass that recomputes each chunk's scores."""
    g = ops.cast(upstream, qs.dtype)
    g = nan_where(ops.isnan(loss), g)

    # dz = g * (a - c e_y): the chunk pass handles a; the positive's -g c e_y term is a gather
    # (d/dq) and a scatter-add (d/dtable) outside it, so no [B, chunk] one-hot is built.
    if kind == "softmax":
        (lse,) = saved
        scale, coef = g, g
    elif kind == "rankmax":
        mu, d, s = saved
        scale, coef = g / d, g * s / d
    else:
        (tau,) = saved
        scale, coef = g, g

    def step(dq, z, cols, bad, tc):
        if kind == "softmax":
            dz = ops.exp(z - lse[:, None])
        elif kind == "rankmax":
            dz = ops.cast(z > mu[:, None], z.dtype)
        else:
            dz = ops.relu(z - tau[:, None])
        dz = scale[:, None] * dz
        return dq + ops.matmul(dz, tc), ops.matmul(ops.transpose(dz), qs)

    buffer = ops.zeros_like(table3)
    dq, dtable = _sweep(qs, table3, pos, excl, num_items, padded, step, ops.zeros_like(qs), buffer)
    flat_shape = (table3.shape[0] * table3.shape[1], table3.shape[2])
    flat = ops.reshape(table3, flat_shape)
    dq = dq - coef[:, None] * _backend.take(flat, pos, axis=0)
    positive = ops.scatter(ops.reshape(pos, (-1, 1)), coef[:, None] * qs, flat_shape)
    dtable = dtable - ops.reshape(positive, table3.shape)
    return dq, dtable


def catalogue_loss(
    queries,
    table,
    positive_ids,
    *,
    loss: str = "softmax",
    temperature: float = 1.0,
    exclude=None,
    margin: float = 1.0,
    chunk_size: int | None = None,
):
    """Exact per-query loss over a whole candidate table, streamed over candidate chunks.

    With ``z_ij = queries_i . table_j / temperature`` (``-inf`` where ``exclude`` lists ``j``
    for row ``i``) and ``y_i = positive_ids_i``, the loss of row ``i`` is

    * ``"softmax"``: ``log sum_j exp(z_ij) - z_iy``;
    * ``"rankmax"`` (``k = 1``): ``log sum_j (z_ij - z_iy + margin)_+ - log margin``;
    * ``"sparsemax"``: ``1/2 ||p_i||^2 + 1/2 - (z_iy - tau_i)``, ``p_i = (z_i - tau_i)_+``
      summing to 1,

    the values ``losszoo.ops.sparsemax_loss`` / ``rankmax_loss`` / softmax cross-entropy give on
    the materialised ``[B, N]`` scores, computed one ``[B, chunk_size]`` block at a time (the
    module docstring lists the passes). Gradients flow to ``queries`` and ``table`` (dense) and
    are recomputed chunk by chunk; the ids get none. Compiles under XLA (``jit_compile=True``,
    ``jax.jit``) and takes an unknown batch size; computes in float32 (or float64).

    Args:
      queries: ``[B, d]`` float query embeddings.
      table: ``[N, d]`` float candidate embeddings (e.g. an ``Embedding`` layer's
        ``embeddings``); ``N`` must be static.
      positive_ids: ``[B]`` integer ids in ``[0, N)``: each row's positive.
      loss: ``"softmax"``, ``"sparsemax"`` or ``"rankmax"``.
      temperature: ``T > 0``, a Python number dividing the scores.
      exclude: ``None`` or ``[B, M]`` integer ids to drop from each row (``-inf`` scores;
        e.g. the items a user has already seen), padded with ``-1``. Must not list the row's
        positive.
      margin: Rankmax's ``eta > 0`` (the paper's 1); ignored by the other losses.
      chunk_size: candidates per chunk, a multiple of 256 (memory ``~ B * chunk_size`` floats
        a few times over; the last chunk is padded). ``None``: 8192, or 32768 where programs
        run on a GPU (fewer loop trips: a step 7-9% faster at batch 4096 and 10^6 items on an
        H200, where larger chunks slow a CPU down: ``BENCHMARKS.md``).

    Returns:
      ``[B]`` losses in ``queries``' dtype.

    Raises:
      ValueError: naming the argument, for NaN or infinite ``queries`` / ``table``, ids out
        of range, an ``exclude`` row holding its positive (eagerly; assertions in TensorFlow
        graphs; under XLA those rows are NaN), a bad ``loss`` / ``temperature`` / ``margin`` /
        ``chunk_size`` or an unknown ``N``.

    Example:
      >>> q = np.array([[1.0, 0.0]], "float32")
      >>> items = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], "float32")
      >>> # scores [1, 0, 0]; positive 1: log((1 + 1) + (0 + 1) + (0 + 1)) = log 4
      >>> keras.ops.convert_to_numpy(catalogue_loss(q, items, [1], loss="rankmax"))
      array([1.3862944], dtype=float32)
    """
    check_choice(loss, "loss", LOSSES)
    temperature = check_number(temperature, "temperature", low=0.0, low_open=True, tensor_ok=False)
    margin = check_number(margin, "margin", low=0.0, low_open=True, tensor_ok=False)
    if chunk_size is None:
        chunk_size = 32768 if _backend.compiles_for_gpu() else 8192
    chunk_size = check_number(chunk_size, "chunk_size", low=_CHUNK_MULTIPLE, integer=True)
    if chunk_size % _CHUNK_MULTIPLE:
        raise ValueError(f"`chunk_size` must be a multiple of {_CHUNK_MULTIPLE}, got {chunk_size}.")
    q, dtype = to_compute_dtype(queries, "queries")
    t, _ = to_compute_dtype(table, "table")
    t = ops.cast(t, q.dtype)
    for x, name, shape in ((q, "queries", "[B, d]"), (t, "table", "[N, d]")):
        check_static_rank(x, 2, name)
        if len(x.shape) != 2:
            raise ValueError(f"`{name}` must be {shape}, got shape {list(x.shape)}.")
    num_items, dim = t.shape
    if num_items is None:
        raise ValueError("`table` must have a static number of rows N.")
    if dim is not None and q.shape[-1] is not None and dim != q.shape[-1]:
        raise ValueError(f"`queries` {list(q.shape)} and `table` {list(t.shape)} differ in d.")
    q = check_finite(q, "queries")
    t = check_finite(t, "table")
    pos = ops.convert_to_tensor(positive_ids)
    if len(pos.shape) != 1:
        raise ValueError(f"`positive_ids` must be [B], got shape {list(pos.shape)}.")
    pos = CLASS_IDS.check(pos, "positive_ids", num_items)
    invalid = CLASS_IDS.invalid(pos, num_items)
    pos = ops.cast(ops.where(invalid, 0, pos), "int32")
    excl = None
    if exclude is not None:
        excl = ops.convert_to_tensor(exclude)
        if len(excl.shape) != 2:
            raise ValueError(f"`exclude` must be [B, M] (padded with -1), got {list(excl.shape)}.")
        excl = PADDED_CLASS_IDS.check(excl, "exclude", num_items)
        bad_excl = ops.any(PADDED_CLASS_IDS.invalid(excl, num_items), axis=-1)
        excl = ops.cast(ops.where(PADDED_CLASS_IDS.invalid(excl, num_items), -1, excl), "int32")
        excl = EXCLUSIONS.check(excl, "exclude", pos)
        invalid = invalid | bad_excl | EXCLUSIONS.invalid(excl, pos)

    chunk = min(chunk_size, -(-num_items // _CHUNK_MULTIPLE) * _CHUNK_MULTIPLE)
    chunks = -(-num_items // chunk)
    padded = chunks * chunk != num_items
    if padded:
        t = ops.pad(t, ((0, chunks * chunk - num_items), (0, 0)))
    table3 = ops.reshape(t, (chunks, chunk, t.shape[-1]))
    qs = q * (1.0 / temperature)
    poison = nan_where(invalid, ops.zeros_like(qs[:, 0]))
    out = _catalogue_kernel(loss, num_items, padded, margin, excl is not None)(
        qs, table3, pos, excl if excl is not None else pos[:, None], poison
    )
    return ops.cast(out, dtype)


def _catalogue_kernel(kind, num_items, padded, margin, has_exclusions):
    @custom_gradient
    def f(qs, table3, pos, excl, poison):
        excl = excl if has_exclusions else None
        args = (qs, table3, pos, excl, num_items, padded)
        if kind == "softmax":
            loss, saved = _softmax_forward(*args)
        elif kind == "rankmax":
            loss, saved = _rankmax_forward(*args, margin)
        else:
            loss, saved = _sparsemax_forward(*args)
        loss = loss + poison

        def grad(upstream):
            dq, dtable = _backward(loss, kind, *args, saved, upstream)
            return dq, dtable, None, None, None

        return loss, grad

    return f
