"""Tests for losszoo.ops.bcsoftmax against the spec's numpy oracle, brute force, the paper's
Algorithm 5, scipy SLSQP, finite differences and the spec's golden vectors."""

import numpy as np
import pytest
import tensorflow as tf
from scipy.optimize import minimize
from scipy.special import softmax as np_softmax

from losszoo.ops._bcsoftmax import _SOLVERS, bcsoftmax
from tests.helpers import (
    assert_grad_matches_fd,
    assert_grad_matches_reference,
    assert_xla_matches_eager,
    load_reference,
)

pytestmark = pytest.mark.tensorflow_only(
    reason="tf.GradientTape / tf.function / XLA checks (tests/helpers.py)"
)

REF = load_reference("bcsoftmax")
METHODS = ("newton", "sort", "bisect")


def _f64(*arrays):
    return [tf.constant(np.asarray(a, np.float64)) for a in arrays]


def bcsoftmax_with_state(x, lower=None, upper=None, temperature=1.0, *, method="newton"):
    """Forward only, rows ``[N, K]`` and a scalar temperature: the kernel's solver on the input
    as the kernel prepares it (``x / tau`` shifted by the row max, bounds clamped into
    ``[0, 1]``). Returns ``(y, state)``, state codes 0 free, 1 at lower, 2 at upper."""
    x = tf.convert_to_tensor(x)
    xs = x / tf.cast(temperature, x.dtype)
    xs = xs - tf.reduce_max(xs, -1, keepdims=True)

    def bound(t, high):
        if t is None:
            return None
        return tf.clip_by_value(tf.broadcast_to(tf.cast(t, x.dtype), tf.shape(x)), 0.0, high)

    return _SOLVERS[method](xs, bound(lower, np.inf), bound(upper, 1.0))


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
        (2, 0, 0, 1, 1),
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


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", range(len(GOLDEN)))
def test_golden_vectors(method, case):
    x, a, b, tau, y_want, st_want = GOLDEN[case]
    x, a, b = _f64([x], a, b)
    y = bcsoftmax(x, a, b, tau, method=method).numpy()[0]
    np.testing.assert_allclose(y, y_want, atol=1e-11)
    _, state = bcsoftmax_with_state(x, a, b, tau, method=method)
    np.testing.assert_array_equal(state.numpy()[0], st_want)


def test_golden_fig1_upper_only_is_ubsoftmax():
    y = bcsoftmax(*_f64([[-1.5, 1, -0.5]]), upper=[1, 0.6, 0.5]).numpy()[0]
    np.testing.assert_allclose(y, (0.107576568548, 0.6, 0.292423431452), atol=1e-11)


# ---------------------------------------------------------------- oracle agreement
@pytest.mark.parametrize("method", METHODS)
def test_matches_oracle_thousands_of_random_cases(method):
    """~4600 random feasible rows per method (the paper's recipe) vs the numpy exact solver."""
    rng = np.random.RandomState(1)
    rows, worst = 0, 0.0
    for k in (2, 3, 5, 10, 32, 100):
        for tau in (0.1, 1.0, 10.0):
            x, a, b = REF.random_problem(rng, 256, k, scale=rng.choice([0.5, 3.0, 10.0]))
            y = bcsoftmax(*_f64(x, a, b), tau, method=method).numpy()
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


@pytest.mark.parametrize("method", METHODS)
def test_ties_masks_and_equal_bounds(method):
    """Integer logits (ties), a == b, b == 0 masks, bounds at 0 and 1, K = 2..6."""
    rng = np.random.RandomState(2)
    checked = 0
    for k in (2, 3, 4, 5, 6):
        x, a, b = _tie_heavy(rng, 600, k)
        y = bcsoftmax(*_f64(x, a, b), method=method).numpy()
        y_ref, _ = REF.bcsoftmax(x, a, b)
        np.testing.assert_allclose(y, y_ref, atol=1e-12)
        for i in range(0, len(x), 60):  # brute force over all 3^K state assignments
            np.testing.assert_allclose(y[i], REF.bcsoftmax_bruteforce(x[i], a[i], b[i]), atol=1e-12)
        checked += len(x)
    assert checked > 1000


def test_matches_brute_force_and_paper_algorithm5():
    rng = np.random.RandomState(3)
    for _ in range(60):
        k = rng.randint(2, 7)
        x, a, b = REF.random_problem(rng, 1, k, scale=rng.choice([0.5, 3.0, 10.0]))
        y = bcsoftmax(*_f64(x, a, b)).numpy()[0]
        np.testing.assert_allclose(
            y, REF.bcsoftmax_bruteforce(x[0], a[0], np.minimum(b[0], 1)), atol=1e-12
        )
        np.testing.assert_allclose(y, REF.bcsoftmax_paper_alg5(x[0], a[0], b[0]), atol=1e-12)
    x, a, b = REF.random_problem(rng, 3, 50)
    y = bcsoftmax(*_f64(x, a, b)).numpy()
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


def test_matches_independent_scipy_solver():
    """200 random feasible problems (K = 2..8, incl. ties and bounds at 0/1) vs SLSQP."""
    rng = np.random.RandomState(4)
    worst = 0.0
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
        y = bcsoftmax(*_f64(x, a, b)).numpy()[0]
        worst = max(worst, np.abs(y - _slsqp(x[0], a[0], b[0])).max())
    assert worst < 1e-6, worst


def test_methods_agree_at_large_k():
    rng = np.random.RandomState(5)
    x, a, b = REF.random_problem(rng, 4, 4096)
    ys = [bcsoftmax(*_f64(x, a, b), 0.5, method=m).numpy() for m in METHODS]
    y_ref, _ = REF.bcsoftmax(x, a, b, 0.5)
    for y in ys:
        np.testing.assert_allclose(y, y_ref, atol=1e-13)


def test_k_100000_float32():
    rng = np.random.RandomState(6)
    x, a, b = REF.random_problem(rng, 2, 100_000)
    y = bcsoftmax(x.astype(np.float32), a.astype(np.float32), b.astype(np.float32)).numpy()
    y_ref, _ = REF.bcsoftmax(
        x.astype(np.float32).astype(float), a.astype(np.float32), b.astype(np.float32)
    )
    assert y.dtype == np.float32
    assert np.abs(y - y_ref).max() < 1e-6
    np.testing.assert_allclose(y.sum(-1), 1.0, atol=1e-4)
    # upper-only at K = 1e5
    y2 = bcsoftmax(tf.constant(x, tf.float32), upper=2e-4).numpy()
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
        y = bcsoftmax(*_f64(x), lower, upper, 0.7).numpy()
        np.testing.assert_allclose(y, want, atol=1e-14)
    y32 = bcsoftmax(x.astype(np.float32), 0.0, 1.0).numpy()
    np.testing.assert_allclose(y32, np_softmax(x, -1), atol=1e-6)
    _, state = bcsoftmax_with_state(x, 0.0, 1.0)
    assert (state.numpy() == 0).all()


def test_invariances():
    rng = np.random.RandomState(8)
    x, a, b = REF.random_problem(rng, 50, 10)
    base = bcsoftmax(*_f64(x, a, b)).numpy()
    # shift invariance
    np.testing.assert_allclose(bcsoftmax(*_f64(x + 123.0, a, b)).numpy(), base, atol=1e-12)
    # temperature is a logit scale: (x, tau) == (x / tau, 1)
    for tau in (0.3, 2.0):
        np.testing.assert_allclose(bcsoftmax(*_f64(x * tau, a, b), tau).numpy(), base, atol=1e-12)
    # per-example temperature [N, 1]
    taus = rng.uniform(0.2, 3, (50, 1))
    np.testing.assert_allclose(
        bcsoftmax(*_f64(x * taus, a, b), tf.constant(taus)).numpy(), base, atol=1e-12
    )
    # permutation equivariance
    perm = rng.permutation(10)
    y_perm = bcsoftmax(*_f64(x[:, perm], a[:, perm], b[:, perm])).numpy()
    np.testing.assert_allclose(y_perm, base[:, perm], atol=1e-12)
    # batch independence
    np.testing.assert_allclose(
        bcsoftmax(*_f64(x[7:9], a[7:9], b[7:9])).numpy(), base[7:9], atol=1e-15
    )


def test_broadcasting_and_axis():
    rng = np.random.RandomState(9)
    x = rng.normal(0, 3, (6, 8))
    a1 = rng.uniform(0, 1 / 8, (6, 1))
    b1 = rng.uniform(1 / 8, 1, (6, 1))
    y = bcsoftmax(*_f64(x, a1, b1)).numpy()
    np.testing.assert_allclose(
        y, bcsoftmax(*_f64(x, np.tile(a1, 8), np.tile(b1, 8))).numpy(), atol=1e-15
    )
    np.testing.assert_allclose(y, REF.bcsoftmax(x, a1, b1)[0], atol=1e-12)
    # per-class vector and scalar bounds
    av = rng.uniform(0, 0.1, 8)
    np.testing.assert_allclose(
        bcsoftmax(*_f64(x, av), upper=0.4).numpy(), REF.bcsoftmax(x, av, 0.4)[0], atol=1e-12
    )
    # class axis 1 of a rank-3 tensor
    x3 = rng.normal(0, 2, (3, 8, 4))
    a3 = rng.uniform(0, 0.05, (3, 8, 4))
    y3 = bcsoftmax(*_f64(x3, a3), upper=0.5, axis=1).numpy()
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
        bcsoftmax(*_f64(x[0]), upper=0.4).numpy(), REF.bcsoftmax(x[:1], 0.0, 0.4)[0][0], atol=1e-12
    )


def test_theorem7_uniform_bounds_are_clipped_logits_and_order_preserved():
    rng = np.random.RandomState(10)
    x = rng.normal(0, 3, (100, 20))
    a = rng.rand(100, 1) / 20
    b = 1 / 20 + (1 - 1 / 20) * rng.rand(100, 1)
    y, st = bcsoftmax_with_state(*_f64(x, a, b))
    y, st = y.numpy(), st.numpy()
    f = np.argmax(st == 0, -1)
    nu = np.take_along_axis(x, f[:, None], -1) - np.log(np.take_along_axis(y, f[:, None], -1))
    np.testing.assert_allclose(
        np_softmax(np.clip(x, np.log(a) + nu, np.log(b) + nu), -1), y, atol=1e-12
    )
    ys = np.take_along_axis(y, np.argsort(x, -1), -1)
    assert (np.diff(ys, axis=-1) >= -1e-15).all()
    # upper bound 1: argmax unchanged
    y1 = bcsoftmax(*_f64(x, a), upper=1.0).numpy()
    np.testing.assert_array_equal(y1.argmax(-1), x.argmax(-1))


# ---------------------------------------------------------------- degenerate inputs (spec 7.9)
def test_degenerate_cases():
    rng = np.random.RandomState(11)
    x = rng.normal(0, 3, (4, 5))
    a = rng.dirichlet(np.ones(5), 4)  # sum(a) == 1  -> y = a
    np.testing.assert_allclose(bcsoftmax(*_f64(x, a), upper=1.0).numpy(), a, atol=1e-12)
    np.testing.assert_allclose(bcsoftmax(*_f64(x), upper=tf.constant(a)).numpy(), a, atol=1e-12)
    # a_k == b_k pins the coordinate
    lo = np.full((4, 5), 0.02)
    hi = np.full((4, 5), 0.9)
    lo[:, 2] = hi[:, 2] = 0.3
    y = bcsoftmax(*_f64(x, lo, hi)).numpy()
    np.testing.assert_allclose(y[:, 2], 0.3, atol=1e-15)
    np.testing.assert_allclose(y, REF.bcsoftmax(x, lo, hi)[0], atol=1e-12)
    # a_k = b_k = 0 masks class k; the rest equals BCSoftmax on the other classes
    lo2, hi2 = np.full((4, 5), 0.01), np.full((4, 5), 0.6)
    lo2[:, 1] = hi2[:, 1] = 0.0
    y = bcsoftmax(*_f64(x, lo2, hi2)).numpy()
    assert (y[:, 1] == 0).all()
    keep = [0, 2, 3, 4]
    np.testing.assert_allclose(y[:, keep], REF.bcsoftmax(x[:, keep], 0.01, 0.6)[0], atol=1e-12)
    # K = 1
    np.testing.assert_allclose(bcsoftmax(*_f64([[3.0], [-2.0]]), 0.0, 1.0).numpy(), [[1.0], [1.0]])
    np.testing.assert_allclose(bcsoftmax(*_f64([[3.0]])).numpy(), [[1.0]])
    # equal logits, uniform bounds -> uniform output
    np.testing.assert_allclose(
        bcsoftmax(*_f64(np.zeros((2, 7))), 0.05, 0.5).numpy(), 1 / 7, atol=1e-15
    )


def test_huge_and_minus_inf_logits():
    x = np.array([[1e4, 0.0, -1e4, 3.0], [3e38, 1e38, -3e38, 0.0]], np.float32)
    y = bcsoftmax(x, 0.01, 0.7).numpy()  # the default method also survives gaps near float max
    assert np.isfinite(y).all()
    want0 = REF.bcsoftmax(x[:1].astype(float), 0.01, 0.7)[0][0]
    np.testing.assert_allclose(want0, [0.7, 0.29 / (1 + np.e**3), 0.01, 0.29 / (1 + np.e**-3)])
    np.testing.assert_allclose(y, [want0, [0.7, 0.28, 0.01, 0.01]], atol=1e-6)
    for method in METHODS:
        y = bcsoftmax(x[:1].astype(float) * 10, 0.01, 0.7, 10.0, method=method).numpy()
        np.testing.assert_allclose(y, [want0], atol=1e-5)
    # -inf logits: forced to the lower bound (0 without one), no NaN in values or gradients
    xm = tf.constant([[-np.inf, 1.0, 0.0, -np.inf]], tf.float64)
    for lower, want0 in ((None, 0.0), (0.1, 0.1)):
        with tf.GradientTape() as tape:
            tape.watch(xm)
            y = bcsoftmax(xm, lower, 0.8)
            out = tf.reduce_sum(y * [[1.0, 2.0, 3.0, 4.0]])
        g = tape.gradient(out, xm)
        assert y.numpy()[0, 0] == want0 and y.numpy()[0, 3] == want0
        np.testing.assert_allclose(y.numpy().sum(), 1.0, atol=1e-12)
        assert np.isfinite(g.numpy()).all()
    ref = REF.bcsoftmax(np.array([[1.0, 0.0]]), 0.1, 0.8)[0][0] * 0.8
    np.testing.assert_allclose(bcsoftmax(xm, 0.1, 0.8).numpy()[0, 1:3], ref, atol=1e-12)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_half_precision_computed_in_float32(dtype):
    rng = np.random.RandomState(12)
    x, a, b = REF.random_problem(rng, 16, 12)
    xh = tf.cast(x, dtype)
    y = bcsoftmax(xh, tf.cast(a, dtype), tf.cast(b, dtype))
    assert y.dtype == dtype
    want, _ = REF.bcsoftmax(
        tf.cast(xh, tf.float64).numpy(),
        tf.cast(tf.cast(a, dtype), tf.float64),
        np.minimum(tf.cast(tf.cast(b, dtype), tf.float64).numpy(), 1),
    )
    tol = 1e-3 if dtype == tf.float16 else 8e-3
    np.testing.assert_allclose(tf.cast(y, tf.float64).numpy(), want, atol=tol)


def test_float32_accuracy_against_float64():
    rng = np.random.RandomState(13)
    x, a, b = REF.random_problem(rng, 32, 4096)
    y64, _ = REF.bcsoftmax(x, a, b)
    y32 = bcsoftmax(x.astype(np.float32), a.astype(np.float32), b.astype(np.float32)).numpy()
    assert np.abs(y32 - y64).max() < 2e-7
    y32t = bcsoftmax(x.astype(np.float32), a.astype(np.float32), b.astype(np.float32), 0.1).numpy()
    assert np.abs(y32t - REF.bcsoftmax(x, a, b, 0.1)[0]).max() < 5e-6
    # output within the box exactly (final clip) and sums to 1
    assert (y32 >= a.astype(np.float32)).all() and (
        y32 <= np.minimum(b.astype(np.float32), 1)
    ).all()
    np.testing.assert_allclose(y32.sum(-1), 1.0, atol=1e-5)


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

    # constants inside a compiled graph are also checked (at trace time)
    @tf.function(jit_compile=True)
    def g(t):
        return bcsoftmax(t, lower=tf.constant(0.5))

    with pytest.raises(ValueError, match="sum"):
        g(tf.constant(x))


def test_infeasible_rows_are_nan_in_compiled_graphs():
    @tf.function(jit_compile=True)
    def g(t, lo, hi):
        return bcsoftmax(t, lo, hi)

    x = tf.zeros((4, 3))
    lo = tf.constant([[0.1] * 3, [0.5] * 3, [0.1] * 3, [0.2, 0.6, 0.1]])
    hi = tf.constant([[0.9] * 3, [0.9] * 3, [0.3] * 3, [0.9, 0.5, 0.9]])
    y = g(x, lo, hi).numpy()
    np.testing.assert_allclose(y[0], 1 / 3, atol=1e-6)
    assert np.isnan(y[1]).all() and np.isnan(y[2]).all() and np.isnan(y[3]).all()


# ---------------------------------------------------------------- gradients (spec section 3)
def _away_from_kinks(rng, n, k):
    x, a, b = REF.random_problem(rng, n, k)
    a = a + 1e-3
    b = np.minimum(np.maximum(b, a + 1e-3), 1.0)
    a = a * np.minimum(1, 0.95 / a.sum(1, keepdims=True))
    return x, a, b


def test_gradients_match_finite_differences():
    rng = np.random.RandomState(14)
    x, a, b = _away_from_kinks(rng, 3, 6)
    _, st = REF.bcsoftmax(x, a, b, 0.7)
    assert (st == 0).any() and (st == 1).any() and (st == 2).any()
    tau = np.array([0.7])
    # tf.function (graph, not XLA) only to make the many FD evaluations fast
    full = tf.function(lambda x, a, b, t: bcsoftmax(x, a, b, t))
    assert_grad_matches_fd(full, [x, a, b, tau], wrt=(0, 1, 2, 3), atol=1e-7, rtol=1e-5)
    # per-example uniform bounds [N, 1] and per-example temperature
    a1 = np.full((3, 1), 0.05)
    b1 = np.full((3, 1), 0.45)
    t1 = np.array([[0.5], [1.0], [2.0]])
    assert_grad_matches_fd(full, [x, a1, b1, t1], wrt=(0, 1, 2, 3), atol=1e-7, rtol=1e-5)
    # upper-only / lower-only
    assert_grad_matches_fd(
        tf.function(lambda x, b: bcsoftmax(x, upper=b)), [x, b], wrt=(0, 1), atol=1e-7
    )
    assert_grad_matches_fd(
        tf.function(lambda x, a: bcsoftmax(x, lower=a)), [x, a], wrt=(0, 1), atol=1e-7
    )


def test_worked_gradient_example():
    x, a, b = _f64([[3, 1, 0, -1, -4]], [0, 0.1, 0, 0.05, 0.1], [0.5, 0.3, 1, 1, 1])
    with tf.GradientTape() as tape:
        tape.watch([x, a, b])
        loss = -tf.math.log(bcsoftmax(x, a, b)[0, 1])
    gx, ga, gb = tape.gradient(loss, [x, a, b])
    np.testing.assert_allclose(gx.numpy()[0], [0, -0.26894142, 0.26894142, 0, 0], atol=1e-8)
    np.testing.assert_allclose(ga.numpy(), [0, 0, 0, 1 / 0.35, 1 / 0.35], atol=1e-8)
    np.testing.assert_allclose(gb.numpy(), [1 / 0.35, 0, 0, 0, 0], atol=1e-8)


def test_gradient_matches_autodiff_through_closed_form_and_oracle_vjp():
    rng = np.random.RandomState(15)
    x, a, b = REF.random_problem(rng, 16, 9)
    b = np.minimum(b, 1.0)
    tau = np.array(0.8)

    def closed_form(x, a, b, t):
        _, state = bcsoftmax_with_state(x, a, b, t)
        state = tf.stop_gradient(state)
        xs = x / t
        xs = xs - tf.stop_gradient(tf.reduce_max(xs, -1, keepdims=True))
        free = tf.equal(state, 0)
        lower, upper = tf.equal(state, 1), tf.equal(state, 2)
        s = 1.0 - tf.reduce_sum(
            tf.where(lower, a, 0.0) + tf.where(upper, b, 0.0), -1, keepdims=True
        )
        xf = tf.where(free, xs, -1e300)
        yf = s * tf.exp(xf - tf.reduce_logsumexp(xf, -1, keepdims=True))
        return tf.where(lower, a, tf.where(upper, b, yf))

    assert_grad_matches_reference(
        lambda x, a, b, t: bcsoftmax(x, a, b, t),
        closed_form,
        [x, a, b, tau],
        wrt=(0, 1, 2, 3),
        atol=1e-10,
    )
    # against the spec's numpy VJP
    v = rng.normal(size=x.shape)
    xt, at, bt = _f64(x, a, b)
    with tf.GradientTape() as tape:
        tape.watch([xt, at, bt])
        y = bcsoftmax(xt, at, bt, 0.8)
        loss = tf.reduce_sum(y * v)
    got = tape.gradient(loss, [xt, at, bt])
    y_ref, st = REF.bcsoftmax(x, a, b, 0.8)
    for g, w in zip(got, REF.bcsoftmax_vjp(y_ref, st, v, 0.8)):
        np.testing.assert_allclose(g.numpy(), w, atol=1e-12)


def test_gradient_identities_and_broadcast_reduction():
    rng = np.random.RandomState(16)
    x, a, b = REF.random_problem(rng, 8, 7)
    xt, at, bt, tt = _f64(x, a, np.minimum(b, 1), 1.3)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([xt, at, bt, tt])
        y = bcsoftmax(xt, at, bt, tt)
        ones = tf.reduce_sum(y)
        lin = tf.reduce_sum(y * rng.normal(size=x.shape))
    for g in tape.gradient(ones, [xt, at, bt, tt]):  # v = 1 gives zero gradients
        np.testing.assert_allclose(g.numpy(), 0.0, atol=1e-12)
    gx, gt = tape.gradient(lin, [xt, tt])
    np.testing.assert_allclose(gx.numpy().sum(-1), 0.0, atol=1e-12)  # sum dL/dx = 0
    xs = x - x.max(-1, keepdims=True)
    np.testing.assert_allclose(gt.numpy(), -(xs * gx.numpy()).sum() / 1.3, atol=1e-12)
    # broadcast [N,1] bounds get the row sums of the [N,K] gradients
    a1, b1 = np.full((8, 1), 0.03), np.full((8, 1), 0.4)
    v = rng.normal(size=x.shape)
    grads = []
    for lo, hi in ((a1, b1), (np.tile(a1, 7), np.tile(b1, 7))):
        lo, hi = _f64(lo, hi)
        with tf.GradientTape() as tape:
            tape.watch([lo, hi])
            out = tf.reduce_sum(bcsoftmax(xt, lo, hi) * v)
        grads.append([g.numpy() for g in tape.gradient(out, [lo, hi])])
    np.testing.assert_allclose(grads[0][0], grads[1][0].sum(-1, keepdims=True), atol=1e-12)
    np.testing.assert_allclose(grads[0][1], grads[1][1].sum(-1, keepdims=True), atol=1e-12)
    # a scalar bound gets the total
    with tf.GradientTape() as tape:
        s = tf.constant(0.4, tf.float64)
        tape.watch(s)
        out = tf.reduce_sum(bcsoftmax(xt, upper=s) * v)
    assert tape.gradient(out, s).shape == ()


def test_equal_bounds_not_double_counted():
    """With a_k = b_k = c, moving c moves y_k by exactly 1: dL/da_k + dL/db_k = FD in c."""
    x = tf.constant([[1.0, 0.5, -0.3, 2.0]], tf.float64)
    v = tf.constant([[0.3, -1.2, 0.7, 2.0]], tf.float64)

    def value(c):
        lo = tf.stack([0.05, c, 0.02, 0.0])[None]
        hi = tf.stack([0.9, c, 0.9, 0.5])[None]
        return tf.reduce_sum(bcsoftmax(x, lo, hi) * v), lo, hi

    c = tf.constant(0.2, tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(c)
        out, lo, hi = value(c)
    total = tape.gradient(out, c).numpy()
    fd = (value(c + 1e-6)[0] - value(c - 1e-6)[0]).numpy() / 2e-6
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
        xt, at, bt, tt = _f64(x, a, b, 1.0)
        with tf.GradientTape() as tape:
            tape.watch([xt, at, bt, tt])
            y = bcsoftmax(xt, at, bt, tt)
            out = tf.reduce_sum(y * tf.range(1.0, xt.shape[-1] + 1.0, dtype=tf.float64))
        y_ref, _ = REF.bcsoftmax(np.array(x), np.array(a), np.array(b))
        np.testing.assert_allclose(y.numpy(), y_ref, atol=1e-12)
        for g in tape.gradient(out, [xt, at, bt, tt]):
            assert np.isfinite(g.numpy()).all()


# ---------------------------------------------------------------- XLA
@pytest.mark.parametrize("method", ["newton", "sort"])
def test_xla_matches_eager(method):
    rng = np.random.RandomState(17)
    x, a, b = REF.random_problem(rng, 32, 20)
    args = [tf.constant(t, tf.float32) for t in (x, a, np.minimum(b, 1))] + [tf.constant(0.9)]
    assert_xla_matches_eager(
        lambda x, a, b, t: bcsoftmax(x, a, b, t, method=method),
        *args,
        atol=2e-6,
        rtol=1e-5,
        grad_wrt=(0, 1, 2, 3),
    )


def test_dynamic_batch_compiles_once():
    traces = []

    @tf.function(jit_compile=True, input_signature=[tf.TensorSpec([None, 16], tf.float32)])
    def f(x):
        traces.append(1)
        return bcsoftmax(x, 0.01, 0.3)

    rng = np.random.RandomState(18)
    for n in (1, 33):
        x = rng.normal(0, 3, (n, 16)).astype(np.float32)
        np.testing.assert_allclose(f(x).numpy(), REF.bcsoftmax(x, 0.01, 0.3)[0], atol=1e-6)
    assert len(traces) == 1

    with pytest.raises(ValueError, match="static"):
        tf.function(
            lambda t: bcsoftmax(t), input_signature=[tf.TensorSpec([2, None], tf.float32)]
        ).get_concrete_function()


def test_fast_newton_matches_robust_newton_and_falls_back_on_huge_gaps():
    """The default solver (log-free Newton, exp computed once) agrees with the exp-per-step
    robust solver, including rows whose free mass underflows (fallback path)."""
    from losszoo.ops import _bcsoftmax as impl

    rng = np.random.RandomState(21)
    for scale in (1.0, 30.0, 300.0):  # 300: free coordinates far below the max -> fallback
        x, a, b = REF.random_problem(rng, 64, 17, scale=scale)
        x = (x - x.max(-1, keepdims=True)).astype(np.float32)
        a, b = np.minimum(a, 1).astype(np.float32), np.minimum(b, 1).astype(np.float32)
        args = [tf.constant(t) for t in (x, a, b)]
        y_fast, s_fast = impl._solve_newton(*args)
        y_rob, _ = impl._solve_newton_robust(*args)
        np.testing.assert_allclose(y_fast.numpy(), y_rob.numpy(), atol=1e-6)
        np.testing.assert_allclose(
            y_fast.numpy(), REF.bcsoftmax(x.astype(float), a, b)[0], atol=1e-5
        )


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
    graph = tf.function(lambda x, t: bcsoftmax(x, **{name: t}))
    with pytest.raises(ValueError, match=f"`{name}`"):
        graph(tf.constant(x), tf.constant(np.asarray(bounds[name], np.float32)))
