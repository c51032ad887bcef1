"""Safe-KL DRO risk: forward+backward against a plain mean of the same losses, and a full
model forward+backward (the training step's compute) with the safe-KL risk against ERM.

Targets (issue 6): report the risk/mean ratios at batch 10, 1024 and 2^20; the model step with
the safe-KL risk <= 1.1x the ERM step on the same model.
"""

import math

import numpy as np
import tensorflow as tf

from harness import Case
from losszoo import ops

LAM, RHO = 1.0, 0.1


def _losses(batch, seed=0):
    def make():
        rng = np.random.default_rng(seed)
        return (tf.constant(rng.gamma(2.0, size=batch).astype(np.float32)),
                tf.constant(1.5, tf.float32))

    return make


def safe_kl(l, alpha):
    return ops.safe_kl_dro_risk(l, alpha, LAM, RHO)


def plain_mean(l, alpha):
    return tf.reduce_mean(l) + 0.0 * alpha


def reduce_logsumexp(l, alpha):
    return LAM * (tf.reduce_logsumexp(l / LAM) - math.log(float(l.shape[0]))) + 0.0 * alpha


def batch_lse(l, alpha):
    return ops.kl_dro_batch_lse(l, LAM) + 0.0 * alpha


# ---- model step: 2-layer MLP, per-example cross-entropy, gradient w.r.t. all weights
def _model_inputs(batch, d=64, h=256, k=10, seed=0):
    def make():
        rng = np.random.default_rng(seed)
        return (tf.constant(rng.normal(size=(d, h)).astype(np.float32) / 8),
                tf.constant(rng.normal(size=(h, k)).astype(np.float32) / 16),
                tf.constant(rng.normal(size=(batch, d)).astype(np.float32)),
                tf.constant(rng.integers(0, k, batch).astype(np.int32)),
                tf.constant(0.5, tf.float32))

    return make


def _per_example(w1, w2, x, y):
    logits = tf.nn.relu(x @ w1) @ w2
    return tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)


def model_safe_kl(w1, w2, x, y, alpha):
    return ops.safe_kl_dro_risk(_per_example(w1, w2, x, y), alpha, LAM, RHO)


def model_erm(w1, w2, x, y, alpha):
    return tf.reduce_mean(_per_example(w1, w2, x, y)) + 0.0 * alpha


def cases(quick=False):
    reps = 5 if quick else 20
    out = []
    for batch in (10, 1024, 2 ** 16 if quick else 2 ** 20):
        out.append(Case(op="safe_kl_dro_risk", shape=f"B={batch}", fn=safe_kl,
                        inputs=_losses(batch),
                        anchors={"mean": plain_mean, "reduce_logsumexp": reduce_logsumexp,
                                 "kl_dro_batch_lse": batch_lse},
                        wrt=(0, 1), target="report ratio vs mean", repeats=reps))
    out.append(Case(op="model_step_safe_kl", shape="MLP 64-256-10, B=256", fn=model_safe_kl,
                    inputs=_model_inputs(256), anchors={"model_step_erm": model_erm},
                    wrt=(0, 1, 4), target="<= 1.1x ERM", repeats=reps))
    return out
