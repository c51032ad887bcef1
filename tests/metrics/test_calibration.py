"""The six streaming calibration metrics on the running backend, each by its registered name:
values against numpy computations of the whole data set (in ``evaluate`` with a partial last
batch, jit on and off, and updated by hand), errors naming the argument when eager, NaN
results when traced."""

import keras
import numpy as np
import pytest

import losszoo
from tests.harness import BACKEND, MODES, compiled, numpy
from tests.references import load_reference

N, D, K = 50, 4, 3
# PyTorch's jit_compile is torch.compile, outside losszoo's contract (tests/harness.py).
JIT = (False,) if BACKEND == "torch" else (False, True)
NAMES = ("ece", "adaptive_ece", "classwise_ece", "nll", "brier_score", "calibration_accuracy")


def _binned_error(values, hits, edges_of, n):
    """``sum_m |B_m| / n * |mean(hits in B_m) - mean(values in B_m)|`` over index groups."""
    return sum(len(i) / n * abs(hits[i].mean() - values[i].mean()) for i in edges_of if len(i))


def _bins(values, m=15):
    """Index groups of right-closed equal-width bins ((j-1)/m, j/m] (0 in the first)."""
    idx = np.clip(np.ceil(values * m).astype(int) - 1, 0, m - 1)
    return [np.flatnonzero(idx == j) for j in range(m)]


def reference(name, p, y):
    """The metric of the whole data set, from probabilities ``p`` [n, K] and ids ``y`` (numpy,
    float64, written from the definitions)."""
    p = np.asarray(p, np.float64)
    n, k = p.shape
    conf, correct = p.max(1), (p.argmax(1) == y).astype(np.float64)
    onehot = np.eye(k)[y]
    if name == "ece":
        return load_reference("bcsoftmax").ece_top_label(p, y, n_bins=15)
    if name == "adaptive_ece":
        groups = np.array_split(np.argsort(conf, kind="stable"), 15)
        return _binned_error(conf, correct, groups, n)
    if name == "classwise_ece":
        return np.mean([_binned_error(p[:, c], onehot[:, c], _bins(p[:, c]), n) for c in range(k)])
    if name == "nll":
        return -np.log(p[np.arange(n), y]).mean()
    if name == "brier_score":
        return ((p - onehot) ** 2).sum(1).mean()
    return correct.mean()


def _data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, D)).astype(np.float32)
    y = np.argmax(x[:, :K] + 0.5 * rng.normal(size=(N, K)), 1)
    return x, y


def _probabilities(n=N, seed=1):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(K) * 0.7, n).astype(np.float32)
    return p / p.sum(1, keepdims=True), rng.integers(0, K, n)


def test_the_names_are_the_registered_calibration_metrics():
    assert set(NAMES) <= set(losszoo.names("metric"))


@pytest.mark.parametrize("jit", JIT)
def test_by_name_in_evaluate_matches_numpy(jit):
    x, y = _data()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(K, activation="softmax")])
    model.compile(loss="sparse_categorical_crossentropy", metrics=list(NAMES), jit_compile=jit)
    result = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)  # 16+16+16+2
    p = model.predict(x, batch_size=N, verbose=0)
    for name in NAMES:
        np.testing.assert_allclose(result[name], reference(name, p, y), rtol=1e-4, err_msg=name)


@pytest.mark.parametrize("name", NAMES)
def test_updates_over_batches_and_label_forms(name):
    p, y = _probabilities()
    metric = losszoo.get(name, kind="metric")
    metric.update_state(y[:30], p[:30])  # ids
    metric.update_state(np.eye(K, dtype=np.float32)[y[30:]], p[30:])  # one-hot rows
    np.testing.assert_allclose(numpy(metric.result()), reference(name, p, y), rtol=1e-5)
    metric.reset_state()
    metric.update_state(y[:7, None].astype(np.float32), p[:7])  # [n, 1] float ids
    np.testing.assert_allclose(numpy(metric.result()), reference(name, p[:7], y[:7]), rtol=1e-5)


_BAD = {
    "id out of range": (lambda p, y: (np.where(np.arange(len(y)) == 3, K, y), p), "y_true"),
    "negative id": (lambda p, y: (np.where(np.arange(len(y)) == 3, -1, y), p), "y_true"),
    "fractional id": (lambda p, y: (np.where(np.arange(len(y)) == 3, 0.5, y), p), "y_true"),
    "NaN probability": (
        lambda p, y: (y, np.where(np.arange(len(y))[:, None] == 3, np.nan, p)),
        "y_pred",
    ),
    "logits": (lambda p, y: (y, 3.0 * p), "y_pred"),
}


@pytest.mark.parametrize("bad", sorted(_BAD))
@pytest.mark.parametrize("name", NAMES)
def test_bad_input_raises_naming_it_eagerly(name, bad):
    p, y = _probabilities(n=8)
    corrupt, argument = _BAD[bad]
    y_bad, p_bad = corrupt(p, y)
    metric = losszoo.get(name, kind="metric")
    with pytest.raises(ValueError, match=f"`{argument}`"):
        metric.update_state(y_bad.astype(np.float32), p_bad.astype(np.float32))


def _stateless(name):
    """The metric's update-then-result as one function of tensors (compilable on any backend)."""
    metric = losszoo.get_class(name, "metric")(
        **({"num_classes": K} if "classwise" in name else {})
    )
    start = [np.zeros(v.shape, np.float32) for v in metric.variables]

    def run(y, p):
        state = metric.stateless_update_state(start, y, p)
        return metric.stateless_result(state)

    return run


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
def test_bad_rows_make_the_result_nan_when_traced(name, mode):
    p, y = _probabilities(n=8)
    run = compiled(_stateless(name), mode)
    np.testing.assert_allclose(
        numpy(run(y.astype(np.float32), p)), reference(name, p, y), rtol=1e-5
    )
    traced = mode in ("xla", "jit") and BACKEND != "torch"  # torch's "jit" runs eagerly
    for corrupt, argument in _BAD.values():
        y_bad, p_bad = corrupt(p, y)
        args = y_bad.astype(np.float32), p_bad.astype(np.float32)
        if traced:
            assert np.isnan(numpy(run(*args))), argument
        else:
            with pytest.raises(Exception, match=f"`{argument}`"):
                numpy(run(*args))
