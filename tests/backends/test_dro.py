"""Safe-KL DRO risk and its baselines on the running backend: values against the spec's numpy
oracle, gradients against the closed forms and finite differences, NaN when traced, errors
naming the argument when eager, and the Keras losses by registered name in a short ``fit``."""

import keras
import numpy as np
import pytest

import losszoo
from losszoo import ops
from tests.harness import (
    BACKEND,
    MODES,
    compiled,
    finite_difference,
    float64,
    numpy,
    value_and_grad,
)
from tests.references import load_reference

R = load_reference("safe_kl_dro")
LAM, RHO = 0.7, 0.2
TRACED = [m for m in MODES if m in ("xla", "jit") and BACKEND != "torch"]  # torch: eager


def _data(n=11, seed=0):
    r = np.random.default_rng(seed)
    return r.gamma(2.0, size=n).astype(np.float32), r.uniform(0.2, 2.0, n).astype(np.float32)


def _upstream():
    return np.random.default_rng(7).uniform(0.5, 1.5, size=())  # value_and_grad's weighting


@pytest.mark.parametrize("mode", MODES)
def test_safe_kl_value_and_gradients_match_reference(mode):
    l, s = _data()
    alpha = np.float32(1.3)
    for weights in (s, None):
        v, (gl, ga) = value_and_grad(
            lambda l, a, w=weights: ops.safe_kl_dro_risk(l, a, LAM, RHO, w),
            l,
            alpha,
            mode=mode,
            argnums=(0, 1),
        )
        vr, glr, gar = R.safe_risk(l, 1.3, LAM, RHO, p_hat=weights)
        np.testing.assert_allclose(v, vr, rtol=1e-5)
        np.testing.assert_allclose(gl, _upstream() * glr, rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(ga, _upstream() * gar, rtol=1e-4, atol=1e-6)
    _, stats = compiled(lambda l: ops.safe_kl_dro_risk_and_stats(l, 1.3, LAM, RHO, s), mode)(l)
    w = R.safe_terms(l, 1.3, LAM, RHO)[1]
    np.testing.assert_allclose(numpy(stats["saturation"]), RHO * w.max(), rtol=1e-5)
    gar = R.safe_risk(l, 1.3, LAM, RHO, p_hat=s)[2]
    np.testing.assert_allclose(numpy(stats["grad_alpha"]), gar, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_baselines_match_closed_forms(mode):
    l, s = _data(seed=1)
    l[3] = l[7]  # a tie: CVaR splits it in index order
    pi = s / s.sum()
    u = _upstream()
    # batch LogSumExp: lam log sum pi exp(l/lam), gradient softmax(l/lam + log pi)
    v, (g,) = value_and_grad(lambda x: ops.kl_dro_batch_lse(x, LAM, s), l, mode=mode)
    np.testing.assert_allclose(v, R.exact_risk(l, LAM, s), rtol=1e-5)
    np.testing.assert_allclose(g, u * R.gibbs_weights(l, LAM, s), rtol=1e-4, atol=1e-7)
    # sum-of-exp: sum pi exp(l/lam), gradient pi exp(l/lam)/lam
    v, (g,) = value_and_grad(lambda x: ops.kl_dro_sumexp(x, LAM, s), l, mode=mode)
    ex = np.exp(np.float64(l) / LAM)
    np.testing.assert_allclose(v, np.sum(pi * ex), rtol=1e-5)
    np.testing.assert_allclose(g, u * pi * ex / LAM, rtol=1e-4)
    # CVaR (unweighted: the oracle's form), gradient: tail mass / rho
    v, (g,) = value_and_grad(lambda x: ops.cvar_risk(x, RHO), l, mode=mode)
    np.testing.assert_allclose(v, R.cvar(l, RHO), rtol=1e-5)
    order = np.argsort(-np.float64(l), kind="stable")
    q = np.zeros(l.size)
    q[order] = np.clip(RHO - np.arange(l.size) / l.size, 0.0, 1.0 / l.size)
    np.testing.assert_allclose(g, u * q / RHO, rtol=1e-5, atol=1e-7)
    # the batch's optimal alpha (bisection) and the weights there: sum pi w = 1
    a = numpy(compiled(lambda x: ops.safe_kl_dro_solve_alpha(x, LAM, RHO, s), mode)(l))
    np.testing.assert_allclose(a, R.solve_alpha(l, LAM, RHO, s), rtol=1e-5)
    w = numpy(compiled(lambda x: ops.safe_kl_dro_weights(x, a, LAM, RHO), mode)(l))
    np.testing.assert_allclose(np.sum(pi * w), 1.0, rtol=1e-4)


@pytest.mark.parametrize(
    "op",
    [
        lambda l: ops.safe_kl_dro_risk(l, 1.1, LAM, RHO, np.linspace(0.5, 2.0, 7)),
        lambda l: ops.kl_dro_batch_lse(l, LAM, np.linspace(0.5, 2.0, 7)),
        lambda l: ops.kl_dro_sumexp(l, LAM),
        lambda l: ops.cvar_risk(l, 0.3),
    ],
    ids=["safe_kl", "batch_lse", "sumexp", "cvar"],
)
def test_gradients_match_finite_differences_in_float64(op):
    l = np.random.default_rng(3).gamma(2.0, size=7)
    with float64():
        _, (g,) = value_and_grad(op, l)
        np.testing.assert_allclose(g, finite_difference(op, l), rtol=1e-6, atol=1e-8)


def test_streaming_exact_risk_over_chunks_equals_full_data_risk():
    r = np.random.default_rng(4)
    l, s = r.gamma(2.0, size=40) * 3, r.uniform(0.0, 2.0, size=40)
    l[5] = 3e3  # exp(l/lam) would overflow: the running shift keeps it exact
    with float64():
        state = tuple(np.array(v) for v in (-np.inf, 0.0, 0.0))  # float64 arrays
        for part in np.array_split(np.arange(l.size), 5):
            state = ops.kl_dro_exact_state_update(*state, l[part], 2.0, s[part])
        got = numpy(ops.kl_dro_exact_state_result(*state, 2.0))
    np.testing.assert_allclose(got, R.exact_risk(l, 2.0, s), rtol=1e-9)


@pytest.mark.parametrize("mode", TRACED)
def test_invalid_weights_or_alpha_give_nan_when_traced(mode):
    l, s = _data(seed=5)
    s[2] = -1.0
    for fn in (
        lambda l, s: ops.safe_kl_dro_risk(l, 1.0, LAM, RHO, s),
        lambda l, s: ops.kl_dro_batch_lse(l, LAM, s),
        lambda l, s: ops.kl_dro_sumexp(l, LAM, s),
        lambda l, s: ops.cvar_risk(l, RHO, s),
        lambda l, s: ops.safe_kl_dro_solve_alpha(l, LAM, RHO, s),
    ):
        assert np.isnan(numpy(compiled(fn, mode)(l, s)))
    w = compiled(lambda l, a: ops.safe_kl_dro_weights(l, a, LAM, RHO), mode)(l, np.float32(np.nan))
    assert np.isnan(numpy(w)).all()


def test_nan_loss_with_weight_is_nan_and_padding_is_ignored():
    l = np.array([np.nan, 1.0, 2.0, 3.0], np.float32)
    for fn in (
        lambda w: ops.safe_kl_dro_risk(l, 1.0, LAM, RHO, w),
        lambda w: ops.kl_dro_batch_lse(l, LAM, w),
        lambda w: ops.cvar_risk(l, 0.5, w),
    ):
        assert np.isnan(numpy(fn(np.ones(4, np.float32))))
        assert np.isfinite(numpy(fn(np.array([0.0, 1.0, 1.0, 1.0], np.float32))))
    with losszoo.validation(False):  # the kernels' own poisoning, without the eager checks
        bad = np.array([1.0, np.nan, 1.0, 1.0], np.float32)
        assert np.isnan(numpy(ops.safe_kl_dro_risk(l[1:], 1.0, LAM, RHO, bad[1:])))


def test_eager_errors_name_the_argument():
    l, s = _data()
    with pytest.raises(ValueError, match="`sample_weight`"):
        ops.safe_kl_dro_risk(l, 1.0, LAM, RHO, -s)
    with pytest.raises(ValueError, match="`sample_weight`.*shape"):
        ops.cvar_risk(l, RHO, np.ones(3, np.float32))
    with pytest.raises(ValueError, match="`alpha`"):
        ops.safe_kl_dro_risk(l, np.float32(np.inf), LAM, RHO)
    with pytest.raises(ValueError, match="`lam`"):
        ops.kl_dro_batch_lse(l, 0.0)
    with pytest.raises(ValueError, match="`rho`"):
        ops.cvar_risk(l, 1.0)
    with pytest.raises(ValueError, match="`n`"):
        ops.kl_dro_exact_state_result(np.float32(0.0), np.float32(1.0), np.float32(-1.0), LAM)


# ----------------------------------------------------------------------------- Keras losses
def _fit(name, jit_compile):
    r = np.random.default_rng(6)
    x = r.normal(size=(10, 4)).astype(np.float32)
    y = r.integers(0, 3, size=10)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss=name, jit_compile=jit_compile)
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)  # batches of 4, 4, 2
    logits = np.float64(model.predict(x, batch_size=10, verbose=0))
    ce = np.log(np.exp(logits).sum(-1)) - logits[np.arange(10), y]
    value = model.evaluate(x, y, batch_size=10, verbose=0, return_dict=True)["loss"]
    return model, history.history, ce, value


JIT = (False,) if BACKEND == "torch" else (False, True)  # torch's jit_compile is torch.compile


@pytest.mark.parametrize("jit_compile", JIT)
@pytest.mark.parametrize("name", ["cvar", "kl_dro_batch_lse", "kl_dro_sumexp"])
def test_baseline_losses_by_name_fit_and_evaluate_to_the_reference(name, jit_compile):
    _, history, ce, value = _fit(name, jit_compile)
    assert np.isfinite(history["loss"]).all()
    want = {
        "cvar": lambda: R.cvar(ce, 0.1),
        "kl_dro_batch_lse": lambda: R.exact_risk(ce, 1.0),
        "kl_dro_sumexp": lambda: np.mean(np.exp(ce)),
    }[name]()
    np.testing.assert_allclose(value, want, rtol=1e-4)


@pytest.mark.parametrize("jit_compile", JIT)
def test_safe_kl_dro_by_name_trains_alpha_and_evaluates_at_it(jit_compile):
    model, history, ce, value = _fit("safe_kl_dro", jit_compile)
    (loss,) = losszoo.losses.dro.find_dro_losses(model)
    alpha = float(numpy(loss.alpha))
    assert alpha != 0.0 and bool(numpy(loss.initialized))
    assert (
        len(history["safe_kl_dro_alpha"]) == 1 and np.isfinite(history["safe_kl_dro_alpha"]).all()
    )
    # evaluation uses (and never moves) the trained alpha
    np.testing.assert_allclose(value, R.safe_risk(ce, alpha, 1.0, 0.1)[0], rtol=1e-4)
    assert float(numpy(loss.alpha)) == alpha
    assert loss.get_config()["alpha_init"] == pytest.approx(alpha)


def _alpha_after_fit(loss, learning_rate, jit_compile):
    r = np.random.default_rng(7)
    x = r.normal(size=(12, 4)).astype(np.float32)
    y = r.integers(0, 3, size=12)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate), loss=loss, jit_compile=jit_compile
    )
    model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    return float(numpy(loss.alpha))


@pytest.mark.parametrize("jit_compile", JIT)
def test_gradient_rule_reads_the_model_optimizers_learning_rate(jit_compile):
    # alpha_optimizer="adam" without alpha_learning_rate takes the model optimiser's rate: the
    # same alpha as the rate given explicitly, also through a (constant) schedule. On JAX the
    # rate is read from the step's optimiser variables (fit releases the stored values).
    def loss(**kw):
        return losszoo.losses.SafeKLDRORisk(alpha_optimizer="adam", **kw)

    explicit = _alpha_after_fit(loss(alpha_learning_rate=0.05), 0.05, jit_compile)
    implicit = _alpha_after_fit(loss(), 0.05, jit_compile)
    constant = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=1, decay_rate=1.0)
    scheduled = _alpha_after_fit(loss(), constant, jit_compile)
    default_rate = _alpha_after_fit(loss(alpha_learning_rate=1e-3), 0.05, jit_compile)
    assert implicit == pytest.approx(explicit, rel=1e-6)
    assert scheduled == pytest.approx(explicit, rel=1e-6)
    assert abs(explicit - default_rate) > 1e-4  # the rate matters: the test can fail
