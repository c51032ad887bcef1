"""Compiled value-and-gradient programs built once and reused (issue 32: CI time).

``tests/harness.py``'s :func:`~tests.harness.value_and_grad` builds a new ``tf.function`` /
``jax.jit`` at every call (a new XLA program: seconds of compile on the 2-core machine) and
first runs ``fn`` eagerly to learn the output's shape. :class:`ValueAndGrad` is built once (keep
it at module level) and takes the upstream weighting as an argument, so every call with inputs
of the same shapes and dtypes reuses one program.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from tests.harness import BACKEND, compiled, numpy


class ValueAndGrad:
    """``run(upstream, *args) -> (fn(*args), [d sum(fn(*args) * upstream) / d args[i] for i
    in argnums])`` as numpy, in ``mode`` (one of ``tests.harness.MODES``), compiled on first
    use and then reused for every call of the same input signature. ``fn`` returns one tensor
    of ``upstream``'s shape; the sum is taken in ``upstream``'s dtype (float32 or float64).

    ``signature``: on TensorFlow, ``[(shape, dtype), ...]`` of ``(upstream, *args)`` for the
    ``tf.function``'s ``input_signature`` (``None`` sizes: unknown when the program is
    built); ignored on the other backends."""

    def __init__(self, fn, mode: str, argnums=(0,), signature=None):
        self.fn, self.mode, self.argnums = fn, mode, tuple(argnums)
        self.signature = signature
        self._run = None

    def _build(self):
        fn, argnums = self.fn, self.argnums
        if BACKEND == "tensorflow":
            import tensorflow as tf

            def run(upstream, *xs):
                xs = [tf.convert_to_tensor(x) for x in xs]
                with tf.GradientTape() as tape:
                    for i in argnums:
                        tape.watch(xs[i])
                    out = fn(*xs)
                    total = ops.sum(ops.cast(out, upstream.dtype) * upstream)
                return out, tape.gradient(total, [xs[i] for i in argnums])

            if self.signature is None or self.mode == "eager":
                return compiled(run, self.mode)
            return tf.function(
                run,
                input_signature=[tf.TensorSpec(s, d) for s, d in self.signature],
                jit_compile=self.mode == "xla",
            )
        if BACKEND == "jax":
            import jax

            def run(upstream, *xs):
                def objective(*xs):
                    return ops.sum(ops.cast(fn(*xs), upstream.dtype) * upstream)

                return fn(*xs), jax.grad(objective, argnums=argnums)(*xs)

            return compiled(run, self.mode)
        import torch

        def run(upstream, *xs):
            xs = [torch.tensor(x) for x in xs]
            for i in argnums:
                xs[i].requires_grad_(True)
            out = fn(*xs)
            up = torch.tensor(upstream)
            total = torch.sum(out.to(up.dtype) * up)
            grads = torch.autograd.grad(total, [xs[i] for i in argnums], allow_unused=True)
            grads = [torch.zeros_like(xs[i]) if g is None else g for i, g in zip(argnums, grads)]
            return out.detach(), [g.detach() for g in grads]

        return run

    def __call__(self, upstream, *args):
        if self._run is None:
            self._run = self._build()
        out, grads = self._run(np.asarray(upstream), *[np.asarray(a) for a in args])
        return numpy(out), [numpy(g) for g in grads]
