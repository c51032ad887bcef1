"""Fail-loud contract (issue 9) for sparsemax, sparsemax_loss, the Sparsemax head and
SparsemaxLoss: hypothesis drives random valid and invalid inputs in every mode of the backend
(tests/contract)."""

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis.extra import numpy as hnp

from losszoo import ops
from losszoo.heads import Sparsemax
from losszoo.losses import SparsemaxLoss
from tests.contract import (
    CONTRACT_SETTINGS,
    MODES,
    OUTCOMES,
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
B, K = 4, 6  # one shape for every example: one graph and one XLA program per function
# Gradient checks retrace per example (the harness builds a fresh tf.function): fewer of them.
GRAD_SETTINGS = hypothesis.settings(CONTRACT_SETTINGS, phases=_NO_SHRINK, max_examples=examples(6))
BAD_SETTINGS = hypothesis.settings(CONTRACT_SETTINGS, phases=_NO_SHRINK, max_examples=10)

# Scores with frequent ties (values drawn from a small grid) and offsets up to 1e8; float64
# so the offset leaves the differences exact and the reference is a fair oracle.
_grid = st.sampled_from([-2.0, -1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 3.0])
scores = st.builds(
    lambda base, offset, scale: base * scale + offset,
    hnp.arrays(np.float64, (B, K), elements=st.one_of(_grid, st.floats(-4, 4))),
    st.sampled_from([0.0, 1e8, -1e8]),
    st.sampled_from([1.0, 10.0]),
)
ids = hnp.arrays(np.int64, (B,), elements=st.integers(0, K - 1))
bad_row = st.integers(0, B - 1)

SPARSEMAX = Modes(ops.sparsemax)
SPARSEMAX_LOSS = Modes(ops.sparsemax_loss)
_HEAD = Sparsemax()
HEAD = Modes(lambda x: _HEAD(x))
_LOSS = SparsemaxLoss(reduction=None)
LOSS = Modes(lambda y, z: _LOSS(y, z))


def _ref_p(z):
    return np.stack([ref.sparsemax(row)[0] for row in z])


def _ref_loss(z, q):
    return np.array([ref.sparsemax_loss(row, t) for row, t in zip(z, q)])


@GRAD_SETTINGS
@hypothesis.given(z=scores)
def test_sparsemax_and_head_valid(z):
    assert_modes_agree(
        SPARSEMAX, z, reference=_ref_p(z), grad_wrt=(0,), atol=1e-6, suite="sparsemax"
    )
    assert_modes_agree(
        HEAD,
        z.astype(np.float32),
        reference=_ref_p(z.astype(np.float32)),
        atol=1e-5,
        suite="Sparsemax head",
    )


@GRAD_SETTINGS
@hypothesis.given(z=scores, y=ids)
def test_sparsemax_loss_valid(z, y):
    q = np.eye(K)[y]
    want = _ref_loss(z, q)
    assert_modes_agree(
        SPARSEMAX_LOSS, q, z, reference=want, grad_wrt=(1,), atol=1e-6, suite="sparsemax_loss"
    )
    assert_modes_agree(
        LOSS,
        y.astype(np.float32),
        z.astype(np.float32),
        grad_wrt=(1,),
        atol=1e-5,
        suite="SparsemaxLoss",
    )


def _assert_nan_rows_everywhere(runner, *args, rows, suite):
    """NaN in -> NaN out: the functions return NaN rows in every mode (no error needed)."""
    for mode in MODES:
        out = np.asarray(runner(mode, *args))
        ok = bool(np.all(np.isnan(out[rows])))
        others = np.delete(out, rows, axis=0)
        ok = ok and bool(np.all(np.isfinite(others)))
        OUTCOMES[(suite, "bad", mode, "nan" if ok else "silent")] += 1
        assert ok, f"[{mode}] rows {rows} not NaN or other rows hurt: {out!r}"


@BAD_SETTINGS
@hypothesis.given(
    z=scores, row=bad_row, col=st.integers(0, K - 1), bad=st.sampled_from(["nan", "inf", "all-inf"])
)
def test_bad_scores_give_nan_rows(z, row, col, bad):
    z = z.copy()
    if bad == "all-inf":
        z[row] = -np.inf
    else:
        z[row, col] = np.nan if bad == "nan" else np.inf
    _assert_nan_rows_everywhere(SPARSEMAX, z, rows=[row], suite="sparsemax")
    q = np.eye(K)[np.arange(B) % K]
    _assert_nan_rows_everywhere(SPARSEMAX_LOSS, q, z, rows=[row], suite="sparsemax_loss")


@BAD_SETTINGS
@hypothesis.given(z=scores, y=ids, row=bad_row, bad=st.sampled_from([np.nan, -1.0, np.inf]))
def test_bad_loss_labels_rejected(z, y, row, bad):
    q = np.eye(K)[y]
    q[row, (y[row] + 1) % K] = bad
    assert_rejects(SPARSEMAX_LOSS, q, z, name="labels", rows=[row], suite="sparsemax_loss")


@BAD_SETTINGS
@hypothesis.given(
    z=scores, y=ids, row=bad_row, bad=st.sampled_from([K, K + 3, -1, 1.5, np.nan, 1e10])
)
def test_sparsemax_loss_class_rejects_bad_ids(z, y, row, bad):
    labels = y.astype(np.float32)
    labels[row] = bad
    assert_rejects(
        LOSS, labels, z.astype(np.float32), name="y_true", rows=[row], suite="SparsemaxLoss"
    )


@BAD_SETTINGS
@hypothesis.given(z=scores, y=ids, row=bad_row, bad=st.sampled_from([np.nan, -0.5, np.inf]))
def test_sparsemax_loss_class_rejects_bad_dense_targets(z, y, row, bad):
    q = np.eye(K, dtype=np.float32)[y]
    q[row, 0] = bad
    assert_rejects(LOSS, q, z.astype(np.float32), name="y_true", rows=[row], suite="SparsemaxLoss")


def test_hyper_parameters_rejected():
    bad_axis = [1.5, "1", None, np.nan]
    assert_hparam_rejected(lambda a: Sparsemax(axis=a), "axis", bad_axis, suite="Sparsemax head")
    assert_hparam_rejected(
        lambda a: ops.sparsemax(np.zeros((2, 3)), axis=a), "axis", bad_axis, suite="sparsemax"
    )
    assert_hparam_rejected(
        lambda a: ops.sparsemax(np.zeros((2, 3)), axis=a), "axis", [2, -3], suite="sparsemax"
    )
    assert_hparam_rejected(
        lambda v: SparsemaxLoss(from_logits=v),
        "from_logits",
        ["yes", 1.0, np.nan],
        suite="SparsemaxLoss",
    )
    assert_hparam_rejected(
        lambda v: SparsemaxLoss(normalize_labels=v),
        "normalize_labels",
        ["no", 0, None],
        suite="SparsemaxLoss",
    )


# Issue 19 items 6, 7 and 10: target rows not summing to 1, rank-0 scores, ragged labels and
# sample weights of the wrong length.


@BAD_SETTINGS
@hypothesis.given(z=scores, y=ids, row=bad_row, kind=st.sampled_from(["zero", "double", "half"]))
def test_loss_labels_not_summing_to_one_rejected(z, y, row, kind):
    q = np.eye(K)[y]
    q[row] = {"zero": 0.0, "double": 2.0, "half": 0.5}[kind] * q[row]
    assert_rejects(
        SPARSEMAX_LOSS, q, z, name="labels", rows=[row], suite="sparsemax_loss", match="sum to 1"
    )


_UNNORMALISED_LOSS = SparsemaxLoss(normalize_labels=False, reduction=None)
UNNORMALISED_LOSS = Modes(lambda y, z: _UNNORMALISED_LOSS(y, z))
_MEAN_LOSS = SparsemaxLoss()
WEIGHTED_LOSS = Modes(lambda y, z, w: _MEAN_LOSS(y, z, sample_weight=w))


def test_keras_loss_bad_shapes_and_sums_rejected():
    z = np.random.default_rng(1).normal(size=(B, K)).astype(np.float32)
    y = np.arange(B) % K
    q = np.eye(K, dtype=np.float32)[y]
    q[1] *= 2.0
    assert_rejects(UNNORMALISED_LOSS, q, z, name="y_true", rows=[1], suite="SparsemaxLoss")
    assert_rejects(
        LOSS, np.float32(0.0), np.float32(2.0), name="y_pred", rows=(), suite="SparsemaxLoss"
    )
    for w in (np.ones(B + 1, np.float32), np.ones((B, 2), np.float32)):
        assert_rejects(
            WEIGHTED_LOSS,
            y.astype(np.float32),
            z,
            w,
            name="sample_weight",
            rows=(),
            suite="SparsemaxLoss",
        )
    w = np.arange(1.0, B + 1, dtype=np.float32)
    want = (_ref_loss(z.astype(np.float64), np.eye(K)[y]) * w).mean()
    assert_modes_agree(
        WEIGHTED_LOSS, y.astype(np.float32), z, w, reference=want, suite="SparsemaxLoss"
    )


@pytest.mark.tensorflow_only(reason="tf.RaggedTensor / tf.SparseTensor labels")
def test_ragged_labels_rejected_sparse_labels_read():
    import tensorflow as tf

    z = np.random.default_rng(2).normal(size=(2, K)).astype(np.float32)
    ragged = tf.ragged.constant([[0.0, 2.0], [1.0]])
    assert_rejects(LOSS, ragged, z, name="y_true", rows=(), suite="SparsemaxLoss")
    assert_rejects(SPARSEMAX_LOSS, ragged, z, name="labels", rows=(), suite="sparsemax_loss")
    q = np.zeros((2, K), np.float32)
    q[0, [0, 2]], q[1, 1] = 1.0, 1.0
    want = _ref_loss(z.astype(np.float64), q / q.sum(1, keepdims=True))
    # XLA cannot compile the densification of a SparseTensor (SparseReorder): eager and graph
    assert_modes_agree(
        LOSS,
        tf.sparse.from_dense(q),
        z,
        reference=want,
        modes=("eager", "graph"),
        suite="SparsemaxLoss",
    )
