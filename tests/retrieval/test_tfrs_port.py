"""Issue 31 item 11: TFRS retrieval code ports to losszoo by its import (examples/
tfrs_tutorial_port.py), on TensorFlow (the tutorial's tf.data candidates) and JAX (candidate
batches): batch_metrics, compute_batch_metrics, a user's own Keras loss, FactorizedTopK over
candidates without ids, tfrs.Model's compute_loss(features, training)."""

import importlib.util
import json
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

import losszoo.retrieval as R
from losszoo.retrieval import tfrs
from tests.harness import BACKEND, numpy
from tests.retrieval._common import softmax_ce, towers

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "tfrs_tutorial_port.py"
IDS = np.array([3, 1, 3, 2, 5, 1], np.int32)


def brute_force_rank(q, table, true):
    """#{j != t : s_j >= s_t} in float64 (the pessimistic rank)."""
    s = q.astype(np.float64) @ table.astype(np.float64).T
    t = s[np.arange(len(q)), true]
    others = np.ones_like(s, bool)
    others[np.arange(len(q)), true] = False
    return np.sum((s >= t[:, None]) & others, axis=1)


def load_example():
    spec = importlib.util.spec_from_file_location(f"example_tfrs_port_{BACKEND}", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_port_changes_only_the_import():
    source = SCRIPT.read_text()
    body = source.split("# ---- from here on, TFRS code", 1)[1].split("\ndef main", 1)[0]
    assert "from losszoo.retrieval import tfrs  # was: import tensorflow_recommenders as tfrs" in (
        source
    )
    for used in (
        "tfrs.metrics.FactorizedTopK(candidates=",
        "tfrs.tasks.Retrieval(",
        "CategoricalCrossentropy(from_logits=True",
        "batch_metrics=[",
        "class MovielensModel(tfrs.Model):",
        "def compute_loss(self, features, training=False):",
        "compute_batch_metrics=not training",
    ):
        assert used in body, used
    assert "losszoo" not in body and "R." not in body


def test_tutorial_port_trains_and_evaluates_on_this_backend(tmp_path, capsys):
    argv = ["--users", "20", "--movies", "30", "--ratings", "600", "--dim", "8"]
    argv += ["--batch-size", "64", "--epochs", "3", "--lr", "0.5", "--out", str(tmp_path)]
    results = load_example().main(argv)
    assert {"loss", "batch_top_10", "top_1", "top_10", "top_100"} <= set(results)
    assert 0.0 <= results["top_1"] <= results["top_10"] <= results["top_100"] == 1.0
    assert results["top_10"] > 0.5  # 30 movies, each user rates a block of one or two
    assert np.all(np.isfinite(results["train_loss"]))
    assert results["train_loss"][-1] < results["train_loss"][0]
    saved = json.loads((tmp_path / "tfrs_tutorial_port.json").read_text())
    assert saved["top_10"] == results["top_10"]
    assert f"wrote {tmp_path / 'tfrs_tutorial_port.md'}" in capsys.readouterr().out


@pytest.mark.parametrize("hits", [False, True])
def test_a_keras_loss_gets_one_hot_labels_and_finite_masks(hits):
    q, v = towers(b=4, c=6)
    kwargs = {"candidate_ids": IDS} if hits else {}
    cce = keras.losses.CategoricalCrossentropy(from_logits=True, reduction="sum")
    task = tfrs.tasks.Retrieval(loss=cce, remove_accidental_hits=hits)
    logits = q @ v.T
    if hits:
        logits[(IDS[:4, None] == IDS[None]) & ~np.eye(4, 6, dtype=bool)] = -np.inf
    want = softmax_ce(logits, np.arange(4))
    assert float(task(q, v, **kwargs)) == pytest.approx(want, rel=1e-5)
    default = tfrs.tasks.Retrieval(remove_accidental_hits=hits)  # losszoo's: class ids
    assert float(default(q, v, **kwargs)) == pytest.approx(want, rel=1e-5)


def test_batch_and_loss_metrics_are_updated_as_in_tfrs():
    q, v = towers(b=5, c=5)
    top1 = keras.metrics.TopKCategoricalAccuracy(k=1)
    mean = keras.metrics.Mean()
    task = tfrs.tasks.Retrieval(batch_metrics=[top1], loss_metrics=[mean])
    loss = task(q, v, compute_batch_metrics=False)
    assert float(top1.result()) == 0.0 and float(mean.result()) == pytest.approx(float(loss))
    task(q, v)
    hits = np.argmax(q @ v.T, axis=1) == np.arange(5)
    assert float(top1.result()) == pytest.approx(hits.mean())


def test_factorized_top_k_without_ids_ranks_by_score():
    rng = np.random.default_rng(0)
    # small integers: exact ties are common and exact in float32
    table = rng.integers(-2, 3, size=(17, 3)).astype(np.float32)
    q = rng.integers(-2, 3, size=(9, 3)).astype(np.float32)
    true = rng.integers(0, 17, size=9)
    want = brute_force_rank(q, table, true)
    batches = [table[:7], table[7:12], table[12:]]
    by_score = numpy(R.streamed_ranks(q, batches, true_embeddings=table[true]))
    np.testing.assert_array_equal(by_score, want)
    metric = tfrs.metrics.FactorizedTopK(candidates=lambda: batches, ks=(1, 5))
    task = tfrs.tasks.Retrieval(metrics=metric)
    task(q, table[true])  # no candidate_ids: the true candidates by their embeddings
    assert float(metric.result()["top_5"]) == pytest.approx(np.mean(want < 5))


def test_streamed_ranks_with_ids_match_the_table_and_nan_for_missing_ids():
    rng = np.random.default_rng(1)
    table = rng.normal(size=(12, 4)).astype(np.float32)
    q = rng.normal(size=(5, 4)).astype(np.float32)
    true = np.array([0, 11, 4, 4, 7])
    perm = rng.permutation(12).astype(np.int32)
    stream = [(perm[:5], table[perm[:5]]), (perm[5:], table[perm[5:]])]
    got = numpy(R.streamed_ranks(q, stream, true_ids=true))
    np.testing.assert_array_equal(got, numpy(R.candidate_ranks(q, true, table)))
    np.testing.assert_array_equal(got, brute_force_rank(q, table, true))
    got = numpy(R.streamed_ranks(q, stream[:1], true_ids=true))  # ids absent: NaN
    assert np.isnan(got).tolist() == [i not in perm[:5] for i in true]


class TwoTower(tfrs.Model):
    def __init__(self):
        super().__init__()
        self.users = keras.Sequential([keras.layers.Embedding(6, 4)])
        regularized = keras.layers.Embedding(8, 4, embeddings_regularizer="l2")
        self.items = keras.Sequential([regularized])
        self.task = tfrs.tasks.Retrieval()

    def compute_loss(self, features, training=False):
        return self.task(self.users(features["user"]), self.items(features["item"]))


def test_model_takes_tfrs_compute_loss_and_adds_regularization():
    model = TwoTower()
    model.compile(optimizer=keras.optimizers.Adagrad(0.1))
    data = {"user": np.arange(6, dtype="int32"), "item": np.arange(6, dtype="int32")}
    history = model.fit(data, batch_size=6, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    task_loss = float(model.task(model.users(data["user"]), model.items(data["item"])))
    penalty = 0.01 * float(np.sum(numpy(model.items.layers[0].embeddings) ** 2))
    logged = model.evaluate(data, batch_size=6, verbose=0, return_dict=True)["loss"]
    assert logged == pytest.approx(task_loss + penalty, rel=1e-5)


@pytest.mark.tensorflow_only(reason="a tf.data candidate dataset")
def test_a_tf_data_candidate_dataset_leaves_xla_off_and_ranks_as_the_table():
    import tensorflow as tf

    rng = np.random.default_rng(2)
    table = rng.normal(size=(10, 3)).astype(np.float32)
    q = rng.normal(size=(4, 3)).astype(np.float32)
    true = np.array([1, 9, 0, 5])
    dataset = tf.data.Dataset.from_tensor_slices(table).batch(3)
    want = brute_force_rank(q, table, true)
    np.testing.assert_array_equal(R.streamed_ranks(q, dataset, true_ids=true), want)
    graph = tf.function(lambda q, t: R.streamed_ranks(q, dataset, true_embeddings=t))
    np.testing.assert_array_equal(graph(q, table[true]), want)
    metric = tfrs.metrics.FactorizedTopK(candidates=dataset)
    task = tfrs.tasks.Retrieval(metrics=metric)
    assert metric.reads_a_dataset and not task.supports_jit
    assert tfrs.tasks.Retrieval(metrics=tfrs.metrics.FactorizedTopK(table)).supports_jit
    xla = tf.function(lambda q: R.streamed_ranks(q, dataset, true_ids=true), jit_compile=True)
    with pytest.raises(ValueError, match="XLA"):
        xla(q)
