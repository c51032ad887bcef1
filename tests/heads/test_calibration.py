"""Tests for the calibrator heads: TemperatureScaling, ProbabilityBounding, LogitBounding."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from losszoo.heads import LogitBounding, ProbabilityBounding, TemperatureScaling
from tests.helpers import (
    assert_config_roundtrip,
    assert_mirrored_matches_single,
    assert_mixed_precision,
    load_reference,
)

pytestmark = pytest.mark.tensorflow_only(
    reason="tf.GradientTape / tf.function / XLA checks (tests/helpers.py)"
)

REF = load_reference("bcsoftmax")
RNG = np.random.RandomState(0)
X = RNG.normal(0, 3, (24, 6)).astype(np.float32)
Z = RNG.normal(0, 1, (24, 5)).astype(np.float32)


def _sig(t):
    return 1 / (1 + np.exp(-t))


def test_temperature_scaling():
    ts = TemperatureScaling(temperature=2.5)
    np.testing.assert_allclose(ts(X).numpy(), tf.nn.softmax(X / 2.5).numpy(), atol=1e-6)
    assert TemperatureScaling(fit_temperature=False)(X) is not None


def test_probability_bounding_constant_and_linear_match_formula():
    k = 6
    pb = ProbabilityBounding(init_lower=0.3, init_upper=-0.4, temperature=1.2)
    a = _sig(0.3) / k
    b = 1 / k + (1 - 1 / k) * _sig(-0.4)
    np.testing.assert_allclose(
        pb(X).numpy(), REF.bcsoftmax(X.astype(float), a, b, 1.2)[0], atol=2e-6
    )
    pbl = ProbabilityBounding(bound_fn="linear", temperature=0.9, init_lower=0.0, init_upper=0.0)
    pbl([X, Z])
    wa, wb = RNG.normal(size=5) * 0.5, RNG.normal(size=5) * 0.5
    for v in pbl.weights:
        if v.name == "lower_kernel":
            v.assign(wa)
        if v.name == "upper_kernel":
            v.assign(wb)
    a = _sig(Z @ wa)[:, None] / k
    b = 1 / k + (1 - 1 / k) * _sig(Z @ wb)[:, None]
    np.testing.assert_allclose(
        pbl([X, Z]).numpy(), REF.bcsoftmax(X.astype(float), a, b, 0.9)[0], atol=2e-6
    )
    with pytest.raises(ValueError, match="features"):
        ProbabilityBounding(bound_fn="linear")(X)


def test_pb_lower_only_never_changes_the_argmax():
    x = RNG.normal(0, 5, (500, 10)).astype(np.float32)
    for init in (-2.0, 0.0, 3.0):
        p = ProbabilityBounding(bounds="lower", init_lower=init, temperature=3.0)(x).numpy()
        np.testing.assert_array_equal(p.argmax(-1), x.argmax(-1))
    pu = ProbabilityBounding(bounds="upper", temperature=1.0, init_upper=0.0)(x).numpy()
    assert (pu <= 1 / 10 + 0.9 * 0.5 + 1e-6).all()


def test_logit_bounding_matches_formula_and_gradients_reach_both_bounds():
    lb = LogitBounding(init_lower=-0.5, init_upper=0.2, temperature=1.1)
    norm = np.linalg.norm(X, axis=-1, keepdims=True)
    c = norm * np.tanh(-0.5)
    cap = norm * np.tanh(-0.5 + np.log1p(np.exp(0.2)))
    want = tf.nn.softmax(np.clip(X, c, cap) / 1.1).numpy()
    np.testing.assert_allclose(lb(X).numpy(), want, atol=1e-6)
    with tf.GradientTape() as tape:
        loss = -tf.reduce_mean(tf.math.log(lb(X)[:, 0]))
    grads = tape.gradient(loss, lb.trainable_variables)
    assert all(abs(float(g)) > 0 for g in grads)
    lbl = LogitBounding(bound_fn="linear", init_lower=-1.0, init_upper=1.0, temperature=1.0)
    np.testing.assert_allclose(
        lbl([X, Z]).numpy(), tf.nn.softmax(np.clip(X, -1.0, -1 + np.log1p(np.e))).numpy(), atol=1e-6
    )


def test_inactive_bounds_get_exactly_zero_gradient():
    x = RNG.uniform(-1, 1, (64, 10)).astype(np.float32)  # softmax in (0.01, 0.3)
    pb = ProbabilityBounding(init_lower=-4.0, init_upper=3.0, temperature=1.0)
    with tf.GradientTape() as tape:
        loss = -tf.reduce_mean(tf.math.log(pb(x)[:, 0]))
    grads = dict(
        zip([v.name for v in pb.trainable_variables], tape.gradient(loss, pb.trainable_variables))
    )
    assert float(grads["lower"]) == 0.0 and float(grads["upper"]) == 0.0
    assert float(grads["log_temperature"]) != 0.0


@pytest.mark.parametrize(
    "layer",
    [
        TemperatureScaling(temperature=1.7),
        ProbabilityBounding(bound_fn="linear", bounds="upper", fit_temperature=False),
        LogitBounding(bound_fn="constant", init_lower=-0.3),
    ],
)
def test_config_roundtrip(layer):
    assert_config_roundtrip(layer)


def _calibrated_model():
    inp = keras.Input((8,))
    z = keras.layers.Dense(5, activation="tanh")(inp)
    logits = keras.layers.Dense(4)(z)
    return keras.Model(inp, ProbabilityBounding(bound_fn="linear")([logits, z]))


def test_pb_mixed_precision_and_mirrored():
    rng = np.random.RandomState(1)
    x = rng.normal(size=(64, 8)).astype(np.float32)
    y = rng.randint(0, 4, 64)
    assert_mixed_precision(_calibrated_model, x, y, "sparse_categorical_crossentropy")
    assert_mirrored_matches_single(_calibrated_model, x, y, "sparse_categorical_crossentropy")


def _np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("scale", [1e30, 1e-30, 1.0])
def test_logit_bounding_constant_at_extreme_scales_matches_numpy(scale):
    # Issue 19 item 4: the squared norm overflowed at 1e30 and the row came out all NaN.
    x = (np.array([[1.0, 0.0, -1.0], [3.0, -2.0, 0.5], [0.0, 0.0, 0.0]]) * scale).astype("f4")
    lb = LogitBounding(init_lower=-0.4, init_upper=0.3, temperature=1.5)
    x64 = x.astype(np.float64)
    norm = np.sqrt(np.sum(x64**2, -1, keepdims=True))
    c, cap = norm * np.tanh(-0.4), norm * np.tanh(-0.4 + np.log1p(np.exp(0.3)))
    want = _np_softmax(np.clip(x64, c, cap) / 1.5)
    got = lb(x).numpy()
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, atol=1e-6)
    lo, hi = (t.numpy() for t in lb.bound_values(x))
    np.testing.assert_allclose(lo, c, rtol=1e-5)
    np.testing.assert_allclose(hi, cap, rtol=1e-5)


@pytest.mark.parametrize("cls", [TemperatureScaling, ProbabilityBounding, LogitBounding])
def test_rank_0_logits_raise_naming_logits(cls):
    # Issue 19 item 7: IndexError / TF-internal errors before.
    with pytest.raises(ValueError, match="`logits` must have rank >= 1"):
        cls()(np.float32(2.0))
