"""Sparsemax head on the running backend: values on any axis, config, fit / save / load by
name, mixed precision. MirroredStrategy: ``test_sparsemax_tensorflow.py``."""

import keras
import numpy as np

import losszoo
from losszoo.heads import Sparsemax
from tests.harness import assert_config_roundtrip, assert_mixed_precision, numpy
from tests.references import load_reference

ref = load_reference("rankmax_sparsemax")


def test_layer_matches_reference_on_any_axis():
    z = np.random.default_rng(0).normal(size=(4, 7, 3)).astype(np.float32)
    out = numpy(Sparsemax(axis=1)(z))
    want = np.stack([[ref.sparsemax(z[b, :, c])[0] for c in range(3)] for b in range(4)], 0)
    np.testing.assert_allclose(out, np.moveaxis(want, 1, 2), atol=1e-6)


def test_config_roundtrip():
    assert_config_roundtrip(Sparsemax(axis=1, name="probs"))


def test_model_with_head_trains_saves_and_loads_without_custom_objects(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(128, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(int) + 2 * (x[:, 1] > 0)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    model = keras.Model(inputs, Sparsemax()(keras.layers.Dense(4)(hidden)))
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparsemax")
    history = model.fit(x, y, epochs=15, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.5 * losses[0], losses
    # the loss trained on the head's logits: it equals the sparsemax loss of those logits
    logits_model = keras.Model(inputs, model.layers[-1].input)
    logits = logits_model.predict(x, verbose=0)
    want = numpy(losszoo.ops.sparsemax_loss(np.eye(4, dtype=np.float32)[y], logits)).mean()
    np.testing.assert_allclose(model.evaluate(x, y, verbose=0), want, rtol=1e-4)

    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.layers[-1], Sparsemax)
    assert isinstance(loaded.loss, losszoo.losses.SparsemaxLoss) or loaded.loss == "sparsemax"
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)
    np.testing.assert_allclose(loaded.evaluate(x, y, verbose=0), want, rtol=1e-4)
    probs = loaded.predict(x, verbose=0)
    np.testing.assert_allclose(probs.sum(1), 1, atol=1e-5)
    assert (probs == 0).mean() > 0.2, "a trained sparsemax head should give exact zeros"
    assert (probs.argmax(1) == y).mean() > 0.8


def build_head_model():
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(4), Sparsemax()])


def test_mixed_precision_head_outputs_float32():
    x = np.random.default_rng(2).normal(size=(64, 5)).astype(np.float32)
    y = np.eye(4, dtype=np.float32)[np.argmax(x[:, :4], 1)]
    assert_mixed_precision(build_head_model, x, y, "mse")
