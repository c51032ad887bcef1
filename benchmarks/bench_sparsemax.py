"""Sparsemax and the sparsemax loss against softmax + cross-entropy and keras.ops.sparsemax.

Targets (issue 2), under XLA on the 2-core CPU: forward+backward <= 2x softmax+CE at
256 x 1000 and <= 3x at 32 x 100000.
"""

import keras
import numpy as np
import tensorflow as tf
from harness import Case

from losszoo import ops


def _inputs(batch, k, seed=0):
    def make():
        rng = np.random.default_rng(seed)
        logits = rng.normal(size=(batch, k)).astype(np.float32)
        labels = rng.integers(0, k, batch)
        return tf.constant(logits), tf.one_hot(labels, k)

    return make


def softmax_ce(logits, targets):
    return tf.nn.softmax_cross_entropy_with_logits(targets, logits)


def keras_sparsemax(logits, targets):
    # keras.ops.sparsemax differentiated by autodiff (it has no custom gradient)
    return tf.reduce_sum(keras.ops.sparsemax(logits) * targets, -1)


def sparsemax_head(logits, targets):
    return tf.reduce_sum(ops.sparsemax(logits) * targets, -1)


def sparsemax_loss(logits, targets):
    return ops.sparsemax_loss(targets, logits)


def cases(quick=False):
    shapes = [(256, 1000, "<= 2x softmax_ce (xla)"), (32, 100_000, "<= 3x softmax_ce (xla)")]
    out = []
    for batch, k, target in shapes:
        anchors = {"softmax_ce": softmax_ce, "keras.ops.sparsemax": keras_sparsemax}
        for name, fn in (("sparsemax_loss", sparsemax_loss), ("sparsemax", sparsemax_head)):
            out.append(
                Case(
                    op=name,
                    shape=f"{batch}x{k}",
                    fn=fn,
                    inputs=_inputs(batch, k),
                    anchors=anchors,
                    target=target,
                    repeats=5 if quick else 20,
                )
            )
    return out
