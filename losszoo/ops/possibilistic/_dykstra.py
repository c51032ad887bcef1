"""Dykstra's algorithm with KL projections in its dual form (spec 2.4), time-major ``[K, B]``.

Cyclic dual coordinate ascent on ``g(lam) = lam.b - log sum_k q_k exp((A^T lam)_k)``,
``lam >= 0``, iterate ``p = softmax(log q + A^T lam)``; each step sets one multiplier to the
closed form of its single-set projection (spec 2.2). Stops per row by the rule of
``stopping`` (0 paper: ``V <= tol``; 1 certified: and ``|gap| <= gap_tol``; 2 fixed). One
kernel: a while loop over the constraints inside a while loop over cycles, with straggler
compaction. Written with ``keras.ops`` in float64. Derivation:
``docs/design/possibilistic_solver.md``.
"""

from keras import ops

from losszoo import _backend
from losszoo._backend import compiled, maximum
from losszoo.ops.possibilistic._certificates import (
    _at_lambda,
    _normalize_log,
    _rcumsum,
    _violation_and_gap,
)


def _pick(low, a, b):
    """``a`` where ``low`` else ``b``: a Python choice for a static family, ``where`` for a
    traced one (the same values either way)."""
    if isinstance(low, bool):
        return a if low else b
    return ops.where(low, a, b)


def _pref_step(arr, prefix, one):
    """Dominance constraint (``arr``: its rows, [B] each): its new multiplier and the
    running prefix mass."""
    prefix = (prefix + arr["z"]) * ops.exp(-arr["lam_old"])  # remove old
    t = arr["tails_pref"]
    viol = arr["act"] & (t > arr["pt_next"] * (prefix + t))
    factor = ops.where(viol, arr["ratio"] * t / ops.where(viol, prefix, one), one)
    return ops.log(factor), prefix * factor


def _shape_step(arr, a, head, one, low):
    """Gap constraint (``arr``: its rows; ``low``: lower bound, else upper, a bool or a bool
    tensor): its new multiplier, the carried coordinate and the head mass."""
    c = arr["z_next"]
    lam_old = arr["lam_old"]
    f = ops.exp(_pick(low, lam_old, -lam_old))
    a, c = a / f, c * f  # remove the old correction
    zi, zj = _pick(low, a, c), _pick(low, c, a)
    u = head + arr["tails_shape"]
    dl = _pick(low, arr["lo"], arr["neg_up"])
    viol = arr["act"] & (zi - zj < dl * (u + a + c))
    zi_s = ops.where(viol, zi, one)
    zj_s = ops.where(viol, zj, one)
    ud = u * dl
    one_m, one_p = 1.0 - dl, 1.0 + dl
    root = ops.sqrt(ud * ud + 4.0 * zi_s * zj_s * one_m * one_p)
    e_zero = ops.sqrt(zj_s / zi_s)
    # delta = lo >= 0 in the low sweep and -up <= 0 in the up sweep, so only one of the two
    # non-tie branches can occur (same values as testing both).
    e_low = e_up = None
    if low is not False:
        e_low = ops.where(dl > 0.0, (ud + root) / (2.0 * zi_s * one_m), e_zero)
    if low is not True:
        e_up = ops.where(dl < 0.0, 2.0 * zj_s * one_p / (root - ud), e_zero)
    e = ops.where(viol, _pick(low, e_low, e_up), one)
    zi, zj = zi * e, zj / e
    a, c = _pick(low, zi, zj), _pick(low, zj, zi)
    return ops.log(e), c, head + a


def _sweep(kind, x, lam_old, cst):
    """One sweep over the m1 constraints of one family; returns the new multipliers.

    ``kind`` is ``"pref"``, ``"low"`` or ``"up"``, or an int32 tensor (0, 1, 2: the same
    families) for the finish's one sweep loop that serves all three (each step then computes
    both step kinds and keeps one: a third of the program for 1.5x the work per step).
    """
    m1 = lam_old.shape[0]
    z = ops.exp(x - _backend.reduce_max(x, axis=0, keepdims=True))  # [K, B]; 0 outside support
    suffix = _rcumsum(z, exclusive=True)  # sum_{k>r} z_k
    one = ops.ones_like(z[0])
    act = ops.cast(cst["act"], x.dtype)
    arrays = {"z": z[:-1], "z_next": z[1:], "lam_old": lam_old, "act": act}
    static = isinstance(kind, str)
    pref = kind == "pref" if static else ops.equal(kind, 0)
    low = kind == "low" if static else ops.equal(kind, 1)
    if not static or pref:
        arrays.update(tails_pref=suffix[:-1], pt_next=cst["pt_next"], ratio=cst["ratio"])
    if not static or not pref:
        arrays.update(tails_shape=suffix[1:], lo=cst["lo"], neg_up=cst["neg_up"])

    # One [m1, arrays, B] table, so that a step reads its rows with one dynamic slice (each
    # dynamic index is ~20 HLO instructions on TensorFlow).
    keys = tuple(arrays)
    table = ops.stack([arrays[key] for key in keys], axis=1)

    def step_at(r, a, head):
        arr = dict(zip(keys, ops.unstack(ops.take(table, r, axis=0), axis=0)))
        arr["act"] = arr["act"] > 0.0
        if static and pref:
            lam, a = _pref_step(arr, a, one)
            return lam, a, head
        lam, c, head_next = _shape_step(arr, a, head, one, low)
        if static:
            return lam, c, head_next
        lam_p, prefix = _pref_step(arr, a, one)
        return _pick(pref, lam_p, lam), _pick(pref, prefix, c), _pick(pref, head, head_next)

    def body(r, out, a, head):
        lam, a, head = step_at(r, a, head)
        return r + 1, ops.slice_update(out, (r, ops.zeros_like(r)), lam[None]), a, head

    # Carry: the prefix mass (dominance) or the carried coordinate (gaps), and the head mass.
    init = (_pick(pref, ops.zeros_like(one), z[0]), ops.zeros_like(one))
    start = (ops.convert_to_tensor(0, "int32"), ops.zeros_like(lam_old))
    return ops.while_loop(lambda r, *_: r < m1, body, start + init)[1]


def dykstra_core(
    lq, cst, active, tol, gap_tol, max_cycles, stopping, lam_init=None, *, finish=False
):
    """Dual-form Dykstra in sorted, time-major coordinates.

    Args: lq [K, B] sorted log q (normalised, -inf outside the support); ``cst`` the
    constraint data ``pt_next``, ``ratio``, ``lo``, ``up`` [m1, B] float and ``act`` [m1, B]
    bool; active [B] bool (rows to iterate).
    tol, gap_tol (float64), max_cycles and stopping (int32: 0 paper, 1 certified, 2 fixed)
    are tensors, so changing them does not recompile. ``lam_init``: starting multipliers
    (3 tensors [m1, B]; zeros by default). ``finish``: the interior point's finish, which
    rarely runs but is compiled into every training step: no straggler compaction (its few
    rows gain little from it) and one sweep loop for the three families (a third of the
    sweeps' program for 1.5x the work per step; same arithmetic).
    Returns: x [K, B] (log projection, normalised), lam [3, m1, B], cycles [B] int32, and
    ``(V, gap)`` [B] of the returned point (the certificate of each row's last cycle; inf
    for rows that ran none).
    """
    cst = {**cst, "neg_up": -cst["up"]}
    zeros = ops.zeros_like(cst["pt_next"])
    lam0 = (zeros, zeros, zeros) if lam_init is None else tuple(lam_init)
    inf = ops.full_like(active, float("inf"), lq.dtype)
    init = (
        ops.convert_to_tensor(0, "int32"),
        *lam0,
        active,
        ops.zeros_like(active, "int32"),
        inf,  # V and gap of the latest cycle (inf before the first)
        inf,
    )

    def loop(data, state, nxt):
        data = dict(data)
        body = _cycle_body(
            data.pop("lq"), data, tol=tol, gap_tol=gap_tol, stopping=stopping, merged=finish
        )

        def cond(k, lp, ll, lu, active, *_):
            count = ops.sum(ops.cast(active, "int32"))
            return (k < max_cycles) & ((count > nxt) | ops.equal(stopping, 2))

        return ops.while_loop(cond, body, state)

    size = None if finish else _compacted_size(active, _COMPACT_MIN_BATCH, _COMPACT_FACTOR)
    _, lp, ll, lu, _, cycles, v, gap = run_in_stages(loop, {"lq": lq, **cst}, init, size)
    x = _normalize_log(lq + _at_lambda(lp, ll, lu))
    return x, ops.stack([lp, ll, lu], axis=0), cycles, (v, gap)


def _cycle_body(lq, cst, *, tol, gap_tol, stopping, merged=False):
    """While-loop body of one cycle on ``lq`` [K, b], ``cst`` [m1, b]; ``merged``: the three
    sweeps are the three trips of one loop (one copy of the sweep in the program)."""

    def sweeps(lp, ll, lu):
        if not merged:
            nlp = _sweep("pref", lq + _at_lambda(lp, ll, lu), lp, cst)
            nll = _sweep("low", lq + _at_lambda(nlp, ll, lu), ll, cst)
            return nlp, nll, _sweep("up", lq + _at_lambda(nlp, nll, lu), lu, cst)
        fams = ops.arange(3, dtype="int32")[:, None, None]

        def trip(f, lam):
            new = _sweep(f, lq + _at_lambda(*ops.unstack(lam)), ops.take(lam, f, axis=0), cst)
            return f + 1, ops.where(ops.equal(fams, f), new[None], lam)

        start = (ops.convert_to_tensor(0, "int32"), ops.stack([lp, ll, lu]))
        lam = ops.while_loop(lambda f, _: f < 3, trip, start, maximum_iterations=3)[1]
        return tuple(ops.unstack(lam))

    def body(k, lp, ll, lu, active, cycles, v, gap):
        nlp, nll, nlu = sweeps(lp, ll, lu)
        nv, ngap = _violation_and_gap(lq + _at_lambda(nlp, nll, nlu), nlp, nll, nlu, cst)
        feasible = nv <= tol
        done = ops.where(
            ops.equal(stopping, 0),
            feasible,
            feasible & (ops.abs(ngap) <= gap_tol) & ops.equal(stopping, 1),
        )
        sel = active[None, :]
        lp = ops.where(sel, nlp, lp)
        ll = ops.where(sel, nll, ll)
        lu = ops.where(sel, nlu, lu)
        cycles = cycles + ops.cast(active, "int32")
        v, gap = ops.where(active, nv, v), ops.where(active, ngap, gap)
        return k + 1, lp, ll, lu, active & ~done, cycles, v, gap

    return body


# Straggler compaction: once at most ``size`` examples are still active, the loop continues
# on a gathered subset of ``size`` examples (the active ones first, padded with frozen
# ones), whose state is scattered back at the end. Per-example arithmetic is unchanged, so
# iterates and cycle counts are the same as without it. Each stage compiles another copy of
# the cycle body (~5 s of XLA compile at K = 100), so only one compacted stage is used:
# B -> B // 8 (e.g. 100 -> 12).
_COMPACT_MIN_BATCH = 16
_COMPACT_FACTOR = 8


def _compacted_size(active, min_batch, factor):
    """Batch of the compacted loop stage (straggler compaction), ``max(1, B // factor)``, or
    None (no compaction) when ``B < min_batch``.

    With ``B`` unknown at trace time (``None``: a Keras dataset with a partial last batch,
    TensorFlow) it is a scalar tensor and the compacted stage is always used (results are
    the same either way; under XLA, which compiles per batch size, it is a constant).
    """
    batch = active.shape[0]
    if batch is None:
        return maximum(ops.shape(active)[0] // factor, 1)
    return None if batch < min_batch else max(1, batch // factor)


def _put_last(full, part, idx):
    """``full`` with the slices ``idx`` of its last axis replaced by ``part``."""
    first = ops.moveaxis(full, -1, 0)
    out = ops.scatter_update(first, idx[:, None], ops.moveaxis(part, -1, 0))
    return ops.moveaxis(out, 0, -1)


def run_in_stages(loop, data, state, size):
    """Straggler compaction of a while loop over a batch (the batch on every last axis).

    ``loop(data, state, nxt)`` iterates until at most ``nxt`` rows are active (``nxt = 0``:
    to its end); ``state`` is the iteration count followed by tensors, ``state[4]`` the
    active rows. With a ``size`` (:func:`_compacted_size`; None: no compaction) the loop
    goes on with the data and state of a subset of ``size`` rows (the active ones first,
    stable in index order, padded with frozen ones), scattered back at the end.
    """
    if size is None:
        return loop(data, state, 0)
    state = loop(data, state, size)
    _, idx = ops.top_k(ops.cast(state[4], "int32"), size, sorted=True)

    def take(t):
        return _backend.take(t, idx, axis=len(t.shape) - 1)

    sub_data = {key: take(val) for key, val in data.items()}
    sub = loop(sub_data, (state[0], *map(take, state[1:])), 0)
    return (sub[0], *(_put_last(full, part, idx) for full, part in zip(state[1:], sub[1:])))


DYKSTRA_JIT = compiled(dykstra_core, static_argnames=("finish",))
