"""Rankmax checks of what only TensorFlow has: ``tf.function`` with ``None``-shaped
signatures (in-batch scores), ``tf.RaggedTensor`` / ``tf.SparseTensor`` labels. The
backend-neutral tests are in ``test_rankmax.py``."""

import numpy as np
import pytest
import tensorflow as tf

from losszoo.ops import rankmax, rankmax_loss
from tests.ops.test_rankmax import _ref_rows, ref

pytestmark = pytest.mark.tensorflow_only(
    reason="None-shaped tf.function signatures, tf.RaggedTensor / tf.SparseTensor labels"
)


def ref_rows(z, lists, k=1):
    return np.array(
        [
            sum(ref.rankmax(row.astype(np.float64), y, k)[4] for y in ids)
            for row, ids in zip(z, lists)
        ]
    )


def test_k_checked_when_the_graph_runs_for_a_dynamic_class_count():
    # in-batch scores have a dynamic n: k < n is checked when the graph runs
    dynamic = tf.function(
        lambda s, y: rankmax_loss(y, s, k=3),
        input_signature=[tf.TensorSpec([None, None]), tf.TensorSpec([None], tf.int32)],
    )
    np.testing.assert_allclose(
        dynamic(tf.zeros([2, 4]), tf.constant([0, 1])), [np.log(4 / 3)] * 2, rtol=1e-6
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="k"):
        dynamic(tf.zeros([2, 3]), tf.constant([0, 1]))


def test_keras_label_format_reads_an_unknown_last_axis_as_dense_weights():
    # Issue 20: an unknown last axis of the labels reads as dense weights (TFRS's tf.eye(B)).
    fn = tf.function(
        lambda lab, s: rankmax_loss(lab, s, label_format="keras"),
        input_signature=[tf.TensorSpec([None, None], tf.float32), tf.TensorSpec([None, None])],
    )
    zz = np.random.default_rng(20).normal(size=(3, 3)).astype(np.float32)
    want, _ = _ref_rows(zz, [[(i, 1.0)] for i in range(3)], 1)
    np.testing.assert_allclose(fn(np.eye(3, dtype=np.float32), zz), want, rtol=1e-5)


def test_ragged_and_sparse_labels():
    # Issue 19 item 10: ragged positive lists (natural for retrieval) and sparse labels failed
    # with TF-internal messages. Ragged ids pad with -1; sparse ids' absent entries are -1.
    z = np.random.default_rng(3).normal(size=(3, 5)).astype(np.float32)
    lists = [[0, 3], [4], []]
    want = ref_rows(z, lists)
    ragged = tf.ragged.constant(lists, dtype=tf.int64)
    np.testing.assert_allclose(rankmax_loss(ragged, z).numpy(), want, rtol=1e-6, atol=1e-6)
    dense = np.zeros((3, 5), np.float32)
    for i, ids in enumerate(lists):
        dense[i, ids] = 1.0
    sparse_dense = tf.sparse.from_dense(dense)
    np.testing.assert_allclose(rankmax_loss(sparse_dense, z).numpy(), want, rtol=1e-6, atol=1e-6)
    sparse_ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], [0, 3, 4], [3, 2])
    np.testing.assert_allclose(rankmax_loss(sparse_ids, z).numpy(), want, rtol=1e-6, atol=1e-6)
    p = rankmax(ragged, z).numpy()  # [3, 2, 5]: one projection per listed id, padding zero
    np.testing.assert_allclose(p[0, 1], ref.rankmax(z[0].astype(np.float64), 3, 1)[0], atol=1e-6)
    np.testing.assert_array_equal(p[1, 1], 0.0)
    empty = tf.ragged.constant([[], []], dtype=tf.int32)
    np.testing.assert_array_equal(rankmax_loss(empty, z[:2]).numpy(), [0.0, 0.0])
    with pytest.raises(TypeError, match="`labels` is a tf.RaggedTensor"):
        rankmax_loss(ragged, z, label_format="dense")


def test_ragged_and_sparse_labels_under_xla_name_the_argument():
    # XLA cannot compile the ops that densify: a TypeError naming `labels`, not TF's own.
    z = np.random.default_rng(4).normal(size=(2, 5)).astype(np.float32)
    xla = tf.function(lambda y: rankmax_loss(y, z), jit_compile=True)
    graph = tf.function(lambda y: rankmax_loss(y, z))
    for labels in (
        tf.ragged.constant([[0, 3], [4]], dtype=tf.int64),
        tf.sparse.from_dense(np.eye(5)[:2]),
    ):
        with pytest.raises(TypeError, match="`labels` is a .*jit_compile=True"):
            xla(labels)
        got = graph(labels)  # graph without XLA still works
        np.testing.assert_allclose(got.numpy(), rankmax_loss(labels, z).numpy(), rtol=1e-6)
