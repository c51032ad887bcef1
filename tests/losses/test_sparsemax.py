"""SparsemaxLoss on the running backend: label formats, reductions, sample weights, errors
naming the argument, compile by name, training (``jit_compile`` False / True / "auto"),
models ending in Keras' softmax. TensorFlow-only checks (MirroredStrategy, ``None``-shaped
signatures, sparse / ragged labels) are in ``test_sparsemax_tensorflow.py``."""

import keras
import numpy as np
import pytest

import losszoo
from losszoo.losses import SparsemaxLoss
from tests.harness import (
    BACKEND,
    assert_config_roundtrip,
    assert_fit_smoke,
    assert_mixed_precision,
    classification_data,
    numpy,
    small_mlp,
    upstream,
    value_and_grad,
)
from tests.references import load_reference

ref = load_reference("rankmax_sparsemax")
rng = np.random.default_rng(0)
Z = rng.normal(size=(6, 5)).astype(np.float32)
IDS = np.array([0, 4, 2, 2, 1, 3])
# PyTorch's jit_compile is torch.compile, outside losszoo's contract (tests/harness.py)
JIT = (False, "auto") if BACKEND == "torch" else (False, True, "auto")


def ref_losses(z, q):
    return np.array([ref.sparsemax_loss(a.astype(np.float64), b) for a, b in zip(z, q)])


def test_integer_ids_and_one_hot_agree_with_reference():
    want = ref_losses(Z, np.eye(5)[IDS])
    loss = SparsemaxLoss(reduction=None)
    for labels in (IDS, IDS[:, None], IDS.astype(np.float32), np.eye(5)[IDS]):
        np.testing.assert_allclose(numpy(loss(labels, Z)), want, rtol=1e-5, atol=1e-6)


def test_multi_hot_targets_are_normalised():
    multi = np.array([[1, 1, 0, 0, 0], [0, 0, 0, 0, 1]], np.float32)
    want = ref_losses(Z[:2], multi / multi.sum(1, keepdims=True))
    np.testing.assert_allclose(numpy(SparsemaxLoss(reduction=None)(multi, Z[:2])), want, rtol=1e-5)
    raw = numpy(SparsemaxLoss(reduction=None, normalize_labels=False)(multi[1:], Z[1:2]))
    np.testing.assert_allclose(raw, ref_losses(Z[1:2], multi[1:]), rtol=1e-5)


def test_reductions_and_sample_weights():
    per_example = ref_losses(Z, np.eye(5)[IDS])
    w = np.array([1.0, 0.0, 2.0, 0.5, 1.0, 3.0], np.float32)
    np.testing.assert_allclose(numpy(SparsemaxLoss()(IDS, Z)), per_example.mean(), rtol=1e-5)
    np.testing.assert_allclose(
        numpy(SparsemaxLoss(reduction="sum")(IDS, Z)), per_example.sum(), rtol=1e-5
    )
    np.testing.assert_allclose(
        numpy(SparsemaxLoss()(IDS, Z, sample_weight=w)), (w * per_example).mean(), rtol=1e-5
    )


@pytest.mark.parametrize(
    "labels, match",
    [
        # the shared rules' wording (contract.CLASS_IDS, contract.NON_NEGATIVE), the row named
        (np.array([0, 5, 1, 1, 1, 1]), r"`y_true` .*whole numbers in \[0, K\); rows \[1\]"),
        (np.array([0, -1, 1, 1, 1, 1]), r"`y_true` .*whole numbers in \[0, K\); rows \[1\]"),
        (np.array([0.0, np.nan, 1, 1, 1, 1]), r"`y_true` .*whole numbers.*rows \[1\]"),
        (np.full((6, 5), np.nan), "`y_true` must be finite"),
        (np.ones((6, 4)), "y_true.*shape"),
        (-np.eye(5)[IDS], "`y_true` must be finite and >= 0"),
    ],
)
def test_bad_labels_raise_clear_errors(labels, match):
    with pytest.raises(ValueError, match=match):
        SparsemaxLoss()(labels, Z)


def test_bad_ids_raise_eagerly():
    for bad in ([0, 3], [0, -1], [0, 1.5], [0, np.nan]):
        with pytest.raises(ValueError, match="`y_true`"):
            SparsemaxLoss()(np.array(bad, np.float32), Z[:2, :3])


def test_from_logits_false_requires_a_head_output():
    with pytest.raises(ValueError, match="from_logits=False"):
        SparsemaxLoss(from_logits=False)(IDS, Z)
    probs = losszoo.heads.Sparsemax()(Z)
    np.testing.assert_allclose(
        numpy(SparsemaxLoss(from_logits=False)(IDS, probs)),
        numpy(SparsemaxLoss()(IDS, Z)),
        rtol=1e-6,
    )


def test_config_roundtrip_and_registry():
    assert_config_roundtrip(SparsemaxLoss(normalize_labels=False, reduction="sum", name="sm"))
    assert isinstance(losszoo.get("sparsemax"), SparsemaxLoss)
    assert isinstance(losszoo.get("sparsemax_loss"), SparsemaxLoss)
    assert losszoo.get("sparsemax", kind="head").__class__ is losszoo.heads.Sparsemax


@pytest.mark.parametrize("jit", JIT)
def test_trains_with_compile_by_name(jit):
    # 200 = 3 * 64 + 8: a partial last batch
    x, y = classification_data(n=200)
    model = small_mlp()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparsemax", jit_compile=jit)
    assert_fit_smoke(model, x, y, epochs=4, batch_size=64)


def test_mixed_precision():
    x, y = classification_data(n=128)
    assert_mixed_precision(small_mlp, x, y, "sparsemax")


def _softmax_models():
    """Sequential and functional models ending in Keras' own softmax (same weights)."""
    seq = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="softmax")])
    inp = keras.Input((4,))
    func = keras.Model(inp, keras.layers.Softmax()(keras.layers.Dense(5)(inp)))
    func.set_weights(seq.get_weights())
    return seq, func


@pytest.mark.parametrize("jit", JIT)
def test_model_ending_in_keras_softmax_trains_on_its_logits(jit):
    # Issue 19 item 8: the loss read the softmax probabilities as scores, silently. Keras'
    # softmax attaches `_keras_logits`; the loss must see them in a real fit / evaluate
    # (40 = 2 * 16 + 8: a partial last batch).
    x = rng.normal(size=(40, 4)).astype(np.float32)
    y = rng.integers(0, 5, 40)
    for model in _softmax_models():
        kernel, bias = (numpy(w) for w in model.weights)
        want = ref_losses(x @ kernel + bias, np.eye(5)[y]).mean()
        model.compile("sgd", loss="sparsemax", jit_compile=jit)
        np.testing.assert_allclose(model.evaluate(x, y, batch_size=16, verbose=0), want, rtol=1e-5)
        history = model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
        assert np.isfinite(history.history["loss"][0])


def test_sample_weight_of_the_wrong_length_names_it():
    # Issue 19 item 10: Keras' "Incompatible shapes: [6] vs. [5]" before.
    loss = SparsemaxLoss()
    with pytest.raises(ValueError, match="`sample_weight` of shape \\(7,\\)"):
        loss(IDS, Z, sample_weight=np.ones(7))
    with pytest.raises(ValueError, match="`sample_weight`"):
        loss(IDS, Z, sample_weight=np.ones((6, 2)))
    per_row = ref_losses(Z, np.eye(5)[IDS])
    w = np.arange(6.0)
    for weights in (w, w[:, None]):
        np.testing.assert_allclose(
            float(numpy(loss(IDS, Z, sample_weight=weights))), (per_row * w).mean(), rtol=1e-5
        )


def test_rank_0_inputs():
    # Issue 19 item 7.
    loss = SparsemaxLoss(reduction=None)
    with pytest.raises(ValueError, match="`y_pred` must have rank >= 1"):
        loss(np.int32(0), np.float32(2.0))
    np.testing.assert_allclose(
        numpy(loss(np.int32(1), Z[0])), ref_losses(Z[:1], np.eye(5)[[1]])[0], atol=1e-6
    )


def test_unnormalised_targets_name_y_true_and_empty_rows_give_zero():
    # Issue 19 item 6, through the Keras loss: rows without a target keep loss 0 (and gradient
    # 0); with normalize_labels=False a row summing to 2 is rejected naming `y_true`.
    q = np.eye(5, dtype=np.float32)[IDS]
    q[2] = 0.0
    want = ref_losses(Z, q)
    want[2] = 0.0
    p = np.stack([ref.sparsemax(r.astype(np.float64))[0] for r in Z])
    for normalize in (True, False):
        loss = SparsemaxLoss(normalize_labels=normalize, reduction=None)
        out, (grad,) = value_and_grad(lambda z: loss(q, z), Z)
        np.testing.assert_allclose(out, want, atol=1e-6)
        np.testing.assert_array_equal(grad[2], 0.0)
        rows = [0, 1, 3, 4, 5]
        want_g = upstream(6)[rows, None] * (p[rows] - q[rows])
        np.testing.assert_allclose(grad[rows], want_g, atol=1e-5)
    with pytest.raises(ValueError, match="`y_true` rows must sum to 1"):
        SparsemaxLoss(normalize_labels=False)(2 * q, Z)
