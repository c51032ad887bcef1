"""tf_keras (Keras 2) ``.keras`` round trip of models compiled with losszoo losses.

A model compiled with ``loss="<registered name>"`` or with ``losszoo.tf_keras_loss(...)``
is saved, loaded without ``custom_objects``, and must evaluate to the same value as before
saving, which is checked against the Keras 3 loss on the same predictions.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import losszoo

pytestmark = pytest.mark.tensorflow_only(reason="tf_keras (Keras 2) saving")

tf_keras = pytest.importorskip("tf_keras")

K = 3


def _labels(name, x):
    """Targets each loss takes: class ids, possibility degrees, or vote counts."""
    r = np.random.default_rng(1)
    ids = np.argmax(x[:, :K], 1)
    if name in ("antipignistic_kl", "possibilistic_projection"):
        pi = np.clip(r.uniform(0.0, 0.7, size=(len(x), K)), 0, 1).astype(np.float32)
        pi[np.arange(len(x)), ids] = 1.0
        return pi
    if name == "vote_kl":
        votes = r.integers(0, 3, size=(len(x), K)).astype(np.float32)
        votes[np.arange(len(x)), ids] += 2.0
        return votes
    return ids


def _data(name):
    x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    return x, _labels(name, x)


def _model(loss):
    model = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(K)])
    model.compile(optimizer=tf_keras.optimizers.SGD(0.05), loss=loss)
    return model


def _keras3_value(name, y, logits, reduction):
    loss = losszoo.get(name, reduction=reduction)
    return float(loss(y, logits))


_FRESH = "possibilistic_projection"
_IN_FRESH_PROCESS = "LOSSZOO_TEST_FRESH_PROCESS"
_IN_CHILD = bool(os.environ.get(_IN_FRESH_PROCESS))


def _here(names):
    """The cases this process runs: the possibilistic ones only in the child process of
    :func:`test_possibilistic_cases_in_a_fresh_process`, every other name only here."""
    return [n for n in names if (n == _FRESH) == _IN_CHILD]


STATELESS = [n for n in losszoo.names("loss") if n != "safe_kl_dro"]
CONFIGS = {
    "rankmax": {"k": 2, "margin": 0.5},
    "cvar": {"rho": 0.3},
    # Dykstra with the paper's rule (as the docs allow): a non-default config to round trip,
    # and a smaller XLA program than the default interior point; the subject here is saving,
    # not the solver (the by-name case below keeps the default program).
    _FRESH: {"method": "dykstra", "stopping": "paper"},
}


@pytest.mark.skipif(_IN_CHILD, reason="this is the child process")
def test_possibilistic_cases_in_a_fresh_process(request):
    """Run the two possibilistic cases below in one Python process of their own.

    Open problem (session 6): after the ~640 tests before this file in one process, tf_keras'
    evaluate of the possibilistic loss crashes the interpreter (SIGSEGV / SIGABRT inside
    TensorFlow's eager execute; the op's inner XLA function runs in a non-XLA tf_keras graph).
    Alone, or after the possibilistic op, loss and solver tests, it passes; no smaller
    reproduction was found yet. A fresh process keeps the check without taking the suite down;
    one process for both cases pays TensorFlow's import once.
    """
    file = request.node.nodeid.split("::")[0]
    tests = [
        f"{file}::{t.__name__}"
        for t in (
            test_compiled_by_name_saves_loads_and_evaluates,
            test_configured_adapter_saves_loads_and_evaluates,
        )
    ]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider"],
        cwd=request.config.rootpath,
        env={**os.environ, _IN_FRESH_PROCESS: "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "2 passed" in result.stdout, result.stdout[-4000:]


@pytest.mark.parametrize("name", _here(STATELESS))
def test_compiled_by_name_saves_loads_and_evaluates(name, tmp_path):
    x, y = _data(name)
    model = _model(name)
    before = model.evaluate(x, y, batch_size=32, verbose=0)
    want = _keras3_value(name, y, model.predict(x, verbose=0), "sum_over_batch_size")
    np.testing.assert_allclose(before, want, rtol=1e-5, atol=1e-6)

    path = tmp_path / f"{name}.keras"
    model.save(path)
    loaded = tf_keras.models.load_model(path)
    after = loaded.evaluate(x, y, batch_size=32, verbose=0)
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", _here(["rankmax", "sparsemax", "cvar", _FRESH]))
def test_configured_adapter_saves_loads_and_evaluates(name, tmp_path):
    x, y = _data(name)
    config = CONFIGS.get(name, {})
    model = _model(losszoo.tf_keras_loss(name, **config))
    before = model.evaluate(x, y, batch_size=32, verbose=0)
    reduction = "sum" if name != "cvar" else "sum_over_batch_size"  # a risk ignores it
    want = float(losszoo.get(name, reduction=reduction, **config)(y, model.predict(x, verbose=0)))
    np.testing.assert_allclose(before, want, rtol=1e-5, atol=1e-6)

    path = tmp_path / f"{name}.keras"
    model.save(path)
    loaded = tf_keras.models.load_model(path)
    assert loaded.loss.get_config() == model.loss.get_config()
    np.testing.assert_allclose(
        loaded.evaluate(x, y, batch_size=32, verbose=0), before, rtol=1e-6, atol=1e-7
    )


def test_batch_risk_is_the_risk_not_the_mean_base_loss():
    # cvar by name in tf_keras must compute CVaR, not silently the mean cross-entropy.
    x, y = _data("cvar")
    model = _model("cvar")
    logits = model.predict(x, verbose=0)
    got = model.evaluate(x, y, batch_size=32, verbose=0)
    erm = float(losszoo.get("cvar").per_example_losses(y, logits).numpy().mean())
    per = np.sort(losszoo.get("cvar").per_example_losses(y, logits).numpy())[::-1]
    rho = losszoo.get("cvar").get_config()["rho"]
    m = rho * len(per)  # CVaR: mean of the worst rho fraction (fractional last example)
    whole = int(np.floor(m))
    want = (per[:whole].sum() + (m - whole) * (per[whole] if whole < len(per) else 0)) / m
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert got > erm * 1.05


def test_stateful_loss_by_name_is_refused_clearly():
    x, y = _data("safe_kl_dro")
    model = _model("safe_kl_dro")
    with pytest.raises(TypeError, match=r"tf_keras_loss\('safe_kl_dro'"):
        model.evaluate(x, y, batch_size=32, verbose=0)


def test_adapter_class_called_like_a_function_fails_clearly():
    adapter = type(losszoo.tf_keras_loss("rankmax"))
    with pytest.raises(TypeError, match="reduction"):
        adapter(np.zeros((2,)), np.zeros((2, 3)))
