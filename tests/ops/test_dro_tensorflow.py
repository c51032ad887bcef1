"""Safe-KL DRO risk ops: the checks that need TensorFlow itself. The backend-neutral tests
are in ``tests/ops/test_dro.py``; ``keras.distribution.DataParallel`` on JAX:
``tests/distributed/test_data_parallel.py``."""

import math

import numpy as np
import pytest
import tensorflow as tf

from losszoo import ops
from tests.helpers import load_reference

pytestmark = pytest.mark.tensorflow_only(
    reason="tf.map_fn over 6,000 batches in one graph; tf.distribute.MirroredStrategy replicas"
)

R = load_reference("safe_kl_dro")


# ----------------------------------------------------------------------------- C6 Monte Carlo
def test_minibatch_gradient_unbiased_naive_biased():
    """Fixed theta, alpha: the safe-KL batch gradient (from the op) averages to the full-data
    gradient; the naive batch-LSE gradient is far off on the same batches (spec C6)."""
    rng = np.random.default_rng(0)
    n, d, lam, rho, B, K = 2000, 5, 2.0, 1e-3, 10, 6000
    X = rng.normal(size=(n, d))
    y = X @ rng.normal(size=d) + rng.standard_t(3, size=n)
    th = rng.normal(size=d) * 0.3
    alpha = R.solve_alpha((y - X @ th) ** 2, lam, rho) + 0.3
    idx = np.stack([rng.choice(n, B, replace=False) for _ in range(K)])
    Xb, yb = tf.constant(X[idx]), tf.constant(y[idx])
    theta = tf.constant(th)

    @tf.function
    def grads(op):
        def one(args):
            xb, ybb = args
            a = tf.constant(alpha, tf.float64)
            with tf.GradientTape() as tape:
                tape.watch([theta, a])
                losses = (ybb - tf.linalg.matvec(xb, theta)) ** 2
                v = op(losses, a)
            g_t, g_a = tape.gradient(v, [theta, a], unconnected_gradients="zero")
            return tf.concat([g_t, [g_a]], 0), v

        return tf.map_fn(
            one, (Xb, yb), fn_output_signature=(tf.float64, tf.float64), parallel_iterations=64
        )

    gs, vs = grads(lambda l, a: ops.safe_kl_dro_risk(l, a, lam, rho))
    gs, vs = gs.numpy(), vs.numpy()
    res = y - X @ th
    w = R.safe_terms(res**2, alpha, lam, rho)[1]
    full = np.append(np.mean((w * -2 * res)[:, None] * X, 0), 1 - w.mean())
    zs = (gs.mean(0) - full) / (gs.std(0) / math.sqrt(K))
    assert np.max(np.abs(zs)) < 4.5, zs
    v_full = R.safe_risk(res**2, alpha, lam, rho)[0]
    assert abs(vs.mean() - v_full) < 4.5 * vs.std() / math.sqrt(K)

    gn, vn = grads(lambda l, a: ops.kl_dro_batch_lse(l, lam) + 0.0 * a)
    gn, vn = gn.numpy()[:, :d], vn.numpy()
    full_r = np.sum((R.gibbs_weights(res**2, lam) * -2 * res)[:, None] * X, 0)
    zn = (gn.mean(0) - full_r) / (gn.std(0) / math.sqrt(K))
    assert np.max(np.abs(zn)) > 10, zn
    assert vn.mean() < R.exact_risk(res**2, lam)  # Jensen: the naive value is biased low


# ----------------------------------------------------------------------------- global batch
_GLOBAL = {
    "cvar": (ops.cvar_risk_global, ops.cvar_risk, 0.35),
    "batch_lse": (ops.kl_dro_batch_lse_global, ops.kl_dro_batch_lse, 0.7),
    "sumexp": (ops.kl_dro_sumexp_global, ops.kl_dro_sumexp, 3.0),
}


def _on_replicas(fn, l_parts, s_parts):
    """``fn(l, s)`` on 2 replicas holding ``l_parts[i]``; each replica's outputs and its
    gradient of the first output w.r.t. its own losses."""
    from tests.helpers import _mirrored_strategy

    strategy = _mirrored_strategy(tuple(d.name for d in tf.config.list_logical_devices("CPU")[:2]))

    def per_replica(parts):
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(parts[ctx.replica_id_in_sync_group], tf.float32)
        )

    @tf.function
    def step(l, s):
        with tf.GradientTape() as tape:
            tape.watch(l)
            out = fn(l, s)
        return out, tape.gradient(tf.nest.flatten(out)[0], l)

    outs, grads = strategy.run(step, (per_replica(l_parts), per_replica(s_parts)))
    local = strategy.experimental_local_results
    return [tf.nest.map_structure(np.asarray, o) for o in local(outs)], [
        g.numpy() for g in local(grads)
    ]


def _uneven_batch():
    rng = np.random.default_rng(5)
    l = rng.gamma(2.0, size=9).astype("float32")
    l[4] = l[7]  # a tie across replicas (CVaR's tail mass must split like one device)
    s = rng.uniform(0.5, 2.0, size=9).astype("float32")
    return l, s, (slice(0, 3), slice(3, 9))


def _one_device(fn, l, s):
    lt = tf.constant(l)
    with tf.GradientTape() as tape:
        tape.watch(lt)
        out = fn(lt, tf.constant(s))
    return out, tape.gradient(tf.nest.flatten(out)[0], lt).numpy()


@pytest.mark.parametrize("name", sorted(_GLOBAL))
def test_global_baseline_ops_on_uneven_replicas_match_one_device(name):
    """Replicas holding 3 and 6 examples: the replicas' values sum to the one-device op and
    their gradients are its slices; on one device the global op is the op itself."""
    global_op, op, hyper = _GLOBAL[name]
    l, s, parts = _uneven_batch()
    ref, g_ref = _one_device(lambda a, b: op(a, hyper, b), l, s)
    same, g_same = _one_device(lambda a, b: global_op(a, hyper, b), l, s)
    np.testing.assert_array_equal(same.numpy(), ref.numpy())
    np.testing.assert_array_equal(g_same, g_ref)
    vals, grads = _on_replicas(
        lambda a, b: global_op(a, hyper, b), [l[p] for p in parts], [s[p] for p in parts]
    )
    np.testing.assert_allclose(sum(vals), float(ref), rtol=2e-6)
    np.testing.assert_allclose(np.concatenate(grads), g_ref, rtol=2e-6, atol=1e-7)


def test_global_sumexp_overflow_gives_nan_gradients_on_every_replica():
    """As on one device: once the global value is not finite (exp(1000 / 0.7) overflows
    float32 on the second replica), every replica's gradient is NaN, not inf or finite."""
    l = np.array([1.0, 2.0, 1000.0, 0.5], np.float32)
    s = np.ones(4, np.float32)
    vals, grads = _on_replicas(
        lambda a, b: ops.kl_dro_sumexp_global(a, 0.7, b), [l[:2], l[2:]], [s[:2], s[2:]]
    )
    assert all(np.isposinf(v) for v in vals), vals
    assert all(np.all(np.isnan(g)) for g in grads), grads


def test_global_safe_kl_on_uneven_replicas_matches_one_device():
    """The safe-KL global risk: values sum to the one-device risk, gradients are its slices,
    every replica reports the global statistics, and ``solve_alpha`` solves the global batch
    (the all-gathered losses), not the replica's own."""
    from losszoo.ops.distribute import safe_kl_dro_risk_and_stats_global

    l, s, parts = _uneven_batch()
    lam, rho, alpha = 0.7, 0.2, 1.5
    (ref, ref_stats), g_ref = _one_device(
        lambda a, b: ops.safe_kl_dro_risk_and_stats(a, alpha, lam, rho, b), l, s
    )
    a_star = float(ops.safe_kl_dro_solve_alpha(l, lam, rho, s))

    def glob(solve):
        return lambda a, b: safe_kl_dro_risk_and_stats_global(
            a, tf.constant(alpha), lam, rho, b, solve_alpha=tf.constant(solve)
        )

    outs, grads = _on_replicas(glob(False), [l[p] for p in parts], [s[p] for p in parts])
    np.testing.assert_allclose(sum(v for v, _ in outs), float(ref), rtol=2e-6)
    np.testing.assert_allclose(np.concatenate(grads), g_ref, rtol=2e-6, atol=1e-7)
    for _, stats in outs:
        for key in ("mean_w", "saturation", "curvature", "grad_alpha"):
            np.testing.assert_allclose(stats[key], ref_stats[key].numpy(), rtol=2e-6)
        np.testing.assert_allclose(stats["total_weight"], s.sum(), rtol=1e-6)
        assert float(stats["alpha"]) == alpha
    outs, _ = _on_replicas(glob(True), [l[p] for p in parts], [s[p] for p in parts])
    own = float(ops.safe_kl_dro_solve_alpha(l[parts[0]], lam, rho, s[parts[0]]))
    assert abs(own - a_star) > 1e-2  # the replica's own batch would give another alpha
    for _, stats in outs:
        np.testing.assert_allclose(float(stats["alpha"]), a_star, rtol=1e-6)
