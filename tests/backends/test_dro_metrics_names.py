"""Issue 31 item 3: ``evaluate()`` of a model compiled with ``loss="safe_kl_dro"`` returned four
values while ``model.metrics_names`` listed two (JAX), and on JAX an ``evaluate`` before any
``fit`` failed ("None is not a valid value for jnp.array": the loss's metrics joined the model
inside the first traced step). The diagnostics are now three scalar metrics, one per logged
value, and a loss attached inside a step gives its state a value there."""

import keras
import numpy as np
import pytest

import losszoo  # noqa: F401  (registers "safe_kl_dro")
from losszoo.losses import SafeKLDRORisk
from tests.harness import BACKEND

DIAG = ["safe_kl_dro_alpha", "safe_kl_dro_mean_w", "safe_kl_dro_saturation"]


def _data():
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    return x, np.random.default_rng(1).integers(0, 3, size=64)


def _model(loss):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(0.05), loss=loss)
    return model


@pytest.mark.parametrize("by_name", [True, False])
@pytest.mark.parametrize("first", ["evaluate", "fit"])
def test_evaluate_values_match_metrics_names(by_name, first):
    x, y = _data()
    model = _model("safe_kl_dro" if by_name else SafeKLDRORisk())
    if first == "fit":
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    values = model.evaluate(x, y, batch_size=32, verbose=0)
    names = model.metrics_names
    assert names == ["loss", *DIAG], (BACKEND, names)
    assert len(values) == len(names), (BACKEND, names, values)
    logs = model.evaluate(x, y, batch_size=32, verbose=0, return_dict=True)
    assert list(logs) == names
    np.testing.assert_allclose(values, [logs[n] for n in names], rtol=1e-6)
    # the values are the diagnostics: weights in (0, 1/rho], saturation rho * max w <= 1
    assert np.isfinite(values).all() and 0.0 < values[2] and 0.0 < values[3] <= 1.0
    (loss,) = losszoo.losses.dro.find_dro_losses(model)
    assert [m.name for m in loss.metrics] == DIAG
    if first == "fit":  # evaluation does not move alpha: its mean is the trained alpha
        np.testing.assert_allclose(values[1], float(loss.alpha), rtol=1e-5)
