"""RankmaxLoss and SparsemaxLoss inside TensorFlow Recommenders and tf_keras (Keras 2).

tests/conftest.py sets TF_USE_LEGACY_KERAS=1, so ``tf.keras`` is tf_keras, as TFRS 0.7 needs.
``losszoo.tf_keras_loss`` sums over the batch by default, like TFRS' default loss.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import losszoo
from losszoo.losses import RankmaxLoss, SparsemaxLoss
from tests.helpers import load_reference

pytestmark = pytest.mark.tensorflow_only(reason="TensorFlow Recommenders and tf_keras")

tfrs = pytest.importorskip("tensorflow_recommenders")
tf_keras = pytest.importorskip("tf_keras")

ref = load_reference("rankmax_sparsemax")
LOSSES = {
    "rankmax": lambda z, y: ref.rankmax(z, y, 1)[4],
    "sparsemax": lambda z, y: ref.sparsemax_loss(z, np.eye(z.size)[y]),
}


def _ref_sum(scores, positives, name, weights=None):
    """TFRS' reduction: the (weighted) per-example losses summed over the batch."""
    per = np.array([LOSSES[name](row, y) for row, y in zip(scores, positives)])
    weights = np.ones_like(per) if weights is None else weights
    return float(np.sum(weights * per))


def _ref_mean(scores, positives, name, weights=None):
    return _ref_sum(scores, positives, name, weights) / len(scores)


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
    for loss in (
        losszoo.tf_keras_loss(name),
        losszoo.tf_keras_loss(RankmaxLoss() if name == "rankmax" else SparsemaxLoss()),
    ):
        task = tfrs.tasks.Retrieval(loss=loss)
        got = float(task(tf.constant(q), tf.constant(c)))
        assert got == pytest.approx(_ref_sum(scores, range(8), name), rel=1e-5, abs=1e-6)
        w = np.linspace(0.0, 2.0, 8).astype(np.float32)
        got_w = float(task(tf.constant(q), tf.constant(c), sample_weight=tf.constant(w)))
        assert got_w == pytest.approx(_ref_sum(scores, range(8), name, w), rel=1e-5, abs=1e-6)
    # the mean, on request
    task = tfrs.tasks.Retrieval(loss=losszoo.tf_keras_loss(name, reduction="sum_over_batch_size"))
    got = float(task(tf.constant(q), tf.constant(c)))
    assert got == pytest.approx(_ref_mean(scores, range(8), name), rel=1e-5, abs=1e-6)


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
    assert got == pytest.approx(_ref_sum(masked, range(8), name), rel=1e-5, abs=1e-6)

    task = tfrs.tasks.Retrieval(loss=losszoo.tf_keras_loss(name), num_hard_negatives=3)
    got = float(task(tf.constant(q), tf.constant(c)))
    kept = []
    for b in range(8):
        others = np.delete(scores[b], b)
        kept.append(np.concatenate([[scores[b, b]], np.sort(others)[::-1][:3]]))
    assert got == pytest.approx(_ref_sum(np.array(kept), [0] * 8, name), rel=1e-5, abs=1e-6)


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


# ---------------------------------------------------------------------------------------
# The TFRS basic-retrieval recipe (Adagrad 0.1, large batches, 3 epochs) on a small
# synthetic task: 200 users with 3 favourite items each. What a user pastes,
# ``tfrs.tasks.Retrieval(loss=losszoo.tf_keras_loss(name))``, must learn about as well as
# TFRS' default loss at the same settings; a batch-mean reduction barely moves.
_N, _FAVOURITES, _BATCH = 200, 3, 1024


def _recipe_data():
    r = np.random.default_rng(0)
    favourites = np.stack([r.permutation(_N) for _ in range(_FAVOURITES)], 1)
    users = np.repeat(np.arange(_N), 24)
    items = favourites[users, r.integers(0, _FAVOURITES, users.size)]
    data = tf.data.Dataset.from_tensor_slices({"user": users, "item": items})
    return favourites, data.shuffle(users.size, seed=0).batch(_BATCH)


class _RecipeModel(tfrs.Model):
    def __init__(self, loss):
        super().__init__()

        def table(seed):
            return tf_keras.layers.Embedding(
                _N,
                16,
                embeddings_initializer=(tf_keras.initializers.RandomNormal(stddev=0.1, seed=seed)),
            )

        self.users, self.items = table(1), table(2)
        self.task = tfrs.tasks.Retrieval(loss=loss)  # loss=None: TFRS' default

    def compute_loss(self, features, training=False):
        return self.task(
            self.users(features["user"]), self.items(features["item"]), compute_metrics=False
        )


def _recipe_top10(loss):
    """Share of (user, favourite) pairs in the user's top 10 after the recipe (brute force)."""
    favourites, data = _recipe_data()
    tf_keras.utils.set_random_seed(0)
    model = _RecipeModel(loss)
    model.compile(optimizer=tf_keras.optimizers.Adagrad(0.1))
    model.fit(data, epochs=3, verbose=0)
    scores = model.users.embeddings.numpy() @ model.items.embeddings.numpy().T
    top = np.argsort(-scores, axis=1)[:, :10]
    return float(np.mean([np.isin(favourites[u], top[u]) for u in range(_N)]))


@pytest.fixture(scope="module")
def default_recipe_top10():
    value = _recipe_top10(None)
    assert value > 0.8, f"TFRS' default loss reached only top-10 {value:.3f}; the task is off"
    return value


@pytest.mark.parametrize("name", ["rankmax", "sparsemax"])
def test_tfrs_recipe_pasted_loss_trains_like_the_default(name, default_recipe_top10):
    got = _recipe_top10(losszoo.tf_keras_loss(name))
    print(f"TFRS recipe top-10: default {default_recipe_top10:.3f}, {name} {got:.3f}")
    assert got >= 0.9 * default_recipe_top10, (name, got, default_recipe_top10)


def test_tfrs_recipe_mean_reduction_is_what_fails(default_recipe_top10):
    # The failure the SUM default prevents: with a batch mean the gradients are 1024x
    # smaller and the model stays near its random initialisation after 3 epochs.
    got = _recipe_top10(losszoo.tf_keras_loss("rankmax", reduction="sum_over_batch_size"))
    assert got < 0.5 * default_recipe_top10, got


# ---------------------------------------------------------------------------------------
# Keras 3 retrieval without TFRS (examples/keras3_retrieval.py, keras-rs).


def test_keras_rs_remove_accidental_hits_does_not_mask():
    # Why losszoo.retrieval masks by -inf itself: keras-rs 0.4's layer adds a tiny positive number.
    keras_rs = pytest.importorskip("keras_rs")
    logits = np.array([[1.0, 2.0, 3.0]], np.float32)
    out = keras_rs.layers.RemoveAccidentalHits()(
        logits, np.eye(3, dtype=np.float32)[:1], np.array([7, 7, 9])
    )
    np.testing.assert_array_equal(np.asarray(out), logits)  # duplicate 7 at column 1 kept
