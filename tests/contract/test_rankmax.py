"""Fail-loud contract (issue 9) for rankmax, rankmax_loss and RankmaxLoss: hypothesis drives
random valid and invalid inputs in every mode of the backend (tests/contract)."""

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis.extra import numpy as hnp

from losszoo import ops
from losszoo.losses import RankmaxLoss
from tests.contract import (
    CONTRACT_SETTINGS,
    Modes,
    assert_hparam_rejected,
    assert_modes_agree,
    assert_rejects,
    examples,
)
from tests.references import load_reference

ref = load_reference("rankmax_sparsemax")
# A failure is reported as generated: shrinking XLA-compiled examples takes minutes.
_NO_SHRINK = (hypothesis.Phase.explicit, hypothesis.Phase.reuse, hypothesis.Phase.generate)
B, N = 4, 6
GRAD_SETTINGS = hypothesis.settings(CONTRACT_SETTINGS, phases=_NO_SHRINK, max_examples=examples(5))
BAD_SETTINGS = hypothesis.settings(CONTRACT_SETTINGS, phases=_NO_SHRINK, max_examples=8)

# Ties are frequent (a small grid); offsets of 1e8 in float64 keep differences exact.
_grid = st.sampled_from([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0])
scores = st.builds(
    lambda base, offset: base + offset,
    hnp.arrays(np.float64, (B, N), elements=st.one_of(_grid, st.floats(-4, 4))),
    st.sampled_from([0.0, 1e8, -1e8]),
)
ids = hnp.arrays(np.int64, (B,), elements=st.integers(0, N - 1))
bad_row = st.integers(0, B - 1)

RUNNERS = {k: (Modes(ops.rankmax, k=k), Modes(ops.rankmax_loss, k=k)) for k in (1, 3)}
_LOSS = RankmaxLoss(reduction=None)
LOSS = Modes(lambda y, z: _LOSS(y, z))


def _ref_loss(z, y, k):
    return np.array([ref.rankmax(row, t, k)[4] for row, t in zip(z, y)])


@pytest.mark.parametrize("k", [1, 3])
@GRAD_SETTINGS
@hypothesis.given(z=scores, y=ids)
def test_valid_projection_and_loss(k, z, y):
    proj, loss = RUNNERS[k]
    want_p = np.stack([ref.rankmax(row, t, k)[0] for row, t in zip(z, y)])
    assert_modes_agree(proj, y, z, reference=want_p, grad_wrt=(1,), atol=1e-6, suite="rankmax")
    want = _ref_loss(z, y, k)
    assert_modes_agree(loss, y, z, reference=want, grad_wrt=(1,), atol=1e-6, suite="rankmax_loss")
    # dense one-hot labels (the TFRS form) take the masked-sum path: same numbers
    assert_modes_agree(
        loss, np.eye(N)[y], z, reference=want, grad_wrt=(1,), atol=1e-6, suite="rankmax_loss"
    )


@GRAD_SETTINGS
@hypothesis.given(z=scores, multi=hnp.arrays(np.bool_, (B, N)))
def test_valid_multi_hot_and_keras_loss(z, multi):
    _, loss = RUNNERS[1]
    w = multi.astype(np.float64)
    want = np.array(
        [sum(ref.rankmax(row, i, 1)[4] for i in np.nonzero(m)[0]) for row, m in zip(z, multi)]
    )
    assert_modes_agree(loss, w, z, reference=want, grad_wrt=(1,), atol=1e-6, suite="rankmax_loss")
    z32 = (z - z.max(1, keepdims=True)).astype(np.float32)
    want32 = np.array(
        [
            sum(ref.rankmax(row.astype(np.float64), i, 1)[4] for i in np.nonzero(m)[0])
            for row, m in zip(z32, multi)
        ]
    )
    assert_modes_agree(
        LOSS,
        w.astype(np.float32),
        z32,
        reference=want32,
        grad_wrt=(1,),
        atol=1e-4,
        rtol=1e-4,
        suite="RankmaxLoss",
    )


@pytest.mark.parametrize("k", [1, 3])
@BAD_SETTINGS
@hypothesis.given(z=scores, y=ids, row=bad_row, bad=st.sampled_from([N, N + 5, -2, 10**6]))
def test_out_of_range_ids(k, z, y, row, bad):
    proj, loss = RUNNERS[k]
    y = y.copy()
    y[row] = bad
    assert_rejects(loss, y, z, name="labels", rows=[row], suite="rankmax_loss")
    assert_rejects(proj, y, z, name="labels", rows=[row], suite="rankmax")


@BAD_SETTINGS
@hypothesis.given(z=scores, y=ids, row=bad_row, bad=st.sampled_from([np.nan, 1.5, N, -3.0]))
def test_keras_loss_bad_ids(z, y, row, bad):
    labels = y.astype(np.float32)
    labels[row] = bad
    assert_rejects(
        LOSS, labels, z.astype(np.float32), name="y_true", rows=[row], suite="RankmaxLoss"
    )


@BAD_SETTINGS
@hypothesis.given(
    z=scores,
    y=ids,
    row=bad_row,
    col=st.integers(0, N - 1),
    bad=st.sampled_from([np.nan, -1.0, np.inf]),
)
def test_bad_dense_labels(z, y, row, col, bad):
    _, loss = RUNNERS[1]
    w = np.eye(N)[y]
    w[row, col] = bad
    assert_rejects(loss, w, z, name="labels", rows=[row], suite="rankmax_loss")
    assert_rejects(
        LOSS,
        w.astype(np.float32),
        z.astype(np.float32),
        name="y_true",
        rows=[row],
        suite="RankmaxLoss",
    )


@pytest.mark.parametrize("k", [1, 3])
@BAD_SETTINGS
@hypothesis.given(z=scores, y=ids, row=bad_row, col=st.integers(0, N - 1))
def test_nan_scores(k, z, y, row, col):
    proj, loss = RUNNERS[k]
    z = z.copy()
    z[row, col] = np.nan
    assert_rejects(loss, y, z, name="logits", rows=[row], suite="rankmax_loss")
    assert_rejects(proj, y, z, name="logits", rows=[row], suite="rankmax")


def test_hyper_parameters_rejected():
    z, y = np.zeros((2, 4)), np.array([0, 1])
    bad_k = [0, -1, 1.5, 2.0, np.nan, np.inf, "2", None, True, 4, 7]
    assert_hparam_rejected(lambda k: ops.rankmax_loss(y, z, k=k), "k", bad_k, suite="rankmax_loss")
    assert_hparam_rejected(lambda k: ops.rankmax(y, z, k=k), "k", bad_k, suite="rankmax")
    assert_hparam_rejected(lambda k: RankmaxLoss(k=k), "k", bad_k[:-2], suite="RankmaxLoss")
    bad_margin = [0.0, -1.0, np.nan, np.inf, "1", None]
    assert_hparam_rejected(
        lambda m: ops.rankmax_loss(y, z, margin=m), "margin", bad_margin, suite="rankmax_loss"
    )
    assert_hparam_rejected(
        lambda m: RankmaxLoss(margin=m), "margin", bad_margin, suite="RankmaxLoss"
    )
    bad_mp = [0, 1.5, "1", 5]
    assert_hparam_rejected(
        lambda m: ops.rankmax_loss(np.eye(4)[y], z, max_positives=m),
        "max_positives",
        bad_mp,
        suite="rankmax_loss",
    )
    assert_hparam_rejected(
        lambda f: ops.rankmax_loss(y, z, label_format=f),
        "label_format",
        ["onehot", None, 1],
        suite="rankmax_loss",
    )
    assert_hparam_rejected(
        lambda f: RankmaxLoss(label_format=f), "label_format", ["onehot", None], suite="RankmaxLoss"
    )
    # ambiguous integer [B, n] labels
    assert_hparam_rejected(
        lambda v: ops.rankmax_loss(v, z),
        "label_format",
        [np.eye(4, dtype=np.int32)[y]],
        suite="rankmax_loss",
    )


# Issue 19 items 7, 10 and 11.


def test_integer_one_hot_is_ambiguous_for_the_projection_too():
    z = np.random.default_rng(3).normal(size=(B, N))
    one_hot = np.eye(N, dtype=np.int32)[np.arange(B) % N]
    proj, loss = RUNNERS[1]
    assert_rejects(proj, one_hot, z, name="labels", rows=(), suite="rankmax", match="ambiguous")
    assert_rejects(
        loss, one_hot, z, name="labels", rows=(), suite="rankmax_loss", match="ambiguous"
    )


_MEAN_LOSS = RankmaxLoss()
WEIGHTED = Modes(lambda y, z, w: _MEAN_LOSS(y, z, sample_weight=w))


def test_keras_loss_rank_1_scores_rank_0_scores_and_sample_weight():
    z = np.array([2.0, 1.0, 0.0], np.float32)
    assert_modes_agree(LOSS, np.float32(1.0), z, reference=np.log(3.0), suite="RankmaxLoss")
    assert_rejects(
        LOSS, np.float32(1.0), np.float32(2.0), name="y_pred", rows=(), suite="RankmaxLoss"
    )
    zb = np.random.default_rng(4).normal(size=(B, N)).astype(np.float32)
    y = (np.arange(B) % N).astype(np.float32)
    assert_rejects(
        WEIGHTED,
        y,
        zb,
        np.ones(B + 2, np.float32),
        name="sample_weight",
        rows=(),
        suite="RankmaxLoss",
    )
    w = np.arange(1.0, B + 1, dtype=np.float32)
    want = (_ref_loss(zb.astype(np.float64), y.astype(int), 1) * w).mean()
    assert_modes_agree(WEIGHTED, y, zb, w, reference=want, atol=1e-5, suite="RankmaxLoss")


@pytest.mark.tensorflow_only(reason="tf.RaggedTensor labels")
def test_ragged_positive_lists():
    import tensorflow as tf

    z = np.random.default_rng(5).normal(size=(3, N))
    lists = [[0, 3], [5], []]
    want = np.array([sum(ref.rankmax(row, t, 1)[4] for t in ids) for row, ids in zip(z, lists)])
    ragged = tf.ragged.constant(lists, dtype=tf.int64)
    _, loss = RUNNERS[1]
    # XLA cannot compile RaggedTensorToTensor: eager and graph only
    assert_modes_agree(
        loss, ragged, z, reference=want, modes=("eager", "graph"), suite="rankmax_loss"
    )
    assert_modes_agree(
        LOSS,
        tf.cast(ragged, tf.float32),
        z.astype(np.float32),
        reference=want,
        atol=1e-5,
        modes=("eager", "graph"),
        suite="RankmaxLoss",
    )
