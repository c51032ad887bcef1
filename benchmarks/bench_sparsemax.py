"""Sparsemax and the sparsemax loss against softmax + cross-entropy and keras.ops.sparsemax.

Targets (issue 2), under XLA on the 2-core CPU: forward+backward <= 2x softmax+CE at
256 x 1000 and <= 3x at 32 x 100000.
"""

import keras
from harness import Case, one_hot_inputs, softmax_ce
from keras import ops as kops

from losszoo import ops


def keras_sparsemax(logits, targets):
    # keras.ops.sparsemax differentiated by autodiff (it has no custom gradient)
    return kops.sum(keras.ops.sparsemax(logits) * targets, -1)


def sparsemax_head(logits, targets):
    return kops.sum(ops.sparsemax(logits) * targets, -1)


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
                    inputs=one_hot_inputs(batch, k),
                    anchors=anchors,
                    target=target,
                    repeats=5 if quick else 20,
                )
            )
    return out
