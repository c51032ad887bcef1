"""Keras losses for possibilistic labels: values, labels, config, training, diagnostics."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import losszoo
from losszoo.losses import (
    AntipignisticKLLoss,
    PossibilisticProjectionLoss,
    ProjectionDiagnostic,
    VoteKLLoss,
)
from tests.helpers import (
    assert_config_roundtrip,
    assert_fit_smoke,
    assert_mirrored_matches_single,
    assert_mixed_precision,
)

pytestmark = pytest.mark.tensorflow_only(
    reason="tf.GradientTape / tf.function / XLA checks (tests/helpers.py)"
)

K = 3
rng = np.random.default_rng(0)
X = rng.normal(size=(64, 4)).astype(np.float32)
_W = rng.normal(size=(4, K))
_SCORES = X @ _W
PI = np.exp(_SCORES - _SCORES.max(1, keepdims=True)) ** 0.7  # possibility labels, max 1
PI = np.round(PI, 3).astype(np.float32)
VOTES = rng.multinomial(20, [0.5, 0.3, 0.2], size=64).astype(np.float32)
Z = rng.normal(size=(64, K)).astype(np.float32)


def ref_antipignistic(pi):
    pi = pi / pi.max()
    order = np.argsort(-pi, kind="stable")
    pt = np.append(pi[order], 0.0)
    out = np.zeros(len(pi))
    for r in range(len(pi)):
        out[order[r]] = sum((pt[j] - pt[j + 1]) / (j + 1) for j in range(r, len(pi)))
    return out


def kl(p, q):
    return np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1) / q), 0.0), -1)


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


class GraphModeSequential(keras.Sequential):
    """Compiles its train step without whole-step XLA: the projection still runs in its
    own cached XLA kernel, but each test avoids one more slow whole-step compilation
    (a fully jitted train step is tested in tests/ops/test_possibilistic_tensorflow.py)."""

    def compile(self, *args, **kwargs):
        kwargs["jit_compile"] = False
        super().compile(*args, **kwargs)


def build_model():
    return GraphModeSequential([keras.Input((4,)), keras.layers.Dense(K)])


def test_values_match_ops_and_references():
    q = softmax(Z.astype(np.float64))
    star, info = losszoo.ops.possibilistic_projection(Z.astype(np.float64), PI)
    loss = PossibilisticProjectionLoss(reduction=None)(PI, Z).numpy()
    np.testing.assert_allclose(loss, kl(star.numpy(), q), rtol=1e-5, atol=1e-7)
    pdot = np.stack([ref_antipignistic(p.astype(np.float64)) for p in PI])
    b_loss = AntipignisticKLLoss(reduction=None)(PI, Z).numpy()
    np.testing.assert_allclose(b_loss, kl(pdot, q), rtol=1e-5, atol=1e-7)
    assert np.all(loss <= b_loss + 1e-6)  # projection never worse than the fixed target
    vbar = VOTES / VOTES.sum(1, keepdims=True)
    np.testing.assert_allclose(
        VoteKLLoss(reduction=None)(VOTES, Z).numpy(), kl(vbar, q), rtol=1e-5, atol=1e-7
    )
    # probabilities instead of logits give the same values
    probs = q.astype(np.float32)
    np.testing.assert_allclose(
        PossibilisticProjectionLoss(reduction=None, from_logits=False)(PI, probs).numpy(),
        loss,
        rtol=1e-4,
        atol=1e-6,
    )


def test_integer_ids_reductions_and_sample_weights():
    ids = rng.integers(0, K, size=64)
    one_hot = np.eye(K, dtype=np.float32)[ids]
    loss = PossibilisticProjectionLoss(reduction=None)
    np.testing.assert_allclose(loss(ids, Z).numpy(), loss(one_hot, Z).numpy())
    # one-hot possibility (floor mode) is cross-entropy up to O(rho)
    ce = -np.log(softmax(Z.astype(np.float64))[np.arange(64), ids])
    np.testing.assert_allclose(loss(ids, Z).numpy(), ce, atol=1e-4)
    per = loss(PI, Z).numpy()
    w = rng.uniform(0, 2, size=64).astype(np.float32)
    np.testing.assert_allclose(PossibilisticProjectionLoss()(PI, Z), per.mean(), rtol=1e-5)
    np.testing.assert_allclose(
        PossibilisticProjectionLoss(reduction="sum")(PI, Z), per.sum(), rtol=1e-5
    )
    np.testing.assert_allclose(
        PossibilisticProjectionLoss()(PI, Z, sample_weight=w), (w * per).mean(), rtol=1e-5
    )
    with pytest.raises(ValueError, match="`y_true` must have the shape"):
        loss(np.ones((64, K + 1), np.float32), Z)
    with pytest.raises(ValueError, match="`stopping`"):
        PossibilisticProjectionLoss(stopping="sometimes")


def test_gradient_is_softmax_minus_projection():
    z = tf.constant(Z)
    with tf.GradientTape() as tape:
        tape.watch(z)
        total = PossibilisticProjectionLoss(reduction="sum")(PI, z)
    star, _ = losszoo.ops.possibilistic_projection(tf.cast(z, tf.float64), PI)
    want = softmax(Z.astype(np.float64)) - star.numpy()
    np.testing.assert_allclose(tape.gradient(total, z).numpy(), want, atol=1e-6)


def test_config_roundtrip():
    for obj in (
        PossibilisticProjectionLoss(
            tol=1e-6, stopping="paper", eps_cap=0.05, support_mode="restrict"
        ),
        AntipignisticKLLoss(floor=1e-6),
        VoteKLLoss(from_logits=False),
    ):
        assert_config_roundtrip(obj)
    metric = ProjectionDiagnostic(PossibilisticProjectionLoss(max_cycles=7), "p90_cycles")
    clone = ProjectionDiagnostic.from_config(metric.get_config())
    assert clone.get_config() == metric.get_config()
    assert (
        losszoo.get_class("possibilistic_projection_diagnostic", "metric") is ProjectionDiagnostic
    )


@pytest.mark.parametrize(
    "name,labels", [("possibilistic_projection", PI), ("antipignistic_kl", PI), ("vote_kl", VOTES)]
)
def test_compile_by_name_and_fit(name, labels):
    model = build_model()
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=name)
    # Full batches of 64: the projection kernel shares its XLA compilation with other tests.
    assert_fit_smoke(model, X, labels, epochs=2, batch_size=64)


def test_diagnostics_are_logged_as_metrics():
    loss = PossibilisticProjectionLoss()
    model = build_model()
    initial = model.get_weights()
    model.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss=loss,
        metrics=loss.diagnostic_metrics(),
        jit_compile=False,
    )
    logs = model.fit(X, PI, epochs=1, batch_size=64, verbose=0, shuffle=False).history
    # One full batch: the metrics report the projection of that step's predictions (made
    # with the initial weights), read from the loss without recomputing it.
    model.set_weights(initial)
    _, info = losszoo.ops.possibilistic_projection(model(X), PI)
    it, cyc = info.iterations.numpy(), info.cycles.numpy()
    cycles = it + cyc  # interior point (+ Dykstra finish) work
    assert cycles.max() > 1
    np.testing.assert_allclose(logs["projection_mean_cycles"][0], cycles.mean(), rtol=1e-6)
    np.testing.assert_allclose(
        logs["projection_p90_cycles"][0], np.percentile(cycles, 90), rtol=1e-6
    )
    assert logs["projection_nonconverged"][0] == np.sum(~info.converged.numpy())
    # Standalone metric (recomputes the projection) on known cycles.
    z = tf.constant(Z)
    _, info = losszoo.ops.possibilistic_projection(z, PI)
    it, cyc = info.iterations.numpy(), info.cycles.numpy()
    cycles = np.where(it == cyc, cyc, it + cyc)
    for stat, want in (
        ("mean_cycles", cycles.mean()),
        ("p90_cycles", np.percentile(cycles, 90)),
        ("nonconverged", np.sum(~info.converged.numpy())),
    ):
        metric = ProjectionDiagnostic(PossibilisticProjectionLoss(), stat)
        metric.update_state(PI, z)
        np.testing.assert_allclose(metric.result().numpy(), want, rtol=1e-6)
    # A budget too small to converge is reported.
    tight = PossibilisticProjectionLoss(max_cycles=1, tol=1e-12, method="dykstra")
    metric = ProjectionDiagnostic(tight, "nonconverged")
    metric.update_state(PI, z)
    _, info = losszoo.ops.possibilistic_projection(z, PI, max_cycles=1, tol=1e-12, method="dykstra")
    want = np.sum(~info.converged.numpy())
    assert want > 0 and metric.result().numpy() == want


def test_mixed_precision_and_mirrored():
    model, _ = assert_mixed_precision(
        build_model, X, PI, PossibilisticProjectionLoss(), batch_size=64
    )
    assert_mirrored_matches_single(build_model, X, PI, PossibilisticProjectionLoss())


@pytest.mark.parametrize(
    "name,labels",
    [
        ("possibilistic_projection", PI),
        ("possibilistic_projection", np.argmax(PI, 1)),  # class ids
        ("antipignistic_kl", PI),
        ("vote_kl", VOTES),
    ],
)
def test_fit_and_evaluate_with_a_partial_last_batch(name, labels):
    # Issue 19: 50 rows in batches of 16 leave a batch of 2, so Keras traces the step with
    # a None batch dimension; the possibilistic losses raised TypeError there.
    x, y = X[:50], labels[:50]
    model = build_model()
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=name)
    initial = model.evaluate(x, y, batch_size=16, verbose=0)
    loss = losszoo.get_class(name, "loss")(reduction=None)
    want = float(np.mean(loss(y, model(x)).numpy()))  # the whole set at a static shape
    np.testing.assert_allclose(initial, want, rtol=1e-5)
    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0).history["loss"]
    assert np.all(np.isfinite(history)) and history[-1] < history[0]


def test_projection_config_is_the_loss_config_payload():
    """The loss stores the fields of one validated ``ProjectionConfig`` (issue 20 item 2):
    its ``get_config`` holds exactly them, and a config of the wrong value fails at
    construction naming the option."""
    import dataclasses

    from losszoo.ops.possibilistic import ProjectionConfig

    loss = PossibilisticProjectionLoss(tol=1e-7, max_cycles=50, method="dykstra")
    cfg = ProjectionConfig(tol=1e-7, max_cycles=50, method="dykstra")
    assert loss.projection_config == dataclasses.asdict(cfg)
    config = loss.get_config()
    assert {k: config[k] for k in loss.projection_config} == dataclasses.asdict(cfg)
    clone = PossibilisticProjectionLoss.from_config(config)
    assert clone.projection_config == loss.projection_config
    with pytest.raises(ValueError, match="`gap_policy`"):
        PossibilisticProjectionLoss(gap_policy="narrow")
