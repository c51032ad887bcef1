"""Fail-loud contract (issue 9) for the safe-KL DRO area: every DRO op, the four DRO losses
and the ExactKLDRORisk metric, in every mode of the backend (tests/contract), with random
valid inputs (against the spec's float64 oracle) and random invalid ones (NaN / Inf / negative
sample weights, non-finite alpha, NaN losses, bad hyper-parameters).

Shapes are fixed per test (8 losses) so that each function compiles once under XLA.
"""

import math

import hypothesis
import hypothesis.strategies as st
import keras
import numpy as np
import pytest
from hypothesis.extra import numpy as hnp

from losszoo import ops
from losszoo.losses import CVaRLoss, KLDROBatchLSE, KLDROSumExp, SafeKLDRORisk
from losszoo.metrics import ExactKLDRORisk
from tests.contract import (
    BACKEND,
    BAD_NUMBERS,
    CONTRACT_SETTINGS,
    MODES,
    NAN_MODES,
    OUTCOMES,
    Modes,
    assert_hparam_rejected,
    assert_modes_agree,
    assert_rejects,
    examples,
)
from tests.references import load_reference

R = load_reference("safe_kl_dro")
# fewer examples than the shared default: 20 parametrised tests x 3 modes must stay ~2 min
SETTINGS = hypothesis.settings(CONTRACT_SETTINGS, max_examples=8)
# gradient checks retrace per example in the harness: fewer still
GRAD_SETTINGS = hypothesis.settings(CONTRACT_SETTINGS, max_examples=examples(5))
# valid inputs without gradients (fewer on JAX, see tests.contract.examples)
VALID_SETTINGS = hypothesis.settings(CONTRACT_SETTINGS, max_examples=examples(8))
N = 8
LAM, RHO = 0.7, 0.2

losses_st = hnp.arrays(np.float64, N, elements=st.floats(-30, 30, allow_nan=False))
weights_st = hnp.arrays(np.float64, N, elements=st.floats(0.0, 3.0)).filter(
    lambda s: s.sum() > 1e-3
)
# one invalid weight somewhere: NaN, +-Inf or negative
bad_weight_st = st.tuples(
    st.integers(0, N - 1), st.sampled_from([np.nan, np.inf, -np.inf, -1.0, -1e-3])
)


def _pi(s):
    return s / s.sum()


def _ref_cvar(l, s, rho):
    """Rockafellar-Uryasev with weights (minimum at a data point), brute force."""
    p = _pi(s)
    return min(a + np.sum(p * np.maximum(l - a, 0.0)) / rho for a in l[s > 0])


def _ref_lse(l, s, lam):
    p = _pi(s)
    live = p > 0
    m = np.max(l[live] / lam)
    return lam * (m + math.log(np.sum(p[live] * np.exp(l[live] / lam - m))))


def _ref_sumexp(l, s, lam):
    return float(np.sum(_pi(s) * np.exp(l / lam)))


# ----------------------------------------------------------------------------- ops
OPS = {
    "safe_kl_dro_risk": (
        Modes(lambda l, a, s: ops.safe_kl_dro_risk(l, a, LAM, RHO, s)),
        lambda l, a, s: R.safe_risk(l, a, LAM, RHO, _pi(s))[0],
    ),
    "kl_dro_batch_lse": (
        Modes(lambda l, a, s: ops.kl_dro_batch_lse(l, LAM, s)),
        lambda l, a, s: _ref_lse(l, s, LAM),
    ),
    "kl_dro_sumexp": (
        Modes(lambda l, a, s: ops.kl_dro_sumexp(l / 10.0, LAM, s)),
        lambda l, a, s: _ref_sumexp(l / 10.0, s, LAM),
    ),
    "cvar_risk": (
        Modes(lambda l, a, s: ops.cvar_risk(l, RHO, s)),
        lambda l, a, s: _ref_cvar(l, s, RHO),
    ),
    "safe_kl_dro_solve_alpha": (
        Modes(lambda l, a, s: ops.safe_kl_dro_solve_alpha(l, LAM, RHO, s, iterations=100)),
        lambda l, a, s: R.solve_alpha(l, LAM, RHO, _pi(s)),
    ),
    "kl_dro_exact": (
        Modes(
            lambda l, a, s: ops.kl_dro_exact_state_result(
                *ops.kl_dro_exact_state_update(
                    keras.ops.convert_to_tensor(-np.inf, "float64"),
                    keras.ops.convert_to_tensor(0.0, "float64"),
                    keras.ops.convert_to_tensor(0.0, "float64"),
                    l,
                    LAM,
                    s,
                ),
                LAM,
            )
        ),
        lambda l, a, s: R.exact_risk(l, LAM, _pi(s)),
    ),
}
# which ops are differentiable in the losses (solve_alpha and the streaming state are not)
GRAD = {
    "safe_kl_dro_risk": (0, 1),
    "kl_dro_batch_lse": (0,),
    "kl_dro_sumexp": (0,),
    "cvar_risk": (0,),
}


@pytest.mark.parametrize("name", sorted(OPS))
@GRAD_SETTINGS
@hypothesis.given(l=losses_st, s=weights_st, alpha=st.floats(-30, 30))
def test_ops_valid_inputs_agree_with_oracle_in_all_modes(name, l, s, alpha):
    runner, ref = OPS[name]
    # cvar: ties at the quantile make the (sub)gradient depend on the sort; values only
    grad = GRAD.get(name) if name != "cvar_risk" or len(set(l.tolist())) == N else None
    assert_modes_agree(
        runner,
        l,
        np.float64(alpha),
        s,
        reference=ref(l, alpha, s),
        atol=1e-7,
        rtol=1e-7,
        grad_wrt=grad,
        suite=f"dro.{name}",
    )


@pytest.mark.parametrize("name", sorted(OPS))
@SETTINGS
@hypothesis.given(l=losses_st, s=weights_st, bad=bad_weight_st)
def test_ops_reject_invalid_sample_weights(name, l, s, bad):
    """NaN / Inf / negative weight: eager and graph raise naming `sample_weight`; XLA NaN
    (before: a NaN weight was dropped, all-NaN weights gave risk 0)."""
    s = s.copy()
    s[bad[0]] = bad[1]
    runner, _ = OPS[name]
    assert_rejects(
        runner, l, np.float64(0.5), s, name="sample_weight", rows=(), suite=f"dro.{name}"
    )


@pytest.mark.parametrize(
    "name",
    [
        "safe_kl_dro_risk",
        "kl_dro_batch_lse",
        "kl_dro_sumexp",
        "cvar_risk",
        "safe_kl_dro_solve_alpha",
        "kl_dro_exact",
    ],
)
@SETTINGS
@hypothesis.given(l=losses_st, s=weights_st, i=st.integers(0, N - 1))
def test_ops_nan_loss_with_positive_weight_gives_nan(name, l, s, i):
    """NaN in -> NaN out in every mode (before: cvar_risk dropped NaN losses)."""
    l, s = l.copy(), s.copy()
    l[i], s[i] = np.nan, max(s[i], 0.5)
    runner, _ = OPS[name]
    for mode in MODES:
        out = np.asarray(runner(mode, l, np.float64(0.5), s))
        assert np.isnan(out), (mode, out)


ALPHA_RUNNERS = [
    Modes(lambda l, a, s: ops.safe_kl_dro_risk(l, a, LAM, RHO, s)),
    Modes(lambda l, a, s: ops.safe_kl_dro_risk(l, a, LAM, RHO)),
    Modes(lambda l, a, s: ops.safe_kl_dro_weights(l, a, LAM, RHO)),
]


@SETTINGS
@hypothesis.given(l=losses_st, s=weights_st, alpha=st.sampled_from([np.nan, np.inf, -np.inf]))
def test_safe_kl_rejects_non_finite_alpha(l, s, alpha):
    for runner in ALPHA_RUNNERS:
        assert_rejects(runner, l, np.float64(alpha), s, name="alpha", rows=(), suite="dro.alpha")


@VALID_SETTINGS
@hypothesis.given(
    l=losses_st, s=weights_st, c=st.sampled_from([1e8, -1e8, 1e4]), alpha=st.floats(-30, 30)
)
def test_ops_are_shift_equivariant_at_float_extremes(l, s, c, alpha):
    """Offsets of 1e8 (float64) shift every risk and alpha* by exactly c, up to rounding."""
    tol = 4 * abs(c) * np.finfo(np.float64).eps + 1e-8
    shifted = l + c
    pairs = [
        (
            ops.safe_kl_dro_risk(shifted, alpha + c, LAM, RHO, s),
            ops.safe_kl_dro_risk(l, alpha, LAM, RHO, s),
        ),
        (ops.kl_dro_batch_lse(shifted, LAM, s), ops.kl_dro_batch_lse(l, LAM, s)),
        (ops.cvar_risk(shifted, RHO, s), ops.cvar_risk(l, RHO, s)),
        (
            ops.safe_kl_dro_solve_alpha(shifted, LAM, RHO, s, iterations=200),
            ops.safe_kl_dro_solve_alpha(l, LAM, RHO, s, iterations=200),
        ),
    ]
    for a, b in pairs:
        np.testing.assert_allclose(float(a) - c, float(b), atol=tol + 1e-9 * abs(float(b)))


@VALID_SETTINGS
@hypothesis.given(l=losses_st, s=weights_st, k=st.sampled_from([1e-6, 1e6, 1e8]))
def test_ops_are_scale_equivariant(l, s, k):
    """(losses, lam, alpha) * k -> risk * k (float64)."""
    for a, b in (
        (
            ops.safe_kl_dro_risk(l * k, 1.5 * k, LAM * k, RHO, s),
            ops.safe_kl_dro_risk(l, 1.5, LAM, RHO, s),
        ),
        (ops.kl_dro_batch_lse(l * k, LAM * k, s), ops.kl_dro_batch_lse(l, LAM, s)),
        (ops.cvar_risk(l * k, RHO, s), ops.cvar_risk(l, RHO, s)),
    ):
        np.testing.assert_allclose(float(a) / k, float(b), rtol=1e-9, atol=1e-9)


def test_ops_bad_hyperparameters_are_rejected_naming_them():
    l = np.arange(4.0)
    for value_set, name, build in (
        ((0.0, -1.0, *BAD_NUMBERS, "1", None, True), "lam", lambda v: ops.kl_dro_batch_lse(l, v)),
        ((0.0, 1.0, 1.5, -0.1, *BAD_NUMBERS, "0.1"), "rho", lambda v: ops.cvar_risk(l, v)),
        (
            (0, -3, 2.5, float("nan"), "80", None),
            "iterations",
            lambda v: ops.safe_kl_dro_solve_alpha(l, 1.0, 0.1, iterations=v),
        ),
        (
            ("yes", 1, None),
            "calibrate",
            lambda v: ops.safe_kl_dro_risk(l, 0.0, 1.0, 0.1, calibrate=v),
        ),
    ):
        assert_hparam_rejected(build, name, value_set, suite="dro.hparams")
    with pytest.raises(TypeError, match="`lam`"):
        ops.kl_dro_sumexp(l, keras.ops.convert_to_tensor(1.0))


# ----------------------------------------------------------------------------- losses, metric
def _loss_runner(loss):
    def fn(y_true, y_pred, s):
        return loss(y_true, y_pred, sample_weight=s)

    return Modes(fn)


def _mse(y, p):
    return (y - p) ** 2


LOSSES = {
    "safe_kl_dro": (
        lambda: SafeKLDRORisk(
            "mse", lam=LAM, rho=RHO, alpha_init=1.0, init_alpha_from_batch=False, update_alpha=False
        ),
        lambda l, s: R.safe_risk(l, 1.0, LAM, RHO, _pi(s))[0],
    ),
    "kl_dro_batch_lse": (lambda: KLDROBatchLSE("mse", lam=LAM), lambda l, s: _ref_lse(l, s, LAM)),
    "kl_dro_sumexp": (lambda: KLDROSumExp("mse", lam=50.0), lambda l, s: _ref_sumexp(l, s, 50.0)),
    "cvar": (lambda: CVaRLoss("mse", rho=RHO), lambda l, s: _ref_cvar(l, s, RHO)),
}
_RUNNERS = {}


def _runner(name):
    if name not in _RUNNERS:
        _RUNNERS[name] = _loss_runner(LOSSES[name][0]())
    return _RUNNERS[name]


preds_st = hnp.arrays(np.float32, (N, 1), elements=st.floats(-5, 5, width=32))


@pytest.mark.parametrize("name", sorted(LOSSES))
@GRAD_SETTINGS
@hypothesis.given(p=preds_st, s=weights_st)
def test_losses_valid_inputs_agree_with_oracle(name, p, s):
    y = np.linspace(-2, 2, N, dtype=np.float32)[:, None]
    s = s.astype(np.float32)
    l = _mse(y[:, 0].astype(np.float64), p[:, 0].astype(np.float64))
    grad = (1,) if name != "cvar" or len(set(l.tolist())) == N else None
    assert_modes_agree(
        _runner(name),
        y,
        p,
        s,
        reference=LOSSES[name][1](l, s.astype(float)),
        atol=2e-4,
        rtol=2e-5,
        grad_wrt=grad,
        suite=f"dro.loss.{name}",
    )


@pytest.mark.parametrize("name", sorted(LOSSES))
@SETTINGS
@hypothesis.given(p=preds_st, s=weights_st, bad=bad_weight_st)
def test_losses_reject_invalid_sample_weights(name, p, s, bad):
    y = np.zeros((N, 1), np.float32)
    s = s.astype(np.float32)
    s[bad[0]] = bad[1]
    assert_rejects(_runner(name), y, p, s, name="sample_weight", rows=(), suite=f"dro.loss.{name}")


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_losses_nan_prediction_gives_nan_in_every_mode(name):
    y = np.zeros((N, 1), np.float32)
    p = np.linspace(-1, 1, N, dtype=np.float32)[:, None]
    p[3] = np.nan
    s = np.ones(N, np.float32)
    for mode in MODES:
        assert np.isnan(np.asarray(_runner(name)(mode, y, p, s))), mode


def test_losses_bad_hyperparameters_are_rejected_naming_them():
    for name, values, build in (
        ("lam", (0.0, *BAD_NUMBERS, "2"), lambda v: KLDROBatchLSE("mse", lam=v)),
        ("lam", (-1.0, *BAD_NUMBERS), lambda v: KLDROSumExp("mse", lam=v)),
        ("rho", (0.0, 1.0, *BAD_NUMBERS), lambda v: CVaRLoss("mse", rho=v)),
        ("rho", (1.2, *BAD_NUMBERS), lambda v: SafeKLDRORisk("mse", rho=v)),
        ("alpha_init", (*BAD_NUMBERS, "0", None), lambda v: SafeKLDRORisk("mse", alpha_init=v)),
        (
            "alpha_damping",
            (0.0, 1.5, *BAD_NUMBERS),
            lambda v: SafeKLDRORisk("mse", alpha_damping=v),
        ),
        (
            "alpha_learning_rate",
            (-1.0, *BAD_NUMBERS),
            lambda v: SafeKLDRORisk("mse", alpha_learning_rate=v),
        ),
        (
            "alpha_lr_multiplier",
            (-1.0, *BAD_NUMBERS),
            lambda v: SafeKLDRORisk("mse", alpha_lr_multiplier=v),
        ),
        ("update_alpha", (1, 0, "yes"), lambda v: SafeKLDRORisk("mse", update_alpha=v)),
        (
            "init_alpha_from_batch",
            ("no", 1),
            lambda v: SafeKLDRORisk("mse", init_alpha_from_batch=v),
        ),
        ("calibrate", ("no",), lambda v: SafeKLDRORisk("mse", calibrate=v)),
        ("alpha_optimizer", ("rmsprop",), lambda v: SafeKLDRORisk("mse", alpha_optimizer=v)),
        ("lam", (0.0, *BAD_NUMBERS), lambda v: ExactKLDRORisk("mse", lam=v)),
    ):
        assert_hparam_rejected(build, name, values, suite="dro.loss.hparams")


_METRIC = {}


def _metric_runner():
    if "m" not in _METRIC:
        metric = ExactKLDRORisk("mse", lam=LAM)

        def fn(y, p, s):
            metric.reset_state()
            metric.update_state(y, p, sample_weight=s)
            return metric.result()

        _METRIC["m"] = Modes(fn)
    return _METRIC["m"]


@VALID_SETTINGS
@hypothesis.given(p=preds_st, s=weights_st)
def test_exact_metric_valid_inputs_agree_with_oracle(p, s):
    y = np.linspace(-2, 2, N, dtype=np.float32)[:, None]
    s = s.astype(np.float32)
    l = _mse(y[:, 0].astype(np.float64), p[:, 0].astype(np.float64))
    assert_modes_agree(
        _metric_runner(),
        y,
        p,
        s,
        reference=R.exact_risk(l, LAM, _pi(s)),
        atol=1e-4,
        rtol=1e-5,
        suite="dro.metric",
    )


@SETTINGS
@hypothesis.given(p=preds_st, s=weights_st, bad=bad_weight_st)
def test_exact_metric_rejects_invalid_sample_weights(p, s, bad):
    y = np.zeros((N, 1), np.float32)
    s = s.astype(np.float32)
    s[bad[0]] = bad[1]
    assert_rejects(_metric_runner(), y, p, s, name="sample_weight", rows=(), suite="dro.metric")


def test_exact_metric_nan_prediction_gives_nan():
    y = np.zeros((N, 1), np.float32)
    p = np.linspace(-1, 1, N, dtype=np.float32)[:, None]
    p[5] = np.nan
    for mode in MODES:
        assert np.isnan(np.asarray(_metric_runner()(mode, y, p, np.ones(N, np.float32)))), mode


def test_keras_fit_with_nan_sample_weight_fails_loudly():
    """End to end: a NaN sample weight in fit raises (before: silently dropped); where Keras
    compiles the step with XLA (JAX's default jit), the training loss is NaN instead."""
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    y = np.zeros((16, 1), "float32")
    sw = np.ones(16, "float32")
    sw[3] = np.nan
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", loss=CVaRLoss("mse", rho=0.5))
    if BACKEND == "jax":  # fit's step runs under jax.jit: no assertions, NaN (NAN_MODES)
        assert NAN_MODES
        history = model.fit(x, y, sample_weight=sw, batch_size=16, epochs=1, verbose=0)
        assert np.isnan(history.history["loss"][-1]), history.history
        return
    if BACKEND == "tensorflow":  # the step is a tf.function: its graph assertion fails
        import tensorflow as tf

        expected = tf.errors.InvalidArgumentError
    else:  # PyTorch runs the step eagerly: the value check raises
        expected = ValueError
    with pytest.raises(expected, match="`sample_weight`"):
        model.fit(x, y, sample_weight=sw, batch_size=16, epochs=1, verbose=0)


# ----------------------------------------------------------------------------- issue 19
K = 3
logits_st = hnp.arrays(np.float32, (N, K), elements=st.floats(-5, 5, width=32))
ids_st = hnp.arrays(np.int32, N, elements=st.integers(0, K - 1))
# one unusable class id: NaN, not whole or out of [0, K) as float ids, out of range as ints
bad_id_st = st.tuples(
    st.integers(0, N - 1),
    st.sampled_from(
        [(np.float32, np.nan), (np.float32, 1.5), (np.float32, K), (np.float32, -1.0)]
        + [(np.float32, 1e9), (np.int32, K), (np.int32, -1), (np.int32, 2**31 - 1)]
    ),
)


def _ce(z, y):
    z = z.astype(np.float64)
    m = z.max(-1)
    return m + np.log(np.exp(z - m[:, None]).sum(-1)) - z[np.arange(len(y)), y]


# the default base loss (sparse categorical cross-entropy on logits, issue 19 items 9/12)
DEFAULT_BASE = {
    "safe_kl_dro": (
        lambda: SafeKLDRORisk(
            lam=LAM, rho=RHO, alpha_init=1.0, init_alpha_from_batch=False, update_alpha=False
        ),
        lambda l, s: R.safe_risk(l, 1.0, LAM, RHO, _pi(s))[0],
    ),
    "kl_dro_batch_lse": (lambda: KLDROBatchLSE(lam=LAM), lambda l, s: _ref_lse(l, s, LAM)),
    "kl_dro_sumexp": (lambda: KLDROSumExp(lam=5.0), lambda l, s: _ref_sumexp(l, s, 5.0)),
    "cvar": (lambda: CVaRLoss(rho=RHO), lambda l, s: _ref_cvar(l, s, RHO)),
    "exact_kl_dro_risk": (
        lambda: ExactKLDRORisk(lam=LAM),
        lambda l, s: R.exact_risk(l, LAM, _pi(s)),
    ),
}
_DEFAULT_RUNNERS = {}


def _default_runner(name):
    if name not in _DEFAULT_RUNNERS:
        obj = DEFAULT_BASE[name][0]()
        if isinstance(obj, keras.metrics.Metric):

            def fn(y, p, s):
                obj.reset_state()
                obj.update_state(y, p, sample_weight=s)
                return obj.result()

            _DEFAULT_RUNNERS[name] = Modes(fn)
        else:
            _DEFAULT_RUNNERS[name] = _loss_runner(obj)
    return _DEFAULT_RUNNERS[name]


@pytest.mark.parametrize("name", sorted(DEFAULT_BASE))
@GRAD_SETTINGS
@hypothesis.given(y=ids_st, z=logits_st, s=weights_st)
def test_default_base_loss_is_cross_entropy_on_logits(name, y, z, s):
    """Issue 19 items 9/12: the default base loss takes logits (it took probabilities)."""
    s = s.astype(np.float32)
    l = _ce(z, y)
    grad = (1,) if name not in ("cvar", "exact_kl_dro_risk") or len(set(l.tolist())) == N else None
    assert_modes_agree(
        _default_runner(name),
        y,
        z,
        s,
        reference=DEFAULT_BASE[name][1](l, s.astype(np.float64)),
        atol=2e-4,
        rtol=2e-5,
        grad_wrt=None if name == "exact_kl_dro_risk" else grad,
        suite=f"dro.default_base.{name}",
    )


@pytest.mark.parametrize("name", sorted(DEFAULT_BASE))
@SETTINGS
@hypothesis.given(y=ids_st, z=logits_st, bad=bad_id_st)
def test_default_base_loss_rejects_unusable_class_ids(name, y, z, bad):
    """Issue 19 item 3: a NaN label gave a finite risk under XLA (Keras' cross-entropy casts
    NaN to an id) and Keras' internal error otherwise. Now eager and graph raise naming
    `y_true` and XLA gives NaN, for NaN, fractional and out-of-range ids."""
    i, (dtype, value) = bad
    y = y.astype(dtype)
    y[i] = value
    assert_rejects(
        _default_runner(name),
        y,
        z,
        np.ones(N, np.float32),
        name="y_true",
        rows=(),
        suite=f"dro.default_base.{name}",
    )


@pytest.mark.parametrize("name", sorted(LOSSES))
@SETTINGS
@hypothesis.given(p=preds_st, i=st.integers(0, N - 1))
def test_losses_reject_nan_targets(name, p, i):
    """Issue 19 item 3 for any base loss: a NaN in a floating `y_true` raises naming it
    (eager, graph) or makes the risk NaN (XLA)."""
    y = np.linspace(-2, 2, N, dtype=np.float32)[:, None]
    y[i] = np.nan
    assert_rejects(
        _runner(name),
        y,
        p,
        np.ones(N, np.float32),
        name="y_true",
        rows=(),
        suite=f"dro.loss.{name}",
    )


_STATE_RESULT = Modes(lambda m, acc, n: ops.kl_dro_exact_state_result(m, acc, n, LAM))


@SETTINGS
@hypothesis.given(
    which=st.sampled_from(["acc", "n"]),
    value=st.sampled_from([-1.0, -1e-9, np.inf, -np.inf]),
    m=st.floats(-30, 30),
)
def test_exact_state_result_rejects_invalid_state(which, value, m):
    """Issue 19 item 11: `n` = -1 (or a negative / infinite `acc`) gave NaN silently. (A NaN
    state is what NaN losses leave: its NaN result is tested above.)"""
    acc, n = (value, 4.0) if which == "acc" else (1.5, value)
    assert_rejects(
        _STATE_RESULT,
        np.float64(m),
        np.float64(acc),
        np.float64(n),
        name=which,
        rows=(),
        suite="dro.kl_dro_exact",
    )


@SETTINGS
@hypothesis.given(
    l=losses_st, s=weights_st, i=st.integers(0, N - 1), big=st.sampled_from([np.inf, 1e4])
)
def test_sumexp_non_finite_value_has_nan_gradient_in_every_mode(l, s, i, big):
    """Issue 19 item 5: a +inf (or overflowing) loss gave the gradient [0.906, inf, 0.550].
    (1e4 / 10 / lam overflows float64.) Value +inf as for the other risks; every gradient
    entry NaN (no finite gradient exists)."""
    l, s = l.copy(), s.copy()
    l[i], s[i] = big, max(s[i], 0.5)
    runner = OPS["kl_dro_sumexp"][0]
    for mode in MODES:
        value, (grad,) = runner.with_gradient(mode, (l, np.float64(0.5), s), (0,))
        ok = float(value) == np.inf and bool(np.all(np.isnan(np.asarray(grad))))
        OUTCOMES[("dro.kl_dro_sumexp", "valid", mode, "right" if ok else "wrong")] += 1
        assert ok, (mode, value, grad)
