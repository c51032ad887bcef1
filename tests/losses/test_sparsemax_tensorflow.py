"""SparsemaxLoss checks of what only TensorFlow has: MirroredStrategy, ``tf.function`` with
``None``-shaped signatures (in-batch ids), ``tf.SparseTensor`` / ``tf.RaggedTensor`` labels.
The backend-neutral tests are in ``test_sparsemax.py``."""

import numpy as np
import pytest
import tensorflow as tf

from losszoo.losses import SparsemaxLoss
from tests.helpers import (
    assert_mirrored_matches_single,
    classification_data,
    dynamic_loss_and_grad,
    small_mlp,
)
from tests.losses.test_sparsemax import IDS, Z, ref, ref_losses

pytestmark = pytest.mark.tensorflow_only(
    reason="MirroredStrategy, None-shaped tf.function signatures, sparse/ragged labels"
)


def test_mirrored_strategy_matches_single_device():
    x, y = classification_data(n=64)
    assert_mirrored_matches_single(small_mlp, x, y, SparsemaxLoss())


@pytest.mark.parametrize("jit", [False, True])
def test_ids_with_dynamic_class_count(jit):
    z = np.random.default_rng(1).normal(size=(5, 5)).astype(np.float32)
    ids = np.array([0, 1, 2, 3, 4], np.float32)
    run = dynamic_loss_and_grad(SparsemaxLoss(reduction=None), jit)

    values, grad = run(ids, z)
    np.testing.assert_allclose(values, ref_losses(z, np.eye(5)), rtol=1e-5, atol=1e-6)
    want_grad = np.stack([ref.sparsemax(r.astype(np.float64))[0] for r in z]) - np.eye(5)
    np.testing.assert_allclose(grad, want_grad, atol=1e-6)
    # A different batch size through the same signature.
    values3, _ = run(ids[:3], z[:3, :3])
    np.testing.assert_allclose(values3, ref_losses(z[:3, :3], np.eye(3)), rtol=1e-5, atol=1e-6)
    bad = np.array([0, 1, 7, 3, np.nan], np.float32)
    if jit:  # assertions vanish under XLA: the bad rows' loss is NaN, the others untouched
        values, grad = run(bad, z)
        assert np.isnan(values[2]) and np.isnan(values[4])
        np.testing.assert_allclose(values[:2], ref_losses(z[:2], np.eye(5)[:2]), rtol=1e-5)
        assert np.all(np.isnan(grad[2])) and np.all(np.isfinite(grad[:2]))
    else:
        with pytest.raises(tf.errors.InvalidArgumentError, match="`y_true`"):
            run(bad, z)


def test_sample_weight_length_checked_in_a_none_batch_graph():
    loss = SparsemaxLoss()
    per_row = ref_losses(Z, np.eye(5)[IDS])
    w = np.arange(6.0, dtype=np.float32)
    graph = tf.function(
        lambda y, z, sw: loss(y, z, sample_weight=sw),
        input_signature=[tf.TensorSpec([None]), tf.TensorSpec([None, 5]), tf.TensorSpec([None])],
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="`sample_weight`"):
        graph(IDS.astype(np.float32), Z, np.ones(5, np.float32))
    np.testing.assert_allclose(
        float(graph(IDS.astype(np.float32), Z, w)), (per_row * w).mean(), rtol=1e-5
    )


def test_sparse_and_ragged_labels():
    # Issue 19 item 10.
    loss = SparsemaxLoss(reduction=None)
    multi = np.zeros((6, 5), np.float32)
    multi[np.arange(6), IDS] = 1.0
    multi[0, 3] = 1.0
    want = ref_losses(Z, multi / multi.sum(1, keepdims=True))
    np.testing.assert_allclose(loss(tf.sparse.from_dense(multi), Z).numpy(), want, atol=1e-6)
    with pytest.raises(TypeError, match="`y_true` must be a dense tensor or a tf.SparseTensor"):
        loss(tf.ragged.constant([[0, 3], [4]]), Z[:2])
