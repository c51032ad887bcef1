"""Checks shared by every method's tests: references, gradients, XLA, config, training."""

from __future__ import annotations

import functools

import keras
import numpy as np
import tensorflow as tf

from tests.contract import assert_nests_close, weighted_output_sum  # noqa: F401 (one copy)
from tests.harness import (  # noqa: F401 (one copy: the backend-neutral versions)
    assert_config_roundtrip,
    assert_fit_smoke,
    assert_mixed_precision,
    classification_data,
    small_mlp,
)
from tests.references import REPO_ROOT, SPECS_DIR, load_reference  # noqa: F401


def _as_float64(args):
    out = []
    for a in args:
        if isinstance(a, (tf.Tensor, tf.Variable)) and not a.dtype.is_floating:
            out.append(a)
        elif isinstance(a, np.ndarray) and not np.issubdtype(a.dtype, np.floating):
            out.append(tf.constant(a))
        elif isinstance(a, (int, bool)) or a is None:
            out.append(a)
        else:
            out.append(tf.constant(np.asarray(a, np.float64)))
    return out


def _weights_like(outputs, seed):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=o.shape) for o in outputs]


def _float_outputs(out):
    return [o for o in tf.nest.flatten(out) if o is not None and o.dtype.is_floating]


def assert_grad_matches_fd(f, args, wrt=(0,), eps=1e-6, atol=1e-6, rtol=1e-5, seed=0):
    """The tape gradient of ``sum(w * f(*args))`` matches central finite differences.

    ``f`` is evaluated on float64 tensors; ``w`` is a fixed random weighting of every
    floating output, so the check covers the whole vector-Jacobian product.
    """
    args = _as_float64(args)
    weights = _weights_like(_float_outputs(f(*args)), seed)

    def scalar(*a):
        return sum(
            tf.reduce_sum(tf.constant(w) * tf.cast(o, tf.float64))
            for w, o in zip(weights, _float_outputs(f(*a)))
        )

    watched = [args[i] for i in wrt]
    with tf.GradientTape() as tape:
        tape.watch(watched)
        value = scalar(*args)
    grads = tape.gradient(value, watched)
    for i, grad in zip(wrt, grads):
        x = args[i].numpy()
        numeric = np.zeros_like(x)
        for j in np.ndindex(x.shape):
            plus, minus = x.copy(), x.copy()
            plus[j] += eps
            minus[j] -= eps
            a_plus, a_minus = list(args), list(args)
            a_plus[i], a_minus[i] = tf.constant(plus), tf.constant(minus)
            numeric[j] = (scalar(*a_plus).numpy() - scalar(*a_minus).numpy()) / (2 * eps)
        analytic = np.zeros_like(x) if grad is None else tf.convert_to_tensor(grad).numpy()
        np.testing.assert_allclose(
            analytic,
            numeric,
            atol=atol,
            rtol=rtol,
            err_msg=f"gradient w.r.t. argument {i} differs from finite differences",
        )


def assert_grad_matches_reference(f, f_ref, args, wrt=(0,), atol=1e-6, rtol=1e-6, seed=0):
    """The custom gradient of ``f`` matches autodiff through a plain-TF reference ``f_ref``."""
    args = _as_float64(args)
    weights = _weights_like(_float_outputs(f(*args)), seed)

    def grads_of(fn):
        watched = [args[i] for i in wrt]
        with tf.GradientTape() as tape:
            tape.watch(watched)
            outs = _float_outputs(fn(*args))
            value = sum(
                tf.reduce_sum(tf.constant(w) * tf.cast(o, tf.float64))
                for w, o in zip(weights, outs)
            )
        return tape.gradient(value, watched)

    for i, got, want in zip(wrt, grads_of(f), grads_of(f_ref)):
        np.testing.assert_allclose(
            np.asarray(got),
            np.asarray(want),
            atol=atol,
            rtol=rtol,
            err_msg=f"gradient w.r.t. argument {i} differs from the reference's autodiff",
        )


def assert_xla_matches_eager(f, *args, atol=1e-6, rtol=1e-6, grad_wrt=(0,)):
    """Outputs (any nest) and gradients of ``f`` agree eagerly and under ``jit_compile=True``."""
    args = [tf.convert_to_tensor(a) if isinstance(a, (np.ndarray, list)) else a for a in args]

    def run(*a):
        watched = [a[i] for i in grad_wrt]
        with tf.GradientTape() as tape:
            tape.watch(watched)
            out = f(*a)
            value = weighted_output_sum(out)
        grads = tape.gradient(value, watched) if grad_wrt else []
        return out, grads

    eager = run(*args)
    compiled = tf.function(run, jit_compile=True)(*args)
    assert_nests_close(compiled, eager, atol=atol, rtol=rtol, err_msg="XLA differs from eager")


def _fresh_loss(loss):
    if isinstance(loss, keras.losses.Loss):
        return type(loss).from_config(loss.get_config())
    return loss


@functools.cache
def _mirrored_strategy(devices):
    # One strategy per process: several MirroredStrategy instances in one process can mix up
    # their collective-op instance keys. Reducing through one device avoids collectives.
    return tf.distribute.MirroredStrategy(
        list(devices), cross_device_ops=tf.distribute.ReductionToOneDevice()
    )


def assert_mirrored_matches_single(
    build_model, x, y, loss, steps=3, atol=1e-5, rtol=1e-4, learning_rate=0.1
):
    """MirroredStrategy over 2 logical CPUs trains exactly like one device.

    Both runs start from the same weights and take ``steps`` full-batch SGD steps on the
    same global batch; the final weights must agree.
    """
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
    assert len(devices) == 2, "tests/conftest.py should have created 2 logical CPUs"
    keras.utils.set_random_seed(0)
    single = build_model()
    initial = single.get_weights()
    single.compile(optimizer=keras.optimizers.SGD(learning_rate), loss=_fresh_loss(loss))
    single.fit(x, y, batch_size=len(x), epochs=steps, shuffle=False, verbose=0)

    strategy = _mirrored_strategy(tuple(devices))
    with strategy.scope():
        mirrored = build_model()
        mirrored.set_weights(initial)
        mirrored.compile(optimizer=keras.optimizers.SGD(learning_rate), loss=_fresh_loss(loss))
    mirrored.fit(x, y, batch_size=len(x), epochs=steps, shuffle=False, verbose=0)

    for a, b in zip(single.get_weights(), mirrored.get_weights()):
        np.testing.assert_allclose(
            b, a, atol=atol, rtol=rtol, err_msg="MirroredStrategy training differs from one device"
        )
    moved = max(np.max(np.abs(a - b)) for a, b in zip(single.get_weights(), initial))
    assert moved > 1e-4, "training did not change the weights; the comparison is vacuous"
    return single, mirrored


# In-batch retrieval: the class axis is the batch axis, unknown when tracing (issue 10 item 4).
DYNAMIC_IDS_SIGNATURE = [tf.TensorSpec([None], tf.float32), tf.TensorSpec([None, None], tf.float32)]


def dynamic_loss_and_grad(loss, jit):
    """``run(ids, scores) -> (per-example losses, d sum / d scores)`` traced once with an
    unknown batch and class count (``[None]`` ids, ``[None, None]`` scores)."""

    @tf.function(input_signature=DYNAMIC_IDS_SIGNATURE, jit_compile=jit)
    def run(y, s):
        with tf.GradientTape() as tape:
            tape.watch(s)
            values = loss(y, s)
            total = tf.reduce_sum(values)
        return values, tape.gradient(total, s)

    return run
