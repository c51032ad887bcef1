"""Keras ``fit`` by registry name on the running backend: the sparsemax and softmax
cross-entropy losses, the Sparsemax head (the retrieval task:
``tests/retrieval/test_two_tower.py``).

Small made-up data with a partial last batch (70 = 64 + 6), ``jit_compile`` off and on:
the loss is finite and decreases, ``evaluate`` equals a numpy computation of the loss of the
whole data set, and a ``.keras`` file loads and predicts identically.
"""

import keras
import numpy as np
import pytest

import losszoo
from tests.harness import BACKEND
from tests.references import load_reference

N, D, K = 70, 6, 4
LOSSES = ("sparsemax", "softmax_cross_entropy")
# PyTorch's jit_compile is torch.compile, outside losszoo's contract (tests/harness.py).
JIT = (False,) if BACKEND == "torch" else (False, True)
ref = load_reference("rankmax_sparsemax")


def _data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, D)).astype(np.float32)
    y = np.argmax(x[:, :K] + 0.3 * rng.normal(size=(N, K)), axis=1)
    return x, y


def numpy_loss(name, logits, y):
    """Per-example loss of ``logits`` [n, K] for class ids ``y`` (float64, numpy)."""
    z = np.asarray(logits, np.float64)
    q = np.eye(z.shape[1])[y]
    if name == "sparsemax":
        return np.array([ref.sparsemax_loss(row, t) for row, t in zip(z, q)])
    top = z.max(1, keepdims=True)
    return (np.log(np.exp(z - top).sum(1)) + top[:, 0]) - z[np.arange(len(y)), y]


def test_the_names_are_registered():
    assert set(LOSSES) <= set(losszoo.names("loss"))
    assert "sparsemax" in losszoo.names("head")


def _mlp(head=None):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((D,))
    logits = keras.layers.Dense(K)(keras.layers.Dense(16, activation="relu")(inputs))
    return keras.Model(inputs, logits if head is None else head(logits))


@pytest.mark.parametrize("jit", JIT)
@pytest.mark.parametrize("name", LOSSES)
def test_fit_by_name_decreases_the_loss(name, jit):
    x, y = _data()
    model = _mlp()
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=name, jit_compile=jit)
    losses = model.fit(x, y, batch_size=64, epochs=3, verbose=0, shuffle=False).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.8 * losses[0], losses
    want = numpy_loss(name, model.predict(x, batch_size=N, verbose=0), y).mean()
    got = model.evaluate(x, y, batch_size=64, verbose=0)  # batches of 64 and 6
    np.testing.assert_allclose(got, want, rtol=1e-4)


@pytest.mark.parametrize("jit", JIT)
def test_sparsemax_head_trains_on_its_logits_and_round_trips(jit, tmp_path):
    x, y = _data(seed=2)
    model = _mlp(head=losszoo.get("sparsemax", kind="head"))
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="sparsemax", jit_compile=jit)
    losses = model.fit(x, y, batch_size=64, epochs=4, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.8 * losses[0], losses
    # the loss saw the head's logits (attached to its output), not its probabilities
    logits = keras.Model(model.inputs, model.layers[-1].input).predict(x, verbose=0)
    want = numpy_loss("sparsemax", logits, y).mean()
    np.testing.assert_allclose(model.evaluate(x, y, batch_size=64, verbose=0), want, rtol=1e-4)
    probs = model.predict(x, verbose=0)
    expected = np.stack([ref.sparsemax(row)[0] for row in logits.astype(np.float64)])
    np.testing.assert_allclose(probs, expected, atol=1e-6)

    path = tmp_path / "head.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.layers[-1], losszoo.heads.Sparsemax)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), probs)
    np.testing.assert_allclose(loaded.evaluate(x, y, batch_size=64, verbose=0), want, rtol=1e-4)


@pytest.mark.parametrize("name", LOSSES)
def test_loss_objects_round_trip_in_a_keras_file(name, tmp_path):
    x, y = _data(seed=3)
    model = _mlp()
    model.compile(optimizer="sgd", loss=losszoo.get(name))
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    np.testing.assert_allclose(
        loaded.evaluate(x, y, verbose=0), model.evaluate(x, y, verbose=0), rtol=1e-6
    )
