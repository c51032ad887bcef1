"""Streaming exact KL-DRO risk metric against the numpy reference, on the running backend
(``MirroredStrategy``: ``tests/metrics/test_dro_tensorflow.py``)."""

import keras
import numpy as np

import losszoo.metrics  # noqa: F401  (the lead imports it from the package)
from losszoo.metrics import ExactKLDRORisk
from tests.harness import assert_config_roundtrip, numpy
from tests.references import load_reference

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
    assert float(numpy(metric.result())) == 0.0
    assert_config_roundtrip(ExactKLDRORisk("mae", lam=2.0))
