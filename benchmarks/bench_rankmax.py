"""Rankmax loss against softmax cross-entropy of the same shape (issue 4).

Targets, forward+backward under XLA on the 2-core CPU: Rankmax k=1 <= 1.2x softmax-CE at
512 x 512 (in-batch scores) and 256 x 100000 (candidates); the k=10 ratio is reported.
Labels are integer ids (the op's O(n) path); the ``dense`` rows feed the identity matrix that
``tfrs.tasks.Retrieval`` passes (k=1 takes the one-hot fast path; issue 10 item 5: within
1.2x of softmax-CE at 512x512 and 8192x8192 under XLA). Dense rows are anchored on the dense
softmax-CE (``keras.ops.categorical_crossentropy`` on the same identity labels) and on the
sparse softmax-CE with ids (``keras.ops.sparse_categorical_crossentropy``; on TensorFlow these
are ``tf.nn.softmax_cross_entropy_with_logits`` and its sparse form).
The ``mf_step`` rows time one full-corpus training step of the MovieLens two-tower model
(gather user rows, scores against all 1682 movies, loss, gradients w.r.t. both tables); the
end-to-end epoch time is in examples/results/movielens_retrieval.md (s/epoch column).
Every case runs on every Keras backend, in the harness' modes (TensorFlow graph and XLA, JAX
jit, PyTorch eager).
"""

import keras
import numpy as np
from harness import Case
from harness import softmax_ce as dense_softmax_ce
from keras import ops as kops

from losszoo import ops


def _inputs(batch, n, dense=False, seed=0, eye=False):
    def make():
        rng = np.random.default_rng(seed)
        scores = rng.normal(size=(batch, n)).astype(np.float32)
        labels = np.arange(batch) if eye else rng.integers(0, n, batch)
        labels = labels.astype(np.int32)
        if dense:
            one_hot = np.zeros((batch, n), np.float32)
            one_hot[np.arange(batch), labels] = 1.0
            return scores, one_hot
        return scores, labels

    return make


def _sparse_softmax_ce(ids, scores):
    return kops.sparse_categorical_crossentropy(ids, scores, from_logits=True)


def sparse_softmax_ce_of_dense(scores, labels):
    """The ids anchor for dense rows: sparse softmax-CE on the argmax of the labels."""
    return _sparse_softmax_ce(kops.cast(kops.argmax(labels, axis=-1), "int32"), scores)


def softmax_ce(scores, labels):
    """Softmax cross-entropy with dense (one-hot) labels or integer ids."""
    if keras.backend.is_float_dtype(labels.dtype):
        return dense_softmax_ce(scores, labels)
    return _sparse_softmax_ce(labels, scores)


def rankmax_k1(scores, labels):
    return ops.rankmax_loss(labels, scores, k=1)


def rankmax_k10(scores, labels):
    return ops.rankmax_loss(labels, scores, k=10)


def _mf_inputs(batch=512, users=943, items=1682, dim=32, seed=0):
    def make():
        rng = np.random.default_rng(seed)
        return (
            rng.normal(scale=0.3, size=(users, dim)).astype(np.float32),
            rng.normal(scale=0.3, size=(items, dim)).astype(np.float32),
            rng.integers(0, users, batch).astype(np.int32),
            rng.integers(0, items, batch).astype(np.int32),
        )

    return make


def _mf(loss):
    def step(u, v, users, items):
        scores = kops.matmul(kops.take(u, users, axis=0), kops.transpose(v))
        return loss(scores, items)

    return step


def cases(quick=False):
    repeats = 5 if quick else 20
    big = (64, 100_000) if quick else (256, 100_000)
    out = []
    for (batch, n), label in (((512, 512), "in-batch"), (big, "candidates")):
        out.append(
            Case(
                op="rankmax_loss k=1",
                shape=f"{batch}x{n} {label}",
                fn=rankmax_k1,
                inputs=_inputs(batch, n),
                anchors={"softmax_ce": softmax_ce},
                target="<= 1.2x softmax_ce (xla)",
                repeats=repeats,
            )
        )
        out.append(
            Case(
                op="rankmax_loss k=10",
                shape=f"{batch}x{n} {label}",
                fn=rankmax_k10,
                inputs=_inputs(batch, n),
                anchors={"softmax_ce": softmax_ce},
                target="ratio reported",
                repeats=repeats,
            )
        )
    for size in (512, 8192):
        reps = repeats if size == 512 else max(3, repeats // 4)
        shape = f"{size}x{size} in-batch (TFRS eye)"
        out.append(
            Case(
                op="rankmax_loss k=1 dense labels",
                shape=shape,
                fn=rankmax_k1,
                inputs=_inputs(size, size, dense=True, eye=True),
                anchors={
                    "softmax_ce dense": softmax_ce,
                    "softmax_ce ids": sparse_softmax_ce_of_dense,
                },
                target="<= 1.2x softmax_ce (xla)",
                repeats=reps,
            )
        )
        out.append(
            Case(
                op="rankmax_loss k=1 ids",
                shape=f"{size}x{size} in-batch (arange)",
                fn=rankmax_k1,
                inputs=_inputs(size, size, eye=True),
                anchors={"softmax_ce": softmax_ce},
                target="ratio reported",
                repeats=reps,
            )
        )
    out.append(
        Case(
            op="mf_step rankmax k=1",
            shape="512 users x 1682 movies, d=32",
            fn=_mf(rankmax_k1),
            inputs=_mf_inputs(),
            wrt=(0, 1),
            anchors={"mf_step softmax_ce": _mf(softmax_ce)},
            target="<= 1.1x softmax (end to end)",
            repeats=repeats,
        )
    )
    return out
