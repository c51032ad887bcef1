"""Issue 31 item 7: sparsemax under TensorFlow XLA with a persistent tape.

From 8192 classes the threshold search has an ``ops.cond`` (the full search when the
support spans more than 64 chunks). Two ``tape.gradient`` calls of one persistent tape
through ``sparsemax`` (or ``sparsemax`` and ``sparsemax_loss`` of the same logits) inside
``tf.function(jit_compile=True)`` used to fail to compile (``FakeParam``: the tape
differentiated that cond). TensorFlow only: JAX and PyTorch have no tape.
"""

import keras
import numpy as np
import pytest

import losszoo

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="TensorFlow's GradientTape"
)

K = 8192


def _data(full_search):
    r = np.random.default_rng(0)
    z = r.normal(size=(3, K)).astype(np.float32)
    if full_search:  # a support spread over far more than 64 chunks: the cond's other branch
        z[1] = 0.0
        z[1, ::4] = 1e-4 * r.normal(size=K // 4)
    q = np.zeros((3, K), np.float32)  # one-hot rows, without the K x K identity
    q[np.arange(3), [5, 70, 8000]] = 1.0
    u = r.uniform(0.5, 1.5, size=(3, K)).astype(np.float32)
    return z, q, u


def _sparsemax_grads(p, u):
    s = (p > 0).astype(np.float64)
    return s * (u - (s * u).sum(-1, keepdims=True) / s.sum(-1, keepdims=True))


@pytest.mark.parametrize("jit_compile", [True, False])
@pytest.mark.parametrize("full_search", [False, True])
def test_two_gradients_of_one_persistent_tape_compile_and_are_right(jit_compile, full_search):
    tf = pytest.importorskip("tensorflow")
    z, q, u = _data(full_search)

    @tf.function(jit_compile=jit_compile)
    def step(z):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(z)
            p = losszoo.ops.sparsemax(z)
            weighted = tf.reduce_sum(p * u)
            squares = tf.reduce_sum(p * p)
            loss = tf.reduce_sum(losszoo.ops.sparsemax_loss(q, z))
        grads = [tape.gradient(t, z) for t in (weighted, squares, loss)]
        return p, grads

    p, (g_weighted, g_squares, g_loss) = step(tf.constant(z))
    p = p.numpy()
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
    if full_search:
        assert (p[1] > 0).sum() > 64 * 32  # the support spans more than 64 chunks
    np.testing.assert_allclose(g_weighted.numpy(), _sparsemax_grads(p, u), atol=1e-5)
    np.testing.assert_allclose(g_squares.numpy(), _sparsemax_grads(p, 2 * p), atol=1e-5)
    np.testing.assert_allclose(g_loss.numpy(), p - q, atol=1e-6)
