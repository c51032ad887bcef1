"""BCSoftmax's default solver (upper-set candidates + monotone model steps, issue 33 item 1) at
every temperature, on every backend: values and gradients against an independent float64
bisection in numpy (and brute force over all 3^K patterns for small K), and against the
safeguarded Newton solver it replaced, at T in {0.05, 0.1, 1, 10} with binding bounds (both,
upper only, lower only, per-class), ties, -inf masks, huge logits, more classes at the upper
bound than the solver takes candidates, empty batches, float64 and an unknown batch size.

CI time (issue 32): the temperature is an argument of the compiled program, not a constant in
it, so one program per test (and bound kind, and solver) serves every temperature: 11 XLA
programs on TensorFlow instead of 35. (Not rows of one batch with a per-row temperature: the
solvers' loops then run to the slowest row's count for every row, 10x slower on PyTorch.)"""

import itertools

import numpy as np
import pytest
from keras import ops

from losszoo.ops import _bcsoftmax as impl
from losszoo.ops import bcsoftmax
from tests.harness import MODES, compiled, float64, numpy
from tests.programs import ValueAndGrad

TEMPERATURES = (0.05, 0.1, 1.0, 10.0)
TRACED = MODES[-1]


def _dynamic(tau):
    """``tau`` as an argument of the program (its value unknown when the program is built, so
    one program serves every temperature)."""
    return np.float32(tau)


@pytest.fixture(autouse=True)
def _candidates_at_every_temperature(monkeypatch):
    """``bcsoftmax`` takes the candidate solver for numbers below 1 only; these tests check
    that solver at every temperature."""
    monkeypatch.setattr(impl, "_use_candidates", lambda temperature: True)


def test_the_dispatch_rule(monkeypatch):
    monkeypatch.undo()  # the real rule
    assert impl._use_candidates(0.05) and impl._use_candidates(np.array([0.5, 0.1]))
    assert not impl._use_candidates(1.0) and not impl._use_candidates(np.array([2.0, 0.5]))
    assert not impl._use_candidates(ops.convert_to_tensor(0.1))  # values unknown when built


def bisect_reference(x, a, b, tau):
    """float64: 200 bisection steps on ``nu`` in ``sum clip(exp(x/tau - nu), a, b) = 1``, then
    the closed form on the pattern at the bracket (exact when no breakpoint is inside it).
    Returns ``(y, state)`` with the state codes 0 free, 1 lower, 2 upper."""
    x = np.asarray(x, np.float64)
    x = (x - x.max(-1, keepdims=True)) / tau
    a, b = (np.broadcast_to(np.asarray(t, np.float64), x.shape) for t in (a, b))
    with np.errstate(divide="ignore"):
        lu, la = np.log(b), np.log(a)
    fin = np.isfinite(x)
    lo = np.where(fin, x - lu, np.inf).min(-1) - 1.0
    xm = np.where(fin, x, -np.inf)
    lse = np.log(np.exp(xm).sum(-1))  # the row max is 0
    hi = lse - np.log(np.maximum(1 - a.sum(-1), 1e-300)) + 1.0  # phi(hi) <= 1
    hi = np.maximum(hi, np.where(fin & (a > 0), x - la, -np.inf).max(-1) + 1.0)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        with np.errstate(over="ignore"):
            phi = np.clip(np.exp(x - mid[:, None]), a, b).sum(-1)
        lo, hi = np.where(phi >= 1, mid, lo), np.where(phi >= 1, hi, mid)
    upper = x - lu > hi[:, None]
    lower = ~upper & (x - la <= lo[:, None])
    free = ~upper & ~lower
    s = (
        1
        - np.where(upper, b, 0).sum(-1, keepdims=True)
        - np.where(lower, a, 0).sum(-1, keepdims=True)
    )
    xf = np.where(free, x, -np.inf)
    m = np.where(free.any(-1, keepdims=True), xf.max(-1, keepdims=True), 0.0)
    with np.errstate(invalid="ignore"):
        z = np.where(free, np.exp(xf - m), 0.0)
    y = np.where(upper, b, np.where(lower, a, z * s / np.maximum(z.sum(-1, keepdims=True), 1e-300)))
    return y, np.where(lower, 1, np.where(upper, 2, 0))


def brute_force(x, a, b, tau):
    """One row, small K: the feasible pattern (among all 3^K) with the best objective."""
    x = np.asarray(x, np.float64) / tau
    best, best_obj = None, -np.inf
    for pattern in itertools.product((0, 1, 2), repeat=len(x)):
        p = np.asarray(pattern)
        s = 1 - a[p == 1].sum() - b[p == 2].sum()
        free = p == 0
        if free.any():
            if s <= 0:
                continue
            z = np.exp(x[free] - x[free].max())
            y = np.where(p == 1, a, b).astype(np.float64)
            y[free] = s * z / z.sum()
        elif abs(s) > 1e-12:
            continue
        else:
            y = np.where(p == 1, a, b).astype(np.float64)
        if np.any(y < a - 1e-12) or np.any(y > b + 1e-12):
            continue
        obj = (x * y).sum() - np.sum(np.where(y > 0, y * np.log(np.where(y > 0, y, 1)), 0))
        if obj > best_obj:
            best, best_obj = y, obj
    return best


def vjp(y, state, v, tau):
    """dL/dx of ``sum(v * y)`` (spec section 3)."""
    q = np.where(state == 0, y, 0.0)
    s = q.sum(-1, keepdims=True)
    vbar = np.where(s > 0, (q * v).sum(-1, keepdims=True) / np.where(s > 0, s, 1), 0)
    return q * (v - vbar) / tau


def upstream(shape):
    return np.random.default_rng(7).uniform(0.5, 1.5, size=shape)  # the harness' weighting


BOUNDS = {
    "both": lambda k: (0.2 / k, 0.1),
    "upper": lambda k: (None, 0.1),
    "lower": lambda k: (0.2 / k, None),
    "wide": lambda k: (0.5 / k, 0.5),
}


def _with_bounds(kind, k):
    lower, upper = BOUNDS[kind](k)
    return lambda x, t: bcsoftmax(x, lower, upper, t)


# One program per bound kind (the bounds are Python numbers: they set the candidates taken).
# On TensorFlow the batch size is unknown when the program is built (a None batch dimension):
# the unknown-batch check of test_empty_batch_float64_and_unknown_batch, with gradients.
_KIND_PROGRAMS = {
    kind: ValueAndGrad(
        _with_bounds(kind, 256),
        TRACED,
        signature=[([None, 256], "float32"), ([None, 256], "float32"), ([], "float32")],
    )
    for kind in BOUNDS
}


@pytest.mark.parametrize("kind", sorted(BOUNDS))
def test_values_and_gradients_at_every_temperature(kind):
    """K = 256, 16 rows, every temperature through one program."""
    k = 256
    x = np.random.default_rng(0).normal(0, 3, (16, k)).astype(np.float32)
    lower, upper = BOUNDS[kind](k)
    v = upstream(x.shape).astype(np.float32)
    for tau in TEMPERATURES:
        y, (gx,) = _KIND_PROGRAMS[kind](v, x, _dynamic(tau))
        want, state = bisect_reference(
            x, 0.0 if lower is None else lower, 1.0 if upper is None else upper, tau
        )
        np.testing.assert_allclose(y, want, atol=1e-6, err_msg=f"tau={tau}")
        np.testing.assert_allclose(
            gx, vjp(want, state, v, tau), atol=2e-5 / tau, err_msg=f"tau={tau}"
        )


def _kernel_with(**how):
    def run(x, a, b, t):
        return impl._kernel(x, a, b, t, "newton", True, **how)

    return run


def test_matches_the_safeguarded_newton_solver():
    """The solver it replaced (still the fallback): outputs and gradients within 1e-6, at
    every temperature (one program per solver)."""
    k, n = 512, 32
    rng = np.random.default_rng(1)
    x = rng.normal(0, 3, (n, k)).astype(np.float32)
    a = (rng.uniform(0, 0.5, (n, k)) / k).astype(np.float32)  # per-class: the log-key path
    b = rng.uniform(0.05, 0.3, (n, k)).astype(np.float32)
    new = ValueAndGrad(_kernel_with(n_upper=impl.n_upper_candidates(b, k)), TRACED)
    old = ValueAndGrad(_kernel_with(solver=impl._solve_newton), TRACED)
    v = upstream(x.shape).astype(np.float32)
    for tau in TEMPERATURES:
        y1, (g1,) = new(v, x, a, b, _dynamic(tau))
        y0, (g0,) = old(v, x, a, b, _dynamic(tau))
        np.testing.assert_allclose(y1, y0, atol=1e-6, err_msg=f"tau={tau}")
        np.testing.assert_allclose(g1 * tau, g0 * tau, atol=1e-6, err_msg=f"tau={tau}")


def test_small_rows_against_brute_force_with_ties_and_masks():
    """40 rows of K = 6 (some classes masked by -inf): integer-spaced logits (ties), lower
    bounds 0 / 0.05 / 0.1, upper bounds 0 / 0.25 / 0.5 / 1; one compiled program."""
    rng = np.random.default_rng(2)
    xs, as_, bs = [], [], []
    while len(xs) < 40:
        x = rng.integers(-2, 3, size=6).astype(np.float32) * 0.3  # ties
        x[rng.uniform(size=6) < 0.15] = -np.inf
        a = rng.choice([0.0, 0.05, 0.1], size=6).astype(np.float32)
        b = np.maximum(a, rng.choice([0.0, 0.25, 0.5, 1.0], size=6)).astype(np.float32)
        alive = np.isfinite(x)
        a[~alive] = 0.0
        if not alive.any() or a.sum() > 1 or b[alive].sum() < 1:
            continue
        xs.append(x), as_.append(a), bs.append(b)
    x, a, b = np.stack(xs), np.stack(as_), np.stack(bs)
    f = compiled(lambda x, a, b, t: bcsoftmax(x, a, b, t), TRACED)
    for tau in TEMPERATURES:
        got = numpy(f(x, a, b, _dynamic(tau)))
        for row, y in enumerate(got):
            alive = np.isfinite(x[row])
            want = a[row].astype(np.float64)
            want[alive] = brute_force(
                x[row][alive],
                a[row][alive].astype(np.float64),
                b[row][alive].astype(np.float64),
                tau,
            )
            np.testing.assert_allclose(
                y, want, atol=1e-6, err_msg=f"tau={tau}: {x[row]} {a[row]} {b[row]}"
            )


def test_more_classes_at_the_upper_bound_than_candidates():
    """Tensor bounds (16 candidates) with up to 1/0.015 = 66 classes at the upper bound: those
    rows go to the safeguarded solver, the others stay exact."""
    k = 200
    x = np.random.default_rng(3).normal(0, 3, (8, k)).astype(np.float32)
    b = np.full((8, 1), 0.1, np.float32)
    b[::2] = 0.015
    f = compiled(lambda x, b, t: bcsoftmax(x, 0.1 / k, b, t), TRACED)
    for tau in (0.05, 1.0):
        want, _ = bisect_reference(x, 0.1 / k, b, tau)
        np.testing.assert_allclose(
            numpy(f(x, b, _dynamic(tau))), want, atol=1e-6, err_msg=f"tau={tau}"
        )


def test_huge_logits_and_offsets():
    x = np.random.default_rng(4).normal(0, 1e4, (8, 64)).astype(np.float32)
    f = compiled(lambda x, t: bcsoftmax(x + 1e6, 0.1 / 64, 0.2, t), TRACED)
    for tau in (0.05, 10.0):
        want, _ = bisect_reference(x.astype(np.float64), 0.1 / 64, 0.2, tau)
        np.testing.assert_allclose(
            numpy(f(x, _dynamic(tau))), want, atol=1e-6, err_msg=f"tau={tau}"
        )


def test_empty_batch_float64_and_unknown_batch():
    """An empty batch and float64 (each its own program). The unknown batch size (TensorFlow:
    a None batch dimension) is in test_values_and_gradients_at_every_temperature, whose
    programs are built with one."""
    f = compiled(lambda x: bcsoftmax(x, 0.01, 0.1, 0.05), TRACED)
    assert numpy(f(np.zeros((0, 50), np.float32))).shape == (0, 50)
    x = np.random.default_rng(5).normal(0, 3, (6, 50))
    with float64():
        y = numpy(compiled(lambda x: bcsoftmax(x, 0.01, 0.1, 0.05), TRACED)(x))
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, bisect_reference(x, 0.01, 0.1, 0.05)[0], atol=1e-12)
