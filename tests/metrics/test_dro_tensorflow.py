"""Streaming exact KL-DRO risk metric under ``tf.distribute.MirroredStrategy`` (the
backend-neutral tests: ``tests/metrics/test_dro.py``)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from losszoo.metrics import ExactKLDRORisk
from tests.references import load_reference

pytestmark = pytest.mark.tensorflow_only(reason="tf.distribute.MirroredStrategy")

R = load_reference("safe_kl_dro")


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])


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
