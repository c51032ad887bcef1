"""Keras losses of the safe-KL DRO method: the checks that need TensorFlow itself (the
custom-loop ``tf.GradientTape`` rule, ``tf.distribute.MirroredStrategy``, the tf_keras
adapter). The backend-neutral tests are in ``tests/losses/test_dro.py``."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import losszoo
from losszoo import ops
from losszoo.losses import CVaRLoss, KLDROBatchLSE, KLDROSumExp, SafeKLDRORisk
from losszoo.losses.dro import alpha_updates, find_dro_losses
from tests.helpers import assert_mirrored_matches_single, load_reference
from tests.losses.test_dro import _data, _linear  # one copy of the data and model

pytestmark = pytest.mark.tensorflow_only(
    reason="tf.GradientTape custom-loop rule; tf.distribute.MirroredStrategy; tf_keras adapter"
)

R = load_reference("safe_kl_dro")


def _sq_losses(model, X, y):
    return (y.astype(np.float64) - model.predict(X, verbose=0)[:, 0].astype(np.float64)) ** 2


def test_custom_loop_tape_rule_and_overrides():
    X, y = _data(16)
    model = _linear()
    pred = model(X)
    loss = SafeKLDRORisk(
        "mse", alpha_init=0.0, init_alpha_from_batch=False, alpha_learning_rate=0.1
    )
    loss(y, pred)  # no tape, no trainer: evaluation
    assert float(loss.alpha.numpy()) == 0.0
    with tf.GradientTape():
        loss(y, model(X))  # computing gradients: a training step
    assert float(loss.alpha.numpy()) != 0.0
    a = float(loss.alpha.numpy())
    with alpha_updates(False), tf.GradientTape():
        loss(y, model(X))
    assert float(loss.alpha.numpy()) == a
    frozen = SafeKLDRORisk("mse", update_alpha=False, init_alpha_from_batch=False)
    with tf.GradientTape():
        frozen(y, pred)
    assert float(frozen.alpha.numpy()) == 0.0


def test_mirrored_strategy_matches_single_device_with_one_alpha():
    X, y = _data(64)
    loss = SafeKLDRORisk("mse", lam=1.0, rho=0.1, alpha_lr_multiplier=10.0)
    single, mirrored = assert_mirrored_matches_single(
        _linear, X, y, loss, steps=4, learning_rate=0.05
    )
    (ls,), (lm,) = find_dro_losses(single), find_dro_losses(mirrored)
    assert isinstance(lm._state.value, tf.distribute.DistributedValues)
    replicas = [float(v.numpy()[0]) for v in lm._state.value.values]
    assert len(replicas) == 2 and replicas[0] == replicas[1]
    np.testing.assert_allclose(replicas[0], float(ls.alpha.numpy()), rtol=1e-5)
    assert float(ls.alpha.numpy()) != 0.0
    # an instance created outside the strategy scope is rejected with a clear error
    strategy = tf.distribute.MirroredStrategy(
        [d.name for d in tf.config.list_logical_devices("CPU")][:2]
    )
    outside = SafeKLDRORisk("mse")
    with strategy.scope():
        m = _linear()
        m.compile("sgd", loss=outside)
    with pytest.raises(ValueError, match="strategy"):
        m.fit(X, y, batch_size=64, epochs=1, verbose=0)


@pytest.mark.parametrize(
    "loss",
    [CVaRLoss("mse", rho=0.3), KLDROBatchLSE("mse", lam=2.0), KLDROSumExp("mse", lam=20.0)],
    ids=["cvar", "kl_dro_batch_lse", "kl_dro_sumexp"],
)
def test_baselines_mirrored_fit_matches_single_device(loss):
    """Issue 10 item 6: every DRO baseline has global-batch semantics under MirroredStrategy
    (before: per-replica risks, first-step loss off by 0.7% for cvar)."""
    X, y = _data(64)
    single, mirrored = assert_mirrored_matches_single(
        _linear, X, y, loss, steps=3, atol=1e-6, rtol=1e-5, learning_rate=0.02
    )
    # the logged loss is the global-batch risk as well
    hs = single.evaluate(X, y, batch_size=64, verbose=0)
    hm = mirrored.evaluate(X, y, batch_size=64, verbose=0)
    np.testing.assert_allclose(hm, hs, rtol=1e-5)


def _per_replica_risks(loss, l_parts, s_parts):
    """Run ``loss._risk`` on per-replica losses of unequal sizes; return the replicas'
    values and their gradients w.r.t. their own losses."""
    from tests.helpers import _mirrored_strategy

    devices = tuple(d.name for d in tf.config.list_logical_devices("CPU")[:2])
    strategy = _mirrored_strategy(devices)
    l_in = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(l_parts[ctx.replica_id_in_sync_group], tf.float32)
    )
    s_in = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(s_parts[ctx.replica_id_in_sync_group], tf.float32)
    )

    @tf.function
    def step(l, s):
        with tf.GradientTape() as tape:
            tape.watch(l)
            v = loss._risk(l, s)
        return v, tape.gradient(v, l)

    vals, grads = strategy.run(step, (l_in, s_in))
    return (
        [float(v.numpy()) for v in strategy.experimental_local_results(vals)],
        [g.numpy() for g in strategy.experimental_local_results(grads)],
    )


@pytest.mark.parametrize("name", ["cvar", "kl_dro_batch_lse", "kl_dro_sumexp", "safe_kl_dro"])
def test_uneven_replica_split_matches_one_device_value_and_gradient(name):
    """Replicas holding 3 and 6 examples (a ragged last batch): the replicas' values sum to
    the one-device risk and their gradients are the one-device gradient's slices."""
    rng = np.random.default_rng(5)
    l = rng.gamma(2.0, size=9).astype("float32")
    l[4] = l[7]  # a tie across replicas (CVaR's tail mass must split like one device)
    s = rng.uniform(0.5, 2.0, size=9).astype("float32")
    parts = (slice(0, 3), slice(3, 9))
    if name == "safe_kl_dro":

        def build():
            return SafeKLDRORisk(
                "mse",
                lam=0.7,
                rho=0.2,
                init_alpha_from_batch=False,
                alpha_init=1.5,
                update_alpha=False,
            )

        def single(lt, st):
            return ops.safe_kl_dro_risk(lt, 1.5, 0.7, 0.2, st)
    else:
        cls, kw, op = {
            "cvar": (CVaRLoss, {"rho": 0.35}, lambda a, b: ops.cvar_risk(a, 0.35, b)),
            "kl_dro_batch_lse": (
                KLDROBatchLSE,
                {"lam": 0.7},
                lambda a, b: ops.kl_dro_batch_lse(a, 0.7, b),
            ),
            "kl_dro_sumexp": (KLDROSumExp, {"lam": 3.0}, lambda a, b: ops.kl_dro_sumexp(a, 3.0, b)),
        }[name]

        def build():
            return cls("mse", **kw)

        single = op
    from tests.helpers import _mirrored_strategy

    with _mirrored_strategy(
        tuple(d.name for d in tf.config.list_logical_devices("CPU")[:2])
    ).scope():
        loss = build()
    vals, grads = _per_replica_risks(loss, [l[p] for p in parts], [s[p] for p in parts])
    lt = tf.constant(l)
    with tf.GradientTape() as tape:
        tape.watch(lt)
        ref = single(lt, tf.constant(s))
    g_ref = tape.gradient(ref, lt).numpy()
    np.testing.assert_allclose(sum(vals), float(ref), rtol=2e-6)
    np.testing.assert_allclose(np.concatenate(grads), g_ref, rtol=2e-6, atol=1e-7)


def _tf_keras_and_keras3_fit(loss_name, epochs=3, **config):
    """Train the same linear model with the same SGD steps in tf_keras (through
    ``losszoo.tf_keras_loss``) and in Keras 3; return both models and losses."""
    import tf_keras

    X, y = _data(64)
    k3 = _linear()
    w0 = k3.get_weights()
    loss3 = losszoo.registry.get_class(loss_name, "loss")("mse", **config)
    k3.compile(keras.optimizers.SGD(0.02), loss=loss3)
    k3.fit(X, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0)

    k2 = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(1)])
    k2.set_weights(w0)
    loss2 = losszoo.tf_keras_loss(loss_name, base_loss="mse", **config)
    k2.compile(tf_keras.optimizers.SGD(0.02), loss=loss2)
    k2.fit(X, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0)
    return (k3, loss3), (k2, loss2), (X, y, w0)


def test_tf_keras_adapter_trains_alpha_like_keras3():
    """Issue 10 item 2: under tf_keras (and so TFRS) alpha is trained, not frozen at
    alpha_init; the trajectory equals Keras 3's step for step; evaluate leaves alpha alone."""
    (k3, loss3), (k2, loss2), (X, y, w0) = _tf_keras_and_keras3_fit(
        "safe_kl_dro", lam=1.0, rho=0.2, alpha_init=0.0
    )
    alpha3, alpha2 = float(loss3.alpha.numpy()), float(loss2.losszoo_loss.alpha.numpy())
    assert abs(alpha2) > 1e-3, "alpha stayed at alpha_init under tf_keras"
    np.testing.assert_allclose(alpha2, alpha3, rtol=1e-5)
    for a, b in zip(k2.get_weights(), k3.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert max(np.max(np.abs(a - b)) for a, b in zip(k2.get_weights(), w0)) > 1e-3
    before = float(loss2.losszoo_loss.alpha.numpy())
    got = k2.evaluate(X, y, batch_size=64, verbose=0)
    assert float(loss2.losszoo_loss.alpha.numpy()) == before
    # evaluate reports the risk at the current alpha (the spec's oracle, float64)
    l = _sq_losses(k3, X, y)
    np.testing.assert_allclose(got, R.safe_risk(l, before, 1.0, 0.2)[0], rtol=1e-4)
    # the config carries the trained alpha (a saved tf_keras model resumes from it)
    assert loss2.get_config()["alpha_init"] == pytest.approx(before)


@pytest.mark.parametrize(
    "name,config", [("cvar", {"rho": 0.3}), ("kl_dro_batch_lse", {"lam": 2.0})]
)
def test_tf_keras_adapter_computes_the_batch_risk_not_erm(name, config):
    """Before, tf_keras averaged the per-example base losses (ERM) for the baselines."""
    (k3, _), (k2, _), (X, y, _) = _tf_keras_and_keras3_fit(name, epochs=2, **config)
    for a, b in zip(k2.get_weights(), k3.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    l = _sq_losses(k3, X, y)
    ref = R.cvar(l, 0.3) if name == "cvar" else R.batch_lse_risk(l, 2.0)
    got = k2.evaluate(X, y, batch_size=64, verbose=0)
    np.testing.assert_allclose(got, ref, rtol=1e-4)
    assert abs(got - float(np.mean(l))) > 1e-2 * abs(float(np.mean(l)))  # not ERM
