"""Pins how registered names reach Keras 3 and tf_keras string lookup.

If a Keras upgrade moves the private table losszoo writes to, these tests fail loudly;
that is their purpose (see losszoo/registry/_keras.py).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import losszoo
from losszoo.losses import SparsemaxLoss

pytestmark = pytest.mark.tensorflow_only(
    reason="tf_keras string lookup; Keras 3 checks read tensors with .numpy()"
)


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    return x, np.argmax(x[:, :3], 1)


def test_keras3_string_lookup():
    assert isinstance(keras.losses.get("sparsemax"), SparsemaxLoss)
    assert isinstance(keras.losses.get("sparsemax_loss"), SparsemaxLoss)


def test_keras3_dict_identifiers():
    for name in ("sparsemax", "SparsemaxLoss", "losszoo>SparsemaxLoss"):
        loss = keras.losses.get({"class_name": name, "config": {"reduction": "sum"}})
        assert isinstance(loss, SparsemaxLoss) and loss.reduction == "sum"


@pytest.mark.parametrize("configured", [False, True])
def test_keras3_compile_by_name_trains_the_right_loss(configured):
    # Keras 3's compile() reads a bare dict as a per-output mapping, so a configured loss
    # goes through keras.losses.get(dict) (or losszoo.get) first.
    x, y = data()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    config = {"class_name": "sparsemax", "config": {"reduction": "sum"}}
    model.compile(optimizer="sgd", loss=keras.losses.get(config) if configured else "sparsemax")
    logits = model.predict(x, verbose=0)
    per_example = losszoo.ops.sparsemax_loss(np.eye(3)[y], logits).numpy()
    want = per_example.sum() if configured else per_example.mean()
    np.testing.assert_allclose(model.evaluate(x, y, batch_size=64, verbose=0), want, rtol=1e-5)


def test_tf_keras_compile_by_name():
    tf_keras = pytest.importorskip("tf_keras")
    x, y = data()
    model = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss="sparsemax")
    logits = model.predict(x, verbose=0)
    want = losszoo.ops.sparsemax_loss(np.eye(3)[y], logits).numpy().mean()
    np.testing.assert_allclose(model.evaluate(x, y, batch_size=64, verbose=0), want, rtol=1e-5)
    history = model.fit(x, y, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_tf_keras_loss_adapter_sample_weights_and_config():
    pytest.importorskip("tf_keras")
    x, y = data()
    logits = tf.constant(x[:, :3])
    w = np.linspace(0, 2, 64).astype(np.float32)
    adapter = losszoo.tf_keras_loss("sparsemax", reduction="sum")
    per_example = losszoo.ops.sparsemax_loss(np.eye(3)[y], logits).numpy()
    np.testing.assert_allclose(
        adapter(y, logits, sample_weight=w), (w * per_example).sum(), rtol=1e-5
    )
    clone = type(adapter).from_config(adapter.get_config())
    assert clone.get_config() == adapter.get_config()
    from_instance = losszoo.tf_keras_loss(SparsemaxLoss(normalize_labels=False))
    assert from_instance.losszoo_loss.normalize_labels is False
