"""``fit_calibrator`` trains with Keras' own ``fit`` (issue 31 item 13): progress (``verbose``),
Keras ``callbacks`` and early stopping, the fitted temperature at the NLL minimum found by a
numpy grid search, a seeded shuffle that leaves the global RNGs alone. On every backend."""

import keras
import numpy as np
import pytest

from losszoo.calibration import fit_calibrator

RNG = np.random.default_rng(11)
N, K, TAU_TRUE = 256, 4, 2.5
X = RNG.normal(0, 3, (N, K)).astype("float32")
_P = np.exp(X / TAU_TRUE)
Y = ((_P / _P.sum(1, keepdims=True)).cumsum(1) > RNG.random((N, 1))).argmax(1)


def _nll(tau, x=X, y=Y):
    """Mean ``-log softmax(x / tau)[y]`` in float64."""
    z = x.astype(np.float64) / tau
    z = z - z.max(1, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y]))


def _tau(model):
    return float(keras.ops.convert_to_numpy(model.layers[-1].tau()))


# Full batch and a large step: converges in well under 300 epochs (seconds on PyTorch).
FAST = dict(batch_size=N, learning_rate=0.02, verbose=0)


def test_early_stopping_ends_at_the_nll_minimum():
    grid = np.linspace(1.0, 5.0, 4001)
    best = grid[np.argmin([_nll(t) for t in grid])]  # numpy reference (grid step 1e-3)
    model, history = fit_calibrator(X, None, Y, "ts", epochs=300, return_history=True, **FAST)
    assert len(history) < 300  # stopped early (the default), once the NLL stopped improving
    assert _tau(model) == pytest.approx(best, abs=0.05)
    assert _nll(_tau(model)) - _nll(best) < 2e-4
    assert history[-1] <= history[0] - 0.01


def test_without_early_stopping_every_epoch_runs():
    _, history = fit_calibrator(
        X, None, Y, "ts", epochs=7, early_stopping=None, return_history=True, **FAST
    )
    assert len(history) == 7 and np.all(np.diff(history) < 0)  # full batch: NLL decreases
    # epoch 1's loss is the NLL at the initial tau = 1.5 (full batch: measured before the step)
    assert history[0] == pytest.approx(_nll(1.5), rel=1e-5)


class _Recorder(keras.callbacks.Callback):
    def __init__(self, stop_after=None):
        super().__init__()
        self.losses, self.stop_after, self.began = [], stop_after, False

    def on_train_begin(self, logs=None):
        self.began = True

    def on_epoch_end(self, epoch, logs=None):
        self.losses.append(float(logs["loss"]))
        if self.stop_after is not None and epoch + 1 >= self.stop_after:
            self.model.stop_training = True


def test_keras_callbacks_see_every_epoch_and_can_stop_it():
    recorder = _Recorder()
    model, history = fit_calibrator(
        X,
        None,
        Y,
        "ts",
        epochs=5,
        early_stopping=None,
        callbacks=[recorder],
        return_history=True,
        **FAST,
    )
    assert recorder.began and recorder.losses == pytest.approx(history) and len(history) == 5
    stopper = _Recorder(stop_after=3)
    _, history = fit_calibrator(
        X, None, Y, "ts", epochs=50, callbacks=[stopper], return_history=True, **FAST
    )
    assert len(history) == 3
    # Keras' own EarlyStopping, as a user passes it
    es = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0)
    _, history = fit_calibrator(
        X,
        None,
        Y,
        "ts",
        epochs=50,
        early_stopping=None,
        callbacks=[es],
        return_history=True,
        **FAST,
    )
    assert len(history) == 2 and es.stopped_epoch == 1


def test_progress_is_printed_unless_verbose_is_zero(capsys):
    fit_calibrator(X, None, Y, "ts", epochs=3, batch_size=N, early_stopping=None)
    out = capsys.readouterr().out
    assert "3/3" in out and "nll:" in out  # default "auto": one bar over the epochs
    fit_calibrator(X, None, Y, "ts", epochs=3, batch_size=N, verbose=2, early_stopping=None)
    out = capsys.readouterr().out
    assert out.count("Epoch ") == 3 and "loss:" in out  # Keras' one line per epoch
    fit_calibrator(X, None, Y, "ts", epochs=3, **FAST)
    assert capsys.readouterr().out == ""


def test_seed_decides_the_fit_and_global_rngs_are_untouched():
    state = np.random.get_state()[1].copy()
    kw = dict(epochs=3, batch_size=64, learning_rate=0.05, verbose=0, early_stopping=None)
    a = fit_calibrator(X, None, Y, "pb-c", seed=1, **kw).layers[-1].get_weights()
    b = fit_calibrator(X, None, Y, "pb-c", seed=1, **kw).layers[-1].get_weights()
    c = fit_calibrator(X, None, Y, "pb-c", seed=2, **kw).layers[-1].get_weights()
    for wa, wb in zip(a, b):
        np.testing.assert_array_equal(wa, wb)
    assert any(not np.array_equal(wa, wc) for wa, wc in zip(a, c))
    np.testing.assert_array_equal(np.random.get_state()[1], state)


def test_linear_variant_trains_on_logits_and_features():
    feats = RNG.normal(size=(N, 3)).astype("float32")
    model, history = fit_calibrator(
        X, feats, Y, "pb-l", epochs=4, batch_size=100, verbose=0, return_history=True
    )
    assert len(history) == 4 and np.isfinite(history).all()
    probs = model.predict([X[:8], feats[:8]], verbose=0)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(verbose=3), "verbose"),
        (dict(verbose="loud"), "verbose"),
        (dict(verbose=True), "verbose"),
        (dict(early_stopping=-1e-3), "early_stopping"),
        (dict(early_stopping=float("nan")), "early_stopping"),
        (dict(patience=-1), "patience"),
        (dict(patience=1.5), "patience"),
        (dict(callbacks=[lambda epoch: None]), "callbacks"),
    ],
)
def test_bad_arguments_are_named(kwargs, name):
    with pytest.raises((ValueError, TypeError), match=f"`{name}`"):
        fit_calibrator(X, None, Y, "ts", epochs=1, **kwargs)
