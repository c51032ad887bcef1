"""Timing harness: forward+backward medians and ratios against anchors run in the same process.

A benchmark module ``benchmarks/bench_<name>.py`` exposes ``cases(quick: bool) -> list[Case]``.
Each :class:`Case` times ``fn(*inputs)`` plus the gradient of its (summed) value with respect
to ``inputs[i]`` for ``i in wrt``, and does the same for every anchor, so every ratio compares
numbers measured seconds apart on the same machine. It runs on the Keras backend that
``KERAS_BACKEND`` names, in that backend's modes (:data:`MODES`): TensorFlow ``graph``
(``tf.function``) and ``xla`` (``jit_compile=True``), JAX ``jit`` (``jax.jit``), PyTorch
``eager``.
"""

from __future__ import annotations

import dataclasses
import platform
import statistics
import time
from collections.abc import Callable, Sequence

import keras
import numpy as np
from keras import ops

BACKEND = keras.backend.backend()
MODES = {"tensorflow": ("graph", "xla"), "jax": ("jit",), "torch": ("eager",)}[BACKEND]


@dataclasses.dataclass
class Case:
    """One benchmark row group.

    Attributes:
      op: name of the measured op, e.g. ``"sparsemax_loss"``.
      shape: human-readable shape, e.g. ``"256x1000"``.
      fn: ``fn(*inputs) -> tensor``; its sum is differentiated.
      inputs: zero-argument callable building the inputs (numpy arrays or tensors; called
        once and converted to the backend's tensors).
      anchors: name -> function with the same signature, timed the same way.
      wrt: indices of the inputs to differentiate with respect to (empty: forward only).
      modes: which of the backend's modes (:data:`MODES`) to run; None: all of them.
      target: the acceptance target in words, printed beside the ratios.
      repeats: timed calls per measurement (the median is reported).
    """

    op: str
    shape: str
    fn: Callable
    inputs: Callable[[], Sequence]
    anchors: dict[str, Callable] = dataclasses.field(default_factory=dict)
    wrt: tuple[int, ...] = (0,)
    modes: tuple[str, ...] | None = None
    target: str = ""
    repeats: int = 20


def _summed(fn):
    return lambda *inputs: ops.sum(ops.cast(fn(*inputs), "float32"))


def forward_backward(fn: Callable, wrt: tuple[int, ...]) -> Callable:
    """Wrap ``fn`` so one call computes its summed value and the gradients w.r.t. ``wrt``."""
    total = _summed(fn)
    if not wrt:
        return total
    if BACKEND == "tensorflow":
        import tensorflow as tf

        def step(*inputs):
            watched = [inputs[i] for i in wrt]
            with tf.GradientTape() as tape:
                tape.watch(watched)
                value = total(*inputs)
            return value, tape.gradient(value, watched)

        return step
    if BACKEND == "jax":
        import jax

        return jax.value_and_grad(total, argnums=wrt)

    import torch

    def step(*inputs):
        inputs = [x.detach().requires_grad_(i in wrt) for i, x in enumerate(inputs)]
        value = total(*inputs)
        return value, torch.autograd.grad(value, [inputs[i] for i in wrt], allow_unused=True)

    return step


def compile_step(step: Callable, mode: str) -> Callable:
    """``step`` compiled for ``mode``."""
    if mode in ("graph", "xla"):
        import tensorflow as tf

        return tf.function(step, jit_compile=mode == "xla")
    if mode == "jit":
        import jax

        return jax.jit(step)
    return step


def _wait(out) -> None:
    """Block until ``out`` is computed (TF: fetch one element; JAX: block_until_ready;
    PyTorch: synchronize the GPU when there is one)."""
    leaves = keras.tree.flatten(out)
    if BACKEND == "jax":
        for t in leaves:
            if t is not None:
                t.block_until_ready()
    elif BACKEND == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
    else:  # TensorFlow's own ops: keras.ops would add eager overhead to every timed call
        import tensorflow as tf

        for t in leaves:
            if t is not None:
                tf.reshape(t, [-1])[:1].numpy()


def median_time(step: Callable, inputs: Sequence, repeats: int) -> float:
    """Median wall time in seconds of ``step(*inputs)`` after two warm-up calls."""

    def run():
        _wait(step(*inputs))

    run()
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(case: Case) -> list[dict]:
    """Time a case and its anchors in each mode; returns one row per (mode, function)."""
    inputs = [ops.convert_to_tensor(x) for x in case.inputs()]
    rows = []
    for mode in case.modes or MODES:
        if mode not in MODES:
            continue
        timed = {}
        for name, fn in [(case.op, case.fn), *case.anchors.items()]:
            step = compile_step(forward_backward(fn, case.wrt), mode)
            timed[name] = median_time(step, inputs, case.repeats)
        base = timed[case.op]
        rows.append(
            {
                "op": case.op,
                "shape": case.shape,
                "mode": f"{BACKEND}:{mode}",
                "ms": base * 1e3,
                "ratios": {a: base / timed[a] for a in case.anchors},
                "anchor_ms": {a: timed[a] * 1e3 for a in case.anchors},
                "target": case.target,
            }
        )
    return rows


def softmax_ce(logits, targets):
    """The anchor of every table: softmax cross-entropy from logits (Keras' op: on TensorFlow
    it is ``tf.nn.softmax_cross_entropy_with_logits``)."""
    return ops.categorical_crossentropy(targets, logits, from_logits=True)


def one_hot_inputs(batch: int, k: int, seed: int = 0) -> Callable:
    """Inputs ``(logits [batch, k] float32, one-hot targets)`` from a fixed seed."""

    def make():
        rng = np.random.default_rng(seed)
        logits = rng.normal(size=(batch, k)).astype(np.float32)
        targets = np.zeros((batch, k), np.float32)
        targets[np.arange(batch), rng.integers(0, k, batch)] = 1.0
        return logits, targets

    return make


def machine_line() -> str:
    """A one-line description of where the numbers were taken."""
    import os

    device = "CPU only"
    if BACKEND == "tensorflow":
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        version = f"TF {tf.__version__}"
    elif BACKEND == "jax":
        import jax

        gpus = [d for d in jax.devices() if d.platform == "gpu"]
        version = f"JAX {jax.__version__}"
        if gpus:
            device = f"{len(gpus)} GPU(s): {gpus[0].device_kind}"
    else:
        import torch

        gpus = list(range(torch.cuda.device_count()))
        version = f"torch {torch.__version__}"
        if gpus:
            device = f"{len(gpus)} GPU(s): {torch.cuda.get_device_name(0)}"
    if gpus and device == "CPU only":
        device = f"{len(gpus)} GPU(s)"
    return (
        f"{platform.node()} | {platform.processor() or platform.machine()} | "
        f"{os.cpu_count()} cores | {device} | Python {platform.python_version()} | "
        f"{version} | Keras {keras.__version__} | NumPy {np.__version__} | "
        f"{time.strftime('%Y-%m-%d')}"
    )
