"""Shared pieces of the BCSoftmax solvers: clamp patterns, their sums, the closed form.

Rows are ``[N, K]`` with the class axis last; ``x`` is already shifted (row max 0) and divided by
the temperature; ``a``, ``b`` are ``[N, K]`` tensors or None (no bound on that side). Every solver
returns ``(y, state)`` with the state codes :data:`FREE`, :data:`LOWER`, :data:`UPPER`
(``docs/design/bcsoftmax.md``)."""

from __future__ import annotations

import numpy as np
from keras import ops

from losszoo._backend import (
    LOOPS_READ_HOST,
    divide_no_nan,
    is_concrete,
    maximum,
    minimum,
    read_flags,
    reduce_max,
    reduce_min,
    take,
    take_along_axis,
)
from losszoo.contract import dtype_name

FREE, LOWER, UPPER = 0, 1, 2

# Bounds ``a``, ``b`` are kept in the compact shape they were given ([N or 1, K or 1]) and
# broadcast by the elementwise ops that read them: a bound of one value per row or per class
# broadcast to [N, K] is written to memory by XLA wherever it enters a loop or a `cond` (three
# extra passes over [N, K] per call at 1024x4096). Only their row sums and gathers need more.


def _bound_sum(t, x):
    """``sum_k t_k`` per row ([N, 1]) of a bound ``t`` that broadcasts to ``x`` ([N, K])."""
    return ops.sum(ops.broadcast_to(t, ops.shape(x)), -1, keepdims=True)


def _bound_take(t, idx, x):
    """``t`` (broadcastable to ``x``, [N, K]) at the column indices ``idx`` ([N, m])."""
    if t.shape[-1] == 1:
        return ops.broadcast_to(t, ops.shape(idx))
    if t.shape[0] == 1 and x.shape[0] != 1:
        return take(ops.reshape(t, (-1,)), idx, axis=0)
    return take_along_axis(t, idx, axis=-1)


def _while_loop(cond, body, loop_vars, maximum_iterations, rounds=(), flags=None):
    """``keras.ops.while_loop`` whose first trips run as straight-line rounds on PyTorch.

    Returns ``(loop_vars, known)``. Where loops read the host at every trip (PyTorch, values
    known), the trips run in ``rounds`` of straight-line code with ONE host read after each
    (:func:`losszoo._backend.read_flags`) of whether ``cond`` is false, together with the
    scalar bool tensors ``flags(*loop_vars)``; ``known`` is then those flags read as bools
    (the caller needs no further read for them). Past the rounds (and everywhere else) the
    loop goes on as ``ops.while_loop`` and ``known`` is None. The result is the loop's only
    when ``body`` leaves every row whose work is done unchanged (a no-op trip once ``cond``
    is false): the rounds may run past the trip where the loop would stop.
    """
    if not (LOOPS_READ_HOST and is_concrete(loop_vars[0])):
        out = ops.while_loop(cond, body, loop_vars, maximum_iterations=maximum_iterations)
        return tuple(out), None
    trips = 0
    for steps in rounds:
        for _ in range(min(steps, maximum_iterations - trips)):
            loop_vars = tuple(body(*loop_vars))
        trips += steps
        extra = () if flags is None else tuple(flags(*loop_vars))
        bits = read_flags(ops.logical_not(cond(*loop_vars)), *extra)
        if bits[0] or trips >= maximum_iterations:
            return loop_vars, bits[1:]
    rest = maximum_iterations - trips
    return tuple(ops.while_loop(cond, body, loop_vars, maximum_iterations=rest)), None


def _info(x):
    return np.finfo(dtype_name(x))


def _pattern(x, a, b, nu):
    """Classification at ``nu`` ([N, 1]): returns z = exp(x - nu), U, L masks (or None)."""
    z = ops.exp(x - nu)
    upper, lower = _clamp_sets(None if b is None else z > b, None if a is None else z <= a)
    return z, upper, lower


def _clamp_sets(above_upper, below_lower):
    """Upper/lower clamp masks from the raw bound tests (None: no such bound).

    A coordinate that passes both tests (only possible where lower == upper) is counted
    at the upper bound, so no coordinate is clamped twice.
    """
    if above_upper is not None and below_lower is not None:
        below_lower = ops.logical_and(below_lower, ops.logical_not(above_upper))
    return above_upper, below_lower


def _free_mask(x, upper, lower):
    if upper is None and lower is None:
        return ops.ones_like(x, dtype="bool")
    if upper is None:
        return ops.logical_not(lower)
    if lower is None:
        return ops.logical_not(upper)
    return ops.logical_not(ops.logical_or(upper, lower))


def _masses(z, a, b, upper, lower):
    """s = 1 - bound mass, R = free mass sum(z_F), no_free flag; all [N, 1]."""
    zero = ops.zeros_like(z)
    bound = ops.zeros_like(z[:, :1])
    if lower is not None:
        bound += ops.sum(ops.where(lower, a, zero), -1, keepdims=True)
    if upper is not None:
        bound += ops.sum(ops.where(upper, b, zero), -1, keepdims=True)
    free = _free_mask(z, upper, lower)
    r = ops.sum(ops.where(free, z, zero), -1, keepdims=True)
    no_free = ops.logical_not(ops.any(free, -1, keepdims=True))
    return 1.0 - bound, r, no_free


def _same(m1, m2):
    return ops.all(ops.equal(m1, m2), -1, keepdims=True)


def _assemble(z, a, b, upper, lower, s, r):
    """y from a pattern: bounds on L/U, free coordinates normalised to the mass s."""
    scale = divide_no_nan(maximum(s, 0.0), r)
    y = z * scale
    state = ops.zeros_like(z, dtype="int8")
    if upper is not None:
        y = ops.where(upper, b, y)
        state = ops.where(upper, ops.cast(UPPER, "int8"), state)
    if lower is not None:
        y = ops.where(lower, a, y)
        state = ops.where(lower, ops.cast(LOWER, "int8"), state)
    return y, state


def _repeat(step, state, n: int):
    """``state = step(*state)`` ``n`` times, as a loop whose body is compiled once (an unrolled
    Python loop puts ``n`` copies of ``step`` in the program)."""
    return ops.while_loop(lambda *_: True, step, state, maximum_iterations=n)


def _finite_min(t, axis=-1):
    return reduce_min(ops.where(ops.isfinite(t), t, np.inf), axis, keepdims=True)


def _finite_max(t, axis=-1):
    return reduce_max(ops.where(ops.isfinite(t), t, -np.inf), axis, keepdims=True)


def _closed_form(x, a, b, upper, lower):
    """The closed form of a given pattern: y_F = s softmax(x_F), bounds elsewhere."""
    free = _free_mask(x, upper, lower)
    xf = ops.where(free, x, -np.inf)
    lse = ops.logsumexp(xf, -1, keepdims=True)
    lse = ops.where(ops.isfinite(lse), lse, ops.zeros_like(lse))
    z = ops.where(free, ops.exp(xf - lse), ops.zeros_like(x))
    s, _, _ = _masses(z, a, b, upper, lower)
    return _assemble(z, a, b, upper, lower, s, ops.ones_like(s))


def _comparison_bounds(x, a, b, positive=False):
    """The bounds the log-free pattern test compares ``exp(x)`` with.

    At ``nu`` (``c = exp(nu)``) a coordinate is U iff ``exp(x) > b c`` and L iff
    ``exp(x) <= a c``: the tests ``x - log b > nu`` and ``x - log a <= nu`` without logs. A zero
    bound would make an underflowed ``exp(x) = 0`` look clamped, so it is replaced by -1 (U for
    ``b = 0``: always; L for ``a = 0``: never), except for a ``-inf`` logit, which is never U
    and always L, as the log-domain tests say. With ``positive`` (every value of the given
    bounds is known to be > 0 when the program is built) that replacement changes nothing and
    the bounds are returned as they are, in their compact shape.
    """
    if positive:  # every given bound > 0 (known when built): the bounds themselves
        return a, b
    dead = ops.equal(x, -np.inf)

    def replace_zero(t):
        return None if t is None else ops.where(ops.logical_or(t > 0, dead), t, -1.0)

    return replace_zero(a), replace_zero(b)


def _pattern_at(e, a_cmp, b_cmp, c):
    """The U and L masks at ``c = exp(nu)`` ([N, 1]); None where that bound is not given."""
    up = None if b_cmp is None else e > b_cmp * c
    low = None if a_cmp is None else e <= a_cmp * c  # wins over `up` (only where a = b)
    return up, low


def _masses_at(e, a, b, a_cmp, b_cmp, c):
    """The clamp pattern at ``c = exp(nu)`` ([N, 1]) and its two sums: ``s = 1 -`` bound mass
    and the free mass ``E = sum_F exp(x)`` (both [N, 1]); a mask is None where its bound is
    not given."""
    zero = ops.zeros_like(e)
    up, low = _pattern_at(e, a_cmp, b_cmp, c)
    bound = zero if up is None else ops.where(up, b, zero)
    if low is not None:
        bound = ops.where(low, a, bound)
    free = _free_mask(e, up, low)
    s = 1.0 - ops.sum(bound, -1, keepdims=True)
    return up, low, s, ops.sum(ops.where(free, e, zero), -1, keepdims=True)


def _clip(y, a, b):
    """``y`` clipped into ``[a, b]`` (None: no bound on that side)."""
    if a is not None:
        y = maximum(y, a)
    if b is not None:
        y = minimum(y, b)
    return y
