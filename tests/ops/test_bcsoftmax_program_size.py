"""The size of BCSoftmax's compiled program (issue 33 item 4, "First compile in seconds").

The compile time of a first ``fit`` and the memory that TensorFlow's XLA cache keeps grow with
the program, and they grew most with loops written as Python loops (each trip one more copy of
its body). Counted on the forward + backward pass at T = 0.1, which holds every solver the
default method compiles (upper-set candidates, the safeguarded Newton searches and the
``tau -> 0`` limit); before the loops became loop trips it was 3,907 HLO instructions on
TensorFlow and 2,329 StableHLO operations on JAX (BENCHMARKS.md, "BCSoftmax program size").
Only lowered, never compiled: a few seconds.
"""

from __future__ import annotations

import numpy as np
import pytest

from losszoo.ops import bcsoftmax
from tests.harness import BACKEND

# Today's sizes (2,538 and 1,450) plus about 10 %: an unrolled loop of the limit's bisection
# alone adds 850 on TensorFlow.
LIMITS = {"tensorflow": 2800, "jax": 1600}


def _weighted_sum(x):
    from keras import ops

    p = bcsoftmax(x, lower=0.02, upper=0.3, temperature=0.1)
    return ops.sum(p * ops.arange(x.shape[-1], dtype=x.dtype))


@pytest.mark.skipif(BACKEND not in LIMITS, reason="counts XLA programs (TensorFlow, JAX)")
def test_forward_and_backward_program_stays_small():
    x = np.random.default_rng(0).normal(size=(8, 10)).astype("float32")
    if BACKEND == "tensorflow":
        import tensorflow as tf

        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                v = _weighted_sum(x)
            return v, tape.gradient(v, x)

        text = tf.function(step, jit_compile=True).experimental_get_compiler_ir(tf.constant(x))(
            stage="hlo"
        )
    else:
        import jax

        text = jax.jit(jax.value_and_grad(_weighted_sum)).lower(x).as_text()
    size = sum(" = " in line for line in text.splitlines())
    assert 200 < size < LIMITS[BACKEND], size
