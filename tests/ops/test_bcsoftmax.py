"""``losszoo.ops.bcsoftmax`` on the running backend, in every mode (tests/harness.py), against
the spec's numpy oracle, brute force, the paper's Algorithm 5, scipy SLSQP, finite differences
and the spec's golden vectors; NaN rows when traced, errors naming the argument when eager.

What only TensorFlow has (``tf.function`` with a ``None`` batch) is in
``test_bcsoftmax_tensorflow.py``.
"""

import keras
import numpy as np
import pytest
from keras import ops
from scipy.optimize import minimize
from scipy.special import softmax as np_softmax

import losszoo
from losszoo.ops import _bcsoftmax as impl
from losszoo.ops._bcsoftmax import _SOLVERS, METHODS, bcsoftmax
from tests.harness import (
    BACKEND,
    MODES,
    compiled,
    finite_difference,
    float64,
    numpy,
    value_and_grad,
)
from tests.programs import ValueAndGrad
from tests.references import load_reference

REF = load_reference("bcsoftmax")
TRACED = {"tensorflow": "xla", "jax": "jit"}.get(BACKEND)
# A compiled mode without XLA's compile time where the backend has one (TensorFlow graph);
# JAX eager would compile the solvers' loops at every call.
FAST = {"tensorflow": "graph", "jax": "jit"}.get(BACKEND, "eager")
# Tests of many small problems of different shapes: on JAX each shape and bound pattern is an
# XLA compile (a golden-vector test took 120 s on the loaded 2-core machine). The kernel is the
# same keras.ops code, checked here on TensorFlow and PyTorch and on JAX by the tests below
# that need few programs (oracle values and VJPs in every mode, gradients, NaN rows, errors).
many_programs = pytest.mark.skipif(
    BACKEND == "jax", reason="one XLA compile per problem shape on JAX (minutes on 2 cores)"
)
# The solvers themselves (private, not written for autograph): eager, jitted on JAX.
SOLVER_MODE = "jit" if BACKEND == "jax" else "eager"


@pytest.fixture(autouse=True)
def _float64_on_jax():
    """The references are float64; on JAX float64 needs 64-bit mode (float32 stays float32)."""
    with float64():
        yield


def _np(*arrays):
    return [np.asarray(a, np.float64) for a in arrays]


def run(*args, **kwargs):
    """``bcsoftmax`` eagerly, as numpy."""
    return numpy(bcsoftmax(*args, **kwargs))


def _upstream(shape):
    return np.random.default_rng(7).uniform(0.5, 1.5, size=shape)  # the harness' weighting


def grad_of_weighted_sum(fn, args, v, argnums):
    """Gradients of ``sum(fn(*args) * v)`` w.r.t. ``args[i]`` for ``i in argnums`` (eager)."""
    u = _upstream(())

    def scalar(*xs):
        return ops.sum(fn(*xs) * ops.convert_to_tensor(np.asarray(v, np.float64)))

    out, grads = value_and_grad(scalar, *args, argnums=argnums)
    return out, [g / u for g in grads]


_STATE_FNS = {}


def bcsoftmax_with_state(x, lower=None, upper=None, temperature=1.0, *, method="newton"):
    """Forward only, rows ``[N, K]`` and a scalar temperature: the kernel's solver on the input
    as the kernel prepares it (``x / tau`` shifted by the row max, bounds clamped into
    ``[0, 1]``). Returns numpy ``(y, state)``, state codes 0 free, 1 at lower, 2 at upper.
    One compiled function per method and bound pattern (the temperature is an argument)."""
    key = (method, lower is None, upper is None)
    if key not in _STATE_FNS:

        def fn(x, t, *bounds):
            x, t = ops.convert_to_tensor(x), ops.convert_to_tensor(t)
            xs = x / t
            xs = xs - ops.max(xs, -1, keepdims=True)
            bounds = list(bounds)

            def bound(absent, high):
                if absent:
                    return None
                t = ops.convert_to_tensor(bounds.pop(0))
                return ops.clip(ops.broadcast_to(t, ops.shape(xs)), 0.0, high)

            return _SOLVERS[method](xs, bound(key[1], np.inf), bound(key[2], 1.0))

        _STATE_FNS[key] = compiled(fn, SOLVER_MODE)
    args = [np.asarray(t, np.float64) for t in (x, temperature, lower, upper) if t is not None]
    y, state = _STATE_FNS[key](*args)
    return numpy(y), numpy(state)


# ---------------------------------------------------------------- golden vectors (spec 7.11)
GOLDEN = [
    # x, a, b, tau, y, states
    (
        (-1.5, 1, -0.5),
        (0, 0, 0),
        (1, 0.6, 0.5),
        1.0,
        (0.107576568548, 0.6, 0.292423431452),
        (0, 2, 0),
    ),
    ((2, 0, -3), (0.05, 0.05, 0.15), (0.6, 1, 1), 1.0, (0.6, 0.25, 0.15), (2, 0, 1)),
    (
        (3, 1, 0, -1, -4),
        (0, 0.1, 0, 0.05, 0.1),
        (0.5, 0.3, 1, 1, 1),
        1.0,
        (0.5, 0.255870502521, 0.094129497479, 0.05, 0.1),
        (2, 0, 0, 0, 1),
    ),
    (
        (3, 1, 0, -1, -4),
        (0, 0.1, 0, 0.05, 0.1),
        (0.5, 0.3, 1, 1, 1),
        2.0,
        (0.5, 0.202592156422, 0.122878354287, 0.074529489290, 0.1),
        (2, 0, 0, 0, 1),
    ),
    (
        (4, 2, 1, 0, -2),
        (0.04,) * 5,
        (0.5,) * 5,
        1.0,
        (0.5, 0.306010839656, 0.112575096685, 0.041414063658, 0.04),
        (2, 0, 0, 0, 1),
    ),
]


@many_programs
@pytest.mark.parametrize("method", METHODS)
def test_golden_vectors(method):
    for x, a, b, tau, y_want, st_want in GOLDEN:
        x, a, b = _np([x], [a], [b])
        y = run(x, a, b, tau, method=method)[0]
        np.testing.assert_allclose(y, y_want, atol=1e-11)
        _, state = bcsoftmax_with_state(x, a, b, tau, method=method)
        # a coordinate exactly at a bound may be reported free or at that bound
        st_want = np.asarray(st_want)
        tie = (st_want == 0) & (
            (state[0] == 1) & (y_want == a[0]) | (state[0] == 2) & (y_want == b[0])
        )
        np.testing.assert_array_equal(np.where(tie, 0, state[0]), st_want)


def test_golden_fig1_upper_only_is_ubsoftmax():
    y = run(*_np([[-1.5, 1, -0.5]]), upper=[1, 0.6, 0.5])[0]
    np.testing.assert_allclose(y, (0.107576568548, 0.6, 0.292423431452), atol=1e-11)


# ---------------------------------------------------------------- oracle agreement
@many_programs
@pytest.mark.parametrize("method", METHODS)
def test_matches_oracle_thousands_of_random_cases(method):
    """~4600 random feasible rows per method (the paper's recipe) vs the numpy exact solver."""
    rng = np.random.RandomState(1)
    rows, worst = 0, 0.0
    for k in (2, 3, 5, 10, 32, 100):
        for tau in (0.1, 1.0, 10.0):
            x, a, b = REF.random_problem(rng, 256, k, scale=rng.choice([0.5, 3.0, 10.0]))
            y = run(x, a, b, tau, method=method)
            y_ref, _ = REF.bcsoftmax(x, a, b, tau)
            worst = max(worst, np.abs(y - y_ref).max())
            assert np.all(y >= np.minimum(a, 1) - 1e-12) and np.all(y <= np.minimum(b, 1) + 1e-12)
            np.testing.assert_allclose(y.sum(-1), 1.0, atol=1e-12)
            rows += len(x)
    assert rows >= 4000
    assert worst < 1e-9, worst


def _tie_heavy(rng, n, k):
    x = rng.randint(-2, 3, size=(n, k)).astype(float)
    a = rng.choice([0.0, 0.05, 0.1], size=(n, k))
    b = np.maximum(a, rng.choice([0.0, 0.2, 0.5, 1.0], size=(n, k)))
    ok = (a.sum(1) <= 1) & (b.sum(1) >= 1)
    return x[ok], a[ok], b[ok]


@many_programs
@pytest.mark.parametrize("method", METHODS)
def test_ties_masks_and_equal_bounds(method):
    """Integer logits (ties), a == b, b == 0 masks, bounds at 0 and 1, K = 2..6."""
    rng = np.random.RandomState(2)
    checked = 0
    for k in (2, 3, 4, 5, 6):
        x, a, b = _tie_heavy(rng, 600, k)
        y = run(x, a, b, method=method)
        y_ref, _ = REF.bcsoftmax(x, a, b)
        np.testing.assert_allclose(y, y_ref, atol=1e-12)
        for i in range(0, len(x), 60):  # brute force over all 3^K state assignments
            np.testing.assert_allclose(y[i], REF.bcsoftmax_bruteforce(x[i], a[i], b[i]), atol=1e-12)
        checked += len(x)
    assert checked > 1000


def _by_k(problems):
    """Stack single-row problems of equal K: one call per K."""
    groups = {}
    for i, (x, a, b) in enumerate(problems):
        groups.setdefault(x.shape[-1], []).append((i, x, a, b))
    for rows in groups.values():
        idx = [r[0] for r in rows]
        yield idx, *(np.concatenate([r[j] for r in rows]) for j in (1, 2, 3))


@many_programs
def test_matches_brute_force_and_paper_algorithm5():
    rng = np.random.RandomState(3)
    problems = []
    for _ in range(60):
        k = rng.randint(2, 7)
        problems.append(REF.random_problem(rng, 1, k, scale=rng.choice([0.5, 3.0, 10.0])))
    for _, x, a, b in _by_k(problems):
        y = run(x, a, b)
        for i in range(len(x)):
            np.testing.assert_allclose(
                y[i], REF.bcsoftmax_bruteforce(x[i], a[i], np.minimum(b[i], 1)), atol=1e-12
            )
            np.testing.assert_allclose(y[i], REF.bcsoftmax_paper_alg5(x[i], a[i], b[i]), atol=1e-12)
    x, a, b = REF.random_problem(rng, 3, 50)
    y = run(x, a, b)
    for i in range(3):
        np.testing.assert_allclose(y[i], REF.bcsoftmax_paper_alg5(x[i], a[i], b[i]), atol=1e-12)


def _slsqp(x, a, b):
    def f(y):
        yc = np.maximum(y, 1e-300)
        return -(x @ y - np.sum(yc * np.log(yc))), -(x - np.log(yc) - 1)

    y0 = a + (b - a) * (1 - a.sum()) / (b.sum() - a.sum())
    res = minimize(
        f,
        y0,
        jac=True,
        method="SLSQP",
        bounds=list(zip(np.maximum(a, 1e-12), b)),
        constraints=[
            {"type": "eq", "fun": lambda y: y.sum() - 1, "jac": lambda y: np.ones_like(y)}
        ],
        options={"ftol": 1e-14, "maxiter": 500},
    )
    return res.x


@many_programs
def test_matches_independent_scipy_solver():
    """200 random feasible problems (K = 2..8, incl. ties and bounds at 0/1) vs SLSQP."""
    rng = np.random.RandomState(4)
    problems = []
    for i in range(200):
        k = rng.randint(2, 9)
        if i % 4 == 3:
            x, a, b = _tie_heavy(rng, 50, k)
            x, a, b = x[:1], a[:1], b[:1]
            if len(x) == 0 or (b[0] == 0).any():
                continue
        else:
            x, a, b = REF.random_problem(rng, 1, k)
            b = np.minimum(b, 1.0)
        problems.append((x, a, b))
    worst = 0.0
    for _, x, a, b in _by_k(problems):
        y = run(x, a, b)
        for i in range(len(x)):
            worst = max(worst, np.abs(y[i] - _slsqp(x[i], a[i], b[i])).max())
    assert worst < 1e-6, worst


def test_methods_agree_at_large_k():
    rng = np.random.RandomState(5)
    x, a, b = REF.random_problem(rng, 4, 4096)
    y_ref, _ = REF.bcsoftmax(x, a, b, 0.5)
    for m in METHODS:
        np.testing.assert_allclose(run(x, a, b, 0.5, method=m), y_ref, atol=1e-13)


def test_k_100000_float32():
    rng = np.random.RandomState(6)
    x, a, b = REF.random_problem(rng, 2, 100_000)
    y = run(x.astype(np.float32), a.astype(np.float32), b.astype(np.float32))
    y_ref, _ = REF.bcsoftmax(
        x.astype(np.float32).astype(float), a.astype(np.float32), b.astype(np.float32)
    )
    assert y.dtype == np.float32
    assert np.abs(y - y_ref).max() < 1e-6
    np.testing.assert_allclose(y.sum(-1), 1.0, atol=1e-4)
    # upper-only at K = 1e5
    y2 = run(x.astype(np.float32), upper=2e-4)
    y2_ref, _ = REF.bcsoftmax(x, 0.0, 2e-4)
    assert np.abs(y2 - y2_ref).max() < 1e-6


# ---------------------------------------------------------------- properties (spec 7.2, 7.7, 7.8)
def test_reduces_to_softmax_with_loose_or_absent_bounds():
    rng = np.random.RandomState(7)
    x = rng.normal(0, 3, (40, 10))
    want = np_softmax(x / 0.7, -1)
    for lower, upper in (
        (None, None),
        (0.0, 1.0),
        (want * 0.5, np.minimum(want * 2, 1)),
        (0.0, None),
        (None, 1.0),
    ):
        np.testing.assert_allclose(run(x, lower, upper, 0.7), want, atol=1e-14)
    y32 = run(x.astype(np.float32), 0.0, 1.0)
    np.testing.assert_allclose(y32, np_softmax(x, -1), atol=1e-6)
    _, state = bcsoftmax_with_state(x, 0.0, 1.0)
    assert (state == 0).all()


def test_invariances():
    rng = np.random.RandomState(8)
    x, a, b = REF.random_problem(rng, 50, 10)
    base = run(x, a, b)
    # shift invariance
    np.testing.assert_allclose(run(x + 123.0, a, b), base, atol=1e-12)
    # temperature is a logit scale: (x, tau) == (x / tau, 1)
    for tau in (0.3, 2.0):
        np.testing.assert_allclose(run(x * tau, a, b, tau), base, atol=1e-12)
    # per-example temperature [N, 1]
    taus = rng.uniform(0.2, 3, (50, 1))
    np.testing.assert_allclose(run(x * taus, a, b, taus), base, atol=1e-12)
    # permutation equivariance
    perm = rng.permutation(10)
    np.testing.assert_allclose(run(x[:, perm], a[:, perm], b[:, perm]), base[:, perm], atol=1e-12)
    # batch independence
    np.testing.assert_allclose(run(x[7:9], a[7:9], b[7:9]), base[7:9], atol=1e-15)


def test_broadcasting_and_axis():
    rng = np.random.RandomState(9)
    x = rng.normal(0, 3, (6, 8))
    a1 = rng.uniform(0, 1 / 8, (6, 1))
    b1 = rng.uniform(1 / 8, 1, (6, 1))
    y = run(x, a1, b1)
    np.testing.assert_allclose(y, run(x, np.tile(a1, 8), np.tile(b1, 8)), atol=1e-15)
    np.testing.assert_allclose(y, REF.bcsoftmax(x, a1, b1)[0], atol=1e-12)
    # per-class vector and scalar bounds
    av = rng.uniform(0, 0.1, 8)
    np.testing.assert_allclose(run(x, av, upper=0.4), REF.bcsoftmax(x, av, 0.4)[0], atol=1e-12)
    # class axis 1 of a rank-3 tensor
    x3 = rng.normal(0, 2, (3, 8, 4))
    a3 = rng.uniform(0, 0.05, (3, 8, 4))
    y3 = run(x3, a3, upper=0.5, axis=1)
    y3_ref = np.moveaxis(
        REF.bcsoftmax(
            np.moveaxis(x3, 1, -1).reshape(-1, 8), np.moveaxis(a3, 1, -1).reshape(-1, 8), 0.5
        )[0].reshape(3, 4, 8),
        -1,
        1,
    )
    np.testing.assert_allclose(y3, y3_ref, atol=1e-12)
    # rank-1 input
    np.testing.assert_allclose(
        run(x[0], upper=0.4), REF.bcsoftmax(x[:1], 0.0, 0.4)[0][0], atol=1e-12
    )


def test_axis_with_broadcast_bounds_float32():
    rng = np.random.RandomState(1)
    x3 = rng.normal(0, 2, (3, 5, 4)).astype(np.float32)
    y = run(x3, 0.02, np.full((3, 1, 4), 0.5, np.float32), axis=1)
    flat = np.moveaxis(x3, 1, -1).reshape(-1, 5).astype(np.float64)
    want = np.moveaxis(REF.bcsoftmax(flat, 0.02, 0.5)[0].reshape(3, 4, 5), -1, 1)
    np.testing.assert_allclose(y, want, atol=2e-6)


@many_programs
def test_theorem7_uniform_bounds_are_clipped_logits_and_order_preserved():
    rng = np.random.RandomState(10)
    x = rng.normal(0, 3, (100, 20))
    a = rng.rand(100, 1) / 20
    b = 1 / 20 + (1 - 1 / 20) * rng.rand(100, 1)
    y, st = bcsoftmax_with_state(x, a, b)
    f = np.argmax(st == 0, -1)
    nu = np.take_along_axis(x, f[:, None], -1) - np.log(np.take_along_axis(y, f[:, None], -1))
    np.testing.assert_allclose(
        np_softmax(np.clip(x, np.log(a) + nu, np.log(b) + nu), -1), y, atol=1e-12
    )
    ys = np.take_along_axis(y, np.argsort(x, -1), -1)
    assert (np.diff(ys, axis=-1) >= -1e-15).all()
    # upper bound 1: argmax unchanged
    np.testing.assert_array_equal(run(x, a, upper=1.0).argmax(-1), x.argmax(-1))


# ---------------------------------------------------------------- degenerate inputs (spec 7.9)
def test_degenerate_cases():
    rng = np.random.RandomState(11)
    x = rng.normal(0, 3, (4, 5))
    a = rng.dirichlet(np.ones(5), 4)  # sum(a) == 1  -> y = a
    np.testing.assert_allclose(run(x, a, upper=1.0), a, atol=1e-12)
    np.testing.assert_allclose(run(x, upper=a), a, atol=1e-12)
    # a_k == b_k pins the coordinate
    lo = np.full((4, 5), 0.02)
    hi = np.full((4, 5), 0.9)
    lo[:, 2] = hi[:, 2] = 0.3
    y = run(x, lo, hi)
    np.testing.assert_allclose(y[:, 2], 0.3, atol=1e-15)
    np.testing.assert_allclose(y, REF.bcsoftmax(x, lo, hi)[0], atol=1e-12)
    # a_k = b_k = 0 masks class k; the rest equals BCSoftmax on the other classes
    lo2, hi2 = np.full((4, 5), 0.01), np.full((4, 5), 0.6)
    lo2[:, 1] = hi2[:, 1] = 0.0
    y = run(x, lo2, hi2)
    assert (y[:, 1] == 0).all()
    keep = [0, 2, 3, 4]
    np.testing.assert_allclose(y[:, keep], REF.bcsoftmax(x[:, keep], 0.01, 0.6)[0], atol=1e-12)
    # K = 1
    np.testing.assert_allclose(run(*_np([[3.0], [-2.0]]), 0.0, 1.0), [[1.0], [1.0]])
    np.testing.assert_allclose(run(*_np([[3.0]])), [[1.0]])
    # equal logits, uniform bounds -> uniform output
    np.testing.assert_allclose(run(np.zeros((2, 7)), 0.05, 0.5), 1 / 7, atol=1e-15)


def test_huge_and_minus_inf_logits():
    x = np.array([[1e4, 0.0, -1e4, 3.0], [3e38, 1e38, -3e38, 0.0]], np.float32)
    y = run(x, 0.01, 0.7)  # the default method also survives gaps near float max
    assert np.isfinite(y).all()
    want0 = REF.bcsoftmax(x[:1].astype(float), 0.01, 0.7)[0][0]
    np.testing.assert_allclose(want0, [0.7, 0.29 / (1 + np.e**3), 0.01, 0.29 / (1 + np.e**-3)])
    np.testing.assert_allclose(y, [want0, [0.7, 0.28, 0.01, 0.01]], atol=1e-6)
    for method in METHODS:
        y = run(x[:1].astype(float) * 10, 0.01, 0.7, 10.0, method=method)
        np.testing.assert_allclose(y, [want0], atol=1e-5)
    # -inf logits: forced to the lower bound (0 without one), no NaN in values or gradients
    xm = np.array([[-np.inf, 1.0, 0.0, -np.inf]])
    for lower, want0 in ((None, 0.0), (0.1, 0.1)):
        y, (g,) = value_and_grad(lambda t, lower=lower: bcsoftmax(t, lower, 0.8), xm)
        assert y[0, 0] == want0 and y[0, 3] == want0
        np.testing.assert_allclose(y.sum(), 1.0, atol=1e-12)
        assert np.isfinite(g).all()
    ref = REF.bcsoftmax(np.array([[1.0, 0.0]]), 0.1, 0.8)[0][0] * 0.8
    np.testing.assert_allclose(run(xm, 0.1, 0.8)[0, 1:3], ref, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_computed_in_float32(dtype):
    rng = np.random.RandomState(12)
    x, a, b = REF.random_problem(rng, 16, 12)
    xh, ah, bh = (ops.cast(t, dtype) for t in (x, a, b))
    y = bcsoftmax(xh, ah, bh)
    assert keras.backend.standardize_dtype(y.dtype) == dtype
    xh64, ah64, bh64 = (numpy(ops.cast(t, "float64")) for t in (xh, ah, bh))
    want, _ = REF.bcsoftmax(xh64, ah64, np.minimum(bh64, 1))
    tol = 1e-3 if dtype == "float16" else 8e-3
    np.testing.assert_allclose(numpy(ops.cast(y, "float64")), want, atol=tol)


def test_float32_accuracy_against_float64():
    rng = np.random.RandomState(13)
    x, a, b = REF.random_problem(rng, 32, 4096)
    y64, _ = REF.bcsoftmax(x, a, b)
    x32, a32, b32 = (t.astype(np.float32) for t in (x, a, b))
    y32 = run(x32, a32, b32)
    assert np.abs(y32 - y64).max() < 2e-7
    y32t = run(x32, a32, b32, 0.1)
    assert np.abs(y32t - REF.bcsoftmax(x, a, b, 0.1)[0]).max() < 5e-6
    # output within the box exactly (final clip) and sums to 1
    assert (y32 >= a32).all() and (y32 <= np.minimum(b32, 1)).all()
    np.testing.assert_allclose(y32.sum(-1), 1.0, atol=1e-5)


# ---------------------------------------------------------------- values and gradients, all modes
def _problem(seed, n=4, k=6):
    x, a, b = REF.random_problem(np.random.RandomState(seed), n, k)
    return x.astype(np.float32), a.astype(np.float32), np.minimum(b, 1.0).astype(np.float32)


@pytest.mark.parametrize(
    # every mode for the default (its XLA / jax.jit program, with a per-row temperature: in
    # test_traced_bad_rows_are_nan, one program for both); the others compiled without XLA on
    # TensorFlow (the contract suite runs every method under XLA), jitted on JAX (eager JAX
    # compiles at every call)
    "method, mode",
    [("newton", mode) for mode in MODES if mode != TRACED] + [(m, FAST) for m in METHODS[1:]],
)
def test_values_and_gradients_match_the_oracle(method, mode):
    """Also what XLA / jit vs eager checked: every mode against the oracle and its VJP (the
    traced mode in test_traced_bad_rows_are_nan)."""
    x, a, b = _problem(0)
    tau = np.float32(0.8)

    def f(x, a, b, t):
        return bcsoftmax(x, a, b, t, method=method)

    y, (gx, ga, gb, gt) = value_and_grad(f, x, a, b, tau, mode=mode, argnums=(0, 1, 2, 3))
    want, state = REF.bcsoftmax(x.astype(np.float64), a, b, 0.8)
    np.testing.assert_allclose(y, want, atol=2e-6)
    wx, wa, wb = REF.bcsoftmax_vjp(want, state, _upstream(y.shape), 0.8)
    np.testing.assert_allclose(gx, wx, atol=2e-5)
    np.testing.assert_allclose(ga, wa, atol=2e-5)
    np.testing.assert_allclose(gb, wb, atol=2e-5)
    xs = x - x.max(-1, keepdims=True)  # dL/dtau = -(1/tau) sum (x - max x) dL/dx
    np.testing.assert_allclose(gt, -(xs * gx).sum() / 0.8, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- validation
def test_infeasible_bounds_raise_when_values_known():
    x = np.zeros((2, 3), np.float32)
    cases = [
        (dict(lower=0.4), "sum(lower) <= 1"),
        (dict(upper=0.3), "1 <= sum(upper)"),
        (dict(lower=[0.1, 0.5, 0.1], upper=[0.9, 0.4, 0.9]), "lower <= upper"),
        (dict(lower=-0.1), "0 <= lower"),
        (dict(upper=1.5), "upper <= 1"),
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
    ]
    for kwargs, rule in cases:
        with pytest.raises(ValueError, match=rule.replace("(", r"\(").replace(")", r"\)")):
            bcsoftmax(x, **kwargs)
    with pytest.raises(ValueError, match=r"\+inf"):
        bcsoftmax([[np.inf, 0.0]])
    with pytest.raises(ValueError, match="NaN"):
        bcsoftmax([[np.nan, 0.0]])
    with pytest.raises(ValueError, match="method"):
        bcsoftmax(x, method="cvx")
    with pytest.raises(ValueError, match="broadcast"):
        bcsoftmax(x, lower=[0.1, 0.1])

    if BACKEND != "tensorflow":  # jax.jit: no check of values inside the program
        return

    # constants inside a TensorFlow graph are also checked (at trace time)
    def g(t):
        return bcsoftmax(t, lower=ops.convert_to_tensor(np.float32(0.5)))

    with pytest.raises(ValueError, match="sum"):
        compiled(g, FAST)(x)


def test_eager_errors_name_the_argument():
    x, a, b = _problem(6)
    bad_x = x.copy()
    bad_x[1, 1] = np.inf
    crossed = a.copy()
    crossed[0, 0] = 0.9
    cases = [
        ("logits", (bad_x, a, b), {}),
        ("lower", (x, np.full_like(a, 0.3), b), {}),
        ("upper", (x, a, np.full_like(b, 0.1)), {}),
        ("lower", (x, crossed, b), {}),
        ("temperature", (x, a, b), {"temperature": 0.0}),
    ]
    for name, args, kwargs in cases:
        with pytest.raises(ValueError, match=f"`{name}`"):
            bcsoftmax(*args, **kwargs)
    with pytest.raises(ValueError, match="`method`"):
        bcsoftmax(x, method="exact")


@pytest.mark.parametrize("mode", [m for m in MODES if m != "xla"])  # XLA: the next test
def test_bad_rows_are_nan_with_validation_off(mode):
    x, a, b = _problem(4)
    x[0, 2] = np.nan
    x[1] = -np.inf
    a[2] = 0.3  # sum(lower) = 1.8
    with losszoo.validation(False):
        y = numpy(compiled(bcsoftmax, mode)(x, a, b))
    assert np.isnan(y[:3]).all()
    want = REF.bcsoftmax(x[3:].astype(np.float64), a[3:], b[3:])[0]
    np.testing.assert_allclose(y[3:], want, atol=2e-6)


@pytest.mark.skipif(TRACED is None, reason="PyTorch has no traced mode without assertions")
def test_traced_bad_rows_are_nan():
    """One program (XLA / jax.jit), validation on: every kind of bad row is NaN, values and
    gradients (also to the bounds and the per-row temperature) of the others match the oracle
    and its VJP (the traced mode of test_values_and_gradients_match_the_oracle)."""
    x, a, b = _problem(5, n=8)
    t = np.full((8, 1), 0.9, np.float32)
    x[1, 2] = np.nan
    x[2] = -np.inf
    b[3] = 0.1  # sum(upper) < 1
    a[4, 0], b[4, 0] = 0.5, 0.2  # lower > upper
    a[5], b[5] = 0.5, 0.9  # sum(lower) > 1
    t[6] = -1.0  # temperature <= 0
    v = _upstream(x.shape).astype(np.float32)
    y, (gx, ga, gb, gt) = _TRACED_VJP(v, x, a, b, t)
    assert np.isnan(y[1:7]).all()
    assert np.isnan(gx[1:7]).all()
    good = [0, 7]
    want, state = REF.bcsoftmax(x[good].astype(np.float64), a[good], b[good], 0.9)
    np.testing.assert_allclose(y[good], want, atol=2e-6)
    wx, wa, wb = REF.bcsoftmax_vjp(want, state, v[good], 0.9)
    np.testing.assert_allclose(gx[good], wx, atol=2e-5)
    np.testing.assert_allclose(ga[good], wa, atol=2e-5)
    np.testing.assert_allclose(gb[good], wb, atol=2e-5)
    xs = x[good] - x[good].max(-1, keepdims=True)  # dL/dtau = -(1/tau) sum (x - max x) dL/dx
    np.testing.assert_allclose(
        gt[good], -(xs * gx[good]).sum(-1, keepdims=True) / 0.9, rtol=1e-4, atol=1e-5
    )


_TRACED_VJP = ValueAndGrad(bcsoftmax, TRACED, argnums=(0, 1, 2, 3)) if TRACED else None


@pytest.mark.parametrize(
    "bounds",
    [
        {"lower": [0.1, 0.1]},
        {"upper": np.full((2, 3), 0.5)},
        {"lower": np.zeros((1, 1, 3))},
    ],
)
def test_bounds_of_a_wrong_shape_name_the_argument(bounds):
    # Issue 19 item 10: numpy's or TF's broadcast error, naming nothing, before.
    (name,) = bounds
    x = np.array([[2.0, 1.0, 0.0]], np.float32)
    with pytest.raises(
        ValueError, match=f"`{name}` .*does not broadcast to `logits`|`{name}` \\(rank"
    ):
        bcsoftmax(x, **bounds)
    graph = compiled(lambda x, t: bcsoftmax(x, **{name: t}), FAST)
    with pytest.raises(ValueError, match=f"`{name}`"):
        graph(x, np.asarray(bounds[name], np.float32))


# ---------------------------------------------------------------- gradients (spec section 3)
def _away_from_kinks(rng, n, k):
    x, a, b = REF.random_problem(rng, n, k)
    a = a + 1e-3
    b = np.minimum(np.maximum(b, a + 1e-3), 1.0)
    a = a * np.minimum(1, 0.95 / a.sum(1, keepdims=True))
    return x, a, b


def _check_fd(fn, args):
    f = compiled(fn, FAST)  # compiled only to make the many FD evaluations fast
    _, grads = value_and_grad(fn, *args, argnums=tuple(range(len(args))))
    for i, g in enumerate(grads):

        def partial(v, i=i):
            return f(*[v if j == i else t for j, t in enumerate(args)])

        np.testing.assert_allclose(
            g, finite_difference(partial, args[i]), atol=1e-7, rtol=1e-5, err_msg=f"argument {i}"
        )


def test_gradients_match_finite_differences_in_float64():
    # The backward pass is shared by the methods (their forward values are checked above).
    rng = np.random.RandomState(14)  # every state present, no coordinate near a state change
    x, a, b = _away_from_kinks(rng, 3, 6)
    assert {0, 1, 2} <= set(REF.bcsoftmax(x, a, b, 0.7)[1].ravel())
    _check_fd(bcsoftmax, [x, a, b, np.float64(0.7)])
    # per-example uniform bounds [N, 1] and per-example temperature
    t1 = np.array([[0.5], [1.0], [2.0]])
    _check_fd(bcsoftmax, [x, np.full((3, 1), 0.05), np.full((3, 1), 0.45), t1])
    # upper-only / lower-only
    _check_fd(lambda x, b: bcsoftmax(x, upper=b), [x, b])
    _check_fd(lambda x, a: bcsoftmax(x, lower=a), [x, a])


def test_worked_gradient_example():
    x, a, b = _np([[3, 1, 0, -1, -4]], [0, 0.1, 0, 0.05, 0.1], [0.5, 0.3, 1, 1, 1])
    _, (gx, ga, gb) = value_and_grad(
        lambda x, a, b: -ops.log(bcsoftmax(x, a, b)[0, 1]), x, a, b, argnums=(0, 1, 2)
    )
    u = _upstream(())
    np.testing.assert_allclose(gx[0] / u, [0, -0.26894142, 0.26894142, 0, 0], atol=1e-8)
    np.testing.assert_allclose(ga / u, [0, 0, 0, 1 / 0.35, 1 / 0.35], atol=1e-8)
    np.testing.assert_allclose(gb / u, [1 / 0.35, 0, 0, 0, 0], atol=1e-8)


def test_gradient_matches_the_oracle_vjp_in_float64():
    rng = np.random.RandomState(15)
    x, a, b = REF.random_problem(rng, 16, 9)
    b = np.minimum(b, 1.0)
    v = rng.normal(size=x.shape)
    _, got = grad_of_weighted_sum(
        lambda x, a, b: bcsoftmax(x, a, b, 0.8), [x, a, b], v, argnums=(0, 1, 2)
    )
    y_ref, st = REF.bcsoftmax(x, a, b, 0.8)
    for g, w in zip(got, REF.bcsoftmax_vjp(y_ref, st, v, 0.8)):
        np.testing.assert_allclose(g, w, atol=1e-12)


def test_gradient_identities_and_broadcast_reduction():
    rng = np.random.RandomState(16)
    x, a, b = REF.random_problem(rng, 8, 7)
    b = np.minimum(b, 1)
    t = np.float64(1.3)
    args = [x, a, b, t]
    _, grads = grad_of_weighted_sum(bcsoftmax, args, np.ones(x.shape), argnums=(0, 1, 2, 3))
    for g in grads:  # v = 1 gives zero gradients
        np.testing.assert_allclose(g, 0.0, atol=1e-12)
    _, (gx, gt) = grad_of_weighted_sum(bcsoftmax, args, rng.normal(size=x.shape), argnums=(0, 3))
    np.testing.assert_allclose(gx.sum(-1), 0.0, atol=1e-12)  # sum dL/dx = 0
    xs = x - x.max(-1, keepdims=True)
    np.testing.assert_allclose(gt, -(xs * gx).sum() / 1.3, atol=1e-12)
    # broadcast [N,1] bounds get the row sums of the [N,K] gradients
    a1, b1 = np.full((8, 1), 0.03), np.full((8, 1), 0.4)
    v = rng.normal(size=x.shape)
    grads = []
    for lo, hi in ((a1, b1), (np.tile(a1, 7), np.tile(b1, 7))):
        grads.append(grad_of_weighted_sum(bcsoftmax, [x, lo, hi], v, argnums=(1, 2))[1])
    np.testing.assert_allclose(grads[0][0], grads[1][0].sum(-1, keepdims=True), atol=1e-12)
    np.testing.assert_allclose(grads[0][1], grads[1][1].sum(-1, keepdims=True), atol=1e-12)
    # a scalar bound gets the total
    _, (gs,) = grad_of_weighted_sum(
        lambda s: bcsoftmax(x, upper=s), [np.float64(0.4)], v, argnums=(0,)
    )
    assert gs.shape == ()


@pytest.mark.xfail(
    BACKEND == "torch",
    strict=True,
    reason="PyTorch: d/dc of sum(v * bcsoftmax(x, lo(c), hi(c))) with lo_k = hi_k = c is "
    "-1.58567 against central differences -1.58309 (TensorFlow and JAX agree with them)",
)
def test_equal_bounds_not_double_counted():
    """With a_k = b_k = c, moving c moves y_k by exactly 1: dL/da_k + dL/db_k = FD in c."""
    x = np.array([[1.0, 0.5, -0.3, 2.0]])
    v = np.array([[0.3, -1.2, 0.7, 2.0]])

    def value(c):
        c = ops.convert_to_tensor(np.float64(c) if isinstance(c, float) else c)
        e1, lo, hi = (
            ops.convert_to_tensor(np.array([t], np.float64))
            for t in ((0, 1, 0, 0), (0.05, 0, 0.02, 0), (0.9, 0, 0.9, 0.5))
        )
        lo, hi = lo + c * e1, hi + c * e1
        return ops.sum(bcsoftmax(x, lo, hi) * ops.convert_to_tensor(v))

    _, (total,) = value_and_grad(value, np.float64(0.2))
    total = total / _upstream(())
    fd = (numpy(value(0.2 + 1e-6)) - numpy(value(0.2 - 1e-6))) / 2e-6
    np.testing.assert_allclose(total, fd, atol=1e-8)


def test_no_nan_gradients_in_degenerate_cases():
    cases = [
        ([[0.5, 0.1, -0.2]], [0.2, 0.5, 0.3], [1.0, 1.0, 1.0]),  # sum(a) = 1
        ([[0.5, 0.1, -0.2]], [0.0, 0.0, 0.0], [0.2, 0.5, 0.3]),  # sum(b) = 1
        ([[0.5, 0.1, -0.2]], [0.0, 0.0, 0.1], [0.0, 1.0, 0.1]),  # mask + a == b
        ([[0.0, 0.0, 0.0]], [0.1, 0.1, 0.1], [0.5, 0.5, 0.5]),  # ties
        ([[2.0]], [0.0], [1.0]),  # K = 1
    ]
    for x, a, b in cases:
        x, a, b = _np(x, a, b)
        y, grads = value_and_grad(bcsoftmax, x, a, b, np.float64(1.0), argnums=(0, 1, 2, 3))
        np.testing.assert_allclose(y, REF.bcsoftmax(x, a, b)[0], atol=1e-12)
        for g in grads:
            assert np.isfinite(g).all()


@many_programs
def test_fast_newton_matches_robust_newton_and_falls_back_on_huge_gaps():
    """The default solver (log-free Newton, exp computed once) agrees with the exp-per-step
    robust solver, including rows whose free mass underflows (fallback path)."""

    def tensors(solver):
        return compiled(lambda *t: solver(*[ops.convert_to_tensor(v) for v in t])[0], SOLVER_MODE)

    fast, robust = tensors(impl._solve_newton), tensors(impl._solve_newton_robust)
    rng = np.random.RandomState(21)
    for scale in (1.0, 30.0, 300.0):  # 300: free coordinates far below the max -> fallback
        x, a, b = REF.random_problem(rng, 64, 17, scale=scale)
        x = (x - x.max(-1, keepdims=True)).astype(np.float32)
        a, b = np.minimum(a, 1).astype(np.float32), np.minimum(b, 1).astype(np.float32)
        y_fast = numpy(fast(x, a, b))
        np.testing.assert_allclose(y_fast, numpy(robust(x, a, b)), atol=1e-6)
        np.testing.assert_allclose(y_fast, REF.bcsoftmax(x.astype(float), a, b)[0], atol=1e-5)
