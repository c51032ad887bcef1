"""Streaming exact KL-DRO risk metric against the numpy reference."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import losszoo.metrics  # noqa: F401  (the lead imports it from the package)
from losszoo.metrics import ExactKLDRORisk
from tests.helpers import assert_config_roundtrip, load_reference

pytestmark = pytest.mark.tensorflow_only(reason="tf.distribute.MirroredStrategy (tests/helpers.py)")

R = load_reference("safe_kl_dro")


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])


def test_streaming_metric_is_exact_full_data_risk():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(101, 3)).astype("float32")
    y = (X @ [1.0, -2.0, 0.5] * 30).astype("float32")  # large losses: no overflow
    sw = rng.uniform(0.1, 2, size=101).astype("float32")
    metric = ExactKLDRORisk("mse", lam=0.5)
    model = _model()
    model.compile("sgd", loss="mse", weighted_metrics=[metric])
    got = model.evaluate(X, y, sample_weight=sw, batch_size=16, verbose=0, return_dict=True)
    l = (y.astype(np.float64) - model.predict(X, verbose=0)[:, 0]) ** 2
    assert l.max() / 0.5 > 100  # exp(l/lam) would overflow float32
    np.testing.assert_allclose(got["exact_kl_dro_risk"], R.exact_risk(l, 0.5, sw), rtol=1e-5)
    metric.reset_state()
    assert float(metric.result()) == 0.0
    assert_config_roundtrip(ExactKLDRORisk("mae", lam=2.0))


def test_streaming_metric_mirrored_matches_single():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(64, 3)).astype("float32")
    y = (X @ [1.0, -2.0, 0.5] + rng.standard_t(3, size=64)).astype("float32")
    single = _model()
    single.compile("sgd", loss="mse", metrics=[ExactKLDRORisk("mse", lam=1.0)])
    want = single.evaluate(X, y, batch_size=16, verbose=0, return_dict=True)["exact_kl_dro_risk"]
    strategy = tf.distribute.MirroredStrategy(
        [d.name for d in tf.config.list_logical_devices("CPU")][:2]
    )
    with strategy.scope():
        mirrored = _model()
        mirrored.set_weights(single.get_weights())
        mirrored.compile("sgd", loss="mse", metrics=[ExactKLDRORisk("mse", lam=1.0)])
    got = mirrored.evaluate(X, y, batch_size=16, verbose=0, return_dict=True)["exact_kl_dro_risk"]
    l = (y.astype(np.float64) - single.predict(X, verbose=0)[:, 0]) ** 2
    np.testing.assert_allclose(want, R.exact_risk(l, 1.0), rtol=1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-5)
