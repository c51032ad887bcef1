"""RankmaxLoss: label formats, reductions, sample weights, compile by name, training."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import losszoo
from losszoo.losses import RankmaxLoss
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
    reason="tf.GradientTape / tf.function / XLA checks (tests/helpers.py); sparse and ragged inputs"
)

ref = load_reference("rankmax_sparsemax")
rng = np.random.default_rng(0)
Z = rng.normal(size=(6, 5)).astype(np.float32)
IDS = np.array([0, 4, 2, 2, 1, 3])


def ref_losses(z, positives, k=1, margin=1.0):
    return np.array(
        [
            sum(w * ref.rankmax(row.astype(np.float64), y, k, margin)[4] for y, w in pos)
            for row, pos in zip(z, positives)
        ]
    )


@pytest.mark.parametrize("k", [1, 2])
def test_label_formats_agree_with_reference(k):
    want = ref_losses(Z, [[(y, 1.0)] for y in IDS], k)
    loss = RankmaxLoss(k=k, reduction=None)
    for labels in (
        IDS,
        IDS[:, None],
        IDS.astype(np.float32),
        np.eye(5)[IDS],
        np.eye(5, dtype=np.float32)[IDS],
    ):
        np.testing.assert_allclose(loss(labels, Z).numpy(), want, rtol=1e-5, atol=1e-6)
    # several positives: multi-hot and padded ids (float ids too, as Keras may cast y_true)
    multi = np.array(
        [
            [1, 0, 1, 0, 0],
            [0, 0, 0, 0, 1],
            [0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [0, 1, 0, 0, 0],
            [0, 0, 0, 1, 1],
        ],
        np.float32,
    )
    padded = np.array([[0, 2, -1], [4, -1, -1], [-1, -1, -1], [0, 1, 2], [1, -1, -1], [3, 4, -1]])
    want = ref_losses(Z, [[(i, 1.0) for i in np.nonzero(r)[0]] for r in multi], k)
    for labels in (multi, padded, padded.astype(np.float32)):
        np.testing.assert_allclose(loss(labels, Z).numpy(), want, rtol=1e-5, atol=1e-6)
    assert loss(multi, Z).numpy()[2] == 0.0


def test_margin_is_passed_through():
    want = ref_losses(Z, [[(y, 1.0)] for y in IDS], 2, 0.5)
    np.testing.assert_allclose(
        RankmaxLoss(k=2, margin=0.5, reduction=None)(IDS, Z), want, rtol=1e-5, atol=1e-6
    )


def test_reductions_and_sample_weights():
    per_example = ref_losses(Z, [[(y, 1.0)] for y in IDS])
    w = np.array([1.0, 0.0, 2.0, 0.5, 1.0, 3.0], np.float32)
    np.testing.assert_allclose(RankmaxLoss()(IDS, Z), per_example.mean(), rtol=1e-5)
    np.testing.assert_allclose(RankmaxLoss(reduction="sum")(IDS, Z), per_example.sum(), rtol=1e-5)
    np.testing.assert_allclose(
        RankmaxLoss()(IDS, Z, sample_weight=w), (w * per_example).mean(), rtol=1e-5
    )


def test_bad_arguments_and_labels():
    with pytest.raises(ValueError, match="k"):
        RankmaxLoss(k=0)
    with pytest.raises(ValueError, match="margin"):
        RankmaxLoss(margin=0.0)
    with pytest.raises(ValueError, match="k"):
        RankmaxLoss(k=5)(IDS, Z)  # k >= n
    with pytest.raises(ValueError, match=r"`y_true` holds class ids.*\[0, K\).*rows \[1\]"):
        RankmaxLoss()(np.array([0, 5, 1, 1, 1, 1]), Z)
    with pytest.raises(ValueError, match="NaN"):
        RankmaxLoss()(IDS, np.where(np.eye(6, 5) > 0, np.nan, Z).astype(np.float32))
    fn = tf.function(lambda y, z: RankmaxLoss()(y, z))
    with pytest.raises(tf.errors.InvalidArgumentError, match="y_true"):
        fn(tf.constant([0, 7, 1, 1, 1, 1]), tf.constant(Z))


def test_config_roundtrip_and_registry():
    assert_config_roundtrip(
        RankmaxLoss(k=3, margin=0.5, max_positives=None, reduction="sum", name="rk")
    )
    assert isinstance(losszoo.get("rankmax"), RankmaxLoss)
    assert isinstance(losszoo.get("rankmax_loss"), RankmaxLoss)
    assert keras.losses.get("rankmax").__class__ is RankmaxLoss


def test_trains_with_compile_by_name_and_xla():
    x, y = classification_data()
    for jit, loss in ((False, "rankmax"), (True, RankmaxLoss(k=2))):
        model = small_mlp()
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss, jit_compile=jit)
        assert_fit_smoke(model, x, y, epochs=4, batch_size=64)


def test_mixed_precision():
    x, y = classification_data()
    assert_mixed_precision(small_mlp, x, y, "rankmax")
    assert RankmaxLoss()(IDS, tf.constant(Z, tf.float16)).dtype == tf.float32


def test_mirrored_strategy_matches_single_device():
    x, y = classification_data(n=64)
    assert_mirrored_matches_single(small_mlp, x, y, RankmaxLoss(k=2))


@pytest.mark.parametrize("jit", [False, True])
def test_ids_with_dynamic_class_count(jit):
    """In-batch retrieval ids when the batch (= class) size is unknown (issue 10 item 4)."""
    z = rng.normal(size=(5, 5)).astype(np.float32)
    ids = np.array([0, 1, 2, 3, 4], np.float32)
    run = dynamic_loss_and_grad(RankmaxLoss(reduction=None), jit)

    values, grad = run(ids, z)
    np.testing.assert_allclose(
        values, ref_losses(z, [[(y, 1.0)] for y in range(5)]), rtol=1e-5, atol=1e-6
    )
    want_grad = np.stack(
        [ref.rankmax_loss_grad(r.astype(np.float64), y, 1) for y, r in enumerate(z)]
    )
    np.testing.assert_allclose(grad, want_grad, atol=1e-5)
    values3, _ = run(ids[:3], z[:3, :3])
    np.testing.assert_allclose(
        values3, ref_losses(z[:3, :3], [[(y, 1.0)] for y in range(3)]), rtol=1e-5, atol=1e-6
    )
    bad = np.array([0, 1, 7, 3, np.nan], np.float32)
    if jit:
        values, _ = run(bad, z)
        assert np.isnan(values[2]) and np.isnan(values[4]) and np.all(np.isfinite(values[:2]))
    else:
        with pytest.raises(tf.errors.InvalidArgumentError, match="`y_true`"):
            run(bad, z)


def test_rank_1_y_pred_and_rank_0_errors():
    # Issue 19 item 7: an IndexError before; the op gives log 3.
    loss = RankmaxLoss()
    z = np.array([2.0, 1.0, 0.0], np.float32)
    np.testing.assert_allclose(float(loss(np.int32(1), z)), np.log(3.0), rtol=1e-6)
    np.testing.assert_allclose(float(loss(np.int32(1), z)), float(losszoo.ops.rankmax_loss(1, z)))
    with pytest.raises(ValueError, match="`y_pred` must have rank >= 1"):
        loss(np.int32(1), np.float32(2.0))


def test_ragged_sparse_labels_sample_weight_and_keras_softmax():
    # Issue 19 items 8 and 10.
    loss = RankmaxLoss(reduction=None)
    lists = [[0, 3], [4], [1, 2, 0], [2], [], [3]]
    want = ref_losses(Z, [[(y, 1.0) for y in ids] for ids in lists])
    ragged = tf.ragged.constant(lists, dtype=tf.int64)
    np.testing.assert_allclose(loss(ragged, Z).numpy(), want, rtol=1e-5, atol=1e-6)
    multi = np.zeros((6, 5), np.float32)
    for i, ids in enumerate(lists):
        multi[i, ids] = 1.0
    sparse = tf.sparse.from_dense(multi)
    np.testing.assert_allclose(
        RankmaxLoss(max_positives=None, reduction=None)(sparse, Z).numpy(),
        want,
        rtol=1e-5,
        atol=1e-6,
    )
    with pytest.raises(ValueError, match="`sample_weight` of shape \\(5,\\)"):
        RankmaxLoss()(IDS, Z, sample_weight=np.ones(5))
    x = rng.normal(size=(32, 4)).astype(np.float32)
    y = rng.integers(0, 5, 32)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="softmax")])
    kernel, bias = (w.numpy() for w in model.weights)
    want = ref_losses(x @ kernel + bias, [[(t, 1.0)] for t in y]).mean()
    model.compile("sgd", loss="rankmax")
    np.testing.assert_allclose(model.evaluate(x, y, batch_size=8, verbose=0), want, rtol=1e-5)
