"""Every registered metric works by name, with its defaults, in Keras 3 and in tf_keras.

``compile(metrics=[name])`` then ``fit`` and ``evaluate`` over batches with a partial last
batch; the streamed value must equal a numpy reference on the whole data set (issue 19,
item 14: ``classwise_ece`` needed ``num_classes``; no metric name worked in tf_keras).
"""

import keras
import numpy as np
import pytest

import losszoo
from losszoo import calibration as C
from tests.harness import float64

N, D, K = 50, 4, 3
METRICS = losszoo.names("metric")


def _data(name):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, D)).astype(np.float32)
    ids = np.argmax(x[:, :K] + 0.5 * rng.normal(size=(N, K)), 1)
    if name == "possibilistic_projection_diagnostic":  # possibility degrees, max 1 at ids
        pi = rng.uniform(0.0, 0.7, size=(N, K)).astype(np.float32)
        pi[np.arange(N), ids] = 1.0
        return x, pi
    return x, ids


def _reference(name, y, out):
    """The metric of the whole data set from the model's outputs (numpy)."""
    if name == "possibilistic_projection_diagnostic":  # mean solver work per example
        # per evaluate batch of 16: a row's iteration count depends on its batch (compaction)
        loss = losszoo.get("possibilistic_projection")
        work = []
        for i in range(0, N, 16):
            _, info = loss.compute(y[i : i + 16], out[i : i + 16])
            work.append(keras.ops.convert_to_numpy(info.iterations + info.cycles))
        return float(np.mean(np.concatenate(work)))
    if name == "exact_kl_dro_risk":  # lam = 1, base: cross-entropy of probabilities
        nll = -np.log(np.clip(out[np.arange(N), y].astype(np.float64), 1e-7, 1.0))
        return float(np.log(np.mean(np.exp(nll))))
    functions = {
        "ece": C.ece,
        "adaptive_ece": C.adaptive_ece,
        "classwise_ece": C.classwise_ece,
        "nll": C.nll,
        "brier_score": C.brier_score,
        "calibration_accuracy": C.accuracy,
    }
    return functions[name](out.astype(np.float64), y)


def _setup(name):
    """Output activation and loss for the metric: probabilities, or logits for the
    possibilistic diagnostic (which reads logits and possibility labels). Its model trains
    with the antipignistic loss (same labels and logits), not the possibilistic projection:
    the metric by name builds its own projection loss and solves in its own update either
    way, and a second interior-point solver in every train and test program doubled the
    largest XLA compiles of this file (~150 s on TensorFlow) without checking more of the
    metric."""
    if name == "possibilistic_projection_diagnostic":
        return None, "antipignistic_kl"
    return "softmax", "sparse_categorical_crossentropy"


def _check(library, name):
    x, y = _data(name)
    activation, loss = _setup(name)
    model = library.Sequential(
        [library.Input((D,)), library.layers.Dense(K, activation=activation)]
    )
    model.compile(optimizer="sgd", loss=loss, metrics=[name])
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    result = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    (value,) = [v for k, v in result.items() if k != "loss"]
    # the outputs of evaluate's batches: the diagnostic's iteration counts are integers, and
    # a row's logits from another batching can differ in the last bits and cross a step
    want = _reference(name, y, model.predict(x, batch_size=16, verbose=0))
    assert np.isfinite(want)
    np.testing.assert_allclose(value, want, rtol=1e-4, atol=1e-5)


def test_every_registered_metric_is_tested():
    assert set(METRICS) == {
        "adaptive_ece",
        "brier_score",
        "calibration_accuracy",
        "classwise_ece",
        "ece",
        "exact_kl_dro_risk",
        "nll",
        "possibilistic_projection_diagnostic",
    }


@pytest.mark.parametrize("name", METRICS)
def test_keras3_metric_by_name(name):
    with float64():  # JAX: 64-bit mode for the possibilistic diagnostic
        _check(keras, name)


@pytest.mark.parametrize("name", METRICS)
def test_tf_keras_metric_by_name(name):
    _check(pytest.importorskip("tf_keras"), name)


def test_tf_keras_keeps_its_own_names_and_metric_state_is_per_model():
    tf_keras = pytest.importorskip("tf_keras")
    assert type(tf_keras.metrics.get("Accuracy")) is tf_keras.metrics.Accuracy
    first, second = tf_keras.metrics.get("ece"), tf_keras.metrics.get("ece")
    assert isinstance(first, tf_keras.metrics.Metric) and first is not second
    first.update_state([0, 1], [[0.9, 0.1], [0.8, 0.2]])
    np.testing.assert_allclose(first.result(), 0.45, rtol=1e-6)  # |0-.8|/2 + |1-.9|/2
    np.testing.assert_allclose(second.result(), 0.0)
    first.reset_state()
    np.testing.assert_allclose(first.result(), 0.0)


def test_classwise_ece_infers_the_class_count_and_saves_it():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(40, 5))
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    y = rng.integers(0, 5, 40)
    metric = C.ClasswiseECE()
    np.testing.assert_allclose(metric.result(), 0.0)  # before any update
    metric.update_state(y[:25], p[:25].astype(np.float32))
    metric.update_state(y[25:], p[25:].astype(np.float32))
    assert metric.num_classes == 5 and metric.get_config()["num_classes"] == 5
    np.testing.assert_allclose(metric.result(), C.classwise_ece(p, y), rtol=1e-5)
    with pytest.raises(ValueError, match="built for 5"):
        metric.update_state([0], [[0.5, 0.5]])
    clone = C.ClasswiseECE.from_config(metric.get_config())
    assert clone.num_classes == 5 and len(clone.variables) == 3
