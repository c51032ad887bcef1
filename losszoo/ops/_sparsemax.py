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
From 256 chunks on (K >= 8192 with chunks of 32) the full steps are avoided too: every support
entry exceeds that start, so the support lies in the chunks whose maximum does. When at most 64
chunks do, the search runs on the 64 chunks with the largest maxima (a ``top_k`` over the
maxima and a gather) and is exact; rows whose support spans more chunks make the batch go on
with full steps from there. The row max is taken from the chunk maxima, so on this path one
pass over the logits comes before the passes that form the output and the loss.
Compiled for a GPU, a problem of at most 2^22 scores and 32768 classes per row is
thresholded by one sort instead (spec A1, :func:`_sorts`): there each Newton step's kernel
launches cost more than the sort. PyTorch has kernels of its own (end of this docstring).

Numerics: the maximum is subtracted first (without it float32 loses the support at large
K, spec section 4); ``-inf`` scores get probability 0; ``+inf`` or all ``-inf`` rows give NaN,
as softmax does. Half-precision inputs are computed in float32 and cast back.

Fail-loud contract (README, "Bad input"): logits keep ``contract.LOGITS`` in its cheaper
form, kept for speed (no host read or extra pass): a row holding a NaN or ``+inf`` score, or
only ``-inf``, comes back entirely NaN (output, loss and gradient) in every mode, eager,
graph and XLA alike, and the other rows are unaffected (folded into the threshold's Newton
passes, and from 256 chunks on into the chunk maxima, NaN for a chunk holding a NaN or
``+inf``). Sparsemax is shift-invariant: offsets of 1e8 give the same output up to float32
rounding of the inputs. ``sparsemax_loss`` reads Keras' label forms (ids or dense targets)
once, and rejects bad ids, NaN/inf or negative ``labels`` and label rows that do not sum to 1
eagerly and in graphs (skipped with ``losszoo.set_validation(False)``); under XLA such a
row's loss and gradient are NaN.
``axis`` must be an integer.

PyTorch runs a ``while_loop`` in Python, reading its condition on the host at every trip,
and each op as its own pass (no fusion), so it has kernels of its own (same values within
float32 rounding): one ``top_k`` gives the row max and the 65 largest scores; spec A1 on the
64 largest gives their threshold, exact for the row when the 65th does not exceed it (one host
read for the batch). Otherwise Newton steps run as straight-line code from that lower bound,
3 then 7, with one read after each round of whether every row's support stopped changing
(then exact); the sort only if not. ``||p||^2`` comes from the 64 scores, class ids are
gathered instead of expanded to one-hot rows, and the labels' NaN mask is skipped where
validation already checked them (``contract.rules_enforced``).
"""

from __future__ import annotations

import functools

import numpy as np
from keras import ops

from losszoo._backend import (
    LOOPS_READ_HOST,
    compiles_for_gpu,
    cumsum,
    custom_gradient,
    jit_on_jax,
    maximum,
    reduce_max,
    reduce_min,
    take_along_axis,
)
from losszoo.contract import (
    TARGETS,
    check_number,
    check_static_rank,
    class_ids_and_invalid,
    dense_labels,
    dtype_name,
    is_class_ids,
    move_axis_last,
    nan_where,
    rules_enforced,
    shapes_compatible,
    static_rank,
    target_distribution,
    to_compute_dtype,
)

# Chunks for the start of the threshold search: the largest of these sizes that divides the
# class axis and leaves at least _MIN_CHUNKS chunks (fewer would make the start no cheaper
# than a full step).
_CHUNK_SIZES = (32, 16, 8, 4, 2)
_MIN_CHUNKS = 16
# With at least _CANDIDATE_MIN chunks, the search runs on the _CANDIDATES chunks with the
# largest maxima instead of the whole row (module docstring).
_CANDIDATES = 64
_CANDIDATE_MIN = 4 * _CANDIDATES
# PyTorch (loops read the host at each trip): Newton steps run as straight-line code, their
# convergence read once; the threshold search starts from the _TOP_K largest scores.
_UNROLLED_ROUNDS = (3, 7)  # Newton steps per round; one host read after each
_TOP_K = 64


def _chunk_size(num_classes) -> int:
    """The chunk size for ``num_classes`` classes: 1 (no chunks) when no size of
    ``_CHUNK_SIZES`` fits or the size is unknown."""
    if num_classes is None:
        return 1
    fits = (c for c in _CHUNK_SIZES if num_classes % c == 0 and num_classes // c >= _MIN_CHUNKS)
    return next(fits, 1)


def _searches_candidates(num_classes) -> bool:
    """Whether the threshold of ``num_classes`` classes is searched on candidate chunks."""
    chunk = _chunk_size(num_classes)
    return chunk > 1 and num_classes // chunk >= _CANDIDATE_MIN


# On a GPU a row of up to _SORT_MAX_CLASSES classes is thresholded by a sort when the whole
# batch holds at most _SORT_MAX_ENTRIES scores: there the Newton search's kernel launches cost
# more than the sort (H200, JAX, fwd+bwd of the loss, sort against Newton with its unrolled
# start: 256x1000 0.11 / 0.29 ms, 128x16384 0.21 / 0.41 ms; from 2^22 scores on the Newton
# search wins: 128x32768 0.40 / 0.36 ms, 1024x4096 0.38 / 0.34, 2048x32768 5.0 / 0.69;
# BENCHMARKS.md, "GPU: the Newton search's unrolled start, whole rows ...").
_SORT_MAX_CLASSES = 32768
_SORT_MAX_ENTRIES = 2**21
# Compiled for a GPU, the Newton search first runs this many steps as straight-line code (no
# loop condition to read); its loop then starts only if a row has not converged (from the
# chunk maxima's start 1 to 3 steps converge: module docstring). 0: the loop from the start.
_GPU_NEWTON_STEPS = 3
# Up to _WHOLE_ROW_MAX_ENTRIES scores (and more than the sort takes), a GPU searches whole
# rows from -1 after _WHOLE_ROW_STEPS unrolled steps, without the candidate chunks' row max,
# chunk maxima, top_k and gather (H200, JAX, fwd+bwd, ratio to optax CE: 32x100000 3.10x ->
# 2.00x, 128x32768 2.78x -> 2.24x; at 2048x32768 the chunks win, 1.96x against 2.85x).
_WHOLE_ROW_MAX_ENTRIES = 2**22
_WHOLE_ROW_STEPS = 6


def _sorts(shape) -> bool:
    """Whether the whole threshold search is one sort of the scores of static ``shape``: for
    small problems of known size compiled for a GPU, else never (XLA on a CPU: the Newton
    search is faster at every size; PyTorch: :func:`_top_threshold`). A size that is not a
    Python int (``None``, or a symbolic size of a shape-polymorphic JAX export) is unknown."""
    entries = _gpu_entries(shape)
    return entries is not None and shape[-1] <= _SORT_MAX_CLASSES and entries <= _SORT_MAX_ENTRIES


def _whole_rows(shape) -> bool:
    """Whether the Newton search runs on whole rows of static ``shape`` rather than on
    candidate chunks: compiled for a GPU, at most ``_WHOLE_ROW_MAX_ENTRIES`` scores of known
    size (as :func:`_sorts`, which is asked first)."""
    entries = _gpu_entries(shape)
    return entries is not None and entries <= _WHOLE_ROW_MAX_ENTRIES


def _gpu_entries(shape):
    """The number of scores of static ``shape`` when compiling for a GPU; None elsewhere or
    when a size is not a Python int (``None``, or a symbolic size of a JAX export)."""
    if not compiles_for_gpu() or not all(isinstance(d, (int, np.integer)) for d in shape):
        return None
    return int(np.prod(shape))


def _chunks(z, chunk):
    """``z`` ([..., K]) as ``[..., K / chunk, chunk]``."""
    return ops.reshape(z, [*ops.shape(z)[:-1], z.shape[-1] // chunk, chunk])


def _chunk_maxima(z, chunk):
    """The maximum of each chunk of ``chunk`` classes; NaN for a chunk holding a NaN or
    ``+inf`` (one pass; ``max`` alone may skip NaNs under XLA)."""
    m = reduce_max(_chunks(ops.where(ops.isnan(z), np.inf, z), chunk), -1)
    return ops.where(ops.equal(m, np.inf), np.nan, m)


def _sorted_threshold(z):
    """The exact threshold of each row of ``z`` (maximum 0) by a sort (spec A1): with ``z``
    in decreasing order and prefix sums ``c_j``, ``k = max{j : 1 + j z_(j) > c_j}`` and
    ``tau = (c_k - 1) / k``. No loop: what PyTorch runs where a loop would read its
    condition on the host at every trip. NaN for rows holding a NaN."""
    ordered = ops.flip(ops.sort(z, axis=-1), axis=-1)
    prefix = cumsum(ordered, axis=-1)
    j = ops.arange(1, z.shape[-1] + 1, dtype=z.dtype)
    size = ops.sum(ops.cast(1.0 + j * ordered > prefix, "int32"), -1, keepdims=True)
    size = maximum(size, 1)  # 1 for a row of NaNs (poisoned below)
    total = take_along_axis(prefix, size - 1, axis=-1)
    tau = (total - 1.0) / ops.cast(size, z.dtype)
    return ops.where(ops.any(ops.isnan(z), -1, keepdims=True), np.nan, tau)


def _michelot(z, tau0, gpu_steps=None):
    """Newton (Michelot) on ``sum_i (z_i - tau)_+ = 1`` from ``tau0`` ([..., 1]) at or left
    of the root: the exact threshold of each row of ``z``; NaN for rows holding a NaN.
    Where loops read the host at each trip (PyTorch), :func:`_michelot_unrolled`; compiled
    for a GPU, ``gpu_steps`` (default ``_GPU_NEWTON_STEPS``) unrolled steps before the loop."""
    if LOOPS_READ_HOST:
        return _michelot_unrolled(z, tau0)

    def support_size(tau):
        return ops.sum(ops.cast(z > tau, "int32"), axis=-1, keepdims=True)

    def newton_step(tau, count, changed):
        # NaN entries are summed too, so a row holding a NaN gets a NaN threshold (XLA's
        # reduce_max may skip NaNs, so nothing else would spread it); folded into the pass
        # the step makes anyway.
        keep = (z > tau) | ops.isnan(z)
        total = ops.sum(ops.where(keep, z, 0.0), -1, keepdims=True)
        # max() keeps the iterates monotone even under rounding, so the support can only
        # shrink and the loop cannot cycle.
        candidate = (total - 1.0) / ops.cast(count, z.dtype)
        new_tau = ops.where(ops.isnan(candidate), candidate, maximum(tau, candidate))
        new_count = support_size(new_tau)
        return new_tau, new_count, ops.any(ops.not_equal(new_count, count))

    unrolled = (_GPU_NEWTON_STEPS if gpu_steps is None else gpu_steps) if compiles_for_gpu() else 0
    if unrolled:
        tau, converged, count = _newton_unrolled(z, tau0, unrolled)
        start = (tau, count, ops.logical_not(ops.all(converged)))
    else:
        start = (tau0, support_size(tau0), ops.convert_to_tensor(True))
    num_classes = z.shape[-1]
    tau, _, _ = ops.while_loop(
        lambda tau, count, changed: changed,
        newton_step,
        start,
        maximum_iterations=num_classes if num_classes is not None else ops.shape(z)[-1],
    )
    if unrolled:  # the unrolled steps skip NaNs; a row holding one may not enter the loop
        tau = ops.where(ops.isnan(ops.sum(z, -1, keepdims=True)), np.nan, tau)
    return tau


def _newton_unrolled(z, tau, steps: int):
    """``steps`` Newton (Michelot) steps on ``z`` from ``tau`` ([..., 1], at or left of the
    root) as straight-line code, without a loop condition: ``(tau, converged, count)``, where
    ``converged`` ([..., 1]) is true for the rows whose support did not change in the last
    step and ``count`` is the support size at ``tau``. Their ``tau`` is exact, and is what
    :func:`_michelot`'s loop stops at (a further step over the same support gives the same
    value). Rows holding a NaN are not marked NaN here (the callers do)."""
    keep = z > tau
    count = ops.sum(ops.cast(keep, "int32"), axis=-1, keepdims=True)
    converged = None
    for _ in range(steps):
        total = ops.sum(ops.where(keep, z, 0.0), -1, keepdims=True)
        # max() keeps the iterates monotone under rounding, as in _michelot.
        tau = maximum(tau, (total - 1.0) / ops.cast(count, z.dtype))
        keep = z > tau
        new_count = ops.sum(ops.cast(keep, "int32"), axis=-1, keepdims=True)
        converged, count = ops.equal(new_count, count), new_count
    return tau, converged, count


def _newton_rounds(z, tau, done=False):
    """Rounds of :func:`_newton_unrolled` (``_UNROLLED_ROUNDS`` steps) from ``tau``, one host
    read after each of whether every row converged (or is ``done``, [..., 1]): the exact
    threshold, or None when a row had not converged after the last round (supports of
    thousands of classes; the callers sort then)."""
    for steps in _UNROLLED_ROUNDS:
        tau, converged, _ = _newton_unrolled(z, tau, steps)
        if bool(ops.all(converged | done)):
            return tau
    return None


def _michelot_unrolled(z, tau0):
    """:func:`_michelot` where loops read the host at each trip (PyTorch):
    :func:`_newton_rounds` (from the chunk maxima's start 1 to 3 steps converge, module
    docstring: one read), the sort of :func:`_sorted_threshold` if they did not converge.
    Exact either way; NaN for rows holding a NaN (or both infinities)."""
    tau = _newton_rounds(z, tau0)
    if tau is None:
        return _sorted_threshold(z)
    return ops.where(ops.isnan(ops.sum(z, -1, keepdims=True)), np.nan, tau)


def _top_threshold(x):
    """PyTorch's threshold search, for :func:`_sparsemax_torch` and
    :func:`_sparsemax_loss_torch`: ``(top, tau, head)`` per row of ``x`` (no gradient).

    ``top`` is the row max and ``tau`` the exact threshold of ``x - top`` ([..., 1] each).
    One ``top_k`` gives the ``_TOP_K + 1`` largest scores in order; the threshold of the
    ``_TOP_K`` largest (spec A1 on them: no sort of the row) is a lower bound of ``tau``, and
    equal to it when the next score does not exceed it (the support then lies in them). Then
    ``head`` holds those ``_TOP_K`` scores minus ``top`` (the support's values). One host
    read tells whether that held in every row; if not (supports of more than ``_TOP_K``
    classes, e.g. logits of scale 0.01), Newton steps on the whole row from that bound
    (:func:`_newton_rounds`: one or two more reads; the sort if they did not converge) and
    ``head`` is None. A row holding a
    NaN or ``+inf``, or only ``-inf``, gets ``tau`` NaN."""
    num_classes = x.shape[-1]
    ordered, _ = ops.top_k(x, min(num_classes, _TOP_K + 1))
    top = ordered[..., :1]
    head = ordered[..., :_TOP_K] - top
    prefix = cumsum(head, axis=-1)
    j = ops.arange(1, head.shape[-1] + 1, dtype=x.dtype)
    size = ops.sum(ops.cast(1.0 + j * head > prefix, "int32"), -1, keepdims=True)
    size = maximum(size, 1)  # 1 for a bad row (poisoned below)
    tau = (take_along_axis(prefix, size - 1, axis=-1) - 1.0) / ops.cast(size, x.dtype)
    # topk ranks NaN first on the CPU, but on CUDA a NaN with its sign bit set may come last
    # (pytorch/pytorch#117617): the row sum finds it (one reduction).
    bad = ops.logical_not(ops.isfinite(top)) | ops.isnan(ops.sum(x, -1, keepdims=True))
    if num_classes > _TOP_K and not bool(ops.all((ordered[..., _TOP_K:] - top <= tau) | bad)):
        z = x - top
        tau = _newton_rounds(z, tau, bad)
        tau = _sorted_threshold(z) if tau is None else tau
        head = None
    return top, ops.where(bad, np.nan, tau), head


@custom_gradient
def _sparsemax_torch(z):
    """:func:`_sparsemax_last_axis` on PyTorch: the threshold of :func:`_top_threshold`, and
    fewer passes in the gradient: ``s = sign(p)`` is 1 on the support, 0 off it and NaN in a
    NaN row, so ``s * (v - sum(s v) / sum(s))`` keeps such a row NaN without a mask."""
    top, tau, _ = _top_threshold(z)
    p = ops.relu(z - top - tau)

    def grad(upstream):
        upstream = ops.cast(upstream, p.dtype)
        support = ops.sign(p)
        mean = ops.sum(support * upstream, -1, keepdims=True) / ops.sum(support, -1, True)
        return support * (upstream - mean)

    return p, grad


def _squared_norm(x):
    """``sum(x^2)`` over the last axis: in float32 one fused pass (``norm``, squared; Keras'
    ``norm`` computes wider dtypes in float32, so float64 squares and sums)."""
    if dtype_name(x) == "float32":
        return ops.square(ops.norm(x, axis=-1))
    return ops.sum(x * x, -1)


def _p_squared(p, head, tau):
    """``||p||^2`` per row: from ``head`` (the support's scores from :func:`_top_threshold`)
    when it holds them, else from ``p``."""
    if head is None:
        return _squared_norm(p)
    return ops.sum(ops.square(ops.relu(head - tau)), -1)


def _sparsemax_loss_torch(q, z, tol: float, checked: bool):
    """:func:`_sparsemax_loss_last_axis` on PyTorch, in fewer passes over ``[..., K]``: the
    threshold of :func:`_top_threshold`, ``||p||^2`` from its ``head`` (the support's
    scores), ``<z - tau, q>`` with NaN (``-inf`` scores times 0) taken as 0, and the
    gradient's NaN rows carried by the upstream factor (NaN times 0 is NaN eagerly). A NaN
    row of ``z`` stays NaN through ``||p||^2``. ``checked``: the labels were validated here
    (:func:`losszoo.contract.rules_enforced`), so the kernel's NaN mask of bad target rows
    is skipped; otherwise it is two reductions (``min(q) >= 0`` fails for NaN and negative
    entries, the row sum for ``+inf`` and the tolerance)."""

    @custom_gradient
    def f(z, q):
        top, tau, head = _top_threshold(z)
        d = z - top - tau
        p = ops.relu(d)
        square = _p_squared(p, head, tau)
        margin = ops.sum(ops.nan_to_num(d * q, nan=0.0, posinf=np.inf, neginf=-np.inf), -1)
        loss = ops.relu(0.5 * (square + _squared_norm(q)) - margin)  # L >= 0 exactly
        if not checked:
            bad = ops.logical_not(reduce_min(q, -1) >= 0)
            bad = bad | ops.logical_not(ops.abs(ops.sum(q, -1) - 1.0) <= tol)
            loss = nan_where(bad, loss)

        def grad(upstream):
            upstream = nan_where(ops.isnan(loss), ops.cast(upstream, p.dtype))
            return upstream[..., None] * (p - q), None

        return loss, grad

    return f(z, q)


def _threshold(x, shift=0.0, maxima=None):
    """Exact sparsemax threshold of each row of ``z = x - shift`` (last axis), whose maximum is
    0; ``shift`` ([..., 1]) is passed apart so that only the rare full search below writes
    ``z`` to memory. ``maxima``: ``z``'s chunk maxima from :func:`_row_max`, if it made them.

    Returns ``tau`` with shape ``x.shape[:-1] + [1]``, without gradient.
    """
    # Constants from here: a persistent TensorFlow tape records no op of the search, so a
    # second ``tape.gradient`` never differentiates the ``cond`` below (XLA cannot compile
    # that cond's rewrite for gradients: FakeParam of its loop's accumulators).
    x = ops.stop_gradient(x)
    z = x - shift
    if _sorts(tuple(z.shape)):
        return ops.stop_gradient(_sorted_threshold(z))
    tau0 = -ops.ones_like(z[..., :1])  # f(-1) >= 0 because max(z) = 0
    if _whole_rows(tuple(z.shape)):
        return ops.stop_gradient(_michelot(z, tau0, _WHOLE_ROW_STEPS))
    chunk = _chunk_size(z.shape[-1])
    if chunk == 1:
        return ops.stop_gradient(_michelot(z, tau0))
    few = not _searches_candidates(z.shape[-1])
    if maxima is None:  # NaNs reach the threshold through the full search when `few`
        maxima = reduce_max(_chunks(z, chunk), -1) if few else _chunk_maxima(z, chunk)
    # The chunk maxima's threshold: a lower bound (module docstring), NaN for a bad row.
    tau_max = _threshold(maxima)
    tau0 = maximum(tau0, tau_max)
    if few:
        return ops.stop_gradient(_michelot(z, tau0))
    # The support lies in the chunks whose maximum exceeds tau_max; when there are at most
    # _CANDIDATES of them, the search on the _CANDIDATES largest chunks is exact.
    # (A NaN row comes out NaN whatever is picked; where NaN lands in top_k's order differs
    # between backends.)
    _, top = ops.top_k(ops.where(ops.isnan(maxima), 0.0, maxima), _CANDIDATES, sorted=False)
    candidates = ops.take_along_axis(_chunks(z, chunk), top[..., None], axis=-2)
    candidates = ops.reshape(candidates, [*ops.shape(z)[:-1], _CANDIDATES * chunk])
    tau = _michelot(candidates, tau0)
    covered = ops.sum(ops.cast(maxima > tau_max, "int32"), -1) <= _CANDIDATES
    tau = ops.cond(ops.all(covered), lambda: tau, lambda: _michelot(x - shift, tau))
    return ops.stop_gradient(ops.where(ops.isnan(tau_max), tau_max, tau))


def _row_max(x):
    """``(max(x), maxima)`` per row, without gradient. With at least ``_CANDIDATE_MIN`` chunks,
    ``maxima`` are the chunk maxima of ``x - max(x)`` (:func:`_chunk_maxima`: NaN for a chunk
    holding a NaN or ``+inf``, which :func:`_threshold` spreads to the row), found in the same
    pass as the row max; otherwise None. Shifted by it, an all ``-inf`` row becomes NaN
    (``-inf - (-inf)``), as in softmax."""
    if not _searches_candidates(x.shape[-1]) or _whole_rows(tuple(x.shape)):
        return ops.stop_gradient(reduce_max(x, axis=-1, keepdims=True)), None
    maxima = _chunk_maxima(x, _chunk_size(x.shape[-1]))
    top = ops.stop_gradient(reduce_max(maxima, axis=-1, keepdims=True))
    return top, ops.stop_gradient(maxima - top)


def _prepare(logits, axis: int, name: str):
    axis = check_number(axis, "axis", integer=True)
    z, dtype = to_compute_dtype(logits, name)
    check_static_rank(z, 1, name)
    z, undo = move_axis_last(z, axis)
    if z.shape[-1] == 0:
        raise ValueError(f"`{name}` must have at least one class along `axis`={axis}.")
    return z, dtype, undo


@jit_on_jax
@custom_gradient
def _sparsemax_last_axis(z):
    top, maxima = _row_max(z)
    p = ops.relu(z - top - _threshold(z, top, maxima))

    def grad(upstream):
        upstream = ops.cast(upstream, p.dtype)
        support = ops.cast(p > 0, p.dtype)
        mean = ops.sum(support * upstream, -1, keepdims=True) / ops.sum(support, -1, keepdims=True)
        # A NaN row (see _row_max) has an empty support; keep its gradient NaN explicitly,
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
    kernel = _sparsemax_torch if LOOPS_READ_HOST else _sparsemax_last_axis
    return ops.cast(undo(kernel(z)), dtype)


# Machine epsilon per floating dtype (np.finfo does not know bfloat16).
_EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}


def _sum_tolerance(label_dtype: str, dtype: str) -> float:
    """How far a target row's sum may stray from 1: sqrt(eps) of the coarser of the labels'
    own dtype and the compute dtype (3.5e-4 in float32; one-hot rows are exact)."""
    eps = max(_EPS[dtype], _EPS.get(label_dtype, 0.0))
    return float(np.sqrt(eps))


def _sparsemax_loss_last_axis(q, z, tol: float, threshold=_threshold):
    """The loss on the last axis; ``q`` is a constant (no gradient). ``threshold`` has
    :func:`_threshold`'s signature (the benchmarks' floor rows pass one that returns a
    precomputed ``tau``)."""

    @custom_gradient
    def f(z, q):
        top, maxima = _row_max(z)
        tau = threshold(z, top, maxima)
        z = z - top
        p = ops.relu(z - tau)
        # <z - tau, q> over the classes that carry target mass; written with where() so that
        # a -inf score with q = 0 contributes 0 rather than NaN.
        margin = ops.where(q > 0, (z - tau) * q, 0.0)
        # Targets breaking TARGETS poison the row: the XLA half of the label check, folded
        # into the sums (NaN squares; not ~(q >= 0), see contract.NON_NEGATIVE).
        bad = ops.isnan(q) | (q < 0) | ops.equal(q, np.inf)
        square = ops.where(bad, np.nan, q * q)
        loss = ops.sum(0.5 * (p * p + square) - margin, -1)  # one pass
        loss = ops.relu(loss)  # L >= 0 exactly; removes round-off below zero.
        loss = nan_where(ops.abs(ops.sum(q, -1) - 1.0) > tol, loss)

        def grad(upstream):
            g = ops.cast(upstream, p.dtype)[..., None] * (p - q)
            return nan_where(ops.isnan(loss)[..., None], g), None

        return loss, grad

    return f(z, q)


@jit_on_jax
def _sparsemax_loss_ids(ids, invalid, z):
    """The loss for class ids (int32, ``z.shape[:-1]``; ``invalid`` marks ids breaking
    ``CLASS_IDS``, NaN rows): ``1/2 ||p||^2 + 1/2 - (z_y - tau)`` with gradient
    ``p - onehot(y)``, the dense formula for a one-hot ``q`` without forming ``q``: no pass
    over the targets, and the one-hot only inside the gradient's subtraction."""

    @custom_gradient
    def f(z, ids, invalid):  # ids and invalid as arguments: JAX's custom VJP closes over none
        top, maxima = _row_max(z)
        tau = _threshold(z, top, maxima)
        z = z - top
        p = ops.relu(z - tau)
        z_y = take_along_axis(z, ids[..., None], axis=-1)
        loss = ops.relu(0.5 * ops.sum(p * p, -1) + 0.5 - (z_y - tau)[..., 0])
        loss = nan_where(invalid, loss)

        def grad(upstream):
            target = ops.one_hot(ids, z.shape[-1], dtype=p.dtype)
            g = ops.cast(upstream, p.dtype)[..., None] * (p - target)
            return nan_where(ops.isnan(loss)[..., None], g), None, None

        return loss, grad

    return f(z, ids, invalid)


def _sparsemax_loss_ids_torch(ids, invalid, z):
    """:func:`_sparsemax_loss_torch` for class ids ``y`` (``z``'s shape without the class
    axis), without one-hot targets: with ``q = e_y``, ``L = 1/2 ||p||^2 + 1/2 - (z_y - tau)``
    (a gather) and the gradient ``p - e_y`` (``-1`` added at ``y`` by a scatter). ``invalid``
    ids (already rejected eagerly when validation is on) make their rows NaN."""
    num_classes = z.shape[-1]
    batch = ops.shape(z)[:-1]
    z = ops.reshape(z, [-1, num_classes])
    ids = ops.reshape(ids, [-1, 1])
    invalid = ops.reshape(invalid, [-1])

    @custom_gradient
    def f(z):
        top, tau, head = _top_threshold(z)
        d = z - top - tau
        p = ops.relu(d)
        square = _p_squared(p, head, tau)
        target = take_along_axis(d, ids, axis=-1)[:, 0]
        loss = nan_where(invalid, ops.relu(0.5 * (square + 1.0) - target))  # L >= 0 exactly

        def grad(upstream):
            upstream = nan_where(ops.isnan(loss), ops.cast(upstream, p.dtype))
            at = ops.stack([ops.arange(ops.shape(ids)[0], dtype=ids.dtype), ids[:, 0]], axis=1)
            return ops.scatter_update(upstream[:, None] * p, at, -upstream, reduction="add")

        return loss, grad

    return ops.reshape(f(z), batch)


@functools.partial(jit_on_jax, static_argnames=("tol",))
def _sparsemax_loss_default(q, z, tol: float):
    """:func:`_sparsemax_loss_last_axis` with the exact threshold (compiled once per shape
    on JAX, see :func:`losszoo._backend.jit_on_jax`); :func:`_sparsemax_loss_torch` on
    PyTorch."""
    if LOOPS_READ_HOST:
        return _sparsemax_loss_torch(q, z, tol, rules_enforced(q, z))
    return _sparsemax_loss_last_axis(q, z, tol)


def sparsemax_loss(
    labels,
    logits,
    axis: int = -1,
    *,
    normalize_labels: bool | None = None,
    labels_name: str = "labels",
    logits_name: str = "logits",
):
    """Per-example sparsemax loss ``L(z; q) = 1/2||p||^2 + 1/2||q||^2 - <z - tau, q>``.

    ``p = sparsemax(z)``. The gradient with respect to the logits is ``p - q``; the labels
    are treated as constants. ``L >= 0`` and ``L = 0`` exactly when ``p = q``; for one-hot
    targets that means the true class leads every other by a margin of at least 1.

    Args:
      labels: Keras' label forms, read by shape (:func:`losszoo.contract.is_class_ids`):
        class ids of shape ``logits.shape[:-1]`` or with a trailing 1 (integer or whole-number
        floats, ``contract.CLASS_IDS``; one-hot targets), or target distributions ``q`` with
        the shape of ``logits``: one-hot, soft, or a normalised multi-label vector, dense or
        (TensorFlow) a ``tf.SparseTensor`` (absent entries are 0; not under
        ``jit_compile=True``, where XLA cannot densify it). Dense rows must keep
        ``contract.TARGETS``: non-negative, summing to 1 within ``sqrt(eps)`` of the coarser
        of the labels' and the compute dtype (3.5e-4 in float32); the loss is
        shift-invariant in the logits only then.
      logits: float tensor of rank >= 1. Logits policy: ``contract.LOGITS`` in its cheaper
        form, kept for speed (no host read, no extra pass): a row holding a NaN or ``+inf``,
        or only ``-inf``, has a NaN loss and gradient in every mode (folded into the
        threshold search); it does not raise.
      axis: the class axis.
      normalize_labels: ``None`` (default): dense rows are distributions as above.
        ``True`` / ``False`` (what :class:`losszoo.losses.SparsemaxLoss` passes): a dense row
        without any target (all 0) has loss 0, and the other rows (``NON_NEGATIVE``) are
        divided by their sum (``True``) or must sum to 1 (``False``).
      labels_name: the name ``labels`` goes by in error messages (``"y_true"`` in a loss).
      logits_name: the name ``logits`` goes by in error messages (``"y_pred"`` in a loss).

    Returns:
      The loss per example: ``logits``' shape without ``axis``, in ``logits``' dtype.

    Raises:
      ValueError: naming ``labels`` (or ``labels_name``; eagerly; a graph assertion in a
        TensorFlow graph) for ids or rows breaking their rule (skipped with
        ``losszoo.set_validation(False)``; under XLA those rows' loss and gradient are NaN).
        TypeError for ``tf.RaggedTensor`` labels.

    Example:
      >>> keras.ops.convert_to_numpy(losszoo.ops.sparsemax_loss([[0.0, 1.0]], [[0.0, 2.0]]))
      array([0.], dtype=float32)
    """
    z, dtype, _ = _prepare(logits, axis, logits_name)
    labels = dense_labels(labels, labels_name)
    if static_rank(labels) is not None and static_rank(labels) == len(z.shape):
        labels = move_axis_last(labels, axis)[0]  # z's rank is known: _prepare moved its axis
    if is_class_ids(labels, z) and z.shape[-1] is not None:
        ids, invalid = class_ids_and_invalid(labels, z, labels_name)
        kernel = _sparsemax_loss_ids_torch if LOOPS_READ_HOST else _sparsemax_loss_ids
        return ops.cast(kernel(ids, invalid, z), dtype)
    has_target = None
    if normalize_labels is None and not is_class_ids(labels, z):
        q = ops.cast(labels, z.dtype)
        if static_rank(q) is not None and not shapes_compatible(q.shape, z.shape):
            raise ValueError(
                f"`{labels_name}` must have the shape of `logits` {list(z.shape)} (class axis "
                f"last), got {list(q.shape)}."
            )
        tol = _sum_tolerance(dtype_name(labels), dtype_name(z))
        q = TARGETS.check(q, labels_name, tol)
    else:
        q, has_target = target_distribution(labels, z, bool(normalize_labels), labels_name)
        tol = _sum_tolerance(dtype_name(z), dtype_name(z))
        # A row without a target gets loss 0; the kernel needs a distribution there, so it
        # sees the uniform one over the row's top scores (finite loss, then times 0).
        top = ops.cast(ops.equal(z, reduce_max(z, -1, keepdims=True)), q.dtype)
        q = ops.where(ops.equal(has_target, 0.0)[..., None], top / ops.sum(top, -1, True), q)
        if normalize_labels is False and not is_class_ids(labels, z):
            q = TARGETS.check(q, labels_name, tol)
    loss = _sparsemax_loss_default(q, z, tol)
    return ops.cast(loss if has_target is None else loss * has_target, dtype)
