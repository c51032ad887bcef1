"""Fail-loud contract (issue 9) for the calibration heads, fit_calibrator, the metric functions
and the streaming metric classes, in every mode of the backend (tests/contract).

References: numpy (softmax of the unmasked classes, -log p[y], Brier) and the spec's ECE oracle.
"""

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
from scipy.special import softmax as np_softmax

from losszoo import calibration as C
from losszoo import heads
from tests.contract import (
    BAD_NUMBERS,
    CONTRACT_SETTINGS,
    OUTCOMES,
    Modes,
    assert_hparam_rejected,
    assert_modes_agree,
    assert_rejects,
    examples,
    numpy,
)
from tests.references import load_reference

REF = load_reference("bcsoftmax")
SUITE = "calibration"
N, K = 4, 5

# ------------------------------------------------------------------------------------------
# Heads
# ------------------------------------------------------------------------------------------


def _built(layer):
    layer.build((None, K))
    return layer


_HEADS = {
    "ts": _built(heads.TemperatureScaling(temperature=1.5)),
    "pb": _built(heads.ProbabilityBounding(init_lower=-1.0, init_upper=1.0)),
    "pb_lower": _built(heads.ProbabilityBounding(bounds="lower", init_lower=-1.0, method="sort")),
    "lb": _built(heads.LogitBounding(init_lower=-0.5, init_upper=0.0)),
    "bcs": _built(heads.BCSoftmax(lower=0.02, upper=0.6, method="bisect")),
}
_HEAD_RUNNERS = {k: Modes(v) for k, v in _HEADS.items()}


def test_logit_bounding_masked_class_gets_zero_and_the_rest_is_unchanged():
    # Issue 9: LogitBounding()([[1., -inf, .5]]) was all NaN.
    lb = heads.LogitBounding()
    x = np.array([[1.0, -np.inf, 0.5], [2.0, 0.0, -1.0]], np.float32)
    p = np.asarray(assert_modes_agree(Modes(lb), x, suite=SUITE))
    sub = numpy(heads.LogitBounding()(x[:1, [0, 2]]))
    assert p[0, 1] == 0.0
    np.testing.assert_allclose(p[0, [0, 2]], sub[0], atol=1e-6)
    # the LB-C bounds use the norm of the unmasked logits: by hand, c' = C' = 0, tau = 1.5
    norm = np.sqrt(1.0 + 0.25)
    c, cap = 0.0, norm * np.tanh(np.log(2.0))
    expected = np_softmax(np.clip([1.0, 0.5], c, cap) / 1.5)
    np.testing.assert_allclose(p[0, [0, 2]], expected, atol=1e-6)


@pytest.mark.parametrize("name", ["ts", "pb", "pb_lower", "lb", "bcs"])
def test_heads_mask_minus_inf_classes(name):
    rng = np.random.default_rng(0)
    x = rng.normal(0, 2, (N, K)).astype(np.float32)
    x[0, 1] = x[2, 4] = x[2, 0] = -np.inf
    p = np.asarray(assert_modes_agree(_HEAD_RUNNERS[name], x, grad_wrt=(0,), suite=SUITE))
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
    if name != "bcs":  # BCSoftmax's fixed lower bound 0.02 applies to masked classes too
        assert p[0, 1] == 0.0 and p[2, 4] == 0.0 and p[2, 0] == 0.0
    else:
        np.testing.assert_allclose([p[0, 1], p[2, 4], p[2, 0]], 0.02, atol=1e-7)
    if name == "ts":
        np.testing.assert_allclose(p, np_softmax(x / 1.5, -1), atol=1e-6)


@pytest.mark.parametrize("name", ["ts", "pb", "lb", "bcs"])
def test_heads_reject_bad_logits(name):
    x = np.random.default_rng(1).normal(0, 2, (N, K)).astype(np.float32)
    for value in (np.nan, np.inf):
        bad = x.copy()
        bad[1, 3] = value
        assert_rejects(_HEAD_RUNNERS[name], bad, name="logits", rows=[1], suite=SUITE)
    bad = x.copy()
    bad[3] = -np.inf
    assert_rejects(_HEAD_RUNNERS[name], bad, name="logits", rows=[3], suite=SUITE)


def test_head_hyper_parameters_rejected():
    bad = [*BAD_NUMBERS, 0.0, -1.0, "2"]
    for cls in (
        heads.TemperatureScaling,
        heads.ProbabilityBounding,
        heads.LogitBounding,
        heads.BCSoftmax,
    ):
        assert_hparam_rejected(
            lambda v, cls=cls: cls(temperature=v), "temperature", bad, suite=SUITE
        )
    for cls in (heads.ProbabilityBounding, heads.LogitBounding):
        for arg in ("init_lower", "init_upper"):
            assert_hparam_rejected(
                lambda v, cls=cls, arg=arg: cls(**{arg: v}), arg, [*BAD_NUMBERS, None], suite=SUITE
            )
        assert_hparam_rejected(
            lambda v, cls=cls: cls(bound_fn=v), "bound_fn", ["Linear", "", None], suite=SUITE
        )
    assert_hparam_rejected(
        lambda v: heads.ProbabilityBounding(bounds=v), "bounds", ["all", None], suite=SUITE
    )
    for cls in (heads.ProbabilityBounding, heads.BCSoftmax):
        assert_hparam_rejected(
            lambda v, cls=cls: cls(method=v), "method", ["Newton", None], suite=SUITE
        )
    assert_hparam_rejected(
        lambda v: heads.BCSoftmax(lower=v), "lower", [np.nan, -0.1, 1.5, [[0.1]]], suite=SUITE
    )
    assert_hparam_rejected(lambda v: heads.BCSoftmax(upper=v), "upper", [np.inf, "x"], suite=SUITE)
    assert_hparam_rejected(
        lambda v: heads.TemperatureScaling(fit_temperature=v),
        "fit_temperature",
        [1, "yes"],
        suite=SUITE,
    )


@hypothesis.settings(CONTRACT_SETTINGS, max_examples=examples(15))
@hypothesis.given(
    seed=st.integers(0, 2**31 - 1),
    name=st.sampled_from(["ts", "pb", "pb_lower", "lb", "bcs"]),
    scale=st.sampled_from([1.0, 1e4]),
    n_masked=st.integers(0, K - 1),
)
def test_heads_valid_random_inputs(seed, name, scale, n_masked):
    rng = np.random.default_rng(seed)
    x = (rng.normal(0, 3, (N, K)) * scale).astype(np.float32)
    if name == "bcs":  # upper 0.6 on two live classes is the least that stays feasible
        n_masked = min(n_masked, K - 2)
    for r in range(N):
        x[r, rng.choice(K, n_masked, replace=False)] = -np.inf
    ref = np_softmax(x.astype(np.float64) / 1.5, -1) if name == "ts" else None
    p = np.asarray(
        assert_modes_agree(_HEAD_RUNNERS[name], x, reference=ref, atol=1e-5, suite=SUITE)
    )
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
    if name != "bcs":
        assert np.all(p[np.isneginf(x)] == 0.0)


@CONTRACT_SETTINGS
@hypothesis.given(
    seed=st.integers(0, 2**31 - 1),
    name=st.sampled_from(["ts", "pb", "lb"]),
    row=st.integers(0, N - 1),
    col=st.integers(0, K - 1),
    kind=st.sampled_from(["nan", "inf", "masked_row"]),
)
def test_heads_invalid_random_inputs(seed, name, row, col, kind):
    x = np.random.default_rng(seed).normal(0, 3, (N, K)).astype(np.float32)
    if kind == "masked_row":
        x[row] = -np.inf
    else:
        x[row, col] = np.nan if kind == "nan" else np.inf
    assert_rejects(_HEAD_RUNNERS[name], x, name="logits", rows=[row], suite=SUITE)


# ------------------------------------------------------------------------------------------
# Metric functions (numpy, eager only)
# ------------------------------------------------------------------------------------------

_FUNCTIONS = {
    "ece": C.ece,
    "classwise_ece": C.classwise_ece,
    "adaptive_ece": C.adaptive_ece,
    "nll": C.nll,
    "brier_score": C.brier_score,
    "accuracy": C.accuracy,
}


def _raises_naming(fn, name, *args, **kwargs):
    with pytest.raises((ValueError, TypeError)) as info:
        fn(*args, **kwargs)
    assert f"`{name}`" in str(info.value), str(info.value)


def test_metric_functions_regressions():
    # Issue 9: ece([[.9, .1]], [5]) returned 0.9; nll(..., [-1]) read the last class.
    for fn in _FUNCTIONS.values():
        _raises_naming(fn, "labels", [[0.9, 0.1]], [5])
        _raises_naming(fn, "labels", [[0.9, 0.1]], [-1])
        _raises_naming(fn, "labels", [[0.9, 0.1]], [0.5])
        _raises_naming(fn, "labels", [[0.9, 0.1]], [np.nan])
        _raises_naming(fn, "labels", [[0.9, 0.1], [0.5, 0.5]], [[1, 1], [0, 1]])
        _raises_naming(fn, "labels", [[0.9, 0.1], [0.5, 0.5]], [0, 1, 1])
        _raises_naming(fn, "probs", [[0.9, np.nan]], [0])
        _raises_naming(fn, "probs", [[1.2, -0.2]], [0])
        _raises_naming(fn, "probs", [[2.0, 3.0]], [0])  # logits, not probabilities
        _raises_naming(fn, "probs", [0.9, 0.1], [0])
    for name in ("ece", "classwise_ece", "adaptive_ece"):
        for bad in (0, -3, 2.5, np.nan, "15", None):
            _raises_naming(_FUNCTIONS[name], "n_bins", [[0.9, 0.1]], [0], n_bins=bad)
    for bad in (0.0, -1.0, np.nan, 2.0):
        _raises_naming(C.nll, "eps", [[0.9, 0.1]], [0], eps=bad)


@hypothesis.settings(CONTRACT_SETTINGS, max_examples=40)
@hypothesis.given(
    seed=st.integers(0, 2**31 - 1), n=st.integers(1, 30), k=st.integers(1, 6), onehot=st.booleans()
)
def test_metric_functions_valid_random_inputs(seed, n, k, onehot):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(k) * 0.5, n)
    y = rng.integers(0, k, n)
    labels = np.eye(k, dtype=int)[y] if (onehot and k > 1) else y
    assert C.ece(p, labels) == pytest.approx(REF.ece_top_label(p, y), abs=1e-12)
    nll = -np.log(np.maximum(p[np.arange(n), y], 1e-12)).mean()
    assert C.nll(p, labels) == pytest.approx(nll, rel=1e-12)
    brier = ((p - np.eye(k)[y]) ** 2).sum(-1).mean()
    assert C.brier_score(p, labels) == pytest.approx(brier, rel=1e-12, abs=1e-15)
    assert C.accuracy(p, labels) == pytest.approx((p.argmax(-1) == y).mean())


def _corrupt(rng, p, y, kind):
    """Break one random row of probabilities ``p`` [N, K] / labels ``y`` [N] in place."""
    r = rng.integers(0, N)
    if kind == "label_high":
        y[r] = K + rng.integers(0, 3)
    elif kind == "label_neg":
        y[r] = -1 - rng.integers(0, 3)
    elif kind == "label_frac":
        y[r] = 0.5
    elif kind == "prob_nan":
        p[r, 0] = np.nan
    elif kind == "prob_neg":
        p[r, :2] = [-0.1, p[r, 1] + p[r, 0] + 0.1]
    else:
        p[r] *= 1.5


@hypothesis.settings(CONTRACT_SETTINGS, max_examples=40)
@hypothesis.given(
    seed=st.integers(0, 2**31 - 1),
    fn=st.sampled_from(sorted(_FUNCTIONS)),
    kind=st.sampled_from(
        ["label_high", "label_neg", "label_frac", "prob_nan", "prob_neg", "prob_sum"]
    ),
)
def test_metric_functions_invalid_random_inputs(seed, fn, kind):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(K), N)
    y = rng.integers(0, K, N).astype(np.float64)
    _corrupt(rng, p, y, kind)
    _raises_naming(_FUNCTIONS[fn], "labels" if kind.startswith("label") else "probs", p, y)
    OUTCOMES[(SUITE, "bad", "eager", "error")] += 1


# ------------------------------------------------------------------------------------------
# Streaming metric classes
# ------------------------------------------------------------------------------------------

_METRICS = {
    "ece": (C.ExpectedCalibrationError, {}, C.ece),
    "adaptive_ece": (C.AdaptiveECE, {"resolution": 100000}, C.adaptive_ece),
    "classwise_ece": (C.ClasswiseECE, {"num_classes": K}, C.classwise_ece),
    "nll": (C.NegativeLogLikelihood, {}, C.nll),
    "brier_score": (C.BrierScore, {}, C.brier_score),
    "accuracy": (C.Accuracy, {}, C.accuracy),
}


def _metric_runner(name):
    cls, kwargs, _ = _METRICS[name]
    metric = cls(**kwargs)

    def run(y_true, y_pred):
        metric.reset_state()
        metric.update_state(y_true, y_pred)
        return metric.result()

    return Modes(run)


_METRIC_RUNNERS = {name: _metric_runner(name) for name in _METRICS}


def test_streaming_metric_regressions_out_of_range_labels():
    p = np.array([[0.9, 0.1, 0, 0, 0], [0.2, 0.8, 0, 0, 0]], np.float32)
    for runner in _METRIC_RUNNERS.values():
        for labels in ([0, 5], [0, -1], [0.0, 1.5], [0.0, np.nan]):
            assert_rejects(runner, np.array(labels), p, name="y_true", rows=(), suite=SUITE)
        assert_rejects(
            runner,
            np.array([[1, 1, 0, 0, 0], [0, 1, 0, 0, 0]], np.float32),
            p,
            name="y_true",
            rows=(),
            suite=SUITE,
        )
        for bad in ([[0.9, 0.3, 0, 0, 0]], [[1.1, -0.1, 0, 0, 0]], [[np.nan, 1, 0, 0, 0]]):
            assert_rejects(
                runner,
                np.array([0]),
                np.array(bad, np.float32),
                name="y_pred",
                rows=(),
                suite=SUITE,
            )


def test_streaming_metric_hyper_parameters_rejected():
    for cls, kwargs in (
        (C.ExpectedCalibrationError, {}),
        (C.AdaptiveECE, {}),
        (C.ClasswiseECE, {"num_classes": 3}),
    ):
        assert_hparam_rejected(
            lambda v, cls=cls, kw=kwargs: cls(n_bins=v, **kw),
            "n_bins",
            [0, -1, 2.5, np.nan, "15", None],
            suite=SUITE,
        )
    assert_hparam_rejected(
        lambda v: C.ClasswiseECE(num_classes=v),
        "num_classes",
        [0, 2.5, "3"],  # None is valid since issue 19 item 14: inferred from y_pred
        suite=SUITE,
    )
    assert_hparam_rejected(
        lambda v: C.AdaptiveECE(n_bins=15, resolution=v), "resolution", [0, 10, 1.5], suite=SUITE
    )


@CONTRACT_SETTINGS
@hypothesis.given(
    seed=st.integers(0, 2**31 - 1), name=st.sampled_from(sorted(_METRICS)), onehot=st.booleans()
)
def test_streaming_metrics_valid_random_inputs(seed, name, onehot):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(K) * 0.7, N).astype(np.float32)
    y = rng.integers(0, K, N)
    labels = np.eye(K, dtype=np.float32)[y] if onehot else y.astype(np.int32)
    reference = _METRICS[name][2](p.astype(np.float64), y)
    assert_modes_agree(
        _METRIC_RUNNERS[name], labels, p, reference=reference, atol=2e-5, suite=SUITE
    )


@CONTRACT_SETTINGS
@hypothesis.given(
    seed=st.integers(0, 2**31 - 1),
    name=st.sampled_from(sorted(_METRICS)),
    kind=st.sampled_from(
        ["label_high", "label_neg", "label_frac", "prob_nan", "prob_neg", "prob_sum"]
    ),
)
def test_streaming_metrics_invalid_random_inputs(seed, name, kind):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(K), N).astype(np.float32)
    y = rng.integers(0, K, N).astype(np.float32)
    _corrupt(rng, p, y, kind)
    assert_rejects(
        _METRIC_RUNNERS[name],
        y,
        p,
        name="y_true" if kind.startswith("label") else "y_pred",
        rows=(),
        suite=SUITE,
    )


# ------------------------------------------------------------------------------------------
# fit_calibrator (host-side loop: eager checks before fitting)
# ------------------------------------------------------------------------------------------


def test_fit_calibrator_regressions():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, (16, 3)).astype(np.float32)
    y = rng.integers(0, 3, 16)
    nan_logits = logits.copy()
    nan_logits[3, 1] = np.nan
    _raises_naming(C.fit_calibrator, "model_or_logits", nan_logits, None, y, epochs=1)
    _raises_naming(
        C.fit_calibrator, "model_or_logits", np.full_like(logits, np.nan), None, y, epochs=1
    )
    for bad_y in (y + 3, np.where(y == 0, -1, y), y + 0.5, y[:-1], np.eye(3)[y]):
        _raises_naming(C.fit_calibrator, "y_val", logits, None, bad_y, epochs=1)
    feats = rng.normal(size=(16, 4)).astype(np.float32)
    feats[2, 2] = np.inf
    _raises_naming(C.fit_calibrator, "x_val", logits, feats, y, method="pb-l", epochs=1)
    for arg, values in (
        ("epochs", [0, 1.5, None]),
        ("batch_size", [0, -2, 2.5]),
        ("learning_rate", [0.0, np.nan, -1e-3]),
        ("epsilon", [0.0, np.inf]),
        ("method", ["dirichlet", None, "pb-x-y-z"]),
    ):
        for v in values:
            _raises_naming(C.fit_calibrator, arg, logits, None, y, **{arg: v})
    _raises_naming(
        C.fit_calibrator, "init_lower", logits, None, y, method="pb-c", init_lower=np.nan
    )


@hypothesis.settings(CONTRACT_SETTINGS, max_examples=10)
@hypothesis.given(
    seed=st.integers(0, 2**31 - 1),
    kind=st.sampled_from(["nan_logit", "inf_logit", "label_high", "label_neg", "label_frac"]),
    method=st.sampled_from(["ts", "pb-c", "lb-c"]),
)
def test_fit_calibrator_invalid_random_inputs(seed, kind, method):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2, (12, 4)).astype(np.float32)
    y = rng.integers(0, 4, 12).astype(np.float64)
    r, c = rng.integers(0, 12), rng.integers(0, 4)
    if kind == "nan_logit":
        logits[r, c] = np.nan
    elif kind == "inf_logit":
        logits[r, c] = np.inf
    elif kind == "label_high":
        y[r] = 4
    elif kind == "label_neg":
        y[r] = -1
    else:
        y[r] = 1.5
    _raises_naming(
        C.fit_calibrator,
        "model_or_logits" if "logit" in kind else "y_val",
        logits,
        None,
        y,
        method=method,
        epochs=1,
    )


# ------------------------------------------------------------------------------------------
# Issue 19: extreme scales, rank-0 logits, models ending in a softmax
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [1e30, -1e30, 1e-30])
def test_logit_bounding_at_scales_of_1e30_matches_numpy(scale):
    # Issue 19 item 4: all NaN at 1e30 (the squared norm overflowed in float32).
    x = (np.random.default_rng(11).normal(0, 3, (N, K)) * scale).astype(np.float32)
    x[0, 1] = -np.inf  # a masked class too
    x64 = x.astype(np.float64)
    live = np.where(np.isfinite(x64), x64, 0.0)
    norm = np.sqrt(np.sum(live**2, -1, keepdims=True))
    lo, hi = norm * np.tanh(-0.5), norm * np.tanh(-0.5 + np.log1p(np.exp(0.0)))
    clipped = np.where(np.isneginf(x64), -np.inf, np.clip(x64, lo, hi))
    assert_modes_agree(
        _HEAD_RUNNERS["lb"], x, reference=np_softmax(clipped / 1.5, -1), atol=1e-6, suite=SUITE
    )


@pytest.mark.parametrize("name", sorted(_HEADS))
def test_heads_reject_rank_0_logits(name):
    # Issue 19 item 7: IndexError / TF-internal errors before.
    assert_rejects(_HEAD_RUNNERS[name], np.float32(2.0), name="logits", rows=(), suite=SUITE)


def test_fit_calibrator_softmax_model_regressions():
    # Issue 19 item 8: a softmax model's probabilities were calibrated as logits. Keras'
    # softmax carries its logits (used); a softmax without them is rejected (next test).
    import keras

    rng = np.random.default_rng(12)
    x = rng.normal(0, 3, (64, K)).astype(np.float32)
    y = rng.integers(0, K, 64)
    soft = keras.Sequential([keras.Input((K,)), keras.layers.Dense(K, activation="softmax")])
    soft.set_weights([np.eye(K, dtype=np.float32), np.zeros(K, np.float32)])
    model = C.fit_calibrator(soft, x, y, "ts", epochs=2)
    want = keras.ops.convert_to_numpy(C.fit_calibrator(x, None, y, "ts", epochs=2).layers[-1].tau())
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model.layers[-1].tau()), want, rtol=1e-6)
    OUTCOMES[(SUITE, "valid", "eager", "right")] += 1


@pytest.mark.tensorflow_only(
    reason="a softmax op without attached logits is recognised by its graph op type, which "
    "only TensorFlow's tensors carry"
)
def test_fit_calibrator_rejects_a_softmax_without_logits():
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(12)
    x = rng.normal(0, 3, (64, K)).astype(np.float32)
    y = rng.integers(0, K, 64)
    lam = keras.Sequential(
        [keras.Input((K,)), keras.layers.Dense(K), keras.layers.Lambda(tf.nn.softmax)]
    )
    _raises_naming(C.fit_calibrator, "model_or_logits", lam, x, y, epochs=1)
    OUTCOMES[(SUITE, "bad", "eager", "error")] += 1
