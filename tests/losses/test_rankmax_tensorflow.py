"""RankmaxLoss checks of what only TensorFlow has: MirroredStrategy, ``tf.function`` with
``None``-shaped signatures (in-batch ids), ``tf.RaggedTensor`` / ``tf.SparseTensor`` labels.
The backend-neutral tests are in ``test_rankmax.py``."""

import numpy as np
import pytest
import tensorflow as tf

from losszoo.losses import RankmaxLoss
from tests.helpers import (
    assert_mirrored_matches_single,
    classification_data,
    dynamic_loss_and_grad,
    small_mlp,
)
from tests.losses.test_rankmax import Z, ref, ref_losses

pytestmark = pytest.mark.tensorflow_only(
    reason="MirroredStrategy, None-shaped tf.function signatures, sparse/ragged labels"
)


def test_mirrored_strategy_matches_single_device():
    x, y = classification_data(n=64)
    assert_mirrored_matches_single(small_mlp, x, y, RankmaxLoss(k=2))


@pytest.mark.parametrize("jit", [False, True])
def test_ids_with_dynamic_class_count(jit):
    """In-batch retrieval ids when the batch (= class) size is unknown (issue 10 item 4)."""
    z = np.random.default_rng(1).normal(size=(5, 5)).astype(np.float32)
    ids = np.array([0, 1, 2, 3, 4], np.float32)
    run = dynamic_loss_and_grad(RankmaxLoss(reduction=None), jit)

    values, grad = run(ids, z)
    np.testing.assert_allclose(
        values, ref_losses(z, [[(y, 1.0)] for y in range(5)]), rtol=1e-5, atol=1e-6
    )
    want_grad = np.stack(
        [ref.rankmax_loss_grad(r.astype(np.float64), y, 1) for y, r in enumerate(z)]
    )
    np.testing.assert_allclose(grad, want_grad, atol=1e-5)
    values3, _ = run(ids[:3], z[:3, :3])
    np.testing.assert_allclose(
        values3, ref_losses(z[:3, :3], [[(y, 1.0)] for y in range(3)]), rtol=1e-5, atol=1e-6
    )
    bad = np.array([0, 1, 7, 3, np.nan], np.float32)
    if jit:
        values, _ = run(bad, z)
        assert np.isnan(values[2]) and np.isnan(values[4]) and np.all(np.isfinite(values[:2]))
    else:
        with pytest.raises(tf.errors.InvalidArgumentError, match="`y_true`"):
            run(bad, z)


def test_ragged_and_sparse_labels():
    # Issue 19 item 10.
    loss = RankmaxLoss(reduction=None)
    lists = [[0, 3], [4], [1, 2, 0], [2], [], [3]]
    want = ref_losses(Z, [[(y, 1.0) for y in ids] for ids in lists])
    ragged = tf.ragged.constant(lists, dtype=tf.int64)
    np.testing.assert_allclose(loss(ragged, Z).numpy(), want, rtol=1e-5, atol=1e-6)
    multi = np.zeros((6, 5), np.float32)
    for i, ids in enumerate(lists):
        multi[i, ids] = 1.0
    sparse = tf.sparse.from_dense(multi)
    np.testing.assert_allclose(
        RankmaxLoss(max_positives=None, reduction=None)(sparse, Z).numpy(),
        want,
        rtol=1e-5,
        atol=1e-6,
    )
