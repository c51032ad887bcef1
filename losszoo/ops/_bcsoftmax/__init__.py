"""Box-constrained softmax (BCSoftmax; Atarashi et al., 2025), on every Keras backend.

For logits ``x`` in R^K, temperature ``tau > 0`` and bounds ``a <= y <= b`` (paper eq. 7)::

    BCSoftmax_tau(x; a, b) = argmax_{y in simplex, a <= y <= b}  <x, y> - tau * sum_k y_k log y_k
                           = clip(exp(x / tau - nu), a, b)

with the one scalar ``nu`` per row that solves ``sum_k clip(exp(x_k/tau - nu), a_k, b_k) = 1``;
feasible iff ``a <= b`` and ``sum(a) <= 1 <= sum(b)``. On the coordinates at neither bound,
``y_F = s * softmax(x_F / tau)`` with ``s`` the mass the bounds leave (paper Thm. 3).
``method="newton"`` (default) takes the classes that can sit at their upper bound from one
``top_k`` and solves for ``nu`` with monotone Newton steps on a model that keeps those classes
exact, so its work does not grow at low temperatures (1-4 passes over the row); rows it cannot
finish go to a safeguarded Newton search, which also solves every row unless the temperature
is a number below 1 (few steps at T >= 1, and no ``top_k``). ``"sort"`` and ``"bisect"``
are the spec's Algorithms A and B; all end with the closed form, so they are exact. Gradients are
hand-derived (paper eqs. 23-25, erratum E5 fixed), O(K) per row. The solver, the gradient
(pinned rows included) and the numerics: ``docs/design/bcsoftmax.md``. Spec:
``shared/specs/bcsoftmax.md``.

Modules: this one (the public op, the kernel and its gradient, the input rules, the solver
choice), ``_common`` (clamp patterns, their sums, the closed form), ``_candidates``,
``_newton`` (the safeguarded Newton searches), ``_sort`` (Algorithms A and B) and ``_limit``
(the ``tau -> 0`` limit). Every iteration is a loop trip, compiled once. On PyTorch, whose
loops read their condition on the host at every trip, the first trips of the Newton and
candidate loops run as straight-line rounds with one host read each (``_common._while_loop``)
and the four input rules are read as one flag (``contract.check_rules``): 3-4 host reads per
call in the cases measured (``benchmarks/torch_host_syncs.py``).

A ``-inf`` logit masks its class (``y_k = max(lower_k, 0)``); ``a_k = b_k = 0`` masks it too.
Bounds outside ``[0, 1]`` by at most 1e-5 are clamped; half precision is computed in float32.

Fail-loud contract (README, "Bad input"), rules ``contract.LOGITS`` (``logits``),
:data:`TEMPERATURE` (``temperature``) and :data:`PROBABILITY_BOUNDS` (``lower`` and ``upper``):
``ValueError`` naming the argument when the values are known, a graph assertion in a TensorFlow
graph; skipped with ``losszoo.set_validation(False)``. Under XLA / ``jax.jit``, and with
validation off, the affected rows come back NaN.
"""

from __future__ import annotations

import functools

import numpy as np
from keras import ops

from losszoo._backend import (
    custom_gradient,
    divide_no_nan,
    jit_on_jax,
    maximum,
    minimum,
    reduce_max,
)
from losszoo.contract import (
    LOGITS,
    PROBABILITY_BOUNDS,
    Rule,
    check_bool,
    check_choice,
    check_number,
    check_real,
    check_rules,
    check_static_rank,
    dtype_name,
    move_axis_last,
    nan_where,
    rules_enforced,
    static_rank,
    to_compute_dtype,
)

from ._candidates import _N_UPPER, _solve_candidates, n_upper_candidates
from ._common import FREE, LOWER, UPPER, _clip, _comparison_bounds, _info, _masses_at
from ._limit import _limit_repair, _not_solved, _solve_limit
from ._newton import _newton_root, _solution_at, _solve_newton, _solve_newton_robust
from ._sort import _repair, _solve_bisect, _solve_sort


def _temperature_mask(xp, t):
    tiny = np.finfo(dtype_name(t)).tiny
    return xp.logical_not(xp.logical_and(xp.isfinite(t), t >= tiny))


TEMPERATURE = Rule(
    "must be finite and at least the smallest normal number of the logits' dtype "
    "(1.2e-38 in float32): TensorFlow and XLA read a subnormal temperature as 0",
    _temperature_mask,
)
"""The temperature rule (entry-wise): :data:`losszoo.contract.POSITIVE` without the subnormal
numbers, which TensorFlow and XLA flush to 0 on the CPU (a division by 0 follows)."""
METHODS = ("newton", "sort", "bisect")
# Backward pass: in a row where every free coordinate lies within this many eps * K of one of
# its bounds, those coordinates count as at the bound (docs/design/bcsoftmax.md, "Gradients").
_PIN_TOL = 4.0


def _use_candidates(temperature) -> bool:
    """Whether ``method="newton"`` takes the candidate solver: for a temperature given as a
    number below 1. At T >= 1 the safeguarded Newton search needs few steps and skips the
    candidates' ``top_k`` (0.5-0.9 softmax passes on XLA:CPU; it was 1.2-2x faster at T = 10
    and at T = 1, 128x1024, and 5-7x slower at T = 0.1: BENCHMARKS.md, "New default
    solver"). A temperature given as a tensor (a calibrator's trained one) also keeps the
    safeguarded search: JAX lowers ``top_k`` to a StableHLO composite that TensorFlow 2.21
    cannot load, so a calibrated model exported on JAX could not be served by TensorFlow."""
    if isinstance(temperature, (int, float, np.ndarray, np.generic)):
        t = np.asarray(temperature, np.float64)
        return bool(t.size) and bool(np.all(t < 1.0))
    return False


def _known_positive(bound) -> bool:
    """Whether ``bound`` is given as Python numbers or a numpy array whose values are all > 0
    (read when the program is built, never from a device)."""
    if isinstance(bound, (int, float, list, tuple, np.ndarray, np.generic)):
        try:
            t = np.asarray(bound, np.float64)
        except (TypeError, ValueError):
            return False
        return bool(t.size) and bool(np.all(t > 0))
    return False


_SOLVERS = {"newton": _solve_candidates, "sort": _solve_sort, "bisect": _solve_bisect}


# --------------------------------------------------------------------------------------------
# The differentiable kernel (class axis last) and the public op.
# --------------------------------------------------------------------------------------------


def _bad_rows(xs, m_raw, t2, a2, b2, tol, checked):
    """[N, 1] mask of the rows the kernel cannot solve; they come back NaN (the XLA half of the
    fail-loud contract: assertions vanish there).

    The logits part is folded into the forward pass (the row max and one sum): scaled logits
    holding NaN or +inf, or all -inf; then the rules :data:`TEMPERATURE` (temperature) and
    :data:`PROBABILITY_BOUNDS` (each given bound). Where the rules were ``checked`` before the
    kernel, only ``x / tau`` overflowing to +inf is left to find (the row max).
    """
    k = xs.shape[-1]
    # m_raw: +inf (a +inf logit, or tau <= 0 flipping a -inf one), -inf (every class masked),
    # NaN; after the shift a NaN anywhere makes the row sum NaN (the rest is <= 0 or -inf).
    bad = ops.logical_not(ops.isfinite(m_raw))
    if checked:
        return bad
    bad = ops.logical_or(bad, ops.isnan(ops.sum(xs, -1, keepdims=True)))
    bad = ops.logical_or(bad, TEMPERATURE.invalid(t2))
    if a2 is not None:
        other = 1.0 if b2 is None else b2
        bad = ops.logical_or(bad, PROBABILITY_BOUNDS.invalid(a2, other, tol, k, True)[:, None])
    if b2 is not None:
        other = 0.0 if a2 is None else a2
        bad = ops.logical_or(bad, PROBABILITY_BOUNDS.invalid(b2, other, tol, k, False)[:, None])
    return bad


def _reduce_to(g, target):
    """Sum ``g`` (the broadcast shape) back to ``target``'s static shape."""
    lead = len(g.shape) - len(target.shape)
    axes = list(range(lead)) + [lead + i for i, d in enumerate(target.shape) if d == 1]
    if axes:
        g = ops.sum(g, axes)
    return ops.reshape(g, ops.shape(target))


@functools.partial(jit_on_jax, static_argnames=("method", "clip", "solver", "n_upper", "positive"))
def _kernel(
    x, a, b, tau, method: str, clip: bool, solver=None, n_upper: int = _N_UPPER, positive=False
):
    """BCSoftmax of compute-dtype tensors with the class axis last (``a``, ``b`` may be None),
    with its hand-derived gradient to every tensor input. ``solver(x, a, b) -> (y, state)``
    replaces ``method``'s (the benchmarks' floor rows pass one with ``nu`` given);
    ``n_upper``: the upper-set candidates of ``method="newton"``; ``positive``: every value
    of the given bounds is known to be > 0 (they then stay compact in the solvers' tests)."""
    k = x.shape[-1]
    if solver is None and method == "newton":
        uniform = b is not None and (static_rank(b) == 0 or b.shape[-1] == 1)
        solver = functools.partial(
            _solve_candidates, n_upper=n_upper, uniform_upper=uniform, positive=positive
        )
    elif solver is _solve_newton:
        solver = functools.partial(_solve_newton, positive=positive)
    solver = solver or _SOLVERS[method]
    eps = float(_info(x).eps)
    # whether bad input was stopped before the kernel (an error or a graph assertion)
    checked = rules_enforced(*[t for t in (x, a, b, tau) if t is not None])

    has_a, has_b = a is not None, b is not None

    @custom_gradient
    def f(x, *rest):  # rest: the bounds given, then the temperature
        a = rest[0] if has_a else None
        b = rest[int(has_a)] if has_b else None
        tau = rest[-1]
        shape = ops.shape(x)
        x2 = ops.reshape(x, (-1, k))
        t2 = ops.reshape(ops.broadcast_to(tau, tuple(shape[:-1]) + (1,)), (-1, 1))
        # Shift, then scale: the row max of (x - max x) / tau is exactly 0 however XLA
        # rewrites the division (x / tau - max(x / tau) is not: XLA turns a constant tau
        # into a multiplication by 1 / tau in one fusion and not in another, and at
        # tau = 1e-10 the "0" came out 119, exp overflowed and the row went NaN).
        m_raw = reduce_max(x2, -1, keepdims=True)
        xs = (x2 - ops.where(ops.isfinite(m_raw), m_raw, ops.zeros_like(m_raw))) / t2

        def flat(t):
            return None if t is None else ops.reshape(ops.broadcast_to(t, shape), (-1, k))

        def compact(t):
            """A bound as [N or 1, K or 1]: not broadcast to [N, K] (``_common``)."""
            r = None if t is None else static_rank(t)
            if r is None or (r and t.shape[-1] is None):
                return flat(t)
            d = t.shape[-1] if r else 1
            if all(s == 1 for s in t.shape[:-1]):
                return ops.reshape(t, (1, d))
            return ops.reshape(ops.broadcast_to(t, tuple(shape[:-1]) + (d,)), (-1, d))

        a2, b2 = compact(a), compact(b)
        ac = None if a2 is None else maximum(a2, 0.0)
        bc = None if b2 is None else ops.clip(b2, 0.0, 1.0)
        y, state = solver(xs, ac, bc)
        if method != "newton":
            y, state = _repair(xs, ac, bc, y, state)
        bad = _bad_rows(xs, m_raw, t2, flat(a), flat(b), 10.0 * eps * k, checked)

        def finish(y):
            return nan_where(bad, _clip(y, ac, bc) if clip else y)

        if ac is not None or bc is not None:
            y, state = _limit_repair(xs, ac, bc, y, state, finish)
        else:
            y = finish(y)

        def grad(v):
            v2 = ops.reshape(ops.cast(v, y.dtype), (-1, k))
            zero = ops.zeros_like(y)
            free = ops.equal(state, FREE)
            at_lower = ops.equal(state, LOWER)
            at_upper = ops.equal(state, UPPER)
            q = ops.where(free, y, zero)
            ssum = ops.sum(q, -1, keepdims=True)
            vbar = divide_no_nan(ops.sum(q * v2, -1, keepdims=True), ssum)
            # Pinned rows (every coordinate at a bound up to rounding, e.g. sum(lower) = 1):
            # the computed free mass lands on either side of 0 depending on the summation
            # order (eager vs XLA), and the one-sided derivatives differ by O(|v|). A row whose
            # free coordinates all lie within _PIN_TOL * eps * K of a bound counts them at that
            # bound, so every mode uses the derivative along the face sum(bounds) = 1 (spec
            # section 3, S = 0): dL/da = g * v, dL/db = h * v, dL/dx = 0. The test is one more
            # reduction in the same pass as the sums above.
            pin_tol = _PIN_TOL * eps * k
            dist_a = None if a2 is None else y - maximum(a2, 0.0)
            dist_b = None if b2 is None else ops.clip(b2, 0.0, 1.0) - y
            if dist_a is not None or dist_b is not None:
                if dist_a is None or dist_b is None:
                    dist = dist_b if dist_a is None else dist_a
                else:
                    dist = minimum(dist_a, dist_b)
                slack = reduce_max(ops.where(free, dist, zero), -1, keepdims=True)
                pinned = ops.logical_and(slack <= pin_tol, ops.logical_not(ops.isnan(ssum)))
                pf = ops.logical_and(pinned, free)
                if dist_b is None:
                    at_lower = ops.logical_or(at_lower, pf)
                else:
                    to_upper = pf if dist_a is None else ops.logical_and(pf, dist_b <= pin_tol)
                    at_upper = ops.logical_or(at_upper, to_upper)
                    if dist_a is not None:
                        at_lower = ops.logical_or(
                            at_lower, ops.logical_and(pf, ops.logical_not(to_upper))
                        )
                q = ops.where(pf, zero, q)
                vbar = ops.where(pinned, ops.zeros_like(vbar), vbar)
            # rows the forward pass made NaN (invalid input) get NaN gradients
            vbar = nan_where(ops.isnan(y[:, :1]), vbar)
            w = v2 - vbar
            qw = q * w
            grads = [ops.reshape(qw / t2, shape)]
            if a is not None:
                ga = ops.where(ops.logical_and(at_lower, a2 >= 0), w, zero)
                grads.append(_reduce_to(ops.reshape(ga, shape), a))
            if b is not None:
                inside = ops.logical_and(b2 >= 0, b2 <= 1)  # clamped entries: gradient 0
                gb = ops.where(ops.logical_and(at_upper, inside), w, zero)
                grads.append(_reduce_to(ops.reshape(gb, shape), b))
            gt = -ops.sum(ops.where(free, xs, zero) * qw, -1, keepdims=True) / t2  # [N, 1]
            grads.append(_reduce_to(ops.reshape(gt, tuple(shape[:-1]) + (1,)), tau))
            return grads

        return ops.reshape(y, shape), grad

    return f(x, *[t for t in (a, b) if t is not None], tau)


def _convert(t, name: str, x, rank: int):
    """A bound or temperature as a tensor of ``x``'s dtype that broadcasts to ``x`` (of rank
    ``rank``; unknown sizes pass)."""
    if t is None:
        return None
    if isinstance(t, (int, float, list, tuple, np.ndarray, np.generic)):
        t = np.asarray(t)
        if t.dtype.kind in "iuf":  # straight to x's dtype: no float32 detour for 0.1
            t = ops.convert_to_tensor(t.astype(dtype_name(x)), dtype_name(x))
    t = ops.convert_to_tensor(t)
    check_real(t, name, bool_ok=False)
    t = ops.cast(t, x.dtype)
    t_rank = static_rank(t)
    if t_rank is None:
        return t
    if t_rank > rank:
        raise ValueError(
            f"`{name}` (rank {t_rank}) must not have a higher rank than `logits` ({rank})."
        )
    pairs = zip(tuple(t.shape)[::-1], tuple(x.shape)[::-1])
    if not all(d is None or s is None or d in (1, s) for d, s in pairs):
        raise ValueError(
            f"`{name}` with shape {tuple(t.shape)} does not broadcast to `logits` "
            f"{tuple(x.shape)} (each axis must have the logits' size or 1)."
        )
    return t


def _class_last(t, rank: int, ax: int):
    """``t`` (broadcastable to rank-``rank`` logits) with the class axis ``ax`` moved last."""
    if t is None or ax == rank - 1:
        return t
    while static_rank(t) < rank:
        t = ops.expand_dims(t, 0)
    return move_axis_last(t, ax)[0]


def bcsoftmax(
    logits,
    lower=None,
    upper=None,
    temperature=1.0,
    axis: int = -1,
    *,
    method: str = "newton",
    clip: bool = True,
):
    """Box-constrained softmax: the exact maximiser of ``<x,y> - tau sum y log y`` on the simplex
    within ``lower <= y <= upper``.

    ``y = clip(exp(x/tau - nu), lower, upper)`` with the one ``nu`` per row that makes ``y`` sum
    to 1. With ``lower=None, upper=None`` this is ``softmax(x / tau)``; upper-only is the paper's
    UBSoftmax, lower-only its LBSoftmax.

    Args:
      logits: float tensor of rank >= 1 with a static class dimension. float16/bfloat16 are
        computed in float32 and the result is cast back. ``-inf`` masks class k
        (``y_k = max(lower_k, 0)``); NaN / +inf / all -inf rows break ``contract.LOGITS``.
      lower: lower bounds ``a`` broadcastable to ``logits`` (scalar, per-class vector,
        ``[..., 1]`` per-example uniform bound, or full tensor), or None (``a = 0``).
      upper: upper bounds ``b``, same broadcasting, or None (``b = 1``). ``lower = upper = 0``
        masks a class. Both keep :data:`PROBABILITY_BOUNDS`: ``0 <= lower <= upper <= 1``,
        ``sum(lower) <= 1 <= sum(upper)``.
      temperature: ``tau > 0``, a normal float (:data:`TEMPERATURE`; a subnormal one raises):
        scalar or broadcastable to ``logits`` with size 1 on ``axis``. Below about 1e-10 the
        scaled logit gaps exceed what the float type resolves, and the result is the
        ``tau -> 0`` limit (the bounds' linear program, ties sharing by water filling).
      axis: the class axis.
      method: ``"newton"`` (default; the upper-bound candidates from one ``top_k`` of size
        ``floor(1 / min upper)`` where ``upper`` is a Python number or numpy array, else 16,
        then monotone Newton steps, the same work at every temperature, for a temperature
        given as a number below 1; otherwise the safeguarded Newton search), ``"sort"`` (spec
        Algorithm A) or ``"bisect"`` (spec Algorithm B). All finish with the closed-form
        solve on the identified clamp pattern.
      clip: clip the result into ``[lower, upper]`` so the box holds exactly (the sum is then 1
        up to about ``K * eps``).

    Rule breaks raise ``ValueError`` naming the argument when the values are known and fail a
    graph assertion in a TensorFlow graph (both skipped with ``losszoo.set_validation(False)``).
    Under XLA / ``jax.jit`` the rows with invalid logits, temperature or bounds come back
    entirely NaN (also with validation off), and so do their gradients. Logit offsets and
    scales of 1e8 give the same result as the float64 solution of the rounded inputs.

    Returns:
      Probabilities with the shape and dtype of ``logits``.

    Example:
      >>> y = bcsoftmax([[-1.5, 1.0, -0.5]], upper=[1.0, 0.6, 0.5])
      >>> keras.ops.convert_to_numpy(y).round(4)
      array([[0.1076, 0.6   , 0.2924]], dtype=float32)
    """
    check_choice(method, "method", METHODS)
    check_bool(clip, "clip")
    axis = check_number(axis, "axis", integer=True)
    x, dtype = to_compute_dtype(logits, "logits")
    check_static_rank(x, 1, "logits")
    rank = static_rank(x)
    if rank is None or not -rank <= axis < rank:
        raise ValueError(f"`axis`={axis} is out of range for `logits` of rank {rank}.")
    ax = axis % rank
    k = x.shape[ax]
    if k is None:
        raise ValueError("`logits` must have a static size along the class axis.")
    if k == 0:
        raise ValueError("`logits` must have at least one class.")
    a, b, tau = (
        _convert(t, name, x, rank)
        for t, name in ((lower, "lower"), (upper, "upper"), (temperature, "temperature"))
    )
    t_rank = static_rank(tau)
    if t_rank:
        pos = ax - (rank - t_rank)
        if pos >= 0 and tau.shape[pos] not in (1, None):
            raise ValueError("`temperature` must have size 1 along the class axis.")
    x, undo = move_axis_last(x, ax)
    a, b, tau = (_class_last(t, rank, ax) for t in (a, b, tau))
    tol = 10.0 * float(_info(x).eps) * k
    # one host read for all four rules on PyTorch (contract.check_rules)
    checks = [(LOGITS, x, "logits"), (TEMPERATURE, tau, "temperature")]
    if a is not None:
        checks.append((PROBABILITY_BOUNDS, a, "lower", 1.0 if b is None else b, tol, k, True))
    if b is not None:
        checks.append((PROBABILITY_BOUNDS, b, "upper", 0.0 if a is None else a, tol, k, False))
    x, tau, *bounds = check_rules(*checks)
    a = bounds.pop(0) if a is not None else None
    b = bounds.pop(0) if b is not None else None
    n_upper = n_upper_candidates(upper, k)
    solver = None if method != "newton" or _use_candidates(temperature) else _solve_newton
    positive = all(_known_positive(t) for t in (lower, upper) if t is not None)
    y = _kernel(x, a, b, tau, method, clip, solver=solver, n_upper=n_upper, positive=positive)
    return ops.cast(undo(y), dtype)
