"""Backend-neutral test tools: values, gradients and compiled calls on the running backend.

Each backend's own machinery, nothing of losszoo's: ``tf.GradientTape`` / ``tf.function``,
``jax.grad`` / ``jax.jit``, ``torch.autograd``. Inputs are numpy arrays; results come back as
numpy arrays.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from losszoo._backend import enable_float64

BACKEND = keras.backend.backend()
MODES = ("eager", "graph", "xla") if BACKEND == "tensorflow" else ("eager", "jit")
"""Ways a function runs: TensorFlow eager / tf.function / jit_compile=True; JAX eager /
jax.jit; PyTorch eager / (``jit``) torch's eager path again (Keras' torch ``jit_compile`` is
torch.compile, which is not part of the contract here)."""


def numpy(x):
    """``x`` (a tensor, or a tuple of them) as numpy."""
    if isinstance(x, (tuple, list)):
        return type(x)(numpy(v) for v in x)
    return np.asarray(ops.convert_to_numpy(x))


def compiled(fn, mode: str):
    """``fn`` run in ``mode`` (one of :data:`MODES`)."""
    if mode == "eager":
        return fn
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=mode == "xla", reduce_retracing=True)
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    return fn


def value_and_grad(fn, *args, mode: str = "eager", argnums=(0,)):
    """``(fn(*args), [d sum(fn * upstream) / d args[i] for i in argnums])`` as numpy.

    ``upstream`` is a fixed random weighting of ``fn``'s output (so that every output entry
    matters); ``fn`` returns one tensor.
    """
    args = [np.asarray(a) for a in args]
    probe = numpy(fn(*args))
    upstream = np.random.default_rng(7).uniform(0.5, 1.5, size=probe.shape).astype(probe.dtype)

    def objective(*xs):
        return ops.sum(
            ops.cast(fn(*xs), "float64" if probe.dtype == np.float64 else "float32") * upstream
        )

    if BACKEND == "tensorflow":
        import tensorflow as tf

        def run(*xs):
            xs = [tf.convert_to_tensor(x) for x in xs]
            with tf.GradientTape() as tape:
                for i in argnums:
                    tape.watch(xs[i])
                out = fn(*xs)
                total = ops.sum(
                    ops.cast(out, "float64" if probe.dtype == np.float64 else "float32") * upstream
                )
            return out, tape.gradient(total, [xs[i] for i in argnums])

        out, grads = compiled(run, mode)(*args)
        return numpy(out), [numpy(g) for g in grads]
    if BACKEND == "jax":
        import jax

        def run(*xs):
            out = fn(*xs)
            grads = jax.grad(objective, argnums=argnums)(*xs)
            return out, grads

        out, grads = compiled(run, mode)(*args)
        return numpy(out), [numpy(g) for g in grads]
    import torch

    xs = [torch.tensor(a) for a in args]
    for i in argnums:
        xs[i].requires_grad_(True)
    out = fn(*xs)
    total = torch.sum(
        out.to(torch.float64 if probe.dtype == np.float64 else torch.float32)
        * torch.tensor(upstream)
    )
    grads = torch.autograd.grad(total, [xs[i] for i in argnums], allow_unused=True)
    return numpy(out.detach()), [
        np.zeros_like(args[i]) if g is None else g.detach().numpy() for i, g in zip(argnums, grads)
    ]


def finite_difference(fn, x, upstream_fn=None, eps=1e-6):
    """Central differences of ``sum(fn(x) * upstream)`` in float64 (``upstream`` as in
    :func:`value_and_grad`)."""
    x = np.asarray(x, np.float64)
    probe = np.asarray(numpy(fn(x)))
    upstream = np.random.default_rng(7).uniform(0.5, 1.5, size=probe.shape)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[i] = eps
        g[i] = (np.sum(numpy(fn(x + step)) * upstream) - np.sum(numpy(fn(x - step)) * upstream)) / (
            2 * eps
        )
    return g


# Float64 available inside a block (JAX: ``jax_enable_x64`` on, then restored).
float64 = enable_float64


# ------------------------------------------------ added for the folded method suites (issue 32)
TRACED_MODES = tuple(m for m in MODES if m == "xla" or (m == "jit" and BACKEND == "jax"))
"""The modes without runtime checks (XLA, ``jax.jit``): bad values come back as NaN rows."""


def errors():
    """The exception types a checked mode raises for bad values: ``ValueError`` / ``TypeError``
    and, in a TensorFlow graph, ``tf.errors.InvalidArgumentError``."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return (ValueError, TypeError, tf.errors.InvalidArgumentError)
    return (ValueError, TypeError)


def upstream(shape):
    """The fixed weighting :func:`value_and_grad` applies to ``fn``'s output (float64)."""
    return np.random.default_rng(7).uniform(0.5, 1.5, size=shape)


def jacobian(fn, x, mode: str = "eager"):
    """The Jacobian ``d fn(x)[i] / d x[j]`` (``[m, n]``, numpy) of a function of a vector ``x``
    (``[n]``) that maps the rows of a batch independently (it acts on the last axis): each
    output entry's gradient is taken from its own copy of ``x`` in one batched call."""
    x = np.asarray(x)
    m = numpy(fn(x[None]))[0].shape[-1]
    pick = np.eye(m, dtype=x.dtype)
    _, (g,) = value_and_grad(
        lambda xs: ops.sum(fn(xs) * ops.convert_to_tensor(pick), axis=-1),
        np.tile(x, (m, 1)),
        mode=mode,
    )
    return g / upstream((m,))[:, None]


def classification_data(n=256, k=6, d=10, seed=0):
    """Features ``[n, d]`` and class ids ``[n]`` from a random linear teacher (learnable)."""
    r = np.random.default_rng(seed)
    x = r.normal(size=(n, d)).astype(np.float32)
    return x, np.argmax(x @ r.normal(size=(d, k)), axis=1)


def small_mlp(k=6, d=10):
    """A tiny MLP emitting ``k`` logits."""
    return keras.Sequential(
        [keras.Input((d,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(k)]
    )


def assert_fit_smoke(model, x, y, epochs=3, **fit_kwargs):
    """``model.fit`` runs with finite losses that go down; returns the History."""
    fit_kwargs.setdefault("verbose", 0)
    history = model.fit(x, y, epochs=epochs, **fit_kwargs)
    losses = np.asarray(history.history["loss"])
    assert np.all(np.isfinite(losses)), f"non-finite training loss: {losses}"
    assert losses[-1] < losses[0], f"training loss did not decrease: {losses}"
    return history


def assert_config_roundtrip(obj):
    """``get_config``/``from_config``, Keras (de)serialization via JSON, and the registry name."""
    import json

    import losszoo

    config = obj.get_config()
    assert type(obj).from_config(config).get_config() == config, "from_config changed the config"
    serialized = json.loads(json.dumps(keras.saving.serialize_keras_object(obj)))
    restored = keras.saving.deserialize_keras_object(serialized)
    assert type(restored) is type(obj), f"deserialized as {type(restored)}"
    assert restored.get_config() == config, "Keras serialization changed the config"
    entry = next((e for e in losszoo.entries() if e.cls is type(obj)), None)
    assert entry is not None, f"{type(obj).__name__} is not registered in losszoo"
    assert losszoo.get_class(entry.name, entry.kind).from_config(config).get_config() == config
    return restored


def assert_mixed_precision(build_model, x, y, loss, epochs=2, batch_size=32):
    """Under ``mixed_float16`` the model trains with finite losses; the loss value is float32,
    and so are the outputs of a model ending in a losszoo head. Returns ``(model, history)``."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = build_model()
        if isinstance(loss, keras.losses.Loss):
            loss = type(loss).from_config(loss.get_config())
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
        history = model.fit(x, y, epochs=epochs, batch_size=batch_size, verbose=0)
        assert np.all(np.isfinite(history.history["loss"])), history.history
        loss_obj = keras.losses.get(loss)
        preds = model(x[:8])
        if isinstance(loss_obj, keras.losses.Loss):
            value = loss_obj(y[:8], preds)
            assert keras.backend.standardize_dtype(value.dtype) == "float32", value.dtype
        if type(model.layers[-1]).__module__.startswith("losszoo."):
            assert keras.backend.standardize_dtype(preds.dtype) == "float32", preds.dtype
        return model, history
    finally:
        keras.mixed_precision.set_global_policy(previous)
