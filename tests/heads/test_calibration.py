"""Tests for the calibrator heads: TemperatureScaling, ProbabilityBounding, LogitBounding, on
every backend (MirroredStrategy: TensorFlow only)."""

import keras
import numpy as np
import pytest
from scipy.special import softmax as np_softmax

from losszoo.heads import LogitBounding, ProbabilityBounding, TemperatureScaling
from tests.harness import assert_config_roundtrip, assert_mixed_precision, numpy
from tests.references import load_reference

REF = load_reference("bcsoftmax")
RNG = np.random.RandomState(0)
X = RNG.normal(0, 3, (24, 6)).astype(np.float32)
Z = RNG.normal(0, 1, (24, 5)).astype(np.float32)


def _sig(t):
    return 1 / (1 + np.exp(-t))


def test_temperature_scaling():
    ts = TemperatureScaling(temperature=2.5)
    np.testing.assert_allclose(numpy(ts(X)), np_softmax(X / 2.5, -1), atol=1e-6)
    assert TemperatureScaling(fit_temperature=False)(X) is not None


def test_probability_bounding_constant_and_linear_match_formula():
    k = 6
    pb = ProbabilityBounding(init_lower=0.3, init_upper=-0.4, temperature=1.2)
    a = _sig(0.3) / k
    b = 1 / k + (1 - 1 / k) * _sig(-0.4)
    np.testing.assert_allclose(
        numpy(pb(X)), REF.bcsoftmax(X.astype(float), a, b, 1.2)[0], atol=2e-6
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
        numpy(pbl([X, Z])), REF.bcsoftmax(X.astype(float), a, b, 0.9)[0], atol=2e-6
    )
    with pytest.raises(ValueError, match="features"):
        ProbabilityBounding(bound_fn="linear")(X)


def test_pb_lower_only_never_changes_the_argmax():
    x = RNG.normal(0, 5, (500, 10)).astype(np.float32)
    for init in (-2.0, 0.0, 3.0):
        p = numpy(ProbabilityBounding(bounds="lower", init_lower=init, temperature=3.0)(x))
        np.testing.assert_array_equal(p.argmax(-1), x.argmax(-1))
    pu = numpy(ProbabilityBounding(bounds="upper", temperature=1.0, init_upper=0.0)(x))
    assert (pu <= 1 / 10 + 0.9 * 0.5 + 1e-6).all()


def test_logit_bounding_matches_formula_and_gradients_reach_both_bounds():
    lb = LogitBounding(init_lower=-0.5, init_upper=0.2, temperature=1.1)
    norm = np.linalg.norm(X, axis=-1, keepdims=True)
    c = norm * np.tanh(-0.5)
    cap = norm * np.tanh(-0.5 + np.log1p(np.exp(0.2)))
    want = np_softmax(np.clip(X, c, cap) / 1.1, -1)
    np.testing.assert_allclose(numpy(lb(X)), want, atol=1e-6)
    grads = _sgd_step_changes(lb, X, np.zeros(len(X), np.int32))
    assert all(abs(g) > 0 for g in grads.values()), grads
    lbl = LogitBounding(bound_fn="linear", init_lower=-1.0, init_upper=1.0, temperature=1.0)
    np.testing.assert_allclose(
        numpy(lbl([X, Z])), np_softmax(np.clip(X, -1.0, -1 + np.log1p(np.e)), -1), atol=1e-6
    )


def _sgd_step_changes(layer, x, labels):
    """``{variable name: change}`` after one SGD step (lr 1) on mean -log p[label]: the
    negative gradient of each (scalar) variable."""
    model = keras.Sequential([keras.Input(x.shape[1:]), layer])
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss="sparse_categorical_crossentropy")
    before = {v.path: numpy(v).copy() for v in layer.trainable_variables}
    model.train_on_batch(x, labels)
    return {
        v.path.split("/")[-1]: float(np.sum(numpy(v) - before[v.path]))
        for v in layer.trainable_variables
    }


def test_inactive_bounds_get_exactly_zero_gradient():
    x = RNG.uniform(-1, 1, (64, 10)).astype(np.float32)  # softmax in (0.01, 0.3)
    pb = ProbabilityBounding(init_lower=-4.0, init_upper=3.0, temperature=1.0)
    grads = _sgd_step_changes(pb, x, np.zeros(64, np.int32))
    assert grads["lower"] == 0.0 and grads["upper"] == 0.0, grads
    assert grads["log_temperature"] != 0.0


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


def _pb_data():
    rng = np.random.RandomState(1)
    return rng.normal(size=(64, 8)).astype(np.float32), rng.randint(0, 4, 64)


def test_pb_mixed_precision():
    assert_mixed_precision(_calibrated_model, *_pb_data(), "sparse_categorical_crossentropy")


@pytest.mark.tensorflow_only(reason="tf.distribute.MirroredStrategy")
def test_pb_mirrored():
    from tests.helpers import assert_mirrored_matches_single

    loss = "sparse_categorical_crossentropy"
    assert_mirrored_matches_single(_calibrated_model, *_pb_data(), loss)


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
    got = numpy(lb(x))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, atol=1e-6)
    lo, hi = (numpy(t) for t in lb.bound_values(x))
    np.testing.assert_allclose(lo, c, rtol=1e-5)
    np.testing.assert_allclose(hi, cap, rtol=1e-5)


@pytest.mark.parametrize("cls", [TemperatureScaling, ProbabilityBounding, LogitBounding])
def test_rank_0_logits_raise_naming_logits(cls):
    # Issue 19 item 7: IndexError / TF-internal errors before.
    with pytest.raises(ValueError, match="`logits` must have rank >= 1"):
        cls()(np.float32(2.0))


def test_calibrator_layers_reject_bad_logits_naming_them():
    bad = X[:8].copy()
    bad[2, 1] = np.nan
    for layer in (
        TemperatureScaling(temperature=2.0),
        ProbabilityBounding(init_lower=0.3, init_upper=-0.4, temperature=1.2),
        LogitBounding(init_lower=-0.5, init_upper=0.2, temperature=1.1),
    ):
        with pytest.raises(ValueError, match="`logits`"):
            layer(bad)
