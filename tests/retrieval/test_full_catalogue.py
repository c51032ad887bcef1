"""losszoo.retrieval.full_catalogue.FullCatalogueRetrieval (issue 34): the task-level layer
over losszoo.ops.catalogue_loss, and examples/keras3_retrieval.py --negatives full.

Backend-neutral except the example run (it needs matplotlib).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import losszoo
from losszoo.retrieval.full_catalogue import FullCatalogueRetrieval
from tests.harness import numpy


def _problem(seed=0, b=6, n=700, d=4):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(b, d)).astype("float32")
    t = rng.normal(size=(n, d)).astype("float32")
    return q, t, rng.integers(0, n, b), rng.uniform(0.5, 2.0, b).astype("float32")


@pytest.mark.parametrize("loss", ["softmax_cross_entropy", "sparsemax", "rankmax"])
def test_layer_is_the_weighted_sum_of_the_op(loss):
    q, t, pos, w = _problem()
    op = {"softmax_cross_entropy": "softmax"}.get(loss, loss)
    per_row = numpy(losszoo.ops.catalogue_loss(q, t, pos, loss=op, temperature=0.5))
    task = FullCatalogueRetrieval(loss=loss, temperature=0.5, chunk_size=256)
    np.testing.assert_allclose(numpy(task(q, t, pos)), per_row.sum(), rtol=1e-6)
    np.testing.assert_allclose(
        numpy(task(q, t, pos, sample_weight=w)), (per_row * w).sum(), rtol=1e-6
    )
    mean = FullCatalogueRetrieval(loss=loss, temperature=0.5, reduction="mean")
    np.testing.assert_allclose(numpy(mean(q, t, pos)), per_row.mean(), rtol=1e-6)


def test_layer_config_round_trip_and_metrics():
    task = FullCatalogueRetrieval(loss="rankmax", temperature=0.2, margin=0.5, chunk_size=512)
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(task))
    assert again.get_config() == task.get_config()
    q, t, pos, _ = _problem(1)
    metric = losszoo.retrieval.CatalogueTopK(ks=(1, 10), candidates=t)
    task = FullCatalogueRetrieval(metrics=metric)
    task(q, t, pos)
    assert float(numpy(metric.result()["top_10"])) >= 0.0
    with pytest.raises(ValueError, match="`loss` must be one of"):
        FullCatalogueRetrieval(loss="kl_dro_sumexp")


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the example runs on TF")
def test_example_trains_on_the_full_catalogue(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from tests.retrieval.test_example import load, synthetic_movielens

    monkeypatch.setenv("LOSSZOO_CACHE_DIR", str(tmp_path / "cache"))
    synthetic_movielens(tmp_path / "ml")
    args = ["--data-dir", str(tmp_path / "ml"), "--dim", "4", "--batch-size", "64"]
    args += ["--epochs", "2", "--negatives", "full", "--out", str(tmp_path / "r")]
    results = load().main(args)
    assert set(results) == {
        ("full", loss) for loss in ("softmax_cross_entropy", "rankmax", "sparsemax")
    }
    for runs in results.values():
        assert 0.0 <= runs[0]["test"]["top100"] <= 1.0
        assert all(np.isfinite(h["loss"]) for h in runs[0]["history"])
