"""BCSoftmax's default solver (upper-set candidates + monotone model steps, issue 33 item 1) at
every temperature, on every backend: values and gradients against an independent float64
bisection in numpy (and brute force over all 3^K patterns for small K), and against the
safeguarded Newton solver it replaced, at T in {0.05, 0.1, 1, 10} with binding bounds (both,
upper only, lower only, per-class), ties, -inf masks, huge logits, more classes at the upper
bound than the solver takes candidates, empty batches, float64 and an unknown batch size."""

import itertools

import numpy as np
import pytest
from keras import ops

from losszoo.ops import _bcsoftmax as impl
from losszoo.ops import bcsoftmax
from tests.harness import BACKEND, MODES, compiled, float64, numpy, value_and_grad

TEMPERATURES = (0.05, 0.1, 1.0, 10.0)
TRACED = MODES[-1]


def _dynamic(tau):
    """``tau`` as a tensor (values unknown when the program is built)."""
    return ops.convert_to_tensor(np.float32(tau))


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


@pytest.mark.parametrize("tau", TEMPERATURES)
@pytest.mark.parametrize("kind", sorted(BOUNDS))
def test_values_and_gradients_at_every_temperature(kind, tau):
    k = 256
    x = np.random.default_rng(0).normal(0, 3, (16, k)).astype(np.float32)
    lower, upper = BOUNDS[kind](k)

    def f(x):
        return bcsoftmax(x, lower, upper, _dynamic(tau))

    y, (gx,) = value_and_grad(f, x, mode=TRACED)
    want, state = bisect_reference(
        x, 0.0 if lower is None else lower, 1.0 if upper is None else upper, tau
    )
    np.testing.assert_allclose(y, want, atol=1e-6)
    np.testing.assert_allclose(gx, vjp(want, state, upstream(y.shape), tau), atol=2e-5 / tau)


@pytest.mark.parametrize("tau", TEMPERATURES)
def test_matches_the_safeguarded_newton_solver(tau):
    """The solver it replaced (still the fallback): outputs and gradients within 1e-6."""
    k = 512
    rng = np.random.default_rng(1)
    x = rng.normal(0, 3, (32, k)).astype(np.float32)
    a = (rng.uniform(0, 0.5, (32, k)) / k).astype(np.float32)  # per-class: the log-key path
    b = rng.uniform(0.05, 0.3, (32, k)).astype(np.float32)

    def run(x, **how):
        a_, b_, t_ = (ops.convert_to_tensor(v) for v in (a, b, np.float32(tau)))
        return impl._kernel(ops.convert_to_tensor(x), a_, b_, t_, "newton", True, **how)

    def new(x):
        return run(x, n_upper=impl.n_upper_candidates(b, k))

    def old(x):
        return run(x, solver=impl._solve_newton)

    y1, (g1,) = value_and_grad(new, x, mode=TRACED)
    y0, (g0,) = value_and_grad(old, x, mode=TRACED)
    np.testing.assert_allclose(y1, y0, atol=1e-6)
    np.testing.assert_allclose(g1 * tau, g0 * tau, atol=1e-6)


@pytest.mark.parametrize("tau", TEMPERATURES)
def test_small_rows_against_brute_force_with_ties_and_masks(tau):
    """40 rows of K = 6 (some classes masked by -inf): integer-spaced logits (ties), lower
    bounds 0 / 0.05 / 0.1, upper bounds 0 / 0.25 / 0.5 / 1; one compiled call."""
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
    got = numpy(compiled(lambda x, a, b: bcsoftmax(x, a, b, _dynamic(tau)), TRACED)(x, a, b))
    for row in range(len(x)):
        alive = np.isfinite(x[row])
        want = a[row].astype(np.float64)
        want[alive] = brute_force(
            x[row][alive], a[row][alive].astype(np.float64), b[row][alive].astype(np.float64), tau
        )
        np.testing.assert_allclose(got[row], want, atol=1e-6, err_msg=f"{x[row]} {a[row]} {b[row]}")


def test_more_classes_at_the_upper_bound_than_candidates():
    """Tensor bounds (16 candidates) with up to 1/0.015 = 66 classes at the upper bound: those
    rows go to the safeguarded solver, the others stay exact."""
    k = 200
    x = np.random.default_rng(3).normal(0, 3, (8, k)).astype(np.float32)
    b = np.full((8, 1), 0.1, np.float32)
    b[::2] = 0.015
    for tau in (0.05, 1.0):
        f = compiled(lambda x, b: bcsoftmax(x, 0.1 / k, b, _dynamic(tau)), TRACED)
        y = numpy(f(x, b))
        want, _ = bisect_reference(x, 0.1 / k, b, tau)
        np.testing.assert_allclose(y, want, atol=1e-6)


def test_huge_logits_and_offsets():
    rng = np.random.default_rng(4)
    x = rng.normal(0, 1e4, (8, 64)).astype(np.float32)
    for tau in (0.05, 10.0):
        y = numpy(compiled(lambda x: bcsoftmax(x + 1e6, 0.1 / 64, 0.2, _dynamic(tau)), TRACED)(x))
        want, _ = bisect_reference(x.astype(np.float64), 0.1 / 64, 0.2, tau)
        np.testing.assert_allclose(y, want, atol=1e-6)


def test_empty_batch_float64_and_unknown_batch():
    f = compiled(lambda x: bcsoftmax(x, 0.01, 0.1, 0.05), TRACED)
    assert numpy(f(np.zeros((0, 50), np.float32))).shape == (0, 50)
    x = np.random.default_rng(5).normal(0, 3, (6, 50))
    with float64():
        y = numpy(compiled(lambda x: bcsoftmax(x, 0.01, 0.1, 0.05), TRACED)(x))
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, bisect_reference(x, 0.01, 0.1, 0.05)[0], atol=1e-12)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        g = tf.function(
            lambda x: bcsoftmax(x, 0.01, 0.1, 0.05),
            input_signature=[tf.TensorSpec([None, 50], tf.float32)],
            jit_compile=True,
        )
        np.testing.assert_allclose(numpy(g(x.astype(np.float32))), y, atol=1e-6)
