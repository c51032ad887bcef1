"""SparsemaxLoss: label formats, reductions, sample weights, compile by name, training."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import losszoo
from losszoo.losses import SparsemaxLoss
from tests.helpers import (
    assert_config_roundtrip,
    assert_fit_smoke,
    assert_mirrored_matches_single,
    assert_mixed_precision,
    classification_data,
    dynamic_loss_and_grad,
    load_reference,
    small_mlp,
)

pytestmark = pytest.mark.tensorflow_only(
    reason="tf.GradientTape / tf.function / XLA checks (tests/helpers.py); sparse inputs"
)

ref = load_reference("rankmax_sparsemax")
rng = np.random.default_rng(0)
Z = rng.normal(size=(6, 5)).astype(np.float32)
IDS = np.array([0, 4, 2, 2, 1, 3])


def ref_losses(z, q):
    return np.array([ref.sparsemax_loss(a.astype(np.float64), b) for a, b in zip(z, q)])


def test_integer_ids_and_one_hot_agree_with_reference():
    want = ref_losses(Z, np.eye(5)[IDS])
    loss = SparsemaxLoss(reduction=None)
    for labels in (IDS, IDS[:, None], IDS.astype(np.float32), np.eye(5)[IDS]):
        np.testing.assert_allclose(loss(labels, Z).numpy(), want, rtol=1e-5, atol=1e-6)


def test_multi_hot_targets_are_normalised():
    multi = np.array([[1, 1, 0, 0, 0], [0, 0, 0, 0, 1]], np.float32)
    want = ref_losses(Z[:2], multi / multi.sum(1, keepdims=True))
    np.testing.assert_allclose(SparsemaxLoss(reduction=None)(multi, Z[:2]).numpy(), want, rtol=1e-5)
    raw = SparsemaxLoss(reduction=None, normalize_labels=False)(multi[1:], Z[1:2]).numpy()
    np.testing.assert_allclose(raw, ref_losses(Z[1:2], multi[1:]), rtol=1e-5)


def test_rows_without_target_get_zero_loss_and_gradient():
    targets = np.array([[0, 0, 0, 0, 0], [0, 1, 0, 0, 0]], np.float32)
    z = tf.constant(Z[:2])
    with tf.GradientTape() as tape:
        tape.watch(z)
        values = SparsemaxLoss(reduction=None)(targets, z)
        total = tf.reduce_sum(values)
    grad = tape.gradient(total, z).numpy()
    assert values.numpy()[0] == 0 and np.all(grad[0] == 0) and np.any(grad[1] != 0)


def test_reductions_and_sample_weights():
    per_example = ref_losses(Z, np.eye(5)[IDS])
    w = np.array([1.0, 0.0, 2.0, 0.5, 1.0, 3.0], np.float32)
    np.testing.assert_allclose(SparsemaxLoss()(IDS, Z), per_example.mean(), rtol=1e-5)
    np.testing.assert_allclose(SparsemaxLoss(reduction="sum")(IDS, Z), per_example.sum(), rtol=1e-5)
    np.testing.assert_allclose(
        SparsemaxLoss()(IDS, Z, sample_weight=w), (w * per_example).mean(), rtol=1e-5
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


def test_from_logits_false_requires_a_head_output():
    with pytest.raises(ValueError, match="from_logits=False"):
        SparsemaxLoss(from_logits=False)(IDS, Z)
    probs = losszoo.heads.Sparsemax()(Z)
    np.testing.assert_allclose(
        SparsemaxLoss(from_logits=False)(IDS, probs), SparsemaxLoss()(IDS, Z), rtol=1e-6
    )


def test_bad_labels_raise_inside_compiled_graphs():
    loss = SparsemaxLoss()
    fn = tf.function(lambda y, z: loss(y, z))
    with pytest.raises(tf.errors.InvalidArgumentError, match="y_true"):
        fn(tf.constant([0, 7, 1, 1, 1, 1]), tf.constant(Z))


def test_config_roundtrip_and_registry():
    assert_config_roundtrip(SparsemaxLoss(normalize_labels=False, reduction="sum", name="sm"))
    assert isinstance(losszoo.get("sparsemax"), SparsemaxLoss)
    assert isinstance(losszoo.get("sparsemax_loss"), SparsemaxLoss)
    assert losszoo.get("sparsemax", kind="head").__class__ is losszoo.heads.Sparsemax


def test_trains_with_compile_by_name_and_xla():
    x, y = classification_data()
    for jit in (False, True):
        model = small_mlp()
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparsemax", jit_compile=jit)
        assert_fit_smoke(model, x, y, epochs=4, batch_size=64)


def test_mixed_precision():
    x, y = classification_data()
    assert_mixed_precision(small_mlp, x, y, "sparsemax")


def test_mirrored_strategy_matches_single_device():
    x, y = classification_data(n=64)
    assert_mirrored_matches_single(small_mlp, x, y, SparsemaxLoss())


@pytest.mark.parametrize("jit", [False, True])
def test_ids_with_dynamic_class_count(jit):
    z = rng.normal(size=(5, 5)).astype(np.float32)
    ids = np.array([0, 1, 2, 3, 4], np.float32)
    run = dynamic_loss_and_grad(SparsemaxLoss(reduction=None), jit)

    values, grad = run(ids, z)
    np.testing.assert_allclose(values, ref_losses(z, np.eye(5)), rtol=1e-5, atol=1e-6)
    want_grad = np.stack([ref.sparsemax(r.astype(np.float64))[0] for r in z]) - np.eye(5)
    np.testing.assert_allclose(grad, want_grad, atol=1e-6)
    # A different batch size through the same signature.
    values3, _ = run(ids[:3], z[:3, :3])
    np.testing.assert_allclose(values3, ref_losses(z[:3, :3], np.eye(3)), rtol=1e-5, atol=1e-6)
    bad = np.array([0, 1, 7, 3, np.nan], np.float32)
    if jit:  # assertions vanish under XLA: the bad rows' loss is NaN, the others untouched
        values, grad = run(bad, z)
        assert np.isnan(values[2]) and np.isnan(values[4])
        np.testing.assert_allclose(values[:2], ref_losses(z[:2], np.eye(5)[:2]), rtol=1e-5)
        assert np.all(np.isnan(grad[2])) and np.all(np.isfinite(grad[:2]))
    else:
        with pytest.raises(tf.errors.InvalidArgumentError, match="`y_true`"):
            run(bad, z)


@pytest.mark.parametrize("bad", [[0, 3], [0, -1], [0, 1.5], [0, np.nan]])
def test_bad_ids_raise_eagerly(bad):
    with pytest.raises(ValueError, match="`y_true`"):
        SparsemaxLoss()(np.array(bad, np.float32), Z[:2, :3])


def _softmax_models():
    """Sequential and functional models ending in Keras' own softmax (same weights)."""
    seq = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="softmax")])
    inp = keras.Input((4,))
    func = keras.Model(inp, keras.layers.Softmax()(keras.layers.Dense(5)(inp)))
    func.set_weights(seq.get_weights())
    return seq, func


@pytest.mark.parametrize("jit", [False, True])
def test_model_ending_in_keras_softmax_trains_on_its_logits(jit):
    # Issue 19 item 8: the loss read the softmax probabilities as scores, silently. Keras'
    # softmax attaches `_keras_logits`; the loss must see them in a real fit / evaluate.
    x = rng.normal(size=(40, 4)).astype(np.float32)
    y = rng.integers(0, 5, 40)
    for model in _softmax_models():
        kernel, bias = (w.numpy() for w in model.weights)
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
            float(loss(IDS, Z, sample_weight=weights)), (per_row * w).mean(), rtol=1e-5
        )
    graph = tf.function(
        lambda y, z, sw: loss(y, z, sample_weight=sw),
        input_signature=[tf.TensorSpec([None]), tf.TensorSpec([None, 5]), tf.TensorSpec([None])],
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="`sample_weight`"):
        graph(IDS.astype(np.float32), Z, np.ones(5, np.float32))
    np.testing.assert_allclose(
        float(graph(IDS.astype(np.float32), Z, w.astype(np.float32))),
        (per_row * w).mean(),
        rtol=1e-5,
    )


def test_sparse_ragged_and_rank_0_inputs():
    # Issue 19 items 7 and 10.
    loss = SparsemaxLoss(reduction=None)
    multi = np.zeros((6, 5), np.float32)
    multi[np.arange(6), IDS] = 1.0
    multi[0, 3] = 1.0
    want = ref_losses(Z, multi / multi.sum(1, keepdims=True))
    np.testing.assert_allclose(loss(tf.sparse.from_dense(multi), Z).numpy(), want, atol=1e-6)
    with pytest.raises(TypeError, match="`y_true` must be a dense tensor or a tf.SparseTensor"):
        loss(tf.ragged.constant([[0, 3], [4]]), Z[:2])
    with pytest.raises(ValueError, match="`y_pred` must have rank >= 1"):
        loss(np.int32(0), np.float32(2.0))
    np.testing.assert_allclose(
        loss(np.int32(1), Z[0]).numpy(), ref_losses(Z[:1], np.eye(5)[[1]])[0], atol=1e-6
    )


def test_unnormalised_targets_name_y_true_and_empty_rows_give_zero():
    # Issue 19 item 6, through the Keras loss: rows without a target keep loss 0 (and gradient
    # 0); with normalize_labels=False a row summing to 2 is rejected naming `y_true`.
    q = np.eye(5, dtype=np.float32)[IDS]
    q[2] = 0.0
    for normalize in (True, False):
        loss = SparsemaxLoss(normalize_labels=normalize, reduction=None)
        z = tf.constant(Z)
        with tf.GradientTape() as tape:
            tape.watch(z)
            out = loss(q, z)
        grad = tape.gradient(out, z).numpy()
        want = ref_losses(Z, q)
        want[2] = 0.0
        np.testing.assert_allclose(out.numpy(), want, atol=1e-6)
        np.testing.assert_array_equal(grad[2], 0.0)
    with pytest.raises(ValueError, match="`y_true` rows must sum to 1"):
        SparsemaxLoss(normalize_labels=False)(2 * q, Z)
