"""Catalogue top-k: ranks against brute force (pessimistic ties), streaming, fail-loud."""

import numpy as np
import pytest
import tensorflow as tf

import losszoo.retrieval as R

pytestmark = pytest.mark.tensorflow_only(reason="tf.function checks of losszoo.retrieval")


def brute_force_rank(q, table, true):
    s = q.astype(np.float64) @ table.astype(np.float64).T
    t = s[np.arange(len(q)), true]
    others = np.ones_like(s, bool)
    others[np.arange(len(q)), true] = False
    return np.sum((s >= t[:, None]) & others, axis=1)


@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
def test_ranks_match_brute_force_with_ties(chunk):
    rng = np.random.default_rng(0)
    # small integers make exact ties common (and float32 dot products exact)
    q = rng.integers(-2, 3, size=(9, 3)).astype(np.float32)
    table = rng.integers(-2, 3, size=(17, 3)).astype(np.float32)
    true = rng.integers(0, 17, size=9)
    want = brute_force_rank(q, table, true)
    assert np.any(want > 0) and len(set(want)) > 2
    ranks = np.asarray(R.candidate_ranks(q, true, table, chunk_size=chunk))
    np.testing.assert_array_equal(ranks, want)


def test_constant_scores_get_no_hits_below_n():
    ranks = np.asarray(R.candidate_ranks(np.zeros((2, 3)), [0, 4], np.ones((5, 3))))
    np.testing.assert_array_equal(ranks, [4, 4])


def test_metric_streams_batches_with_weights():
    rng = np.random.default_rng(1)
    table = rng.normal(size=(40, 4)).astype(np.float32)
    metric = R.CatalogueTopK(lambda: table, ks=(1, 5, 10), chunk_size=16)
    hits, total = np.zeros(3), 0.0
    for _ in range(3):
        q = rng.normal(size=(6, 4)).astype(np.float32)
        true = rng.integers(0, 40, size=6)
        w = rng.uniform(size=6).astype(np.float32)
        metric.update_state(q, true, sample_weight=w)
        rank = brute_force_rank(q, table, true)
        hits += [(w * (rank < k)).sum() for k in (1, 5, 10)]
        total += w.sum()
    got = {k: float(v) for k, v in metric.result().items()}
    assert got == pytest.approx(dict(zip(("top_1", "top_5", "top_10"), hits / total)), rel=1e-5)
    metric.reset_state()
    assert float(metric.result()["top_5"]) == 0.0


def test_bad_true_ids_raise_and_nan_scores_are_nan():
    table = np.ones((5, 2), np.float32)
    with pytest.raises(ValueError, match="true_ids"):
        R.candidate_ranks(np.ones((1, 2)), [5], table)
    xla = tf.function(lambda t: R.candidate_ranks(tf.ones((2, 2)), t, table), jit_compile=True)
    assert np.isnan(xla(tf.constant([0, 7]))).tolist() == [False, True]
    q = np.array([[np.nan, 1.0], [1.0, 1.0]], np.float32)
    assert np.isnan(np.asarray(R.candidate_ranks(q, [0, 1], table))).tolist() == [True, False]


def test_config_roundtrip():
    metric = R.CatalogueTopK(ks=(3, 7), chunk_size=5, name="hit")
    again = R.CatalogueTopK.from_config(metric.get_config())
    assert again.get_config() == metric.get_config()
    again.candidates = np.eye(8, dtype=np.float32)
    again.update_state(np.eye(8, dtype=np.float32)[:2], [0, 1])
    assert float(again.result()["hit_3"]) == 1.0
