"""Timing harness: forward+backward medians and ratios against anchors run in the same process.

A benchmark module ``benchmarks/bench_<name>.py`` exposes ``cases(quick: bool) -> list[Case]``.
Each :class:`Case` times ``fn(*inputs)`` plus the gradient of its (summed) value with respect
to ``inputs[i]`` for ``i in wrt``, and does the same for every anchor, eagerly (as a
``tf.function``) and under XLA, so every ratio compares numbers measured minutes apart on the
same machine.
"""

from __future__ import annotations

import dataclasses
import platform
import statistics
import time
from collections.abc import Callable, Sequence

import tensorflow as tf


@dataclasses.dataclass
class Case:
    """One benchmark row group.

    Attributes:
      op: name of the measured op, e.g. ``"sparsemax_loss"``.
      shape: human-readable shape, e.g. ``"256x1000"``.
      fn: ``fn(*inputs) -> tensor``; its sum is differentiated.
      inputs: zero-argument callable building the input tensors (called once).
      anchors: name -> function with the same signature, timed the same way.
      wrt: indices of the inputs to differentiate with respect to (empty: forward only).
      modes: which of ``"graph"`` (tf.function) and ``"xla"`` (jit_compile) to run.
      target: the acceptance target in words, printed beside the ratios.
      repeats: timed calls per measurement (the median is reported).
    """

    op: str
    shape: str
    fn: Callable
    inputs: Callable[[], Sequence[tf.Tensor]]
    anchors: dict[str, Callable] = dataclasses.field(default_factory=dict)
    wrt: tuple[int, ...] = (0,)
    modes: tuple[str, ...] = ("graph", "xla")
    target: str = ""
    repeats: int = 20


def forward_backward(fn: Callable, wrt: tuple[int, ...]) -> Callable:
    """Wrap ``fn`` so one call computes its value and the gradients w.r.t. ``wrt``."""

    def step(*inputs):
        if not wrt:
            return fn(*inputs)
        watched = [inputs[i] for i in wrt]
        with tf.GradientTape() as tape:
            tape.watch(watched)
            value = tf.reduce_sum(tf.cast(fn(*inputs), tf.float32))
        return value, tape.gradient(value, watched)

    return step


def median_time(step: Callable, inputs: Sequence[tf.Tensor], repeats: int) -> float:
    """Median wall time in seconds of ``step(*inputs)`` after two warm-up calls."""

    def run():
        out = step(*inputs)
        # Wait for the result: fetching one element forces completion of the graph.
        for t in tf.nest.flatten(out):
            if t is not None:
                tf.reshape(t, [-1])[:1].numpy()

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
    inputs = [tf.convert_to_tensor(x) for x in case.inputs()]
    rows = []
    for mode in case.modes:
        jit = mode == "xla"
        timed = {}
        for name, fn in [(case.op, case.fn), *case.anchors.items()]:
            step = tf.function(forward_backward(fn, case.wrt), jit_compile=jit)
            timed[name] = median_time(step, inputs, case.repeats)
        base = timed[case.op]
        rows.append(
            {
                "op": case.op,
                "shape": case.shape,
                "mode": mode,
                "ms": base * 1e3,
                "ratios": {a: base / timed[a] for a in case.anchors},
                "anchor_ms": {a: timed[a] * 1e3 for a in case.anchors},
                "target": case.target,
            }
        )
    return rows


def machine_line() -> str:
    """A one-line description of where the numbers were taken."""
    import os

    import keras
    import numpy as np

    gpus = tf.config.list_physical_devices("GPU")
    device = f"{len(gpus)} GPU(s)" if gpus else "CPU only"
    return (
        f"{platform.node()} | {platform.processor() or platform.machine()} | "
        f"{os.cpu_count()} cores | {device} | Python {platform.python_version()} | "
        f"TF {tf.__version__} | Keras {keras.__version__} | NumPy {np.__version__} | "
        f"{time.strftime('%Y-%m-%d')}"
    )
