"""Sparsemax checks of what only TensorFlow has: ``tf.function`` with a ``None`` batch,
persistent ``tf.GradientTape``, ``tf.SparseTensor`` / ``tf.RaggedTensor`` labels. The
backend-neutral tests are in ``test_sparsemax.py``."""

import numpy as np
import pytest
import tensorflow as tf

from losszoo import ops
from tests.ops.test_sparsemax import (
    CHUNK_SHAPES,
    _chunk_data,
    candidate_chunk_data,
    ref_losses,
)

pytestmark = pytest.mark.tensorflow_only(
    reason="tf.function None-batch signatures, persistent GradientTape, sparse/ragged labels"
)


def test_chunked_start_with_an_unknown_batch():
    """The chunk-maxima start traced with a ``None`` batch (test_sparsemax's shapes)."""
    for shape in CHUNK_SHAPES:
        z, want = _chunk_data(shape)
        graph = tf.function(ops.sparsemax, input_signature=[tf.TensorSpec([None, *shape[1:]])])
        np.testing.assert_allclose(graph(tf.constant(z)).numpy(), want, atol=1e-6, err_msg=shape)


@pytest.mark.parametrize("num_classes", [32768, 1_000_000])
def test_candidate_chunks_with_an_unknown_batch(num_classes):
    """test_sparsemax's candidate-chunk batch in a graph traced with a None batch: values,
    the loss and its gradient ``p - q`` (the graph mode of that test)."""
    z, q, p_want, loss_want = candidate_chunk_data(num_classes)

    @tf.function(input_signature=[tf.TensorSpec([None, num_classes])] * 2)
    def both(z, q):
        with tf.GradientTape() as tape:
            tape.watch(z)
            loss = ops.sparsemax_loss(q, z)
        return ops.sparsemax(z), loss, tape.gradient(loss, z)

    p, loss, grad = (t.numpy() for t in both(tf.constant(z), tf.constant(q)))
    np.testing.assert_allclose(p[:3], p_want, atol=1e-6)
    np.testing.assert_allclose(loss[:3], loss_want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad[:3], p_want - q[:3], atol=1e-6)
    assert np.all(np.isnan(p[3])) and np.isnan(loss[3]) and np.all(np.isnan(grad[3]))


# Issue 31 item 7: from 8192 classes the threshold search has an ``ops.cond`` (the full search
# when the support spans more than 64 chunks). Two ``tape.gradient`` calls of one persistent
# tape through ``sparsemax`` (or ``sparsemax`` and ``sparsemax_loss`` of the same logits)
# inside ``tf.function(jit_compile=True)`` used to fail to compile (``FakeParam``: the tape
# differentiated that cond).
K = 8192


def _tape_data(full_search):
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
def test_two_gradients_of_one_persistent_tape_compile_and_are_right(jit_compile):
    @tf.function(jit_compile=jit_compile)
    def step(z, q, u):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(z)
            p = ops.sparsemax(z)
            weighted = tf.reduce_sum(p * u)
            squares = tf.reduce_sum(p * p)
            loss = tf.reduce_sum(ops.sparsemax_loss(q, z))
        grads = [tape.gradient(t, z) for t in (weighted, squares, loss)]
        return p, grads

    for full_search in (False, True):  # one program, both branches taken
        z, q, u = _tape_data(full_search)
        p, (g_weighted, g_squares, g_loss) = step(tf.constant(z), tf.constant(q), tf.constant(u))
        p = p.numpy()
        np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
        if full_search:
            assert (p[1] > 0).sum() > 64 * 32  # the support spans more than 64 chunks
        np.testing.assert_allclose(g_weighted.numpy(), _sparsemax_grads(p, u), atol=1e-5)
        np.testing.assert_allclose(g_squares.numpy(), _sparsemax_grads(p, 2 * p), atol=1e-5)
        np.testing.assert_allclose(g_loss.numpy(), p - q, atol=1e-6)
    assert step.experimental_get_tracing_count() == 1


def test_sparse_labels_are_densified_and_ragged_labels_rejected():
    # Issue 19 item 10: both failed with TF-internal messages naming no argument.
    z = np.array([[1.0, 0.0, -1.0], [0.5, 0.2, 0.1]], np.float32)
    q = np.array([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]], np.float32)
    want = ops.sparsemax_loss(q, z).numpy()
    np.testing.assert_allclose(want, ref_losses(z, q), atol=1e-6)
    sparse = tf.sparse.from_dense(q)
    np.testing.assert_allclose(ops.sparsemax_loss(sparse, z).numpy(), want, atol=1e-7)
    with pytest.raises(TypeError, match="`labels` must be a dense tensor or a tf.SparseTensor"):
        ops.sparsemax_loss(tf.ragged.constant([[1, 2], [0]]), z)
