"""Samplers: the probability they report is the one they draw with, exactly."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import losszoo.retrieval as R
from losszoo.retrieval.sampling import TOTAL, count_at_most

pytestmark = pytest.mark.tensorflow_only(reason="tf.function checks of losszoo.retrieval")


def targets():
    j = np.arange(50, dtype=np.float64)
    counts = np.random.default_rng(0).integers(0, 20, size=50).astype(float)
    return [
        (R.UniformSampler(50), np.full(50, 1 / 50)),
        (R.LogUniformSampler(50), np.log((j + 2) / (j + 1)) / np.log(51)),
        (R.UnigramSampler(counts), counts / counts.sum()),
        (R.UnigramSampler(counts, power=0.75), counts**0.75 / np.sum(counts**0.75)),
    ]


@pytest.mark.parametrize("index", range(4))
def test_weights_round_the_target_and_probability_reports_them(index):
    sampler, p = targets()[index]
    w = sampler.weights()
    assert w.sum() == TOTAL and np.all(w >= 0)
    assert np.all(np.abs(w - p * TOTAL) < 1.0 + 1e-9)  # largest-remainder rounding
    assert np.all((w > 0) == (p > 0))
    got = np.asarray(sampler.probability(np.arange(50)))
    np.testing.assert_allclose(got, w / TOTAL, rtol=1e-7)
    assert np.isnan(np.asarray(sampler.probability(np.array([-1, 50])))).all()


@pytest.mark.parametrize("index", range(4))
def test_draws_follow_the_reported_probability(index):
    sampler, _ = targets()[index]
    n = 200_000
    ids = np.asarray(sampler.sample(n, seed=keras.random.SeedGenerator(index)))
    assert ids.dtype == np.int32 and ids.min() >= 0 and ids.max() < 50
    freq = np.bincount(ids, minlength=50)
    expected = n * np.asarray(sampler.probability(np.arange(50)), np.float64)
    assert np.all(freq[expected == 0] == 0)
    keep = expected > 0
    chi2 = np.sum((freq[keep] - expected[keep]) ** 2 / expected[keep])
    dof = keep.sum() - 1
    assert chi2 < dof + 5 * np.sqrt(2 * dof), (chi2, dof)  # about a 5-sigma bound


def test_exact_inverse_cdf_of_the_integer_draw():
    sampler = R.UnigramSampler([3, 0, 1, 4])
    cumulative = np.cumsum(sampler.weights())
    r = np.array([0, cumulative[0] - 1, cumulative[0], cumulative[2] - 1, TOTAL - 1])
    ids = count_at_most(cumulative.astype(np.int32), tf.constant(r, tf.int32))
    np.testing.assert_array_equal(ids, [0, 0, 2, 2, 3])  # the rule `sample` applies


@pytest.mark.parametrize("n", [1, 2, 5, 64, 1000])
def test_binary_search_matches_numpy_searchsorted(n):
    rng = np.random.default_rng(n)
    cumulative = np.cumsum(rng.integers(0, 4, n)).astype(np.int32)
    r = rng.integers(-1, cumulative[-1] + 2, 300).astype(np.int32)
    xla = tf.function(lambda r: count_at_most(cumulative, r), jit_compile=True)
    want = np.searchsorted(cumulative, r, side="right")
    np.testing.assert_array_equal(count_at_most(cumulative, tf.constant(r)), want)
    np.testing.assert_array_equal(xla(tf.constant(r)), want)


def test_sampling_under_xla_and_with_a_seed_generator():
    sampler = R.LogUniformSampler(1000)
    seed = keras.random.SeedGenerator(1)
    draw = tf.function(lambda: sampler.sample(64, seed=seed), jit_compile=True)
    a, b = np.asarray(draw()), np.asarray(draw())
    assert a.shape == (64,) and 0 <= a.min() and a.max() < 1000 and not np.array_equal(a, b)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="counts"):
        R.UnigramSampler([0, 0])
    with pytest.raises(ValueError, match="counts"):
        R.UnigramSampler([1, -1])
    with pytest.raises(ValueError, match="num_items"):
        R.UniformSampler(0)
    with pytest.raises(ValueError, match="power"):
        R.UnigramSampler([1, 2], power=0)


def test_config_roundtrip():
    for sampler in (R.UniformSampler(7), R.LogUniformSampler(9), R.UnigramSampler([1, 2], 0.5)):
        again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(sampler))
        assert type(again) is type(sampler) and again.get_config() == sampler.get_config()
        np.testing.assert_array_equal(again.weights(), sampler.weights())
