"""Tests for losszoo.calibration: metrics (functions vs streaming vs oracle), fit_calibrator,
reliability diagrams, on every backend (the tf.function retracing check: TensorFlow only)."""

import logging

import keras
import numpy as np
import pytest

import losszoo
from losszoo import calibration as C
from tests.harness import numpy
from tests.references import load_reference

REF = load_reference("bcsoftmax")


def test_ece_hand_computed_six_samples():
    # conf 0.95, 0.9 -> bin 15 ((14/15, 1]) and bin 14 ((13/15, 14/15]); 0.6, 0.55 -> bin 9
    # ((8/15, 9/15]); 0.4, 0.4 -> bin 6 ((5/15, 6/15]).
    probs = np.array([[0.95, 0.05], [0.1, 0.9], [0.6, 0.4], [0.45, 0.55], [0.4, 0.3], [0.4, 0.35]])
    probs[4:, :] = [[0.4, 0.3], [0.4, 0.35]]
    probs = np.c_[probs, 1 - probs.sum(1)]
    labels = np.array([0, 0, 0, 1, 2, 0])
    # bins: {0.95: correct}, {0.9: wrong}, {0.6 ok, 0.55 ok}, {0.4 wrong, 0.4 ok}
    want = (
        (1 / 6) * abs(1 - 0.95)
        + (1 / 6) * abs(0 - 0.9)
        + (2 / 6) * abs(1 - 0.575)
        + (2 / 6) * abs(0.5 - 0.4)
    )
    assert C.ece(probs, labels) == pytest.approx(want, abs=1e-12)
    assert C.ece(probs, labels) == pytest.approx(REF.ece_top_label(probs, labels), abs=1e-12)
    # a confidence exactly on an edge goes to the lower bin (right-closed)
    edge = np.array([[10 / 15, 5 / 15]])
    assert C.ece(edge, [0]) == pytest.approx(5 / 15, abs=1e-12)


def _random_probs(rng, n=600, k=7):
    logits = rng.normal(0, 2, (n, k))
    p = np.exp(logits)
    p /= p.sum(1, keepdims=True)
    y = np.array(
        [
            rng.choice(k, p=pi)
            for pi in np.exp(logits / 2) / np.exp(logits / 2).sum(1, keepdims=True)
        ]
    )
    return p.astype(np.float32), y


def test_metric_functions_against_oracle_and_definitions():
    rng = np.random.default_rng(0)
    p, y = _random_probs(rng)
    assert C.ece(p, y) == pytest.approx(REF.ece_top_label(p.astype(float), y), abs=1e-9)
    assert C.ece(p, np.eye(7)[y]) == pytest.approx(C.ece(p, y))
    onehot = np.eye(7)[y]
    assert C.brier_score(p, y) == pytest.approx(((p - onehot) ** 2).sum(1).mean(), rel=1e-6)
    assert C.nll(p, y) == pytest.approx(-np.log(p[np.arange(600), y]).mean(), rel=1e-6)
    assert C.accuracy(p, y) == pytest.approx((p.argmax(1) == y).mean())
    # classwise ECE of a 2-class problem with symmetric probs; adaptive ECE with one bin
    assert C.adaptive_ece(p, y, n_bins=1) == pytest.approx(
        abs((p.argmax(1) == y).mean() - p.max(1).mean()), abs=1e-7
    )
    # perfectly calibrated-by-construction: labels drawn from p -> small ECE
    y_cal = np.array([rng.choice(7, p=pi / pi.sum()) for pi in p.astype(float)])
    assert C.ece(p, y_cal) < 0.5 * C.ece(p, y)


def test_streaming_metrics_match_functions_across_batches():
    rng = np.random.default_rng(1)
    p, y = _random_probs(rng)
    metrics = {
        "ece": (C.ExpectedCalibrationError(), C.ece, 1e-6),
        "cw": (C.ClasswiseECE(num_classes=7), C.classwise_ece, 1e-6),
        "ada": (C.AdaptiveECE(), C.adaptive_ece, 3e-3),
        "nll": (C.NegativeLogLikelihood(), C.nll, 1e-6),
        "brier": (C.BrierScore(), C.brier_score, 1e-6),
        "acc": (C.Accuracy(), C.accuracy, 1e-7),
    }
    for metric, fn, tol in metrics.values():
        for start in range(0, 600, 128):
            metric.update_state(y[start : start + 128], p[start : start + 128])
        assert float(metric.result()) == pytest.approx(fn(p, y), abs=tol), type(metric).__name__
        metric.reset_state()
        metric.update_state(np.eye(7)[y[:50]], p[:50])  # one-hot labels
        assert float(metric.result()) == pytest.approx(fn(p[:50], y[:50]), abs=tol)
    acc = keras.metrics.SparseCategoricalAccuracy()
    acc.update_state(y, p)
    assert float(acc.result()) == pytest.approx(C.accuracy(p, y))
    assert losszoo.get_class("ece", "metric") is C.ExpectedCalibrationError


def _overconfident(rng, n, k=10, tau_true=2.0):
    x = rng.normal(0, 3, (n, k)).astype(np.float32)
    p = np.exp(x / tau_true)
    p /= p.sum(1, keepdims=True)
    y = (p.cumsum(1) > rng.random((n, 1))).argmax(1)
    return x, y


def test_fit_calibrator_on_synthetic_overconfident_logits():
    rng = np.random.default_rng(2)
    # 3,072 = 12 x 256 rows: no partial last batch, so each compiled training step (XLA on
    # JAX) is built for one batch shape, not two; predict runs in one batch (one program)
    xv, yv = _overconfident(rng, 3072)
    xt, yt = _overconfident(rng, 3072)
    uncal = np.exp(xt) / np.exp(xt).sum(1, keepdims=True)
    ece_uncal = C.ece(uncal, yt)
    ts = C.fit_calibrator(xv, None, yv, "ts", epochs=40, learning_rate=1e-2, batch_size=256)
    assert float(numpy(ts.layers[-1].tau())) == pytest.approx(2.0, rel=0.05)  # recovers tau_true
    for method in ("pb-c", "pb-c-l", "lb-c"):
        model = C.fit_calibrator(
            xv, None, yv, method, epochs=25, learning_rate=1e-2, batch_size=256
        )
        p = model.predict(xt, batch_size=len(xt), verbose=0)
        assert C.ece(p, yt) < 0.5 * ece_uncal, method
        if method == "pb-c-l":
            np.testing.assert_array_equal(p.argmax(1), xt.argmax(1))  # accuracy preserved


def test_fit_calibrator_on_a_model_saves_and_loads(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(400, 8)).astype(np.float32)
    y = (x[:, :4] * 3).argmax(1)
    inp = keras.Input((8,))
    z = keras.layers.Dense(6, activation="tanh", name="embedding")(inp)
    base = keras.Model(inp, keras.layers.Dense(4)(z))
    base.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    base.fit(x, y, epochs=2, verbose=0)
    before = [w.copy() for w in base.get_weights()]
    model, hist = C.fit_calibrator(base, x, y, "pb-l", epochs=3, return_history=True)
    assert len(hist) == 3 and np.isfinite(hist).all()
    for w0, w1 in zip(before, base.get_weights()):
        np.testing.assert_array_equal(w0, w1)  # base frozen
    p = model.predict(x, verbose=0)
    np.testing.assert_allclose(p.sum(1), 1, atol=1e-5)
    path = str(tmp_path / "calibrated.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), p, atol=1e-6)
    with pytest.raises(ValueError, match="`method`: unknown calibration"):
        C.fit_calibrator(base, x, y, "dirichlet")


def test_reliability_diagram_writes_png(tmp_path):
    rng = np.random.default_rng(4)
    p, y = _random_probs(rng, 200, 5)
    mean_conf, acc, count = C.reliability_curve(p, y)
    assert count.sum() == 200
    assert np.nansum(count * np.abs(acc - mean_conf)) / 200 == pytest.approx(C.ece(p, y), abs=1e-6)
    path = tmp_path / "rd.png"
    C.reliability_diagram({"a": p, "b": p**2 / (p**2).sum(1, keepdims=True)}, y, path=path)
    assert path.stat().st_size > 1000


def _softmax_model(k=10):
    """A model whose logits are its inputs, ending in Keras' softmax (Dense + activation)."""
    model = keras.Sequential([keras.Input((k,)), keras.layers.Dense(k, activation="softmax")])
    model.set_weights([np.eye(k, dtype=np.float32), np.zeros(k, np.float32)])
    return model


def test_fit_calibrator_on_a_softmax_model_calibrates_its_logits(tmp_path):
    # Issue 19 item 8: the softmax probabilities were calibrated as if they were logits (ECE
    # 0.039 before "calibration", 0.607 after). Keras' softmax attaches its logits; they are
    # used, and the result is the same as calibrating the logits themselves.
    rng = np.random.default_rng(5)
    xv, yv = _overconfident(rng, 3000)
    xt, yt = _overconfident(rng, 3000)
    kwargs = dict(epochs=40, learning_rate=1e-2, batch_size=256)
    model = C.fit_calibrator(_softmax_model(), xv, yv, "ts", **kwargs)
    on_logits = C.fit_calibrator(xv, None, yv, "ts", **kwargs)
    tau = float(numpy(model.layers[-1].tau()))
    assert tau == pytest.approx(float(numpy(on_logits.layers[-1].tau())), rel=1e-6)
    assert tau == pytest.approx(2.0, rel=0.05)
    p = model.predict(xt, verbose=0)
    e = np.exp(xt / tau - (xt / tau).max(1, keepdims=True))
    np.testing.assert_allclose(p, e / e.sum(1, keepdims=True), atol=1e-6)
    uncal = np.exp(xt) / np.exp(xt).sum(1, keepdims=True)
    assert C.ece(p, yt) < 0.5 * C.ece(uncal, yt)
    path = str(tmp_path / "calibrated_softmax.keras")
    model.save(path)
    np.testing.assert_allclose(keras.saving.load_model(path).predict(xt, verbose=0), p, atol=1e-6)


@pytest.mark.tensorflow_only(reason="tf.function retracing warnings (TensorFlow's logger)")
def test_repeated_fit_calibrator_does_not_retrace():
    # Issue 19 item 17: every call built a new tf.function (and predict function), and TF
    # warned "triggered tf.function retracing" after a few calls.
    import tensorflow as tf

    rng = np.random.default_rng(7)
    x, y = _overconfident(rng, 300, k=4)
    base = _softmax_model(k=4)
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = tf.get_logger()
    logger.addHandler(handler)
    try:
        for _ in range(4):
            for method in ("ts", "pb-c"):
                C.fit_calibrator(base, x, y, method, epochs=2, batch_size=128)
                C.fit_calibrator(x, None, y, method, epochs=2, batch_size=128)
    finally:
        logger.removeHandler(handler)
    assert not [m for m in messages if "retracing" in m], messages


def test_repeated_fit_calibrator_starts_from_scratch():
    # reused trainers start from scratch: the same fit twice gives the same calibrator
    x, y = _overconfident(np.random.default_rng(7), 300, k=4)
    a = C.fit_calibrator(x, None, y, "pb-c", epochs=3).layers[-1].get_weights()
    b = C.fit_calibrator(x, None, y, "pb-c", epochs=3).layers[-1].get_weights()
    for wa, wb in zip(a, b):
        np.testing.assert_array_equal(wa, wb)


def test_make_calibrator_resolves_names_through_the_registry():
    """Issue 20 item 4: calibrator names are the registry's (one alias table). Every name and
    alias registered for a calibrator head builds that calibrator, the paper's suffixes
    configure the bounding ones, and other heads or unknown names are rejected."""
    from losszoo.heads.calibration import LogitBounding, ProbabilityBounding, TemperatureScaling

    classes = (TemperatureScaling, ProbabilityBounding, LogitBounding)
    found = [e for e in losszoo.entries("head") if e.cls in classes]
    assert sorted(e.cls.__name__ for e in found) == sorted(c.__name__ for c in classes)
    for entry in found:
        for key in (entry.name, *entry.aliases):
            assert type(C.make_calibrator(key)) is entry.cls
            assert type(C.make_calibrator(key.upper())) is entry.cls
    pb = C.make_calibrator("pb-l-u")
    assert type(pb) is ProbabilityBounding and (pb.bound_fn, pb.bounds) == ("linear", "upper")
    assert type(C.make_calibrator("lb-c")) is LogitBounding
    for bad in ("sparsemax", "bcsoftmax", "tsx", "ts-c", "lb-c-l", "pb-c-l-u"):
        with pytest.raises(ValueError, match="unknown calibration method"):
            C.make_calibrator(bad)
