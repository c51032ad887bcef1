"""RankmaxLoss and SparsemaxLoss inside TensorFlow Recommenders and tf_keras (Keras 2).

tests/conftest.py sets TF_USE_LEGACY_KERAS=1, so ``tf.keras`` is tf_keras, as TFRS 0.7 needs.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import losszoo
from losszoo.losses import RankmaxLoss, SparsemaxLoss
from tests.helpers import load_reference

tfrs = pytest.importorskip("tensorflow_recommenders")
tf_keras = pytest.importorskip("tf_keras")

ref = load_reference("rankmax_sparsemax")
LOSSES = {
    "rankmax": lambda z, y: ref.rankmax(z, y, 1)[4],
    "sparsemax": lambda z, y: ref.sparsemax_loss(z, np.eye(z.size)[y]),
}


def _ref_mean(scores, positives, name, weights=None):
    per = np.array([LOSSES[name](row, y) for row, y in zip(scores, positives)])
    weights = np.ones_like(per) if weights is None else weights
    return float(np.mean(weights * per))


def _embeddings(b=8, d=4, seed=0):
    r = np.random.default_rng(seed)
    return r.normal(size=(b, d)).astype(np.float32), r.normal(size=(b, d)).astype(np.float32)


def test_tf_keras_is_legacy_keras():
    assert os.environ.get("TF_USE_LEGACY_KERAS") == "1"
    assert tf.keras.__name__.startswith("tf_keras") or tf.keras.Model is tf_keras.Model


@pytest.mark.parametrize("name", ["rankmax", "sparsemax"])
def test_retrieval_task_computes_the_reference_loss(name):
    q, c = _embeddings()
    scores = q.astype(np.float64) @ c.T.astype(np.float64)
    for loss in (losszoo.tf_keras_loss(name),
                 losszoo.tf_keras_loss(RankmaxLoss() if name == "rankmax" else SparsemaxLoss())):
        task = tfrs.tasks.Retrieval(loss=loss)
        got = float(task(tf.constant(q), tf.constant(c)))
        assert got == pytest.approx(_ref_mean(scores, range(8), name), rel=1e-5, abs=1e-6)
        w = np.linspace(0.0, 2.0, 8).astype(np.float32)
        got_w = float(task(tf.constant(q), tf.constant(c), sample_weight=tf.constant(w)))
        assert got_w == pytest.approx(_ref_mean(scores, range(8), name, w), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("name", ["rankmax", "sparsemax"])
def test_retrieval_with_accidental_hits_and_hard_negatives(name):
    q, c = _embeddings(seed=1)
    scores = q.astype(np.float64) @ c.T.astype(np.float64)
    ids = np.array([0, 1, 2, 1, 4, 5, 0, 7])  # rows 1/3 and 0/6 share a candidate
    task = tfrs.tasks.Retrieval(loss=losszoo.tf_keras_loss(name), remove_accidental_hits=True)
    got = float(task(tf.constant(q), tf.constant(c), candidate_ids=tf.constant(ids)))
    masked = scores.copy()
    dup = (ids[:, None] == ids[None, :]) & ~np.eye(8, dtype=bool)
    masked[dup] = -1e30  # an accidental hit never enters the support
    assert got == pytest.approx(_ref_mean(masked, range(8), name), rel=1e-5, abs=1e-6)

    task = tfrs.tasks.Retrieval(loss=losszoo.tf_keras_loss(name), num_hard_negatives=3)
    got = float(task(tf.constant(q), tf.constant(c)))
    kept = []
    for b in range(8):
        others = np.delete(scores[b], b)
        kept.append(np.concatenate([[scores[b, b]], np.sort(others)[::-1][:3]]))
    assert got == pytest.approx(_ref_mean(np.array(kept), [0] * 8, name), rel=1e-5, abs=1e-6)


class _TwoTower(tfrs.Model):
    def __init__(self, loss, n=20, d=8):
        super().__init__()
        self.users = tf_keras.layers.Embedding(n, d)
        self.items = tf_keras.layers.Embedding(n, d)
        self.task = tfrs.tasks.Retrieval(loss=loss)

    def compute_loss(self, features, training=False):
        return self.task(self.users(features["user"]), self.items(features["item"]))


@pytest.mark.parametrize("name", ["rankmax", "sparsemax"])
def test_tfrs_model_trains(name):
    r = np.random.default_rng(2)
    users = r.integers(0, 20, size=256)
    data = tf.data.Dataset.from_tensor_slices({"user": users, "item": (users * 7) % 20}).batch(32)
    model = _TwoTower(losszoo.tf_keras_loss(name))
    model.compile(optimizer=tf_keras.optimizers.Adagrad(0.5))
    hist = model.fit(data, epochs=4, verbose=0).history["loss"]
    assert np.all(np.isfinite(hist)) and hist[-1] < hist[0]


@pytest.mark.parametrize("name", ["rankmax", "sparsemax"])
def test_tf_keras_compile_by_name(name):
    r = np.random.default_rng(3)
    x = r.normal(size=(128, 6)).astype(np.float32)
    y = np.argmax(x @ r.normal(size=(6, 5)), 1)
    model = tf_keras.Sequential([tf_keras.layers.Dense(5, input_shape=(6,))])
    model.compile(optimizer=tf_keras.optimizers.Adam(0.05), loss=name)
    hist = model.fit(x, y, epochs=4, batch_size=32, verbose=0).history["loss"]
    assert np.all(np.isfinite(hist)) and hist[-1] < hist[0]
    # the value tf_keras reports is the reference loss
    scores = model.predict(x[:16], verbose=0).astype(np.float64)
    got = float(model.evaluate(x[:16], y[:16], batch_size=16, verbose=0))
    assert got == pytest.approx(_ref_mean(scores, y[:16], name), rel=1e-4, abs=1e-5)
