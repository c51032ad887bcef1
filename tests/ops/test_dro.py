"""Safe-KL DRO risk ops against the float64 numpy reference (spec safe_kl_dro.md section 7), on
the running backend: values and gradients against the spec's oracle and finite differences,
in every execution mode (``tests/harness.py``), NaN when traced, errors naming the argument
when checked. TensorFlow-only checks (``tf.map_fn`` Monte Carlo, ``tf.distribute`` replicas):
``tests/ops/test_dro_tensorflow.py``."""

import inspect
import math

import keras
import numpy as np
import pytest

import losszoo
from losszoo import ops
from tests.harness import (
    MODES,
    TRACED_MODES,
    compiled,
    errors,
    finite_difference,
    float64,
    numpy,
    upstream,
    value_and_grad,
)
from tests.references import load_reference

R = load_reference("safe_kl_dro")
LAM, RHO = 0.7, 0.2
U = float(upstream(()))  # value_and_grad's weighting of a scalar output


@pytest.fixture
def x64():
    with float64():
        yield


def _risk_grads(l, a, lam, rho, s=None, calibrate=True, mode="eager"):
    """``(value, d/dl, d/dalpha, stats)`` of the safe-KL risk, as numpy."""
    l = np.asarray(l)
    a = np.asarray(a, l.dtype)

    def risk(l, a):
        return ops.safe_kl_dro_risk(l, a, lam, rho, s, calibrate=calibrate)

    v, (gl, ga) = value_and_grad(risk, l, a, mode=mode, argnums=(0, 1))
    _, stats = ops.safe_kl_dro_risk_and_stats(l, a, lam, rho, s, calibrate=calibrate)
    return v, gl / U, ga / U, {k: numpy(x) for k, x in stats.items()}


def _data(n=11, seed=0):
    r = np.random.default_rng(seed)
    return r.gamma(2.0, size=n).astype(np.float32), r.uniform(0.2, 2.0, n).astype(np.float32)


# ----------------------------------------------------------------------------- C8 value/grad
def test_value_and_gradients_match_reference_weighted(x64):
    rng = np.random.default_rng(1)
    for i in range(25):
        n = (1, 2, 17, 59)[i % 4]  # few shapes: JAX compiles each op once per shape
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


@pytest.mark.parametrize("mode", MODES)
def test_safe_kl_value_and_gradients_match_reference_in_every_mode(mode):
    l, s = _data()
    alpha = np.float32(1.3)
    for weights in (s, None):
        v, gl, ga, _ = _risk_grads(l, alpha, LAM, RHO, weights, mode=mode)
        vr, glr, gar = R.safe_risk(l, 1.3, LAM, RHO, p_hat=weights)
        np.testing.assert_allclose(v, vr, rtol=1e-5)
        np.testing.assert_allclose(gl, glr, rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(ga, gar, rtol=1e-4, atol=1e-6)
    _, stats = compiled(lambda l: ops.safe_kl_dro_risk_and_stats(l, 1.3, LAM, RHO, s), mode)(l)
    w = R.safe_terms(l, 1.3, LAM, RHO)[1]
    np.testing.assert_allclose(numpy(stats["saturation"]), RHO * w.max(), rtol=1e-5)
    gar = R.safe_risk(l, 1.3, LAM, RHO, p_hat=s)[2]
    np.testing.assert_allclose(numpy(stats["grad_alpha"]), gar, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_baselines_match_closed_forms(mode):
    l, s = _data(seed=1)
    l[3] = l[7]  # a tie: CVaR splits it in index order
    pi = s / s.sum()
    # batch LogSumExp: lam log sum pi exp(l/lam), gradient softmax(l/lam + log pi)
    v, (g,) = value_and_grad(lambda x: ops.kl_dro_batch_lse(x, LAM, s), l, mode=mode)
    np.testing.assert_allclose(v, R.exact_risk(l, LAM, s), rtol=1e-5)
    np.testing.assert_allclose(g, U * R.gibbs_weights(l, LAM, s), rtol=1e-4, atol=1e-7)
    # sum-of-exp: sum pi exp(l/lam), gradient pi exp(l/lam)/lam
    v, (g,) = value_and_grad(lambda x: ops.kl_dro_sumexp(x, LAM, s), l, mode=mode)
    ex = np.exp(np.float64(l) / LAM)
    np.testing.assert_allclose(v, np.sum(pi * ex), rtol=1e-5)
    np.testing.assert_allclose(g, U * pi * ex / LAM, rtol=1e-4)
    # CVaR (unweighted: the oracle's form), gradient: tail mass / rho
    v, (g,) = value_and_grad(lambda x: ops.cvar_risk(x, RHO), l, mode=mode)
    np.testing.assert_allclose(v, R.cvar(l, RHO), rtol=1e-5)
    order = np.argsort(-np.float64(l), kind="stable")
    q = np.zeros(l.size)
    q[order] = np.clip(RHO - np.arange(l.size) / l.size, 0.0, 1.0 / l.size)
    np.testing.assert_allclose(g, U * q / RHO, rtol=1e-5, atol=1e-7)
    # the batch's optimal alpha (bisection) and the weights there: sum pi w = 1
    a = numpy(compiled(lambda x: ops.safe_kl_dro_solve_alpha(x, LAM, RHO, s), mode)(l))
    np.testing.assert_allclose(a, R.solve_alpha(l, LAM, RHO, s), rtol=1e-5)
    w = numpy(compiled(lambda x: ops.safe_kl_dro_weights(x, a, LAM, RHO), mode)(l))
    np.testing.assert_allclose(np.sum(pi * w), 1.0, rtol=1e-4)


@pytest.mark.parametrize(
    "op",
    [
        lambda l: ops.safe_kl_dro_risk(l, 1.1, LAM, RHO, np.linspace(0.5, 2.0, 7)),
        lambda l: ops.kl_dro_batch_lse(l, LAM, np.linspace(0.5, 2.0, 7)),
        lambda l: ops.kl_dro_sumexp(l, LAM),
        # CVaR: gradient q/rho, checked away from kinks (distinct losses, rho*n not integer)
        lambda l: ops.cvar_risk(l, 0.3),
    ],
    ids=["safe_kl", "batch_lse", "sumexp", "cvar"],
)
def test_gradients_match_finite_differences_in_float64(op, x64):
    l = np.random.default_rng(3).gamma(2.0, size=7)
    _, (g,) = value_and_grad(op, l)
    np.testing.assert_allclose(g, finite_difference(op, l), rtol=1e-6, atol=1e-8)


def test_float32_matches_float64(x64):  # C9
    rng = np.random.default_rng(4)
    for _ in range(20):
        l = rng.gamma(2.0, size=40) * 3
        lam, rho, a = rng.uniform(0.2, 5), 10 ** rng.uniform(-4, -0.1), rng.normal() * 2 + 5
        v64, g64, _ga64, _ = _risk_grads(l, a, lam, rho)
        v32, g32, _ga32, _ = _risk_grads(l.astype(np.float32), a, lam, rho)
        assert v32.dtype == np.float32 and v64.dtype == np.float64
        assert abs(v32 - v64) <= 1e-5 * max(1.0, abs(v64))
        assert np.max(np.abs(g32 - g64)) <= 1e-5 * np.max(np.abs(g64)) + 1e-7


# ----------------------------------------------------------------------------- C10 overflow
@pytest.mark.parametrize("big", [95.0, 1e4, 1e6])
def test_overflow_safe_float32(big):
    l = np.array([big, big, 1.0, 2.0], np.float32)
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.log(np.mean(np.exp(l))))  # the naive formula overflows
    v, gl, ga, st = _risk_grads(l, 0.0, 1.0, 0.1)
    assert np.isfinite(v) and np.all(np.isfinite(gl)) and np.isfinite(ga)
    np.testing.assert_allclose(gl[:2] * 4, 1 / 0.1, rtol=1e-6)  # w = 1/rho, pi = 1/4
    # value grows linearly: (lam/rho) * mean(z) for the saturated entries
    want = R.safe_risk(l.astype(np.float64), 0.0, 1.0, 0.1)[0]
    np.testing.assert_allclose(v, want, rtol=1e-6)
    np.testing.assert_allclose(st["saturation"], 1.0, rtol=1e-6)
    assert np.isfinite(numpy(ops.kl_dro_batch_lse(l, 1.0)))


# ----------------------------------------------------------------------------- bounds, alpha*
def test_solve_alpha_and_stationarity(x64):
    rng = np.random.default_rng(5)
    for i in range(20):
        n = (1, 3, 40, 149)[i % 4]
        l = rng.gamma(2.0, size=n) * rng.uniform(0.1, 5)
        s = rng.uniform(0.1, 2, size=n)
        lam, rho = rng.uniform(0.1, 5), 10 ** rng.uniform(-5, -0.05)
        a = numpy(ops.safe_kl_dro_solve_alpha(l, lam, rho, s))
        np.testing.assert_allclose(a, R.solve_alpha(l, lam, rho, s), atol=1e-9 * max(1, abs(a)))
        _, _, ga, st = _risk_grads(l, float(a), lam, rho, s)
        assert abs(ga) < 1e-8 and abs(st["mean_w"] - 1) < 1e-8  # sum pi w = 1 at alpha*
    # C2 closed forms for constant losses
    const = np.full([7], 1.3)
    for rho in (1e-3, 0.1, 0.5):
        a = numpy(ops.safe_kl_dro_solve_alpha(const, 2.0, rho))
        np.testing.assert_allclose(a, 1.3 + 2.0 * math.log1p(-rho), atol=1e-9)
        v = numpy(ops.safe_kl_dro_risk(const, a, 2.0, rho))
        np.testing.assert_allclose(v, 1.3 - 2.0 * R.f_rho(1.0, rho), atol=1e-12)


def test_min_over_alpha_sandwich_and_rho_limit(x64):
    """R - lam rho n max p* <= min_alpha V <= R, min V -> R as rho -> 0 (spec 4, C3, C4)."""
    rng = np.random.default_rng(6)
    for i in range(40):
        n = (1, 5, 64, 199)[i % 4]
        lam = rng.uniform(0.1, 5)
        l = rng.gamma(2.0, size=n) * rng.uniform(0.1, 5)
        rho = 10 ** rng.uniform(-6, -0.01)
        a = numpy(ops.safe_kl_dro_solve_alpha(l, lam, rho))
        v = numpy(ops.safe_kl_dro_risk(l, a, lam, rho))
        # a grid of other alphas never goes below the minimum (convex in alpha)
        others = [numpy(ops.safe_kl_dro_risk(l, a + d, lam, rho)) for d in (-1.0, -1e-3, 1e-3, 1.0)]
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
        a = ops.safe_kl_dro_solve_alpha(l, 1.0, rho)
        gaps.append(R.exact_risk(l, 1.0) - numpy(ops.safe_kl_dro_risk(l, a, 1.0, rho)))
    assert gaps[0] > gaps[1] > gaps[2] > 0
    assert abs(gaps[2] / 1e-6 - slope) / slope < 1e-3


def test_cvar_matches_rockafellar_uryasev_and_is_the_lam_to_zero_limit(x64):  # C5
    rng = np.random.default_rng(7)
    for i in range(20):
        n = (1, 4, 31, 79)[i % 4]
        l = rng.normal(size=n) * 3
        s = rng.uniform(0.1, 2, size=n)
        rho = rng.uniform(0.01, 0.99)
        pi = s / s.sum()
        brute = min(a + np.sum(pi * np.maximum(l - a, 0)) / rho for a in l)  # eq. 9
        np.testing.assert_allclose(numpy(ops.cvar_risk(l, rho, s)), brute, rtol=1e-12)
        np.testing.assert_allclose(numpy(ops.cvar_risk(l, rho)), R.cvar(l, rho), rtol=1e-12)
        lam = 10 ** rng.uniform(-3, 1)
        v = numpy(ops.safe_kl_dro_risk(l, ops.safe_kl_dro_solve_alpha(l, lam, rho), lam, rho))
        c = R.cvar(l, rho)
        low, high = c + lam * (math.log(rho) - 1), c + lam * (math.log(rho) - 1 + 1 / rho)
        assert low - 1e-8 <= v <= high + 1e-8
    l = rng.normal(size=300)
    lam = 1e-4
    v = numpy(ops.safe_kl_dro_risk(l, ops.safe_kl_dro_solve_alpha(l, lam, 0.05), lam, 0.05))
    assert abs(v - R.cvar(l, 0.05)) < 2e-3


def test_baselines_match_reference(x64):
    rng = np.random.default_rng(8)
    l, s = rng.gamma(2.0, size=30) * 4, rng.uniform(0.1, 2, size=30)
    v, (g,) = value_and_grad(lambda x: ops.kl_dro_batch_lse(x, 0.8, s), l)
    np.testing.assert_allclose(v, R.exact_risk(l, 0.8, s), rtol=1e-13)
    np.testing.assert_allclose(g / U, R.gibbs_weights(l, 0.8, s), rtol=1e-12)
    pi = s / s.sum()
    np.testing.assert_allclose(
        numpy(ops.kl_dro_sumexp(l, 3.0, s)), np.sum(pi * np.exp(l / 3.0)), rtol=1e-13
    )
    # huge losses: batch LSE finite (max-shift), sum-of-exp overflows by design
    big = np.array([500.0, 1.0], np.float32)
    assert np.isfinite(numpy(ops.kl_dro_batch_lse(big, 1.0)))
    assert np.isinf(numpy(ops.kl_dro_sumexp(big, 1.0)))


# ----------------------------------------------------------------------------- streaming exact
def test_streaming_exact_risk_over_chunks_equals_full_data_risk(x64):
    r = np.random.default_rng(4)
    l, s = r.gamma(2.0, size=40) * 3, r.uniform(0.0, 2.0, size=40)
    l[5] = 3e3  # exp(l/lam) would overflow: the running shift keeps it exact
    state = tuple(np.array(v) for v in (-np.inf, 0.0, 0.0))  # float64 arrays
    for part in np.array_split(np.arange(l.size), 5):
        state = ops.kl_dro_exact_state_update(*state, l[part], 2.0, s[part])
    got = numpy(ops.kl_dro_exact_state_result(*state, 2.0))
    np.testing.assert_allclose(got, R.exact_risk(l, 2.0, s), rtol=1e-9)
    empty = tuple(np.array(v) for v in (-np.inf, 0.0, 0.0))
    assert numpy(ops.kl_dro_exact_state_result(*empty, 2.0)) == 0.0


def _state_batch():
    r = np.random.default_rng(3)
    return r.gamma(2.0, size=9), r.uniform(0.2, 2.0, size=9)


@pytest.mark.parametrize(
    "state, name",
    [
        ((-np.inf, 0.0, 0.0), "m"),  # Python floats
        ((np.float64(-np.inf), 0.0, np.float64(0.0)), "acc"),
        ((np.float64(-np.inf), np.float64(0.0), 0), "n"),
        ((np.float32(-np.inf), np.float64(0.0), np.float64(0.0)), "acc"),  # mixed dtypes
        ((np.float32(-np.inf), np.float32(0.0), np.float64(0.0)), "n"),
        ((np.int32(0), np.int32(0), np.int32(0)), "m"),  # not floating
    ],
)
def test_state_of_mixed_or_unknown_dtype_raises_naming_the_argument(state, name, x64):
    """Issue 31 item 14: a float32 ``m`` beside a float64 ``acc``, or Python floats, were cast
    silently; now a TypeError names the argument."""
    l, s = _state_batch()
    with pytest.raises(TypeError, match=f"`{name}`"):
        ops.kl_dro_exact_state_update(*state, l, 2.0, s)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_state_of_one_dtype_streams_the_exact_risk(dtype, x64):
    l, s = _state_batch()
    state = tuple(np.array(v, dtype) for v in (-np.inf, 0.0, 0.0))
    for part in np.array_split(np.arange(l.size), 3):
        state = ops.kl_dro_exact_state_update(*state, l[part], 2.0, s[part])
    assert {str(numpy(x).dtype) for x in state} == {dtype}
    got = numpy(ops.kl_dro_exact_state_result(*state, 2.0))
    rtol = 1e-6 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, R.exact_risk(l, 2.0, s), rtol=rtol)


# ----------------------------------------------------------------------------- C11 edge table
def test_eager_errors_name_the_argument():
    l = np.array([1.0, 2.0], np.float32)
    for lam in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="lam"):
            ops.safe_kl_dro_risk(l, 0.0, lam, 0.1)
    for rho in (0.0, 1.0, 1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match="rho"):
            ops.safe_kl_dro_risk(l, 0.0, 1.0, rho)
    with pytest.raises(ValueError, match="sample_weight"):
        ops.safe_kl_dro_risk(l, 0.0, 1.0, 0.1, [1.0, -1.0])
    with pytest.raises(TypeError, match="lam"):
        ops.safe_kl_dro_risk(l, 0.0, keras.ops.convert_to_tensor(1.0), 0.1)
    with pytest.raises(ValueError, match="`sample_weight`.*shape"):
        ops.cvar_risk(l, RHO, np.ones(3, np.float32))
    with pytest.raises(ValueError, match="`lam`"):
        ops.kl_dro_batch_lse(l, 0.0)
    with pytest.raises(ValueError, match="`rho`"):
        ops.cvar_risk(l, 1.0)


def test_edge_inputs(x64):
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
    # empty batch and all-zero weights: 0 value, zero gradients, also compiled
    for l, s in ((np.zeros([0]), None), (np.array([1.0, 2.0]), np.zeros(2))):
        v, gl, ga, _ = _risk_grads(l, 1.0, 1.0, 0.1, s)
        assert v == 0 and np.all(gl == 0) and ga == 0
    f = compiled(lambda l: ops.safe_kl_dro_risk(l, 1.0, 1.0, 0.1), MODES[-1])
    assert numpy(f(np.zeros([0], np.float32))) == 0.0
    # batch of one: valid; rank > 1 is flattened; integers become float32
    v, gl, ga, _ = _risk_grads(np.array([2.0]), 0.0, 1.0, 0.1)
    np.testing.assert_allclose(v, R.safe_risk(np.array([2.0]), 0.0, 1.0, 0.1)[0])
    m = np.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(
        numpy(ops.safe_kl_dro_risk(m, 1.0, 1.0, 0.1)), R.safe_risk(m.ravel(), 1.0, 1.0, 0.1)[0]
    )
    # per-example weights [2] broadcast over the trailing axis of losses [2, 3]
    np.testing.assert_allclose(
        numpy(ops.safe_kl_dro_risk(m, 1.0, 1.0, 0.1, np.array([1.0, 3.0]))),
        R.safe_risk(m.ravel(), 1.0, 1.0, 0.1, np.repeat([1.0, 3.0], 3))[0],
    )
    dtype = keras.backend.standardize_dtype
    assert dtype(ops.safe_kl_dro_risk(np.array([1, 2], np.int32), 0.0, 1.0, 0.1).dtype) == "float32"
    # half precision in, computed in float32, cast back
    h = ops.safe_kl_dro_risk(np.array([300.0, 1.0], np.float16), 0.0, 1.0, 0.1)
    assert dtype(h.dtype) == "float16"
    np.testing.assert_allclose(
        float(numpy(h)), R.safe_risk(np.array([300.0, 1.0]), 0.0, 1.0, 0.1)[0], rtol=1e-3
    )


# ----------------------------------------------------------------------------- issue 9 regressions
_WEIGHTED = {
    "safe_kl": lambda l, s: ops.safe_kl_dro_risk(l, 0.0, 1.0, 0.1, s),
    "batch_lse": lambda l, s: ops.kl_dro_batch_lse(l, 1.0, s),
    "sumexp": lambda l, s: ops.kl_dro_sumexp(l, 1.0, s),
    "cvar": lambda l, s: ops.cvar_risk(l, 0.5, s),
    "solve_alpha": lambda l, s: ops.safe_kl_dro_solve_alpha(l, 1.0, 0.1, s),
}


def test_issue9_nan_sample_weight_is_rejected_not_risk_zero(x64):
    """Before: a NaN weight was treated as 0, all-NaN weights gave risk 0 silently."""
    l = np.array([1.0, 2.0, 3.0])
    for fn in _WEIGHTED.values():
        for s in ([np.nan] * 3, [1.0, np.nan, 1.0], [1.0, np.inf, 1.0], [1.0, -2.0, 1.0]):
            with pytest.raises(ValueError, match="`sample_weight`"):
                fn(l, np.array(s))
    # validation off: no error, and NaN still comes out (never 0)
    with losszoo.validation(False):
        assert np.isnan(numpy(ops.safe_kl_dro_risk(l, 0.0, 1.0, 0.1, np.array([np.nan] * 3))))
    with pytest.raises(ValueError, match="`sample_weight`.*shape"):
        ops.safe_kl_dro_risk(l, 0.0, 1.0, 0.1, np.ones(4))


def test_invalid_weights_raise_when_checked_or_give_nan_when_traced():
    """A NaN or negative weight: an error naming ``sample_weight`` in a checked mode (eager,
    TensorFlow graph), NaN from every risk under XLA / ``jax.jit``; a NaN ``alpha``: NaN
    weights when traced."""
    for mode in MODES:
        l, s = _data(seed=5)
        nan_s = np.full_like(s, np.nan)
        s[2] = -1.0
        for name, fn in _WEIGHTED.items():
            run = compiled(fn, mode)
            for bad in (s, nan_s):
                if mode in TRACED_MODES:
                    assert np.isnan(numpy(run(l, bad))), name
                else:
                    with pytest.raises(errors(), match="`sample_weight`"):
                        numpy(run(l, bad))
        if mode in TRACED_MODES:
            w = compiled(lambda l, a: ops.safe_kl_dro_weights(l, a, LAM, RHO), mode)
            assert np.isnan(numpy(w(l, np.float32(np.nan)))).all()


def test_issue9_cvar_nan_loss_is_nan_not_dropped():
    for mode in MODES:
        l = np.array([np.nan, 1.0, 2.0, 3.0], np.float32)
        v, (g,) = value_and_grad(lambda x: ops.cvar_risk(x, 0.5), l, mode=mode)
        assert np.isnan(v) and np.all(np.isnan(g))


def test_nan_loss_with_weight_is_nan_and_padding_is_ignored():
    l = np.array([np.nan, 1.0, 2.0, 3.0], np.float32)
    for fn in (
        lambda w: ops.safe_kl_dro_risk(l, 1.0, LAM, RHO, w),
        lambda w: ops.kl_dro_batch_lse(l, LAM, w),
        lambda w: ops.cvar_risk(l, 0.5, w),
    ):
        assert np.isnan(numpy(fn(np.ones(4, np.float32))))
        assert np.isfinite(numpy(fn(np.array([0.0, 1.0, 1.0, 1.0], np.float32))))
    # a NaN with zero weight is padding: ignored
    np.testing.assert_allclose(
        numpy(ops.cvar_risk(np.array([np.nan, 1.0, 3.0]), 0.5, np.array([0.0, 1.0, 1.0]))), 3.0
    )
    with losszoo.validation(False):  # the kernels' own poisoning, without the eager checks
        bad = np.array([1.0, np.nan, 1.0], np.float32)
        assert np.isnan(numpy(ops.safe_kl_dro_risk(l[1:], 1.0, LAM, RHO, bad)))


def test_issue9_batch_lse_plus_inf_loss_has_inf_value_and_limit_gradient(x64):
    """Decision: +inf loss -> risk +inf with the softmax limit as gradient (the +inf entries
    share weight 1 in proportion to pi, others 0), in every mode. Before: NaN gradient."""
    for mode in MODES:
        l = np.array([np.inf, 1.0, np.inf, 5.0])
        s = np.array([1.0, 1.0, 3.0, 1.0])
        v, (g,) = value_and_grad(lambda x, w: ops.kl_dro_batch_lse(x, 2.0, w), l, s, mode=mode)
        assert v == np.inf
        np.testing.assert_allclose(g / U, [0.25, 0.0, 0.75, 0.0])
        # NaN beside +inf stays NaN (not +inf)
        assert np.isnan(numpy(ops.kl_dro_batch_lse(np.array([np.inf, np.nan]), 1.0)))


def test_issue9_solve_alpha_needs_iterations_and_propagates_nan():
    l = np.array([1.0, 2.0], np.float32)
    for bad in (0, -1, 2.5, True):
        with pytest.raises((ValueError, TypeError), match="`iterations`"):
            ops.safe_kl_dro_solve_alpha(l, 1.0, 0.1, iterations=bad)
    # a NaN loss: NaN alpha, also compiled (XLA's max skips NaN)
    run = compiled(lambda x: ops.safe_kl_dro_solve_alpha(x, 1.0, 0.1), MODES[-1])
    assert np.isnan(numpy(run(np.array([np.nan, 1.0, 2.0], np.float32))))


def test_issue9_non_finite_alpha_rejected_or_nan_when_traced(x64):
    for mode in MODES:
        l = np.array([1.0, 2.0])
        risk = compiled(lambda a: ops.safe_kl_dro_risk(l, a, 1.0, 0.1), mode)
        weights = compiled(lambda a: ops.safe_kl_dro_weights(l, a, 1.0, 0.1), mode)
        for alpha in (np.nan, np.inf, -np.inf):
            if mode in TRACED_MODES:
                assert np.all(np.isnan(numpy(weights(np.float64(alpha)))))
            else:
                with pytest.raises(errors(), match="`alpha`"):
                    numpy(risk(np.float64(alpha)))
        with pytest.raises(ValueError, match="`alpha`.*scalar"):
            ops.safe_kl_dro_risk(l, [0.0, 1.0], 1.0, 0.1)


@pytest.mark.parametrize("mode", MODES)
def test_issue19_sumexp_non_finite_value_gives_all_nan_gradient(mode):
    """Issue 19 item 5: a +inf loss gave the gradient [0.906, inf, 0.550], a mixture of
    plausible numbers and inf. Decision: the value is +inf (as for the other risks) and,
    since no finite gradient exists, every gradient entry is NaN; the same for an
    overflow (l/lam = 100 in float32) and a NaN loss. Finite values keep the exact gradient."""

    def run(l, w):
        return value_and_grad(lambda x, w: ops.kl_dro_sumexp(x, 1.0, w), l, w, mode=mode)

    s = np.array([1.0, 1.0, 2.0], np.float32)
    for l, value in (
        ([1.0, np.inf, 0.5], np.inf),
        ([1.0, 100.0, 0.5], np.inf),
        ([1.0, np.nan, 0.5], np.nan),
    ):
        v, (g,) = run(np.array(l, np.float32), s)
        np.testing.assert_equal(v, value)
        assert np.all(np.isnan(g)), (l, g)
    # a finite value: the exact gradient pi_i exp(l_i / lam) / lam (reference in float64)
    l = np.array([1.0, 2.0, 0.5])
    v, (g,) = run(l.astype(np.float32), s)
    pi = np.array([0.25, 0.25, 0.5])
    np.testing.assert_allclose(v, np.sum(pi * np.exp(l)), rtol=1e-6)
    np.testing.assert_allclose(g / U, pi * np.exp(l), rtol=1e-6)
    # a +inf loss with zero weight is padding: ignored, gradients finite
    v, (g,) = run(np.array([1.0, np.inf, 0.5], np.float32), np.array([1.0, 0.0, 1.0], np.float32))
    np.testing.assert_allclose(v, 0.5 * (np.e + np.exp(0.5)), rtol=1e-6)
    np.testing.assert_allclose(g / U, [0.5 * np.e, 0.0, 0.5 * np.exp(0.5)], rtol=1e-6)


def _state(n, acc=1.0):
    return np.array(0.5), np.array(acc), np.array(n, np.float64)  # float64 tensors


def test_issue19_exact_state_result_rejects_negative_or_non_finite_counts(x64):
    """Issue 19 item 11: n = -1 gave NaN with no error. Eager and graph raise naming the
    argument (negative or infinite `acc` / `n`); under XLA / jit the result is NaN. A valid
    state matches the formula."""
    for mode in MODES:
        run = compiled(lambda m, a, n: ops.kl_dro_exact_state_result(m, a, n, 2.0), mode)
        for name, state in (
            ("n", _state(-1.0)),
            ("n", _state(np.inf)),
            ("acc", _state(3.0, acc=-0.5)),
            ("acc", _state(3.0, acc=-np.inf)),
        ):
            if mode in TRACED_MODES:
                assert np.isnan(numpy(run(*state))), (name, state)
            else:
                with pytest.raises(errors(), match=f"`{name}`"):
                    numpy(run(*state))
        want = 2.0 * (0.5 + np.log(1.5) - np.log(3.0))
        np.testing.assert_allclose(numpy(run(*_state(3.0, acc=1.5))), want, rtol=1e-14)
        # a NaN state (what NaN losses leave) gives NaN, without an error
        assert np.isnan(numpy(run(*_state(3.0, acc=np.nan))))


def test_no_public_op_takes_private_arguments():
    """Issue 20: the loss no longer reaches into the ops through ``_prepared_bad`` /
    ``_validate_alpha``; no public op (nor a global-batch one) has a private parameter."""
    from losszoo.ops import distribute

    public = [getattr(ops, n) for n in dir(ops) if not n.startswith("_")]
    public += [getattr(distribute, n) for n in distribute.__all__]
    fns = [f for f in public if inspect.isfunction(f)]
    assert len(fns) > 20
    private = [
        f"{f.__name__}({p})" for f in fns for p in inspect.signature(f).parameters if p[0] == "_"
    ]
    assert not private
