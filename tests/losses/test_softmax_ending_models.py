"""Models ending in a softmax train on their logits, on every backend (issue 31 item 1).

On JAX Keras' softmax cannot attach its logits to its output, so the losses trained on the
probabilities as if they were scores; ``softmax_cross_entropy`` did so on every backend. The
rule (:func:`losszoo._logits.scores`): attached logits, else ``log(y_pred)`` after a Keras
softmax (the logits up to a per-row shift), else an error after a sigmoid or a losszoo head.
Each fit is compared with a twin model that outputs the logits (same weights, same loss):
equal losses and equal weights after training (so equal gradients), partial last batch
included.
"""

import keras
import numpy as np
import pytest
from keras import ops

import losszoo
from losszoo import _logits
from tests.harness import BACKEND, float64, numpy, value_and_grad

D, K, N, BATCH = 6, 5, 40, 16  # 40 rows in batches of 16: the last batch is partial
JITS = (False, "auto", True) if BACKEND in ("tensorflow", "jax") else (False, "auto")


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(N, D)).astype("float32"), rng.integers(0, K, N)


def _models(ending):
    """A model ending in a softmax (``ending``) and its twin outputting the logits."""
    inp = keras.Input((D,))
    if ending == "dense":
        dense = keras.layers.Dense(K, activation="softmax")
        out = dense(inp)
    else:
        dense = keras.layers.Dense(K)
        last = keras.layers.Softmax() if ending == "layer" else keras.layers.Activation("softmax")
        out = last(dense(inp))
    model = keras.Model(inp, out)
    twin = keras.Sequential([keras.Input((D,)), keras.layers.Dense(K)])
    twin.set_weights(model.get_weights())
    return model, twin


def _fit_both(ending, loss, jit):
    keras.utils.set_random_seed(1)
    x, y = _data()
    model, twin = _models(ending)
    results = []
    for m in (model, twin):
        m.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss(), jit_compile=jit)
        before = m.evaluate(x, y, batch_size=BATCH, verbose=0)
        hist = m.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        results.append((before, hist.history["loss"], [numpy(w) for w in m.get_weights()]))
    return results


def _softmax_ce_reference(z, y):
    z = z - z.max(-1, keepdims=True)
    return (np.log(np.exp(z).sum(-1)) - z[np.arange(len(y)), y]).mean()


@pytest.mark.parametrize(
    "ending, jit", [("dense", "auto"), ("activation", JITS[-1])] + [("layer", j) for j in JITS]
)
def test_softmax_cross_entropy_trains_on_the_logits(ending, jit):
    (before, hist, weights), (t_before, t_hist, t_weights) = _fit_both(
        ending, lambda: "softmax_cross_entropy", jit
    )
    x, y = _data()
    keras.utils.set_random_seed(1)
    kernel, bias = _models(ending)[0].get_weights()
    # The logits by hand: before this fix the model gave the loss of the probabilities.
    np.testing.assert_allclose(before, _softmax_ce_reference(x @ kernel + bias, y), rtol=1e-5)
    np.testing.assert_allclose(before, t_before, rtol=1e-5)
    np.testing.assert_allclose(hist, t_hist, rtol=1e-4)
    for w, t in zip(weights, t_weights):
        np.testing.assert_allclose(w, t, rtol=1e-4, atol=1e-5)


LOSSES = {
    "sparsemax": lambda: "sparsemax",
    "rankmax": lambda: losszoo.losses.RankmaxLoss(k=2, margin=0.5),
    "vote_kl": lambda: "vote_kl",
    "antipignistic_kl": lambda: "antipignistic_kl",
    "cvar": lambda: "cvar",  # a DRO risk by name: sparse CE from logits as its base loss
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_loss_on_scores_trains_on_the_logits(name):
    with float64():  # the possibilistic losses compute in float64 (JAX: x64 mode)
        (before, hist, weights), (t_before, t_hist, t_weights) = _fit_both(
            "dense", LOSSES[name], JITS[-1]
        )
    np.testing.assert_allclose(before, t_before, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hist, t_hist, rtol=1e-4, atol=1e-6)
    for w, t in zip(weights, t_weights):
        np.testing.assert_allclose(w, t, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("jit", JITS[:-1])  # JITS[-1]: test_every_loss_on_scores...
def test_sparsemax_in_every_jit_mode(jit):
    (before, hist, weights), (t_before, t_hist, t_weights) = _fit_both(
        "layer", lambda: "sparsemax", jit
    )
    np.testing.assert_allclose(before, t_before, rtol=1e-5)
    np.testing.assert_allclose(hist, t_hist, rtol=1e-4)
    for w, t in zip(weights, t_weights):
        np.testing.assert_allclose(w, t, rtol=1e-4, atol=1e-5)


def test_rankmax_is_shift_invariant():
    # The rule needs it: log(softmax(z)) = z - logsumexp(z).
    rng = np.random.default_rng(3)
    z = rng.normal(size=(8, 7)).astype("float32")
    y = rng.integers(0, 7, 8)
    shift = rng.normal(size=(8, 1)).astype("float32") * 10
    for k in (1, 3):
        a = numpy(losszoo.ops.rankmax_loss(y, z, k=k, margin=0.7))
        b = numpy(losszoo.ops.rankmax_loss(y, z + shift, k=k, margin=0.7))
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_underflowed_probabilities_give_finite_gradients():
    # A class whose probability is 0 in float32 gets a -inf score; the loss ignores it and its
    # gradient must be 0 (log's own gradient would give 0 * inf = NaN).
    z = np.array([[0.0, 1.0, -200.0, 0.5]], "float32")
    y = np.eye(4, dtype="float32")[[1]]

    def from_probabilities(logits):
        return losszoo.ops.sparsemax_loss(y, _logits._log(ops.softmax(logits)))

    def from_logits(logits):
        return losszoo.ops.sparsemax_loss(y, logits)

    value, (grad,) = value_and_grad(from_probabilities, z)
    want, (want_grad,) = value_and_grad(from_logits, z)
    np.testing.assert_allclose(value, want, rtol=1e-6)
    np.testing.assert_allclose(grad, want_grad, atol=1e-6)
    assert np.isfinite(grad).all()


def _fit_error(model, loss):
    x, y = _data()
    model.compile(optimizer="sgd", loss=loss)
    with pytest.raises(ValueError, match="have the model output its logits"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)


def test_a_losszoo_head_with_probabilities_is_refused():
    # BCSoftmax outputs bounded probabilities and attaches no logits: trained on silently before.
    inp = keras.Input((D,))
    model = keras.Model(inp, losszoo.heads.BCSoftmax(upper=0.9)(keras.layers.Dense(K)(inp)))
    _fit_error(model, "sparsemax")


def test_a_sigmoid_without_attached_logits_is_refused():
    model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(K)])
    inp = keras.Input((D,))
    ending = keras.Model(inp, keras.layers.Activation("sigmoid")(model(inp)))
    if BACKEND != "jax":  # Keras' sigmoid attaches its logits there: they are used
        pytest.skip("Keras' sigmoid attaches its logits on TensorFlow and PyTorch")
    _fit_error(ending, "softmax_cross_entropy")


def test_a_base_loss_that_is_not_shift_invariant_is_refused_on_jax():
    if BACKEND != "jax":
        pytest.skip("the logits are attached on TensorFlow and PyTorch")
    model, _ = _models("dense")
    base = keras.losses.BinaryCrossentropy(from_logits=True)
    x, y = _data()
    model.compile(optimizer="sgd", loss=losszoo.losses.CVaRLoss(base, rho=0.5))
    with pytest.raises(ValueError, match="not invariant to a shift"):
        model.fit(x, np.eye(K)[y], batch_size=BATCH, epochs=1, verbose=0)


def _two_output_models():
    """A two-output model whose first output ends in a softmax, and its logits twin."""
    inp = keras.Input((D,))
    hidden = keras.layers.Dense(8, activation="tanh")(inp)
    probs = keras.layers.Dense(K, activation="softmax", name="a")(hidden)
    scores = keras.layers.Dense(3, name="b")(hidden)
    model = keras.Model(inp, {"a": probs, "b": scores})
    t_hidden = keras.layers.Dense(8, activation="tanh")(inp)
    twin = keras.Model(
        inp,
        {
            "a": keras.layers.Dense(K, name="a")(t_hidden),
            "b": keras.layers.Dense(3, name="b")(t_hidden),
        },
    )
    twin.set_weights(model.get_weights())
    return model, twin


@pytest.mark.parametrize("jit", JITS)
def test_a_multi_output_model_trains_each_output_on_its_logits(jit):
    # On JAX the multi-output case read the probabilities as scores: 0.4324 against the
    # 0.8740 of the logits for sparsemax (the output is now found by identity in y_pred).
    keras.utils.set_random_seed(1)
    x, y = _data()
    y_b = np.random.default_rng(5).integers(0, 3, N)
    labels = {"a": y, "b": y_b}
    results = []
    for m in _two_output_models():
        m.compile(
            optimizer=keras.optimizers.SGD(0.5),
            loss={"a": "sparsemax", "b": "softmax_cross_entropy"},
            jit_compile=jit,
        )
        before = m.evaluate(x, labels, batch_size=BATCH, verbose=0, return_dict=True)
        hist = m.fit(x, labels, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        results.append((before, hist.history["loss"], [numpy(w) for w in m.get_weights()]))
    (before, hist, weights), (t_before, t_hist, t_weights) = results
    for key in ("a_loss", "b_loss", "loss"):
        np.testing.assert_allclose(before[key], t_before[key], rtol=1e-5)
    np.testing.assert_allclose(hist, t_hist, rtol=1e-4)
    for w, t in zip(weights, t_weights):
        np.testing.assert_allclose(w, t, rtol=1e-4, atol=1e-5)
