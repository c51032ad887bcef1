"""Fail-loud contract (issue 9) for ``ops.bcsoftmax``: every method, in every mode of the
backend (tests/contract: TensorFlow eager / graph / XLA, JAX eager / jit, PyTorch eager).

References: the spec's float64 numpy oracle (``shared/specs/bcsoftmax_reference.py``) run on
the same float32 inputs the kernel sees.
"""

import hypothesis
import hypothesis.strategies as st
import keras
import numpy as np
import pytest

import losszoo
from losszoo.ops._bcsoftmax import METHODS, bcsoftmax
from tests.contract import (
    COMPILED_MODES,
    CONTRACT_SETTINGS,
    LAST_MODE,
    Modes,
    assert_hparam_rejected,
    assert_modes_agree,
    assert_rejects,
    examples,
)
from tests.references import load_reference

REF = load_reference("bcsoftmax")
SUITE = "bcsoftmax"
N, K = 3, 4

_RUNNERS = {m: Modes(lambda x, a, b, m=m: bcsoftmax(x, a, b, method=m)) for m in METHODS}


def _oracle(x, a, b):
    return REF.bcsoftmax(
        np.asarray(x, np.float64), np.asarray(a, np.float64), np.asarray(b, np.float64)
    )[0]


def _problem(seed, k=K, n=N):
    x, a, b = REF.random_problem(np.random.RandomState(seed), n, k)
    b = np.minimum(b, 1.0)
    return x.astype(np.float32), a.astype(np.float32), b.astype(np.float32)


# ------------------------------------------------------------------------------------------
# Regression tests: the cases listed in issue 9.
# ------------------------------------------------------------------------------------------


# CI time (issue 32): the regression tests below use the [N, K] = [3, 4] float32 inputs of the
# property tests (rows added where a case has fewer), so they reuse the compiled programs of
# `_RUNNERS` (one per method, mode and input signature) instead of compiling their own.


@pytest.mark.parametrize("method", METHODS)
def test_logit_gaps_of_1e8_are_exact(method):
    # Issue 9: "sort" and "bisect" returned rows summing to 0.66 / 0.8 at gaps of 1e8.
    x = np.array([[1e8, 0.0, -1e8, 2e8], [0.0, 1e8, 3e8, -1e8], [-2e8, 3e8, 1e8, 0.0]], np.float32)
    a = np.array([[0.1] * 4, [0.0] * 4, [0.05] * 4], np.float32)
    b = np.array([[0.5] * 4, [0.5, 0.4, 0.3, 0.5], [0.6] * 4], np.float32)
    y = assert_modes_agree(
        _RUNNERS[method], x, a, b, reference=_oracle(x, a, b), atol=1e-6, suite=SUITE
    )
    np.testing.assert_allclose(np.asarray(y).sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(y[0], [0.3, 0.1, 0.1, 0.5], atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_every_coordinate_at_a_bound_gradients_agree_across_modes(method):
    # Issue 9: with sum(lower) = 1 in float32 (every coordinate at its lower bound), eager saw a
    # free coordinate of mass ~1e-8 and used its one-sided derivative, XLA saw none. Rounding-
    # level free mass now counts as none in every mode: dL/da = v, dL/dx = 0 (spec section 3).
    # (The third row sums to 1 exactly.)
    x = np.array([[0.3, 1.0, -2.0, 0.5], [2.0, 0.0, -1.0, 1.0], [1.0, -1.0, 0.0, 2.5]], np.float32)
    a = np.array(
        [
            [0.1, 0.2, 0.3, 0.4],
            [0.3355677, 0.27543208, 0.04027072, 0.3487295],
            [0.25, 0.25, 0.25, 0.25],
        ],
        np.float32,
    )
    b = np.ones_like(a)
    runner = _RUNNERS[method]
    out, (gx, ga, gb) = runner.with_gradient("eager", [x, a, b], wrt=(0, 1, 2))
    np.testing.assert_allclose(out, a, atol=1e-6)
    w = 1.0 + 0.5 * np.sin(np.arange(x.size)).reshape(x.shape)  # the harness' weighting
    np.testing.assert_allclose(ga, w, atol=1e-5)
    np.testing.assert_allclose(gx, 0.0, atol=1e-6)
    np.testing.assert_allclose(gb, 0.0, atol=1e-6)
    assert_modes_agree(runner, x, a, b, grad_wrt=(0, 1, 2), suite=SUITE)
    # the same with every coordinate at its upper bound (sum(upper) = 1)
    assert_modes_agree(runner, x, np.zeros_like(a), a, grad_wrt=(0, 1, 2), suite=SUITE)


@pytest.mark.parametrize("method", METHODS)
def test_bad_logits_raise_or_give_nan_rows(method):
    x, a, b = _problem(1)
    for value in (np.nan, np.inf):
        bad = x.copy()
        bad[1, 2] = value
        assert_rejects(_RUNNERS[method], bad, a, b, name="logits", rows=[1], suite=SUITE)
    masked_row = x.copy()
    masked_row[2] = -np.inf
    assert_rejects(_RUNNERS[method], masked_row, a, b, name="logits", rows=[2], suite=SUITE)


@pytest.mark.parametrize("method", METHODS)
def test_infeasible_bounds_raise_or_give_nan_rows(method):
    x, a, b = _problem(2)
    cases = []
    hi_a = a.copy()
    hi_a[0] = 0.4  # sum(lower) = 1.6 > 1
    cases.append((hi_a, np.maximum(b, hi_a), "lower", [0]))
    lo_b = b.copy()
    lo_b[1] = 0.2  # sum(upper) = 0.8 < 1
    cases.append((np.minimum(a, lo_b), lo_b, "upper", [1]))
    crossed, lo_c = b.copy(), a.copy()
    crossed[2] = 1.0
    crossed[2, 0], lo_c[2, 0] = 0.01, 0.05  # lower > upper, the sums stay feasible
    cases.append((lo_c, crossed, "lower", [2]))
    neg = a.copy()
    neg[0, 1] = -0.5
    cases.append((neg, b, "lower", [0]))
    big = b.copy()
    big[1, 3] = 1.5
    cases.append((a, big, "upper", [1]))
    nan_b = b.copy()
    nan_b[2, 1] = np.nan
    cases.append((a, nan_b, "upper", [2]))
    for lo, up, name, rows in cases:
        assert_rejects(_RUNNERS[method], x, lo, up, name=name, rows=rows, suite=SUITE)


@pytest.mark.parametrize("method", METHODS)
def test_bad_temperature(method):
    x, _, b = _problem(3)
    runner = Modes(lambda x, t: bcsoftmax(x, None, b, t, method=method))
    for t in (0.0, -1.0, np.nan, np.inf):
        assert_rejects(runner, x, np.float32(t), name="temperature", rows=None, suite=SUITE)


def test_minus_inf_masks_a_class():
    # A -inf logit gets the least probability the box allows, max(lower_k, 0): 0 without a
    # lower bound, and the other classes are BCSoftmax on the unmasked ones.
    x = np.array(
        [[1.0, -np.inf, 0.5, -1.0], [-np.inf, 2.0, -np.inf, 0.0], [0.3, 0.2, 0.1, -np.inf]],
        np.float32,
    )
    b = np.array([[0.5] * 4, [0.7] * 4, [0.5] * 4], np.float32)
    a = np.array([[0.0, 0.05, 0.0, 0.1], [0.05, 0.0, 0.1, 0.0], [0.0, 0.0, 0.05, 0.2]], np.float32)
    masked = np.isinf(x)
    for method in METHODS:
        y = np.asarray(assert_modes_agree(_RUNNERS[method], x, np.zeros_like(b), b, suite=SUITE))
        for row, keep in enumerate(~masked):
            rest = _oracle(x[row : row + 1, keep], 0.0, b[row : row + 1, keep])
            np.testing.assert_allclose(y[row, keep], rest[0], atol=1e-6, err_msg=f"row {row}")
        assert (y[masked] == 0.0).all()
        y = np.asarray(_RUNNERS[method](LAST_MODE, x, a, b))
        np.testing.assert_allclose(y, _oracle(np.where(masked, -1e4, x), a, b), atol=1e-6)
        np.testing.assert_array_equal(y[masked], a[masked])


def test_global_validation_switch():
    x, a, b = _problem(4)
    bad_a = a.copy()
    bad_a[0] = 0.5
    with pytest.raises(ValueError, match="`lower`"):
        bcsoftmax(x, bad_a, np.maximum(b, bad_a))
    for ctx in (losszoo.validation(False),):
        with ctx:
            y = keras.ops.convert_to_numpy(bcsoftmax(x, bad_a, np.maximum(b, bad_a)))
        assert np.isnan(y[0]).all() and np.isfinite(y[1:]).all()
    # issue 20 item 1: the global switch is the only one (no `validate=` argument)
    with pytest.raises(TypeError, match="validate"):
        bcsoftmax(x, bad_a, np.maximum(b, bad_a), validate=False)
    # traced with validation off: no assertion in the graph, NaN rows instead
    for mode in COMPILED_MODES:
        with losszoo.validation(False):
            y = np.asarray(Modes(bcsoftmax)(mode, x, bad_a, np.maximum(b, bad_a)))
        assert np.isnan(y[0]).all() and np.isfinite(y[1:]).all(), mode


def test_hyper_parameters_rejected():
    x, a, b = _problem(5)
    assert_hparam_rejected(
        lambda m: bcsoftmax(x, a, b, method=m), "method", ["Newton", "", None, "exact"], suite=SUITE
    )
    assert_hparam_rejected(lambda c: bcsoftmax(x, a, b, clip=c), "clip", [0, None], suite=SUITE)


@pytest.mark.parametrize("method", METHODS)
def test_k1_ties_and_half_precision(method):
    runner = _RUNNERS[method]
    one = np.array([[3.0], [-2.0], [0.0]], np.float32)
    y = assert_modes_agree(runner, one, np.zeros_like(one), np.ones_like(one), suite=SUITE)
    np.testing.assert_array_equal(y, 1.0)
    ties = np.zeros((N, K), np.float32)
    a = np.full((N, K), 0.1, np.float32)
    b = np.array([[0.4, 0.4, 0.4, 0.1]] * N, np.float32)
    assert_modes_agree(
        runner,
        ties,
        a,
        b,
        reference=_oracle(ties, a, b),
        atol=1e-6,
        grad_wrt=(0, 1, 2),
        suite=SUITE,
    )
    x, a, b = _problem(6)
    y16 = bcsoftmax(x.astype(np.float16), a, b, method=method)
    assert keras.backend.standardize_dtype(y16.dtype) == "float16"
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(y16).astype(np.float64),
        _oracle(x.astype(np.float16), a, b),
        atol=2e-3,
    )


# ------------------------------------------------------------------------------------------
# Property tests.
# ------------------------------------------------------------------------------------------


@hypothesis.settings(CONTRACT_SETTINGS, max_examples=examples(15))
@hypothesis.given(
    seed=st.integers(0, 2**31 - 1),
    method=st.sampled_from(METHODS),
    transform=st.sampled_from(["none", "shift", "scale", "both"]),
)
def test_valid_inputs_match_the_oracle_in_every_mode(seed, method, transform):
    x, a, b = _problem(seed)
    if transform in ("scale", "both"):
        x = (x * np.float32(1e8)).astype(np.float32)
    if transform in ("shift", "both"):
        x = (x + np.float32(1e8)).astype(np.float32)
    # the oracle sees exactly the float32 logits the kernel sees, shifted in float64
    ref = _oracle(x.astype(np.float64) - x.astype(np.float64).max(-1, keepdims=True), a, b)
    y = assert_modes_agree(_RUNNERS[method], x, a, b, reference=ref, atol=2e-6, suite=SUITE)
    np.testing.assert_allclose(np.asarray(y).sum(-1), 1.0, atol=1e-5)


@hypothesis.settings(CONTRACT_SETTINGS, max_examples=examples(6))
@hypothesis.given(
    seed=st.integers(0, 2**31 - 1),
    method=st.sampled_from(METHODS),
    pin=st.sampled_from(["none", "lower", "upper", "equal"]),
)
def test_gradients_agree_in_every_mode_also_when_pinned(seed, method, pin):
    x, a, b = _problem(seed)
    if pin == "lower":
        a = (a / a.sum(-1, keepdims=True)).astype(np.float32)
        b = np.ones_like(a)
    elif pin == "upper":
        b = (b / b.sum(-1, keepdims=True)).astype(np.float32)
        a = np.zeros_like(b)
    elif pin == "equal":
        a = b = (a / a.sum(-1, keepdims=True)).astype(np.float32)
    assert_modes_agree(_RUNNERS[method], x, a, b, grad_wrt=(0, 1, 2), atol=1e-5, suite=SUITE)


@CONTRACT_SETTINGS
@hypothesis.given(
    seed=st.integers(0, 2**31 - 1),
    method=st.sampled_from(METHODS),
    row=st.integers(0, N - 1),
    col=st.integers(0, K - 1),
    kind=st.sampled_from(
        [
            "nan_logit",
            "inf_logit",
            "masked_row",
            "nan_lower",
            "neg_lower",
            "lower_sum",
            "upper_sum",
            "crossed",
            "upper_gt_1",
        ]
    ),
)
def test_invalid_inputs_raise_or_give_nan_rows(seed, method, row, col, kind):
    x, a, b = _problem(seed)
    a, b = a.copy(), b.copy()
    name = {
        "nan_logit": "logits",
        "inf_logit": "logits",
        "masked_row": "logits",
        "nan_lower": "lower",
        "neg_lower": "lower",
        "lower_sum": "lower",
        "upper_sum": "upper",
        "crossed": "lower",
        "upper_gt_1": "upper",
    }[kind]
    if kind == "nan_logit":
        x[row, col] = np.nan
    elif kind == "inf_logit":
        x[row, col] = np.inf
    elif kind == "masked_row":
        x[row] = -np.inf
    elif kind == "nan_lower":
        a[row, col] = np.nan
    elif kind == "neg_lower":
        a[row, col] = -0.1
    elif kind == "lower_sum":
        a[row] = 0.3
        b[row] = 0.5
    elif kind == "upper_sum":
        b[row] = 0.2
        a[row] = 0.0
    elif kind == "crossed":
        a[row] = 0.0
        b[row] = 1.0
        a[row, col] = 0.2
        b[row, col] = 0.1
    else:
        b[row, col] = 1.2
    assert_rejects(_RUNNERS[method], x, a, b, name=name, rows=[row], suite=SUITE)


@pytest.mark.parametrize(
    "name, shape", [("lower", (2,)), ("upper", (2, K)), ("lower", (1, N, K)), ("upper", (N + 1, 1))]
)
def test_bounds_of_a_wrong_shape_are_rejected_naming_them(name, shape):
    # Issue 19 item 10: numpy's / TF's broadcast errors before, naming no argument.
    x, a, b = _problem(5)
    bounds = {"lower": a, "upper": b}
    bounds[name] = np.full(shape, 0.1 if name == "lower" else 0.9, np.float32)
    runner = Modes(lambda x, a, b: bcsoftmax(x, a, b))
    assert_rejects(runner, x, bounds["lower"], bounds["upper"], name=name, rows=(), suite=SUITE)


_UPPER_ONLY = Modes(lambda x, b: bcsoftmax(x, upper=b))


def test_negative_upper_without_lower_is_rejected_and_tolerance_clamps():
    # Without `lower` (a = 0), an upper bound below 0 was taken as it was: the row came back
    # with a negative "probability" (-0.1). Now it breaks PROBABILITY_BOUNDS and names `upper`.
    x = np.array([[0.5, 1.0, -0.3], [0.0, 0.2, 0.1]], np.float32)
    b = np.array([[-0.1, 0.6, 0.6], [0.5, 0.5, 0.5]], np.float32)
    assert_rejects(_UPPER_ONLY, x, b, name="upper", rows=[0], suite=SUITE)
    # within BOUND_RANGE_TOL of 0 the entry is clamped to 0, like an upper bound above 1 to 1
    b[0, 0] = -1e-6
    zero = b.copy()
    zero[0, 0] = 0.0
    expected = _oracle(x, np.zeros_like(x), zero)
    y = assert_modes_agree(_UPPER_ONLY, x, b, reference=expected, atol=1e-6, suite=SUITE)
    assert y[0, 0] == 0.0
