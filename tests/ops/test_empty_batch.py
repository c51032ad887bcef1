"""Empty batches (issue 31 item 5): empty in, empty out, on every backend and in every mode.

A ``[0, K]`` batch gives ``[0, K]`` outputs (ops, heads), ``[0]`` per-example losses,
``[0, K]`` gradients, a loss object's value as Keras' own cross-entropy gives it for the same
empty batch, and metrics left as they were. Keras' ``ops.max`` refused such batches on
TensorFlow and PyTorch ("Cannot compute the max of an empty tensor");
``losszoo._backend.reduce_max`` reduces them.
"""

import keras
import numpy as np
import pytest

import losszoo
from tests.harness import MODES, compiled, float64, numpy, value_and_grad

K = 4
Z = np.zeros((0, K), np.float32)
IDS = np.zeros((0,), np.int32)
PI = np.zeros((0, K), np.float32)

OPS = {
    "sparsemax": (lambda z: losszoo.ops.sparsemax(z), (0, K)),
    "sparsemax_loss": (lambda z: losszoo.ops.sparsemax_loss(PI, z), (0,)),
    "bcsoftmax": (lambda z: losszoo.ops.bcsoftmax(z, lower=0.01, upper=0.9), (0, K)),
    "bcsoftmax_temperature": (lambda z: losszoo.ops.bcsoftmax(z, temperature=0.5), (0, K)),
    "rankmax": (lambda z: losszoo.ops.rankmax(IDS, z, k=2), (0, K)),
    "rankmax_loss": (lambda z: losszoo.ops.rankmax_loss(IDS, z, k=2), (0,)),
    "rankmax_loss_dense": (lambda z: losszoo.ops.rankmax_loss(PI, z, max_positives=None), (0,)),
    "possibilistic_projection": (
        lambda z: losszoo.ops.possibilistic_projection(z, PI)[0],
        (0, K),
    ),
    "antipignistic": (lambda z: losszoo.ops.antipignistic(z + PI), (0, K)),
}
_FLOAT64 = {"possibilistic_projection", "antipignistic"}  # JAX: with x64 on


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(OPS))
def test_ops_of_an_empty_batch_are_empty_with_empty_gradients(name, mode):
    fn, shape = OPS[name]
    with float64() if name in _FLOAT64 else _nothing():
        out = numpy(compiled(fn, mode)(Z))
        assert out.shape == shape
        if name in _FLOAT64:
            return  # no custom gradient through the solver's outputs is asked here
        value, (g,) = value_and_grad(fn, Z, mode=mode)
    assert value.shape == shape and g.shape == (0, K)


HEADS = ["sparsemax", "bcsoftmax", "probability_bounding", "logit_bounding", "temperature_scaling"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", HEADS)
def test_heads_of_an_empty_batch_are_empty(name, mode):
    head = losszoo.get(name, "head")
    head(np.zeros((2, K), np.float32))  # built on a real batch
    out = numpy(compiled(lambda z: head(z), mode)(Z))
    assert out.shape == (0, K)


LOSSES = {
    "sparsemax": IDS,
    "softmax_cross_entropy": IDS,
    "rankmax": IDS,
    "vote_kl": PI,
    "antipignistic_kl": PI,
    "possibilistic_projection": PI,
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_losses_of_an_empty_batch_are_what_keras_gives(name, mode):
    keras_ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    expected = numpy(compiled(lambda z: keras_ce(IDS, z), mode)(Z))
    loss = losszoo.get(name)
    with (
        float64()
        if name in ("vote_kl", "antipignistic_kl", "possibilistic_projection")
        else (_nothing())
    ):
        got = numpy(compiled(lambda z: loss(LOSSES[name], z), mode)(Z))
    assert got.shape == expected.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_array_equal(np.nan_to_num(got), np.nan_to_num(expected))


METRICS = ["ece", "adaptive_ece", "classwise_ece", "brier_score", "nll", "calibration_accuracy"]


@pytest.mark.parametrize("name", METRICS)
def test_metrics_ignore_an_empty_batch(name):
    probs = np.array([[0.7, 0.1, 0.1, 0.1], [0.2, 0.5, 0.2, 0.1]], np.float32)
    ids = np.array([0, 2])
    metric = losszoo.get(name, "metric")
    metric.update_state(ids, probs)
    before = numpy(metric.result())
    metric.update_state(IDS, Z + 0.25)
    np.testing.assert_allclose(numpy(metric.result()), before, rtol=1e-6)
    fresh = losszoo.get(name, "metric")
    fresh.update_state(IDS, Z + 0.25)
    assert np.isfinite(numpy(fresh.result())) or np.isnan(numpy(fresh.result()))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
