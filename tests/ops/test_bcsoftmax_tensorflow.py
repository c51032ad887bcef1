"""BCSoftmax under what only TensorFlow has: ``tf.function`` with a ``None`` batch dimension
in its input signature (one XLA program for every batch size), and a static class axis."""

import numpy as np
import pytest
import tensorflow as tf

from losszoo.ops._bcsoftmax import bcsoftmax
from tests.references import load_reference

pytestmark = pytest.mark.tensorflow_only(
    reason="tf.function input signatures with a None batch dimension"
)

REF = load_reference("bcsoftmax")


def test_dynamic_batch_compiles_once():
    traces = []

    @tf.function(jit_compile=True, input_signature=[tf.TensorSpec([None, 16], tf.float32)])
    def f(x):
        traces.append(1)
        return bcsoftmax(x, 0.01, 0.3)

    rng = np.random.RandomState(18)
    for n in (1, 33):
        x = rng.normal(0, 3, (n, 16)).astype(np.float32)
        np.testing.assert_allclose(f(x).numpy(), REF.bcsoftmax(x, 0.01, 0.3)[0], atol=1e-6)
    assert len(traces) == 1

    with pytest.raises(ValueError, match="static"):
        tf.function(
            lambda t: bcsoftmax(t), input_signature=[tf.TensorSpec([2, None], tf.float32)]
        ).get_concrete_function()
