"""The registered softmax cross-entropy loss against numpy, and its fail-loud behaviour."""

import numpy as np
import pytest
import tensorflow as tf

import losszoo
from tests.retrieval._common import softmax_ce

pytestmark = pytest.mark.tensorflow_only(
    reason="tf.GradientTape / tf.errors checks of losszoo.retrieval"
)


def test_registered_under_its_name_and_alias():
    assert losszoo.get_class("softmax_cross_entropy") is losszoo.get_class("softmax_ce")
    assert type(losszoo.get("softmax_cross_entropy")).__name__ == "SoftmaxCrossEntropyLoss"


def test_ids_and_dense_targets_match_numpy():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(5, 7)).astype(np.float32)
    y = rng.integers(0, 7, size=5)
    loss = losszoo.get("softmax_cross_entropy", reduction="sum")
    assert float(loss(y, z)) == pytest.approx(softmax_ce(z, y), rel=1e-6)
    assert float(loss(np.eye(7)[y], z)) == pytest.approx(softmax_ce(z, y), rel=1e-6)
    soft = rng.uniform(size=(5, 7))
    log_p = z - np.log(np.exp(z).sum(1, keepdims=True))
    want = -np.sum(soft / soft.sum(1, keepdims=True) * log_p)
    assert float(loss(soft, z)) == pytest.approx(want, rel=1e-5)


def test_minus_inf_is_not_a_candidate_and_gradient_is_softmax_minus_target():
    z = tf.constant([[0.5, -np.inf, 1.0, 0.0]])
    loss = losszoo.get("softmax_cross_entropy")
    with tf.GradientTape() as tape:
        tape.watch(z)
        value = loss([2], z)
    kept = np.array([0.5, 1.0, 0.0])
    p = np.exp(kept) / np.exp(kept).sum()
    assert float(value) == pytest.approx(-np.log(p[1]), rel=1e-6)
    np.testing.assert_allclose(tape.gradient(value, z)[0], [p[0], 0.0, p[1] - 1, p[2]], atol=1e-6)
    assert float(loss([1], z)) == np.inf  # the target itself masked
    assert np.isnan(float(loss([0], [[np.inf, 0.0]])))  # +inf logit: NaN, never finite


@pytest.mark.parametrize("bad", [3, -1, 1.5])
def test_bad_ids_raise_eagerly_and_are_nan_under_xla(bad):
    z = np.zeros((1, 3), np.float32)
    loss = losszoo.get("softmax_cross_entropy")
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="y_true"):
        loss(np.array([bad]), z)
    xla = tf.function(lambda y, z: loss.call(y, z), jit_compile=True)
    assert np.isnan(xla(tf.constant([float(bad)]), tf.constant(z)).numpy()).all()


def test_nan_logits_raise_naming_y_pred():
    with pytest.raises(ValueError, match="y_pred"):
        losszoo.get("softmax_cross_entropy")([0], [[np.nan, 0.0]])


def test_config_roundtrip():
    loss = losszoo.get("softmax_cross_entropy", normalize_labels=False, reduction="sum")
    again = type(loss).from_config(loss.get_config())
    assert again.get_config() == loss.get_config()
