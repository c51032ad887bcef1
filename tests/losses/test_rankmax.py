"""RankmaxLoss on the running backend: label formats, reductions, sample weights, errors
naming the argument, compile by name and training (``jit_compile`` False / True / "auto"),
models ending in Keras' softmax. TensorFlow-only checks (MirroredStrategy, ``None``-shaped
signatures, sparse / ragged labels): ``test_rankmax_tensorflow.py``."""

import keras
import numpy as np
import pytest
from keras import ops as kops

import losszoo
from losszoo.losses import RankmaxLoss
from tests.harness import (
    BACKEND,
    assert_config_roundtrip,
    assert_fit_smoke,
    assert_mixed_precision,
    classification_data,
    numpy,
    small_mlp,
)
from tests.references import load_reference

ref = load_reference("rankmax_sparsemax")
rng = np.random.default_rng(0)
Z = rng.normal(size=(6, 5)).astype(np.float32)
IDS = np.array([0, 4, 2, 2, 1, 3])
# PyTorch's jit_compile is torch.compile, outside losszoo's contract (tests/harness.py)
JIT = (False, "auto") if BACKEND == "torch" else (False, True, "auto")


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
        np.testing.assert_allclose(numpy(loss(labels, Z)), want, rtol=1e-5, atol=1e-6)
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
        np.testing.assert_allclose(numpy(loss(labels, Z)), want, rtol=1e-5, atol=1e-6)
    assert numpy(loss(multi, Z))[2] == 0.0


def test_margin_is_passed_through():
    want = ref_losses(Z, [[(y, 1.0)] for y in IDS], 2, 0.5)
    got = numpy(RankmaxLoss(k=2, margin=0.5, reduction=None)(IDS, Z))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_reductions_and_sample_weights():
    per_example = ref_losses(Z, [[(y, 1.0)] for y in IDS])
    w = np.array([1.0, 0.0, 2.0, 0.5, 1.0, 3.0], np.float32)
    np.testing.assert_allclose(numpy(RankmaxLoss()(IDS, Z)), per_example.mean(), rtol=1e-5)
    np.testing.assert_allclose(
        numpy(RankmaxLoss(reduction="sum")(IDS, Z)), per_example.sum(), rtol=1e-5
    )
    np.testing.assert_allclose(
        numpy(RankmaxLoss()(IDS, Z, sample_weight=w)), (w * per_example).mean(), rtol=1e-5
    )
    with pytest.raises(ValueError, match="`sample_weight` of shape \\(5,\\)"):
        RankmaxLoss()(IDS, Z, sample_weight=np.ones(5))


def test_bad_arguments_and_labels():
    # the same in compiled modes, on random batches: tests/contract/test_rankmax.py
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


def test_config_roundtrip_and_registry():
    assert_config_roundtrip(
        RankmaxLoss(k=3, margin=0.5, max_positives=None, reduction="sum", name="rk")
    )
    assert isinstance(losszoo.get("rankmax"), RankmaxLoss)
    assert isinstance(losszoo.get("rankmax_loss"), RankmaxLoss)
    assert keras.losses.get("rankmax").__class__ is RankmaxLoss


@pytest.mark.parametrize("jit", JIT)
def test_trains_with_compile_by_name(jit):
    # 200 = 3 * 64 + 8: a partial last batch; by name and as an object with k = 2
    x, y = classification_data(n=200)
    model = small_mlp()
    loss = RankmaxLoss(k=2) if jit is True else "rankmax"
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss, jit_compile=jit)
    assert_fit_smoke(model, x, y, epochs=4, batch_size=64)


def test_mixed_precision():
    x, y = classification_data(n=128)
    assert_mixed_precision(small_mlp, x, y, "rankmax")
    value = RankmaxLoss()(IDS, kops.cast(Z, "float16"))
    assert keras.backend.standardize_dtype(value.dtype) == "float32"


def test_rank_1_y_pred_and_rank_0_errors():
    # Issue 19 item 7: an IndexError before; the op gives log 3.
    loss = RankmaxLoss()
    z = np.array([2.0, 1.0, 0.0], np.float32)
    np.testing.assert_allclose(float(numpy(loss(np.int32(1), z))), np.log(3.0), rtol=1e-6)
    np.testing.assert_allclose(
        float(numpy(loss(np.int32(1), z))), float(numpy(losszoo.ops.rankmax_loss(1, z)))
    )
    with pytest.raises(ValueError, match="`y_pred` must have rank >= 1"):
        loss(np.int32(1), np.float32(2.0))


def test_model_ending_in_keras_softmax_is_scored_on_its_logits():
    # Issue 19 item 8 (32 = 3 * 10 + 2: a partial last batch).
    x = rng.normal(size=(32, 4)).astype(np.float32)
    y = rng.integers(0, 5, 32)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="softmax")])
    kernel, bias = (numpy(w) for w in model.weights)
    want = ref_losses(x @ kernel + bias, [[(t, 1.0)] for t in y]).mean()
    model.compile("sgd", loss="rankmax")
    np.testing.assert_allclose(model.evaluate(x, y, batch_size=10, verbose=0), want, rtol=1e-5)
