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
