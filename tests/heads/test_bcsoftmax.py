"""Tests for the BCSoftmax Keras head, on every backend (MirroredStrategy: TensorFlow only)."""

import keras
import numpy as np
import pytest
from keras import ops
from scipy.special import softmax as np_softmax

import losszoo
from losszoo.heads import BCSoftmax
from tests.harness import assert_config_roundtrip, assert_fit_smoke, assert_mixed_precision, numpy
from tests.references import load_reference

REF = load_reference("bcsoftmax")


def test_fixed_bounds_match_reference_and_call_time_override():
    rng = np.random.RandomState(0)
    x = rng.normal(0, 3, (16, 6)).astype(np.float32)
    head = BCSoftmax(lower=0.02, upper=[0.5, 0.5, 0.5, 0.9, 0.9, 0.9], temperature=0.8)
    want, _ = REF.bcsoftmax(x.astype(float), 0.02, np.array([0.5] * 3 + [0.9] * 3), 0.8)
    np.testing.assert_allclose(numpy(head(x)), want, atol=1e-6)
    lo = rng.uniform(0, 0.1, (16, 6)).astype(np.float32)
    hi = np.full((16, 1), 0.4, np.float32)
    np.testing.assert_allclose(
        numpy(head(x, lower=lo, upper=hi)),
        REF.bcsoftmax(x.astype(float), lo, hi, 0.8)[0],
        atol=1e-6,
    )
    # no bounds: softmax(x / tau)
    np.testing.assert_allclose(
        numpy(BCSoftmax(temperature=2.0)(x)), np_softmax(x / 2.0, -1), atol=1e-6
    )


def test_learned_bounds_and_temperature_get_gradients_and_stay_feasible():
    rng = np.random.RandomState(1)
    x = rng.normal(0, 4, (32, 5)).astype(np.float32)
    head = BCSoftmax(
        lower=0.05, upper=0.6, learn_bounds=True, learn_temperature=True, temperature=1.3
    )
    y0 = numpy(head(x))
    lo, hi = head.bounds()
    np.testing.assert_allclose(numpy(lo), 0.05, atol=1e-6)
    np.testing.assert_allclose(numpy(hi), 0.6, atol=1e-6)
    np.testing.assert_allclose(y0, REF.bcsoftmax(x / 1.3, 0.05, 0.6)[0], atol=1e-5)
    labels = rng.randint(0, 5, 32)
    assert len(head.trainable_variables) == 3
    # one SGD step on -log y[label]: every variable moves by -lr * its gradient
    model = keras.Sequential([keras.Input((5,)), head])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    before = [numpy(v).copy() for v in head.trainable_variables]
    model.train_on_batch(x, labels)
    for b, v in zip(before, head.trainable_variables):
        assert np.abs(numpy(v) - b).sum() > 0, v.name
    lo, hi = head.bounds()
    assert float(numpy(ops.sum(lo))) < 1 < float(numpy(ops.sum(hi)))


def test_invalid_configs():
    with pytest.raises(ValueError, match="lower <= upper"):
        BCSoftmax(lower=0.5, upper=0.4)
    with pytest.raises(ValueError, match="temperature"):
        BCSoftmax(temperature=0.0)
    with pytest.raises(ValueError, match="sum"):
        BCSoftmax(lower=0.4)(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="entries"):
        BCSoftmax(upper=[0.5, 0.5])(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="1/K"):
        BCSoftmax(lower=0.5, learn_bounds=True)(np.zeros((2, 3), np.float32))


def test_config_roundtrip():
    restored = assert_config_roundtrip(
        BCSoftmax(lower=0.01, upper=[0.6, 0.7, 0.8], temperature=0.5, learn_temperature=True)
    )
    assert restored.upper == [0.6, 0.7, 0.8]
    assert losszoo.get_class("bcsoftmax", "head") is BCSoftmax


def _data(n=128, d=8, k=4, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = (x[:, :k] + 0.3 * rng.normal(size=(n, k))).argmax(-1).astype(np.int32)
    return x, y


def _build(**head_kwargs):
    def build():
        return keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(4), BCSoftmax(**head_kwargs)]
        )

    return build


def test_fit_smoke_and_saving(tmp_path):
    x, y = _data()
    model = _build(lower=0.01, upper=0.9, learn_temperature=True)()
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy")
    assert_fit_smoke(model, x, y, epochs=3, batch_size=32)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)


def test_mixed_precision():
    x, y = _data()
    assert_mixed_precision(
        _build(lower=0.01, upper=0.9, learn_bounds=True), x, y, "sparse_categorical_crossentropy"
    )


@pytest.mark.tensorflow_only(reason="tf.distribute.MirroredStrategy")
def test_mirrored_matches_single():
    from tests.helpers import assert_mirrored_matches_single

    x, y = _data(64)
    assert_mirrored_matches_single(
        _build(lower=0.02, upper=0.8, learn_bounds=True), x, y, "sparse_categorical_crossentropy"
    )


def test_rank_0_logits_raise_naming_logits():
    # Issue 19 item 7: an IndexError in build() before.
    with pytest.raises(ValueError, match="`logits` of rank 0"):
        BCSoftmax()(np.float32(2.0))
