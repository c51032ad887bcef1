"""BCSoftmax and the calibrators on the running backend: values against the spec's numpy oracle,
gradients against the spec's VJP and finite differences, NaN rows when traced, errors naming
the argument, and a short ``fit_calibrator``."""

import numpy as np
import pytest

import losszoo
from losszoo import heads
from losszoo.calibration import fit_calibrator
from losszoo.ops._bcsoftmax import METHODS
from tests.harness import (
    MODES,
    compiled,
    finite_difference,
    float64,
    numpy,
    value_and_grad,
)
from tests.references import load_reference

REF = load_reference("bcsoftmax")
TRACED = {"tensorflow": "xla", "jax": "jit"}.get(losszoo._backend.NAME)


def _problem(seed, n=4, k=6):
    x, a, b = REF.random_problem(np.random.RandomState(seed), n, k)
    return x.astype(np.float32), a.astype(np.float32), np.minimum(b, 1.0).astype(np.float32)


def _upstream(shape):
    return np.random.default_rng(7).uniform(0.5, 1.5, size=shape)  # the harness' weighting


@pytest.mark.parametrize(
    "method, mode",  # every mode for the default; the others traced (eager JAX compiles per call)
    [("newton", mode) for mode in MODES] + [(m, MODES[-1]) for m in METHODS[1:]],
)
def test_values_and_gradients_match_the_oracle(method, mode):
    x, a, b = _problem(0)
    tau = np.float32(0.8)

    def f(x, a, b, t):
        return losszoo.ops.bcsoftmax(x, a, b, t, method=method)

    y, (gx, ga, gb, gt) = value_and_grad(f, x, a, b, tau, mode=mode, argnums=(0, 1, 2, 3))
    want, state = REF.bcsoftmax(x.astype(np.float64), a, b, 0.8)
    np.testing.assert_allclose(y, want, atol=2e-6)
    wx, wa, wb = REF.bcsoftmax_vjp(want, state, _upstream(y.shape), 0.8)
    np.testing.assert_allclose(gx, wx, atol=2e-5)
    np.testing.assert_allclose(ga, wa, atol=2e-5)
    np.testing.assert_allclose(gb, wb, atol=2e-5)
    xs = x - x.max(-1, keepdims=True)  # dL/dtau = -(1/tau) sum (x - max x) dL/dx
    np.testing.assert_allclose(gt, -(xs * gx).sum() / 0.8, rtol=1e-4, atol=1e-5)


def test_axis_broadcast_bounds_and_half_precision():
    rng = np.random.RandomState(1)
    x3 = rng.normal(0, 2, (3, 5, 4)).astype(np.float32)
    y = numpy(losszoo.ops.bcsoftmax(x3, 0.02, np.full((3, 1, 4), 0.5, np.float32), axis=1))
    flat = np.moveaxis(x3, 1, -1).reshape(-1, 5).astype(np.float64)
    want = np.moveaxis(REF.bcsoftmax(flat, 0.02, 0.5)[0].reshape(3, 4, 5), -1, 1)
    np.testing.assert_allclose(y, want, atol=2e-6)
    x, a, b = _problem(2)
    y16 = numpy(losszoo.ops.bcsoftmax(x.astype(np.float16), a, b))
    assert y16.dtype == np.float16
    np.testing.assert_allclose(y16, REF.bcsoftmax(x.astype(np.float16), a, b)[0], atol=2e-3)


def test_gradients_match_finite_differences_in_float64():
    # The backward pass is shared by the methods (their forward values are checked above).
    rng = np.random.RandomState(14)  # every state present, no coordinate near a state change
    x, a, b = REF.random_problem(rng, 3, 6)
    a = a + 1e-3
    b = np.minimum(np.maximum(b, a + 1e-3), 1.0)
    a = a * np.minimum(1, 0.95 / a.sum(1, keepdims=True))
    assert {0, 1, 2} <= set(REF.bcsoftmax(x, a, b, 0.7)[1].ravel())
    args = [x, a, b, np.float64(0.7)]
    with float64():
        f = compiled(losszoo.ops.bcsoftmax, MODES[-1])
        _, grads = value_and_grad(losszoo.ops.bcsoftmax, *args, argnums=(0, 1, 2, 3))
        for i, g in enumerate(grads):

            def partial(v, i=i):
                return f(*[v if j == i else t for j, t in enumerate(args)])

            np.testing.assert_allclose(g, finite_difference(partial, args[i]), atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_bad_rows_are_nan_with_validation_off(mode):
    x, a, b = _problem(4)
    x[0, 2] = np.nan
    x[1] = -np.inf
    a[2] = 0.3  # sum(lower) = 1.8
    with losszoo.validation(False):
        y = numpy(compiled(losszoo.ops.bcsoftmax, mode)(x, a, b))
    assert np.isnan(y[:3]).all()
    want = REF.bcsoftmax(x[3:].astype(np.float64), a[3:], b[3:])[0]
    np.testing.assert_allclose(y[3:], want, atol=2e-6)


@pytest.mark.skipif(TRACED is None, reason="PyTorch has no traced mode without assertions")
def test_traced_bad_rows_are_nan_with_validation_on():
    x, a, b = _problem(5)
    b[1] = 0.1  # sum(upper) < 1
    a[2, 0], b[2, 0] = 0.5, 0.2  # lower > upper
    y = numpy(compiled(lambda x, a, b: losszoo.ops.bcsoftmax(x, a, b), TRACED)(x, a, b))
    assert np.isnan(y[1:3]).all() and np.isfinite(y[[0, 3]]).all()
    negative = np.full((4, 1), -1.0, np.float32)
    y = numpy(compiled(lambda x, t: losszoo.ops.bcsoftmax(x, temperature=t), TRACED)(x, negative))
    assert np.isnan(y).all()


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
            losszoo.ops.bcsoftmax(*args, **kwargs)
    with pytest.raises(ValueError, match="`method`"):
        losszoo.ops.bcsoftmax(x, method="exact")


def _sig(t):
    return 1.0 / (1.0 + np.exp(-t))


def test_calibrator_layers_match_their_formulas():
    rng = np.random.RandomState(7)
    x = rng.normal(0, 3, (8, 5)).astype(np.float32)
    x64 = x.astype(np.float64)
    e = np.exp(x64 / 2.0 - (x64 / 2.0).max(-1, keepdims=True))
    ts = heads.TemperatureScaling(temperature=2.0)
    np.testing.assert_allclose(numpy(ts(x)), e / e.sum(-1, keepdims=True), atol=1e-6)
    pb = heads.ProbabilityBounding(init_lower=0.3, init_upper=-0.4, temperature=1.2)
    a, b = _sig(0.3) / 5, 0.2 + 0.8 * _sig(-0.4)
    np.testing.assert_allclose(numpy(pb(x)), REF.bcsoftmax(x64, a, b, 1.2)[0], atol=2e-6)
    lb = heads.LogitBounding(init_lower=-0.5, init_upper=0.2, temperature=1.1)
    norm = np.linalg.norm(x64, axis=-1, keepdims=True)
    clipped = np.clip(x64, norm * np.tanh(-0.5), norm * np.tanh(-0.5 + np.log1p(np.exp(0.2))))
    e = np.exp(clipped / 1.1 - (clipped / 1.1).max(-1, keepdims=True))
    np.testing.assert_allclose(numpy(lb(x)), e / e.sum(-1, keepdims=True), atol=1e-6)
    head = heads.BCSoftmax(lower=0.02, upper=0.6, temperature=0.8)
    np.testing.assert_allclose(numpy(head(x)), REF.bcsoftmax(x64, 0.02, 0.6, 0.8)[0], atol=2e-6)
    bad = x.copy()
    bad[2, 1] = np.nan
    for layer in (ts, pb, lb, head):
        with pytest.raises(ValueError, match="`logits`"):
            layer(bad)


def test_fit_calibrator_learns_the_temperature_of_overconfident_logits():
    rng = np.random.default_rng(8)
    x = rng.normal(0, 3, (256, 4)).astype(np.float32)
    p = np.exp(x / 3.0)
    y = ((p / p.sum(1, keepdims=True)).cumsum(1) > rng.random((256, 1))).argmax(1)
    model, history = fit_calibrator(
        x, None, y, "ts", epochs=8, batch_size=64, learning_rate=0.05, return_history=True
    )
    tau = float(numpy(model.layers[-1].tau()))
    assert tau > 1.8 and history[-1] < history[0]  # from 1.5 towards the true 3
    e = np.exp(x / tau - (x / tau).max(1, keepdims=True))
    probs = np.asarray(model.predict(x[:16], verbose=0))
    np.testing.assert_allclose(probs, e[:16] / e[:16].sum(1, keepdims=True), atol=1e-5)
    pb = fit_calibrator(x, None, y, "pb-c", epochs=1, batch_size=64)
    np.testing.assert_allclose(np.asarray(pb.predict(x, verbose=0)).sum(1), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="`y_val`"):
        fit_calibrator(x, None, y + 4, "ts", epochs=1)
