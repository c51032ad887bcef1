"""Labels of the wrong kind for the backend, and text, raise naming the argument (issue 31
items 8 and 14): before, raw JAX errors for TensorFlow's sparse / ragged labels, ``'>=' not
supported`` for sparse labels of the possibilistic and vote losses on TensorFlow, and "Cast
string to float" for text."""

import numpy as np
import pytest

import losszoo
from tests.harness import BACKEND, float64, numpy

Z = np.random.default_rng(0).normal(size=(3, 4)).astype("float32")
DENSE = np.eye(4, dtype="float32")[[0, 2, 1]]
NAMES = ["softmax_cross_entropy", "vote_kl", "antipignistic_kl", "possibilistic_projection"]
on_tensorflow = pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.SparseTensor labels")


@on_tensorflow
@pytest.mark.parametrize("name", NAMES + ["sparsemax", "rankmax"])
def test_sparse_labels_are_densified_on_tensorflow(name):
    tf = pytest.importorskip("tensorflow")
    loss = losszoo.get(name)
    want = float(loss(DENSE, Z))
    np.testing.assert_allclose(float(loss(tf.sparse.from_dense(DENSE), Z)), want, rtol=1e-6)


@on_tensorflow
@pytest.mark.parametrize("name", NAMES + ["sparsemax"])
def test_ragged_labels_raise_naming_y_true_on_tensorflow(name):
    tf = pytest.importorskip("tensorflow")
    with pytest.raises(TypeError, match="`y_true` must be a dense tensor"):
        losszoo.get(name)(tf.ragged.constant([[0], [2], [1]]), Z)


def _tensorflow_object(kind):
    """A tf.SparseTensor / tf.RaggedTensor; on JAX and PyTorch (no TensorFlow in the test
    process) a stand-in of the same class name and module."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        if kind == "SparseTensor":
            return tf.sparse.from_dense(DENSE)
        return tf.ragged.constant([[0], [2], [1]])
    cls = type(kind, (), {"__module__": "tensorflow.python.framework." + kind.lower()})
    return cls()


@pytest.mark.skipif(BACKEND == "tensorflow", reason="TensorFlow takes its own labels")
@pytest.mark.parametrize("kind", ["SparseTensor", "RaggedTensor"])
@pytest.mark.parametrize("name", NAMES + ["sparsemax", "rankmax"])
def test_tensorflow_labels_elsewhere_raise_naming_y_true(name, kind):
    with pytest.raises(TypeError, match=f"`y_true` is a tf.{kind}, which only the TensorFlow"):
        losszoo.get(name)(_tensorflow_object(kind), Z)


@pytest.mark.skipif(BACKEND == "tensorflow", reason="TensorFlow takes its own labels")
def test_tensorflow_labels_for_the_ops_elsewhere_raise_naming_labels():
    with pytest.raises(TypeError, match="`labels` is a tf.SparseTensor"):
        losszoo.ops.sparsemax_loss(_tensorflow_object("SparseTensor"), Z)


TEXT = np.array([["a"] * 4] * 3)


def test_text_raises_naming_the_argument():
    with pytest.raises(TypeError, match="`labels` must hold real numbers"):
        losszoo.ops.sparsemax_loss(TEXT, Z)
    with pytest.raises(TypeError, match="`logits` must hold real numbers"):
        losszoo.ops.sparsemax_loss(DENSE, TEXT)
    with float64():
        for name in NAMES + ["sparsemax", "rankmax"]:
            with pytest.raises(TypeError, match="`y_true` must hold real numbers"):
                losszoo.get(name)(np.array(["a", "b", "c"]), Z)
    # Numbers still go through (the check looks at the dtype only).
    assert np.isfinite(numpy(losszoo.ops.sparsemax_loss(DENSE, Z))).all()
