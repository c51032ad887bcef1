"""Safe-KL DRO risk ops against the float64 numpy reference (spec safe_kl_dro.md section 7)."""

import math

import numpy as np
import pytest
import tensorflow as tf

from losszoo import ops
from tests.helpers import (
    assert_grad_matches_fd,
    assert_grad_matches_reference,
    assert_xla_matches_eager,
    load_reference,
)

pytestmark = pytest.mark.tensorflow_only(
    reason="tf.GradientTape / tf.function / XLA checks (tests/helpers.py); tf.distribute"
)

R = load_reference("safe_kl_dro")


def _risk_grads(l, a, lam, rho, s=None, calibrate=True):
    lt = tf.constant(l)
    at = tf.constant(a, lt.dtype)
    with tf.GradientTape() as tape:
        tape.watch([lt, at])
        v, stats = ops.safe_kl_dro_risk_and_stats(lt, at, lam, rho, s, calibrate=calibrate)
    gl, ga = tape.gradient(v, [lt, at])
    return v.numpy(), gl.numpy(), ga.numpy(), {k: x.numpy() for k, x in stats.items()}


# ----------------------------------------------------------------------------- C8 value/grad
def test_value_and_gradients_match_reference_weighted():
    rng = np.random.default_rng(1)
    for _ in range(25):
        n = int(rng.integers(1, 60))
        l = rng.gamma(2.0, size=n) * rng.uniform(0.1, 5) - 1.0
        s = rng.uniform(0.0, 2.0, size=n)
        s[0] = max(s[0], 0.1)
        lam, rho = rng.uniform(0.1, 5), 10 ** rng.uniform(-4, -0.05)
        a = float(rng.normal() * 3)
        v, gl, ga, st = _risk_grads(l, a, lam, rho, s)
        vr, glr, gar = R.safe_risk(l, a, lam, rho, p_hat=s)
        np.testing.assert_allclose(v, vr, rtol=1e-13, atol=1e-12)
        np.testing.assert_allclose(gl, glr, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(ga, gar, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(st["grad_alpha"], gar, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(st["mean_w"], 1.0 - gar, rtol=1e-12, atol=1e-13)
        w = R.safe_terms(l, a, lam, rho)[1]
        np.testing.assert_allclose(st["saturation"], rho * w[s > 0].max(), rtol=1e-12)
    # calibrate=False is the paper's G = V + lam; same gradients
    v2, gl2, _ga2, _ = _risk_grads(l, a, lam, rho, s, calibrate=False)
    np.testing.assert_allclose(v2, vr + lam, rtol=1e-13)
    np.testing.assert_allclose(gl2, glr, rtol=1e-12, atol=1e-15)


def test_gradients_match_finite_differences_and_autodiff():
    rng = np.random.default_rng(2)
    l, s = rng.gamma(2.0, size=12) * 2, rng.uniform(0.1, 2, size=12)

    # alpha as a [1] array (the FD helper perturbs array entries)
    def f(l, a):
        return ops.safe_kl_dro_risk(l, a[0], 1.3, 0.05, s)

    def plain(l, a):  # autodiff through the plain formula
        a = a[0]
        z = (l - a) / 1.3 + math.log(0.05)
        return a - 1.3 + 1.3 / 0.05 * tf.reduce_sum(s * tf.math.softplus(z)) / s.sum()

    assert_grad_matches_fd(f, [l, np.array([2.0])], wrt=(0, 1), rtol=1e-4, atol=1e-7)
    assert_grad_matches_reference(
        f, plain, [l, np.array([2.0])], wrt=(0, 1), atol=1e-12, rtol=1e-12
    )
    for fn in (lambda l: ops.kl_dro_batch_lse(l, 0.7, s), lambda l: ops.kl_dro_sumexp(l, 3.0, s)):
        assert_grad_matches_fd(fn, [l], rtol=1e-4, atol=1e-7)
    # CVaR: gradient q/rho, checked away from kinks (distinct losses, rho*n not integer)
    assert_grad_matches_fd(lambda l: ops.cvar_risk(l, 0.23, s), [l], rtol=1e-4, atol=1e-7)


def test_xla_matches_eager_all_ops():
    rng = np.random.default_rng(3)
    l = tf.constant(rng.gamma(2.0, size=33).astype(np.float32))
    s = tf.constant(rng.uniform(0, 2, size=33).astype(np.float32))
    a = tf.constant(1.5)
    assert_xla_matches_eager(
        lambda l, a, s: (
            ops.safe_kl_dro_risk_and_stats(l, a, 1.0, 0.1, s),
            ops.kl_dro_batch_lse(l, 2.0, s),
            ops.kl_dro_sumexp(l, 2.0, s),
            ops.cvar_risk(l, 0.2, s),
            tf.stop_gradient(ops.safe_kl_dro_solve_alpha(l, 1.0, 0.1, s)),
        ),
        l,
        a,
        s,
        grad_wrt=(0, 1),
        rtol=1e-5,
    )


def test_float32_matches_float64():  # C9
    rng = np.random.default_rng(4)
    for _ in range(20):
        l = rng.gamma(2.0, size=40) * 3
        lam, rho, a = rng.uniform(0.2, 5), 10 ** rng.uniform(-4, -0.1), rng.normal() * 2 + 5
        v64, g64, _ga64, _ = _risk_grads(l, a, lam, rho)
        v32, g32, _ga32, _ = _risk_grads(l.astype(np.float32), a, lam, rho)
        assert abs(v32 - v64) <= 1e-5 * max(1.0, abs(v64))
        assert np.max(np.abs(g32 - g64)) <= 1e-5 * np.max(np.abs(g64)) + 1e-7


# ----------------------------------------------------------------------------- C10 overflow
@pytest.mark.parametrize("big", [95.0, 1e4, 1e6])
def test_overflow_safe_float32(big):
    l = tf.constant([big, big, 1.0, 2.0], tf.float32)
    naive = tf.math.log(tf.reduce_mean(tf.exp(l)))
    assert not np.isfinite(naive.numpy())
    v, gl, ga, st = _risk_grads(l.numpy(), 0.0, 1.0, 0.1)
    assert np.isfinite(v) and np.all(np.isfinite(gl)) and np.isfinite(ga)
    np.testing.assert_allclose(gl[:2] * 4, 1 / 0.1, rtol=1e-6)  # w = 1/rho, pi = 1/4
    # value grows linearly: (lam/rho) * mean(z) for the saturated entries
    want = R.safe_risk(l.numpy().astype(np.float64), 0.0, 1.0, 0.1)[0]
    np.testing.assert_allclose(v, want, rtol=1e-6)
    np.testing.assert_allclose(st["saturation"], 1.0, rtol=1e-6)
    assert np.isfinite(ops.kl_dro_batch_lse(l, 1.0).numpy())


# ----------------------------------------------------------------------------- bounds, alpha*
def test_solve_alpha_and_stationarity():
    rng = np.random.default_rng(5)
    for _ in range(20):
        n = int(rng.integers(1, 150))
        l = rng.gamma(2.0, size=n) * rng.uniform(0.1, 5)
        s = rng.uniform(0.1, 2, size=n)
        lam, rho = rng.uniform(0.1, 5), 10 ** rng.uniform(-5, -0.05)
        a = ops.safe_kl_dro_solve_alpha(tf.constant(l), lam, rho, s).numpy()
        np.testing.assert_allclose(a, R.solve_alpha(l, lam, rho, s), atol=1e-9 * max(1, abs(a)))
        _, _, ga, st = _risk_grads(l, float(a), lam, rho, s)
        assert abs(ga) < 1e-8 and abs(st["mean_w"] - 1) < 1e-8  # sum pi w = 1 at alpha*
    # C2 closed forms for constant losses
    for rho in (1e-3, 0.1, 0.5):
        const = tf.fill([7], tf.constant(1.3, tf.float64))
        a = ops.safe_kl_dro_solve_alpha(const, 2.0, rho).numpy()
        np.testing.assert_allclose(a, 1.3 + 2.0 * math.log1p(-rho), atol=1e-9)
        v = ops.safe_kl_dro_risk(tf.fill([7], tf.constant(1.3, tf.float64)), a, 2.0, rho).numpy()
        np.testing.assert_allclose(v, 1.3 - 2.0 * R.f_rho(1.0, rho), atol=1e-12)


def test_min_over_alpha_sandwich_and_rho_limit():
    """R - lam rho n max p* <= min_alpha V <= R, min V -> R as rho -> 0 (spec 4, C3, C4)."""
    rng = np.random.default_rng(6)
    for _ in range(40):
        n = int(rng.integers(1, 200))
        lam = rng.uniform(0.1, 5)
        l = rng.gamma(2.0, size=n) * rng.uniform(0.1, 5)
        rho = 10 ** rng.uniform(-6, -0.01)
        lt = tf.constant(l)
        a = ops.safe_kl_dro_solve_alpha(lt, lam, rho)
        v = ops.safe_kl_dro_risk(lt, a, lam, rho).numpy()
        # a grid of other alphas never goes below the minimum (convex in alpha)
        others = [
            ops.safe_kl_dro_risk(lt, a + d, lam, rho).numpy() for d in (-1.0, -1e-3, 1e-3, 1.0)
        ]
        assert min(others) >= v - 1e-12 * max(1, abs(v))
        r = R.exact_risk(l, lam)
        p = R.gibbs_weights(l, lam)
        assert v <= r + 1e-9
        if rho * n * p.max() < 1:
            assert r - lam * rho * n * p.max() - 1e-9 <= v
    # rho -> 0: (R - V*)/rho -> (lam/2) n sum p*^2 (C4), and V* increases to R
    l = rng.gamma(2.0, size=1000)
    p = R.gibbs_weights(l, 1.0)
    slope = 0.5 * l.size * np.sum(p**2)
    gaps = []
    for rho in (1e-2, 1e-4, 1e-6):
        a = ops.safe_kl_dro_solve_alpha(tf.constant(l), 1.0, rho)
        gaps.append(
            R.exact_risk(l, 1.0) - ops.safe_kl_dro_risk(tf.constant(l), a, 1.0, rho).numpy()
        )
    assert gaps[0] > gaps[1] > gaps[2] > 0
    assert abs(gaps[2] / 1e-6 - slope) / slope < 1e-3


def test_cvar_matches_rockafellar_uryasev_and_is_the_lam_to_zero_limit():  # C5
    rng = np.random.default_rng(7)
    for _ in range(20):
        n = int(rng.integers(1, 80))
        l = rng.normal(size=n) * 3
        s = rng.uniform(0.1, 2, size=n)
        rho = rng.uniform(0.01, 0.99)
        pi = s / s.sum()
        brute = min(a + np.sum(pi * np.maximum(l - a, 0)) / rho for a in l)  # eq. 9
        np.testing.assert_allclose(ops.cvar_risk(tf.constant(l), rho, s).numpy(), brute, rtol=1e-12)
        np.testing.assert_allclose(
            ops.cvar_risk(tf.constant(l), rho).numpy(), R.cvar(l, rho), rtol=1e-12
        )
        lam = 10 ** rng.uniform(-3, 1)
        lt = tf.constant(l)
        v = ops.safe_kl_dro_risk(lt, ops.safe_kl_dro_solve_alpha(lt, lam, rho), lam, rho).numpy()
        c = R.cvar(l, rho)
        low, high = c + lam * (math.log(rho) - 1), c + lam * (math.log(rho) - 1 + 1 / rho)
        assert low - 1e-8 <= v <= high + 1e-8
    l = rng.normal(size=300)
    lt = tf.constant(l)
    lam = 1e-4
    v = ops.safe_kl_dro_risk(lt, ops.safe_kl_dro_solve_alpha(lt, lam, 0.05), lam, 0.05).numpy()
    assert abs(v - R.cvar(l, 0.05)) < 2e-3


def test_baselines_match_reference():
    rng = np.random.default_rng(8)
    l, s = rng.gamma(2.0, size=30) * 4, rng.uniform(0.1, 2, size=30)
    lt = tf.constant(l)
    np.testing.assert_allclose(
        ops.kl_dro_batch_lse(lt, 0.8, s).numpy(), R.exact_risk(l, 0.8, s), rtol=1e-13
    )
    with tf.GradientTape() as tape:
        tape.watch(lt)
        v = ops.kl_dro_batch_lse(lt, 0.8, s)
    np.testing.assert_allclose(tape.gradient(v, lt).numpy(), R.gibbs_weights(l, 0.8, s), rtol=1e-12)
    pi = s / s.sum()
    np.testing.assert_allclose(
        ops.kl_dro_sumexp(lt, 3.0, s).numpy(), np.sum(pi * np.exp(l / 3.0)), rtol=1e-13
    )
    # huge losses: batch LSE finite (max-shift), sum-of-exp overflows by design
    big = tf.constant([500.0, 1.0])
    assert np.isfinite(ops.kl_dro_batch_lse(big, 1.0).numpy())
    assert np.isinf(ops.kl_dro_sumexp(big, 1.0).numpy())


# ----------------------------------------------------------------------------- C6 Monte Carlo
def test_minibatch_gradient_unbiased_naive_biased():
    """Fixed theta, alpha: the safe-KL batch gradient (from the op) averages to the full-data
    gradient; the naive batch-LSE gradient is far off on the same batches (spec C6)."""
    rng = np.random.default_rng(0)
    n, d, lam, rho, B, K = 2000, 5, 2.0, 1e-3, 10, 6000
    X = rng.normal(size=(n, d))
    y = X @ rng.normal(size=d) + rng.standard_t(3, size=n)
    th = rng.normal(size=d) * 0.3
    alpha = R.solve_alpha((y - X @ th) ** 2, lam, rho) + 0.3
    idx = np.stack([rng.choice(n, B, replace=False) for _ in range(K)])
    Xb, yb = tf.constant(X[idx]), tf.constant(y[idx])
    theta = tf.constant(th)

    @tf.function
    def grads(op):
        def one(args):
            xb, ybb = args
            a = tf.constant(alpha, tf.float64)
            with tf.GradientTape() as tape:
                tape.watch([theta, a])
                losses = (ybb - tf.linalg.matvec(xb, theta)) ** 2
                v = op(losses, a)
            g_t, g_a = tape.gradient(v, [theta, a], unconnected_gradients="zero")
            return tf.concat([g_t, [g_a]], 0), v

        return tf.map_fn(
            one, (Xb, yb), fn_output_signature=(tf.float64, tf.float64), parallel_iterations=64
        )

    gs, vs = grads(lambda l, a: ops.safe_kl_dro_risk(l, a, lam, rho))
    gs, vs = gs.numpy(), vs.numpy()
    res = y - X @ th
    w = R.safe_terms(res**2, alpha, lam, rho)[1]
    full = np.append(np.mean((w * -2 * res)[:, None] * X, 0), 1 - w.mean())
    zs = (gs.mean(0) - full) / (gs.std(0) / math.sqrt(K))
    assert np.max(np.abs(zs)) < 4.5, zs
    v_full = R.safe_risk(res**2, alpha, lam, rho)[0]
    assert abs(vs.mean() - v_full) < 4.5 * vs.std() / math.sqrt(K)

    gn, vn = grads(lambda l, a: ops.kl_dro_batch_lse(l, lam) + 0.0 * a)
    gn, vn = gn.numpy()[:, :d], vn.numpy()
    full_r = np.sum((R.gibbs_weights(res**2, lam) * -2 * res)[:, None] * X, 0)
    zn = (gn.mean(0) - full_r) / (gn.std(0) / math.sqrt(K))
    assert np.max(np.abs(zn)) > 10, zn
    assert vn.mean() < R.exact_risk(res**2, lam)  # Jensen: the naive value is biased low


# ----------------------------------------------------------------------------- streaming exact
def test_streaming_exact_risk_matches_full_data():
    rng = np.random.default_rng(9)
    l = np.concatenate([rng.gamma(2.0, size=100), [3e4]])  # one huge loss: no overflow
    s = rng.uniform(0, 2, size=l.size)
    s[-1] = 1.0
    state = (
        tf.constant(-np.inf, tf.float64),
        tf.constant(0.0, tf.float64),
        tf.constant(0.0, tf.float64),
    )
    for chunk in np.array_split(np.arange(l.size), 7):
        state = ops.kl_dro_exact_state_update(
            *state, tf.constant(l[chunk], tf.float32), 2.0, s[chunk]
        )
    got = ops.kl_dro_exact_state_result(*state, 2.0).numpy()
    np.testing.assert_allclose(got, R.exact_risk(l, 2.0, s), rtol=1e-6)
    empty = ops.kl_dro_exact_state_result(
        tf.constant(-np.inf, tf.float64),
        tf.constant(0.0, tf.float64),
        tf.constant(0.0, tf.float64),
        2.0,
    )
    assert empty.numpy() == 0.0


# ----------------------------------------------------------------------------- C11 edge table
def test_bad_hyperparameters_raise():
    l = tf.constant([1.0, 2.0])
    for lam in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="lam"):
            ops.safe_kl_dro_risk(l, 0.0, lam, 0.1)
    for rho in (0.0, 1.0, 1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match="rho"):
            ops.safe_kl_dro_risk(l, 0.0, 1.0, rho)
    with pytest.raises(ValueError, match="sample_weight"):
        ops.safe_kl_dro_risk(l, 0.0, 1.0, 0.1, [1.0, -1.0])
    with pytest.raises(TypeError, match="lam"):
        ops.safe_kl_dro_risk(l, 0.0, tf.constant(1.0), 0.1)


def test_edge_inputs():
    inf, nan = np.inf, np.nan
    # +inf loss: value +inf, gradient pi/rho for it, alpha gradient finite
    v, gl, ga, _ = _risk_grads(np.array([inf, 1.0]), 0.0, 1.0, 0.1)
    assert v == inf and np.all(np.isfinite(gl)) and np.isfinite(ga)
    np.testing.assert_allclose(gl[0], 0.5 / 0.1)
    # -inf loss: weight 0, finite value
    v, gl, ga, _ = _risk_grads(np.array([-inf, 1.0]), 0.0, 1.0, 0.1)
    assert np.isfinite(v) and gl[0] == 0.0 and np.isfinite(ga)
    np.testing.assert_allclose(v, R.safe_risk(np.array([-1e300, 1.0]), 0.0, 1.0, 0.1)[0])
    # NaN/inf with weight 0: ignored entirely (padding)
    v, gl, ga, _ = _risk_grads(np.array([nan, inf, 1.0]), 0.5, 1.0, 0.1, np.array([0.0, 0.0, 1.0]))
    vr, glr, gar = R.safe_risk(np.array([1.0]), 0.5, 1.0, 0.1)
    np.testing.assert_allclose([v, gl[2], ga], [vr, glr[0], gar])
    assert gl[0] == 0 and gl[1] == 0
    # NaN with positive weight: propagates (no silent masking), other entries finite
    v, gl, ga, _ = _risk_grads(np.array([nan, 1.0]), 0.0, 1.0, 0.1)
    assert np.isnan(v) and np.isnan(gl[0]) and np.isfinite(gl[1]) and np.isnan(ga)
    # empty batch and all-zero weights: 0 value, zero gradients, also under XLA
    for l, s in ((np.zeros([0]), None), (np.array([1.0, 2.0]), np.zeros(2))):
        v, gl, ga, _ = _risk_grads(l, 1.0, 1.0, 0.1, s)
        assert v == 0 and np.all(gl == 0) and ga == 0
    f = tf.function(lambda l: ops.safe_kl_dro_risk(l, 1.0, 1.0, 0.1), jit_compile=True)
    assert f(tf.zeros([0])).numpy() == 0.0
    # batch of one: valid; rank > 1 is flattened; integers become float32
    v, gl, ga, _ = _risk_grads(np.array([2.0]), 0.0, 1.0, 0.1)
    np.testing.assert_allclose(v, R.safe_risk(np.array([2.0]), 0.0, 1.0, 0.1)[0])
    m = np.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(
        ops.safe_kl_dro_risk(tf.constant(m), 1.0, 1.0, 0.1).numpy(),
        R.safe_risk(m.ravel(), 1.0, 1.0, 0.1)[0],
    )
    # per-example weights [2] broadcast over the trailing axis of losses [2, 3]
    np.testing.assert_allclose(
        ops.safe_kl_dro_risk(tf.constant(m), 1.0, 1.0, 0.1, np.array([1.0, 3.0])).numpy(),
        R.safe_risk(m.ravel(), 1.0, 1.0, 0.1, np.repeat([1.0, 3.0], 3))[0],
    )
    assert ops.safe_kl_dro_risk(tf.constant([1, 2]), 0.0, 1.0, 0.1).dtype == tf.float32
    # half precision in, computed in float32, cast back
    h = ops.safe_kl_dro_risk(tf.constant([300.0, 1.0], tf.float16), 0.0, 1.0, 0.1)
    assert h.dtype == tf.float16
    np.testing.assert_allclose(
        float(h), R.safe_risk(np.array([300.0, 1.0]), 0.0, 1.0, 0.1)[0], rtol=1e-3
    )


# ----------------------------------------------------------------------------- issue 9 regressions
def test_issue9_nan_sample_weight_is_rejected_not_risk_zero():
    """Before: a NaN weight was treated as 0, all-NaN weights gave risk 0 silently."""
    l = np.array([1.0, 2.0, 3.0])
    for fn in (
        lambda s: ops.safe_kl_dro_risk(l, 0.0, 1.0, 0.1, s),
        lambda s: ops.kl_dro_batch_lse(l, 1.0, s),
        lambda s: ops.kl_dro_sumexp(l, 1.0, s),
        lambda s: ops.cvar_risk(l, 0.5, s),
        lambda s: ops.safe_kl_dro_solve_alpha(l, 1.0, 0.1, s),
    ):
        for s in ([np.nan] * 3, [1.0, np.nan, 1.0], [1.0, np.inf, 1.0], [1.0, -2.0, 1.0]):
            with pytest.raises(ValueError, match="`sample_weight`"):
                fn(np.array(s))
    graph = tf.function(lambda s: ops.safe_kl_dro_risk(l, 0.0, 1.0, 0.1, s))
    with pytest.raises(tf.errors.InvalidArgumentError, match="`sample_weight`"):
        graph(tf.constant([np.nan] * 3, tf.float64))
    xla = tf.function(lambda s: ops.safe_kl_dro_risk(l, 0.0, 1.0, 0.1, s), jit_compile=True)
    assert np.isnan(xla(tf.constant([np.nan] * 3, tf.float64)).numpy())
    # validation off: no error, and NaN still comes out (never 0)
    import losszoo

    with losszoo.validation(False):
        assert np.isnan(ops.safe_kl_dro_risk(l, 0.0, 1.0, 0.1, np.array([np.nan] * 3)).numpy())
    with pytest.raises(ValueError, match="`sample_weight`.*shape"):
        ops.safe_kl_dro_risk(l, 0.0, 1.0, 0.1, np.ones(4))


def test_issue9_cvar_nan_loss_is_nan_not_dropped():
    for mode in (lambda f: f, tf.function, lambda f: tf.function(f, jit_compile=True)):
        l = tf.constant([np.nan, 1.0, 2.0, 3.0])
        with tf.GradientTape() as tape:
            tape.watch(l)
            v = mode(lambda x: ops.cvar_risk(x, 0.5))(l)
        assert np.isnan(v.numpy()) and np.all(np.isnan(tape.gradient(v, l).numpy()))
    # a NaN with zero weight is padding: ignored
    np.testing.assert_allclose(
        ops.cvar_risk(np.array([np.nan, 1.0, 3.0]), 0.5, np.array([0.0, 1.0, 1.0])).numpy(), 3.0
    )


def test_issue9_batch_lse_plus_inf_loss_has_inf_value_and_limit_gradient():
    """Decision: +inf loss -> risk +inf with the softmax limit as gradient (the +inf entries
    share weight 1 in proportion to pi, others 0), in every mode. Before: NaN gradient."""
    for mode in (lambda f: f, tf.function, lambda f: tf.function(f, jit_compile=True)):
        l = tf.constant([np.inf, 1.0, np.inf, 5.0], tf.float64)
        s = tf.constant([1.0, 1.0, 3.0, 1.0], tf.float64)
        with tf.GradientTape() as tape:
            tape.watch(l)
            v = mode(lambda x, w: ops.kl_dro_batch_lse(x, 2.0, w))(l, s)
        assert v.numpy() == np.inf
        np.testing.assert_allclose(tape.gradient(v, l).numpy(), [0.25, 0.0, 0.75, 0.0])
    # NaN beside +inf stays NaN (not +inf)
    assert np.isnan(ops.kl_dro_batch_lse(np.array([np.inf, np.nan]), 1.0).numpy())


def test_issue9_solve_alpha_needs_iterations_and_propagates_nan():
    l = np.array([1.0, 2.0])
    for bad in (0, -1, 2.5, True):
        with pytest.raises((ValueError, TypeError), match="`iterations`"):
            ops.safe_kl_dro_solve_alpha(l, 1.0, 0.1, iterations=bad)
    xla = tf.function(lambda x: ops.safe_kl_dro_solve_alpha(x, 1.0, 0.1), jit_compile=True)
    assert np.isnan(xla(tf.constant([np.nan, 1.0, 2.0])).numpy())  # XLA's max skips NaN


def test_issue9_non_finite_alpha_rejected_or_nan_under_xla():
    l = np.array([1.0, 2.0])
    for alpha in (np.nan, np.inf, -np.inf):
        with pytest.raises(ValueError, match="`alpha`"):
            ops.safe_kl_dro_risk(l, alpha, 1.0, 0.1)
        with pytest.raises(tf.errors.InvalidArgumentError, match="`alpha`"):
            tf.function(lambda a: ops.safe_kl_dro_risk(l, a, 1.0, 0.1))(tf.constant(alpha))
        xla = tf.function(lambda a: ops.safe_kl_dro_weights(l, a, 1.0, 0.1), jit_compile=True)
        assert np.all(np.isnan(xla(tf.constant(alpha, tf.float64)).numpy()))
    with pytest.raises(ValueError, match="`alpha`.*scalar"):
        ops.safe_kl_dro_risk(l, [0.0, 1.0], 1.0, 0.1)


_MODES = {
    "eager": lambda f: f,
    "graph": tf.function,
    "xla": lambda f: tf.function(f, jit_compile=True),
}


@pytest.mark.parametrize("mode", sorted(_MODES))
def test_issue19_sumexp_non_finite_value_gives_all_nan_gradient(mode):
    """Issue 19 item 5: a +inf loss gave the gradient [0.906, inf, 0.550], a mixture of
    plausible numbers and inf. Decision: the value is +inf (as for the other risks) and,
    since no finite gradient exists, every gradient entry is NaN; the same for an
    overflow (l/lam = 100 in float32) and a NaN loss. Finite values keep the exact gradient."""
    run = _MODES[mode](lambda x, w: ops.kl_dro_sumexp(x, 1.0, w))
    s = tf.constant([1.0, 1.0, 2.0])
    for l, value in (
        ([1.0, np.inf, 0.5], np.inf),
        ([1.0, 100.0, 0.5], np.inf),
        ([1.0, np.nan, 0.5], np.nan),
    ):
        lt = tf.constant(l)
        with tf.GradientTape() as tape:
            tape.watch(lt)
            v = run(lt, s)
        np.testing.assert_equal(v.numpy(), value)
        assert np.all(np.isnan(tape.gradient(v, lt).numpy())), (l, tape.gradient(v, lt))
    # a finite value: the exact gradient pi_i exp(l_i / lam) / lam (reference in float64)
    l = np.array([1.0, 2.0, 0.5])
    lt = tf.constant(l, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(lt)
        v = run(lt, s)
    pi = np.array([0.25, 0.25, 0.5])
    np.testing.assert_allclose(v.numpy(), np.sum(pi * np.exp(l)), rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(v, lt).numpy(), pi * np.exp(l), rtol=1e-6)
    # a +inf loss with zero weight is padding: ignored, gradients finite
    lt = tf.constant([1.0, np.inf, 0.5])
    with tf.GradientTape() as tape:
        tape.watch(lt)
        v = run(lt, tf.constant([1.0, 0.0, 1.0]))
    np.testing.assert_allclose(v.numpy(), 0.5 * (np.e + np.exp(0.5)), rtol=1e-6)
    np.testing.assert_allclose(
        tape.gradient(v, lt).numpy(), [0.5 * np.e, 0.0, 0.5 * np.exp(0.5)], rtol=1e-6
    )


def _state(n, acc=1.0):
    return (
        tf.constant(0.5, tf.float64),
        tf.constant(acc, tf.float64),
        tf.constant(n, tf.float64),
    )


def test_issue19_exact_state_result_rejects_negative_or_non_finite_counts():
    """Issue 19 item 11: n = -1 gave NaN with no error. Eager and graph raise naming the
    argument (negative or infinite `acc` / `n`); under XLA the result is NaN. A valid state
    matches the formula."""
    graph = tf.function(lambda m, a, n: ops.kl_dro_exact_state_result(m, a, n, 2.0))
    xla = tf.function(lambda m, a, n: ops.kl_dro_exact_state_result(m, a, n, 2.0), jit_compile=True)
    for name, state in (
        ("n", _state(-1.0)),
        ("n", _state(np.inf)),
        ("acc", _state(3.0, acc=-0.5)),
        ("acc", _state(3.0, acc=-np.inf)),
    ):
        with pytest.raises(ValueError, match=f"`{name}`"):
            ops.kl_dro_exact_state_result(*state, 2.0)
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"`{name}`"):
            graph(*state)
        assert np.isnan(xla(*state).numpy()), (name, state)
    want = 2.0 * (0.5 + np.log(1.5) - np.log(3.0))
    for run in (lambda *a: ops.kl_dro_exact_state_result(*a, 2.0), graph, xla):
        np.testing.assert_allclose(run(*_state(3.0, acc=1.5)).numpy(), want, rtol=1e-14)
        # a NaN state (what NaN losses leave) gives NaN, without an error
        assert np.isnan(run(*_state(3.0, acc=np.nan)).numpy())


# ----------------------------------------------------------------------------- global batch
_GLOBAL = {
    "cvar": (ops.cvar_risk_global, ops.cvar_risk, 0.35),
    "batch_lse": (ops.kl_dro_batch_lse_global, ops.kl_dro_batch_lse, 0.7),
    "sumexp": (ops.kl_dro_sumexp_global, ops.kl_dro_sumexp, 3.0),
}


def _on_replicas(fn, l_parts, s_parts):
    """``fn(l, s)`` on 2 replicas holding ``l_parts[i]``; each replica's outputs and its
    gradient of the first output w.r.t. its own losses."""
    from tests.helpers import _mirrored_strategy

    strategy = _mirrored_strategy(tuple(d.name for d in tf.config.list_logical_devices("CPU")[:2]))

    def per_replica(parts):
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(parts[ctx.replica_id_in_sync_group], tf.float32)
        )

    @tf.function
    def step(l, s):
        with tf.GradientTape() as tape:
            tape.watch(l)
            out = fn(l, s)
        return out, tape.gradient(tf.nest.flatten(out)[0], l)

    outs, grads = strategy.run(step, (per_replica(l_parts), per_replica(s_parts)))
    local = strategy.experimental_local_results
    return [tf.nest.map_structure(np.asarray, o) for o in local(outs)], [
        g.numpy() for g in local(grads)
    ]


def _uneven_batch():
    rng = np.random.default_rng(5)
    l = rng.gamma(2.0, size=9).astype("float32")
    l[4] = l[7]  # a tie across replicas (CVaR's tail mass must split like one device)
    s = rng.uniform(0.5, 2.0, size=9).astype("float32")
    return l, s, (slice(0, 3), slice(3, 9))


def _one_device(fn, l, s):
    lt = tf.constant(l)
    with tf.GradientTape() as tape:
        tape.watch(lt)
        out = fn(lt, tf.constant(s))
    return out, tape.gradient(tf.nest.flatten(out)[0], lt).numpy()


@pytest.mark.parametrize("name", sorted(_GLOBAL))
def test_global_baseline_ops_on_uneven_replicas_match_one_device(name):
    """Replicas holding 3 and 6 examples: the replicas' values sum to the one-device op and
    their gradients are its slices; on one device the global op is the op itself."""
    global_op, op, hyper = _GLOBAL[name]
    l, s, parts = _uneven_batch()
    ref, g_ref = _one_device(lambda a, b: op(a, hyper, b), l, s)
    same, g_same = _one_device(lambda a, b: global_op(a, hyper, b), l, s)
    np.testing.assert_array_equal(same.numpy(), ref.numpy())
    np.testing.assert_array_equal(g_same, g_ref)
    vals, grads = _on_replicas(
        lambda a, b: global_op(a, hyper, b), [l[p] for p in parts], [s[p] for p in parts]
    )
    np.testing.assert_allclose(sum(vals), float(ref), rtol=2e-6)
    np.testing.assert_allclose(np.concatenate(grads), g_ref, rtol=2e-6, atol=1e-7)


def test_global_safe_kl_on_uneven_replicas_matches_one_device():
    """The safe-KL global risk: values sum to the one-device risk, gradients are its slices,
    every replica reports the global statistics, and ``solve_alpha`` solves the global batch
    (the all-gathered losses), not the replica's own."""
    from losszoo.ops.distribute import safe_kl_dro_risk_and_stats_global

    l, s, parts = _uneven_batch()
    lam, rho, alpha = 0.7, 0.2, 1.5
    (ref, ref_stats), g_ref = _one_device(
        lambda a, b: ops.safe_kl_dro_risk_and_stats(a, alpha, lam, rho, b), l, s
    )
    a_star = float(ops.safe_kl_dro_solve_alpha(l, lam, rho, s))

    def glob(solve):
        return lambda a, b: safe_kl_dro_risk_and_stats_global(
            a, tf.constant(alpha), lam, rho, b, solve_alpha=tf.constant(solve)
        )

    outs, grads = _on_replicas(glob(False), [l[p] for p in parts], [s[p] for p in parts])
    np.testing.assert_allclose(sum(v for v, _ in outs), float(ref), rtol=2e-6)
    np.testing.assert_allclose(np.concatenate(grads), g_ref, rtol=2e-6, atol=1e-7)
    for _, stats in outs:
        for key in ("mean_w", "saturation", "curvature", "grad_alpha"):
            np.testing.assert_allclose(stats[key], ref_stats[key].numpy(), rtol=2e-6)
        np.testing.assert_allclose(stats["total_weight"], s.sum(), rtol=1e-6)
        assert float(stats["alpha"]) == alpha
    outs, _ = _on_replicas(glob(True), [l[p] for p in parts], [s[p] for p in parts])
    own = float(ops.safe_kl_dro_solve_alpha(l[parts[0]], lam, rho, s[parts[0]]))
    assert abs(own - a_star) > 1e-2  # the replica's own batch would give another alpha
    for _, stats in outs:
        np.testing.assert_allclose(float(stats["alpha"]), a_star, rtol=1e-6)


def test_no_public_op_takes_private_arguments():
    """Issue 20: the loss no longer reaches into the ops through ``_prepared_bad`` /
    ``_validate_alpha``; no public op (nor a global-batch one) has a private parameter."""
    import inspect

    from losszoo.ops import distribute

    public = [getattr(ops, n) for n in dir(ops) if not n.startswith("_")]
    public += [getattr(distribute, n) for n in distribute.__all__]
    fns = [f for f in public if inspect.isfunction(f)]
    assert len(fns) > 20
    private = [
        f"{f.__name__}({p})" for f in fns for p in inspect.signature(f).parameters if p[0] == "_"
    ]
    assert not private
