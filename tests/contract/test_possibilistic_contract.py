"""Fail-loud contract (issue 9) for the possibilistic ops and losses.

Bad labels / logits raise naming the argument eagerly and in graphs; under XLA and jax.jit the
affected rows come back NaN (every mode of the backend: tests/contract). Valid inputs agree
across modes and with the certified Dykstra oracle.
"""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import keras
import numpy as np
import pytest

import losszoo
from losszoo import ops
from losszoo.losses import PossibilisticProjectionLoss
from tests.contract import (
    COMPILED_MODES,
    CONTRACT_SETTINGS,
    ERRORS,
    MODES,
    NAN_MODES,
    OUTCOMES,
    Modes,
    assert_hparam_rejected,
    assert_modes_agree,
    assert_rejects,
    examples,
)

K = 4
SUITE = "possibilistic"


def _loss(z, pi):
    return ops.possibilistic_projection_loss(pi, z)


def _proj(z, pi):
    return ops.possibilistic_projection(z, pi)[0]


LOSS = Modes(_loss)
PROJ = Modes(_proj)
# Three rows, the shape of _valid_case's examples: every test of this module feeds the ops
# [3, K] float64 inputs, so each compiled program (the ops' cached XLA solvers, the graph, XLA
# and jax.jit programs of LOSS / PROJ) is built once per module, not once per shape.
GOOD_PI = np.array([[1.0, 0.5, 0.2, 0.1], [0.3, 1.0, 0.3, 0.0], [1.0, 1.0, 0.25, 0.0]])
GOOD_Z = np.array([[0.5, -1.0, 2.0, 0.0], [1.0, 0.0, -0.5, 0.3], [-0.2, 0.4, 1.5, -1.0]])


def test_issue9_nan_logit_is_not_zero_loss():
    # Issue 9: possibilistic_projection_loss([[nan, 1, 0]], [[1, .5, .2]]) returned 0.
    with pytest.raises(ValueError, match="`logits`"):
        ops.possibilistic_projection_loss([[1.0, 0.5, 0.2]], [[np.nan, 1.0, 0.0]])
    with losszoo.validation(False):
        loss = ops.possibilistic_projection_loss([[1.0, 0.5, 0.2]], [[np.nan, 1.0, 0.0]])
    assert np.isnan(keras.ops.convert_to_numpy(loss)).all()
    z = np.array([[np.nan, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], GOOD_Z[2]])
    assert_rejects(LOSS, z, GOOD_PI, name="logits", rows=[0], suite=SUITE)


@pytest.mark.parametrize(
    "bad_row",
    [
        [1.0, np.nan, 0.2, 0.1],  # NaN
        [1.0, -0.5, 0.2, 0.1],  # negative
        [1.0, 1.5, 0.2, 0.1],  # > 1
        [0.5, 0.4, 0.2, 0.1],  # maximum below 1 (not normalised: ambiguous)
        [0.0, 0.0, 0.0, 0.0],  # no possible class
    ],
)
def test_invalid_possibility_rejected_or_nan(bad_row):
    pi = np.array([bad_row, *GOOD_PI[1:]])
    assert_rejects(LOSS, GOOD_Z, pi, name="labels", rows=[0], suite=SUITE)
    assert_rejects(PROJ, GOOD_Z, pi, name="possibility", rows=[0], suite=SUITE)


def test_keras_loss_out_of_range_ids_and_nan_labels_under_xla():
    # Issue 9: class id 7 with K=4 and NaN labels trained with finite losses under XLA.
    loss = PossibilisticProjectionLoss(reduction=None)
    z = GOOD_Z.astype(np.float32)
    runner = Modes(lambda y, p: loss(y, p))
    nan_labels = np.array([[np.nan, 1.0, 0.0, 0.0], *GOOD_PI[1:]], np.float32)
    for mode in NAN_MODES:
        with losszoo.validation(False):
            out = np.asarray(runner(mode, np.array([7, 1, 0]), z))
        assert np.isnan(out[0]) and np.isfinite(out[1:]).all()
        out = np.asarray(runner(mode, nan_labels, z))
        assert np.isnan(out[0]) and np.isfinite(out[1:]).all()
    with pytest.raises(ValueError, match="`y_true`"):
        loss(nan_labels, z)
    for mode in ("eager", *(m for m in COMPILED_MODES if m not in NAN_MODES)):
        with pytest.raises(ERRORS, match="`y_true`"):
            runner(mode, np.array([7, 1, 0]), z)


def test_hyper_parameters_rejected_naming_the_argument():
    def build(**kw):
        return lambda v: PossibilisticProjectionLoss(**{next(iter(kw)): v})

    bad = (float("nan"), float("inf"), -1.0, 0.0)
    assert_hparam_rejected(build(tol=0), "tol", bad, suite=SUITE)
    assert_hparam_rejected(build(gap_tol=0), "gap_tol", bad, suite=SUITE)
    assert_hparam_rejected(
        build(max_cycles=0), "max_cycles", (2.5, float("nan"), 0, -3, True, "10"), suite=SUITE
    )
    assert_hparam_rejected(build(floor=0), "floor", bad + (1.0,), suite=SUITE)
    assert_hparam_rejected(build(eps_cap=0), "eps_cap", (float("nan"), -1e-3, 0.5), suite=SUITE)
    assert_hparam_rejected(build(q_clip=0), "q_clip", bad, suite=SUITE)
    assert_hparam_rejected(build(method=0), "method", ("newton", 3), suite=SUITE)
    with pytest.raises(ValueError, match="`method`"):
        ops.possibilistic_projection(GOOD_Z, GOOD_PI, method="interior_point", stopping="paper")


@st.composite
def _valid_case(draw):
    rows = draw(st.integers(1, 3))
    pi = np.array(
        draw(
            st.lists(
                st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.7, 1.0]), min_size=K, max_size=K),
                min_size=rows,
                max_size=rows,
            )
        )
    )
    top = draw(st.lists(st.integers(0, K - 1), min_size=rows, max_size=rows))
    pi[np.arange(rows), top] = 1.0
    z = np.array(
        draw(
            st.lists(
                st.lists(st.floats(-6, 6), min_size=K, max_size=K), min_size=rows, max_size=rows
            )
        )
    )
    return np.pad(z, [(0, 3 - rows), (0, 0)]), np.pad(
        pi, [(0, 3 - rows), (0, 0)], constant_values=1.0
    )


@hypothesis.given(_valid_case())
@hypothesis.settings(CONTRACT_SETTINGS, max_examples=examples(15))
def test_valid_inputs_agree_across_modes_and_with_dykstra(case):
    z, pi = case
    # 500 cycles: three of these examples never meet the certified rule (their gap stalls at
    # rounding) and ran to the cap; their 500-cycle points equal the 20,000-cycle ones to
    # 9e-16 (checked on TensorFlow), and on PyTorch's eager loop the cap cost 450 s.
    ref = ops.possibilistic_projection(z, pi, method="dykstra", max_cycles=500)[0]
    ref = keras.ops.convert_to_numpy(ref)
    assert_modes_agree(PROJ, z, pi, reference=ref, atol=1e-6, suite=SUITE)
    assert_modes_agree(LOSS, z, pi, atol=1e-6, grad_wrt=(0,), suite=SUITE)


@hypothesis.given(st.integers(0, 3), st.sampled_from([np.nan, -0.1, 1.2]))
@CONTRACT_SETTINGS
def test_bad_possibility_entries_property(col, value):
    pi = GOOD_PI.copy()
    pi[0, col] = value
    assert_rejects(LOSS, GOOD_Z, pi, name="labels", rows=[0], suite=SUITE)


# Issue 19: invalid logits rows, antipignistic bad rows, constraint options, None batch dim.


def _fixed_b(z, pi):
    return ops.antipignistic_kl_loss(pi, z)


def _fixed_c(z, votes):
    return ops.vote_kl_loss(votes, z)


# One runner (one program per mode and signature) for every parameter of a test.
FIXED_B = Modes(_fixed_b)
FIXED_C = Modes(_fixed_c)
ANTIPIGNISTIC = Modes(ops.antipignistic)


@pytest.mark.parametrize(
    "bad_row",
    [
        [np.inf, 0.0, -1.0, 0.5],  # +inf: softmax undefined
        [-np.inf, -np.inf, -np.inf, -np.inf],  # every class masked
    ],
)
def test_invalid_logit_rows_rejected_or_nan(bad_row):
    # Issue 19: these rows gave loss 0.0 (the projection was NaN).
    z = np.array([bad_row, *GOOD_Z[1:]])
    votes = np.array([[3.0, 1.0, 0.0, 2.0], [1.0, 1.0, 1.0, 1.0], [0.0, 2.0, 1.0, 0.0]])
    for runner, labels in ((LOSS, GOOD_PI), (PROJ, GOOD_PI), (FIXED_B, GOOD_PI), (FIXED_C, votes)):
        assert_rejects(runner, z, labels, name="logits", rows=[0], suite=SUITE)
        # where the bad row is NaN, the good row beside it stays finite (the cached program)
        for mode in NAN_MODES:
            out = np.asarray(runner(mode, z, labels))
            assert np.isfinite(out[1:]).all(), (mode, out)


@pytest.mark.parametrize(
    "bad_row",
    [
        [np.nan, 1.0, 0.5, 0.2],  # issue 19: came back as the uniform row
        [np.inf, 1.0, 0.5, 0.2],
        [1.0, -0.5, 0.2, 0.1],
        [0.0, 0.0, 0.0, 0.0],
    ],
)
def test_antipignistic_bad_rows_rejected_or_nan(bad_row):
    pi = np.array([bad_row, *GOOD_PI[1:]])
    assert_rejects(ANTIPIGNISTIC, pi, name="possibility", rows=[0], suite=SUITE)


def test_constraint_options_rejected_naming_the_argument():
    # Issue 19: possibility_constraints(floor=-1.0) and (tie_tol=2.0) were accepted.
    def build(name):
        return lambda v: ops.possibility_constraints(GOOD_PI, **{name: v})

    assert_hparam_rejected(build("floor"), "floor", (-1.0, 0.0, 1.0, float("nan")), suite=SUITE)
    assert_hparam_rejected(build("tie_tol"), "tie_tol", (2.0, 1.0, -0.1, float("inf")), suite=SUITE)
    assert_hparam_rejected(build("eps_cap"), "eps_cap", (0.5, -1e-3), suite=SUITE)


class _NoneBatch(Modes):
    """:class:`Modes` whose graph and XLA programs are traced with a ``None`` batch dim
    (as Keras traces a dataset with a partial last batch); gradients as in :class:`Modes`
    (static shapes: tests/ops/test_possibilistic_tensorflow.py checks them at a None batch dim).
    TensorFlow only: JAX and PyTorch trace concrete shapes."""

    def __init__(self, fn, k):
        super().__init__(fn)
        self.k = k

    def compile(self, fn, mode):
        import tensorflow as tf

        spec = [tf.TensorSpec([None, self.k], tf.float64)] * 2
        return tf.function(fn, input_signature=spec, jit_compile=(mode == "xla"), autograph=False)


def _loss_and_projection(z, pi):
    """The loss and its projection ``p* = q - dloss/dz`` from one projection (one compiled
    program for both outputs, as Keras compiles a training step)."""
    import tensorflow as tf

    z = tf.convert_to_tensor(z)
    with tf.GradientTape() as tape:
        tape.watch(z)
        loss = ops.possibilistic_projection_loss(pi, z)
    return loss, tf.nn.softmax(z) - tape.gradient(loss, z)


BOTH_NONE = _NoneBatch(_loss_and_projection, K)
_NONE_BATCH = "a None batch dim exists only in TensorFlow's traced signatures"


@pytest.mark.tensorflow_only(reason=_NONE_BATCH)
@hypothesis.given(_valid_case())
@CONTRACT_SETTINGS
def test_none_batch_dim_agrees_with_eager(case):
    # Issue 19: a None batch dim raised TypeError in the cyclic-reduction solve.
    z, pi = case
    assert_modes_agree(BOTH_NONE, z, pi, atol=1e-10, suite=SUITE)
    # in every mode p* = q - gradient is the projection op's answer (the programs are cached)
    want = np.asarray(PROJ("eager", z, pi))
    for mode in MODES:
        p_star = np.asarray(BOTH_NONE(mode, z, pi)[1])
        ok = np.allclose(p_star, want, atol=1e-10, rtol=0)
        OUTCOMES[(SUITE, "valid", mode, "right" if ok else "wrong")] += 1
        np.testing.assert_allclose(
            p_star, want, atol=1e-10, rtol=0, err_msg=f"[{mode}] p* differs from the projection"
        )


@pytest.mark.tensorflow_only(reason=_NONE_BATCH)
def test_none_batch_dim_bad_input_rejected_or_nan():
    # The loss (first output) of test_none_batch_dim_agrees_with_eager's programs (cached).
    z = np.array([[np.inf, 0.0, -1.0, 0.5], *GOOD_Z[1:]])
    assert_rejects(BOTH_NONE, z, GOOD_PI, name="logits", rows=[0], suite=SUITE)
    pi = np.array([[np.nan, 1.0, 0.5, 0.2], *GOOD_PI[1:]])
    assert_rejects(BOTH_NONE, GOOD_Z, pi, name="labels", rows=[0], suite=SUITE)
