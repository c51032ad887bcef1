"""Seam tests of TensorFlow graphs: every public op (``losszoo.ops``) runs under
``tf.function`` with a ``None`` batch dimension in its ``input_signature`` (and a ``None``
class dimension where ids make that valid), with and without XLA, and agrees with the eager
result, values and gradients (issue 19). The Keras ``fit`` seams of every backend are in
``test_seams.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import losszoo
from losszoo import ops
from tests.contract import assert_nests_close, weighted_output_sum
from tests.test_seams import K, labels_for

pytestmark = pytest.mark.tensorflow_only(reason="tf.function input signatures with None dims")


# ----------------------------------------------------------------------------- ops, None dims
def _spec(array, dynamic):
    """A TensorSpec of ``array`` with its axes in ``dynamic`` unknown."""
    shape = [None if i in dynamic else s for i, s in enumerate(np.shape(array))]
    return tf.TensorSpec(shape, tf.as_dtype(np.asarray(array).dtype))


def _op_cases():
    """``(id, fn, args, dynamic axes per arg, gradient arg)``: every public op, float32 args."""
    rng = np.random.default_rng(2)
    n = 5
    z = rng.normal(size=(n, K)).astype(np.float32) * 2
    ids = rng.integers(0, K, n).astype(np.float32)
    onehot = np.eye(K, dtype=np.float32)[ids.astype(int)]
    pi = labels_for(losszoo.losses.PossibilisticProjectionLoss, ids.astype(int), K)
    votes = labels_for(losszoo.losses.VoteKLLoss, ids.astype(int), K)
    losses = rng.uniform(0.0, 3.0, n).astype(np.float32)
    weights = rng.uniform(0.5, 2.0, n).astype(np.float32)
    square = rng.normal(size=(n, n)).astype(np.float32)  # in-batch scores: K is the batch
    diag = np.arange(n, dtype=np.float32)
    state = (np.float32(0.5), np.float32(2.0), np.float32(7.0))
    b0, b01 = (0,), (0, 1)  # dynamic axes: batch; batch and class
    return [
        ("sparsemax", ops.sparsemax, (z,), (b0,), 0),
        ("sparsemax[None,None]", ops.sparsemax, (square,), (b01,), 0),
        ("sparsemax_loss", ops.sparsemax_loss, (onehot, z), (b0, b0), 1),
        ("rankmax", ops.rankmax, (ids, z), (b0, b0), 1),
        ("rankmax[None,None]", ops.rankmax, (diag, square), (b0, b01), 1),
        ("rankmax_loss", ops.rankmax_loss, (ids, z), (b0, b0), 1),
        ("softmax_cross_entropy", ops.softmax_cross_entropy, (ids, z), (b0, b0), 1),
        ("softmax_cross_entropy[dense]", ops.softmax_cross_entropy, (onehot, z), (b0, b0), 1),
        ("rankmax_loss[None,None]", ops.rankmax_loss, (diag, square), (b0, b01), 1),
        (  # streamed over 3 chunks of a 600-item table (the last one padded)
            "catalogue_loss",
            lambda q, p: ops.catalogue_loss(q, np.resize(z, (600, K)), p, chunk_size=256),
            (z, ids.astype(np.int32)),
            (b0, b0),
            0,
        ),
        ("bcsoftmax", ops.bcsoftmax, (z,), (b0,), 0),  # no bounds: softmax, as the head's default
        (
            "bcsoftmax[fixed bounds]",
            lambda x: ops.bcsoftmax(x, lower=0.05, upper=[0.8, 0.7, 0.9]),
            (z,),
            (b0,),
            0,
        ),
        (  # per-example bounds, as the probability-bounding head passes them
            "bcsoftmax[bounds of the batch]",
            lambda x, a, b: ops.bcsoftmax(x, lower=a, upper=b),
            (z, np.full_like(z, 0.05), np.full_like(z, 0.8)),
            (b0, b0, b0),
            0,
        ),
        ("possibilistic_projection", ops.possibilistic_projection, (z, pi), (b0, b0), 0),
        (  # with its diagnostics: possibilistic_projection_info is this call's second output
            "possibilistic_projection_loss",
            lambda p, z: ops.possibilistic_projection_loss(p, z, return_info=True),
            (pi, z),
            (b0, b0),
            1,
        ),
        ("possibility_constraints", ops.possibility_constraints, (pi,), (b0,), None),
        ("antipignistic", ops.antipignistic, (pi,), (b0,), None),
        ("antipignistic_kl_loss", ops.antipignistic_kl_loss, (pi, z), (b0, b0), 1),
        ("vote_kl_loss", ops.vote_kl_loss, (votes, z), (b0, b0), 1),
        ("cvar_risk", lambda l, s: ops.cvar_risk(l, 0.3, s), (losses, weights), (b0, b0), 0),
        (  # the global-batch risks: outside a replica context, the batch risk itself
            "cvar_risk_global",
            lambda l, s: ops.cvar_risk_global(l, 0.3, s),
            (losses, weights),
            (b0, b0),
            0,
        ),
        (
            "kl_dro_batch_lse_global",
            lambda l, s: ops.kl_dro_batch_lse_global(l, 0.7, s),
            (losses, weights),
            (b0, b0),
            0,
        ),
        (
            "kl_dro_sumexp_global",
            lambda l, s: ops.kl_dro_sumexp_global(l, 0.7, s),
            (losses, weights),
            (b0, b0),
            0,
        ),
        (
            "kl_dro_batch_lse",
            lambda l, s: ops.kl_dro_batch_lse(l, 0.7, s),
            (losses, weights),
            (b0, b0),
            0,
        ),
        (
            "kl_dro_sumexp",
            lambda l, s: ops.kl_dro_sumexp(l, 0.7, s),
            (losses, weights),
            (b0, b0),
            0,
        ),
        (
            "kl_dro_exact_batch_max",
            lambda l, s: ops.kl_dro_exact_batch_max(l, 0.7, s),
            (losses, weights),
            (b0, b0),
            None,
        ),
        (
            "kl_dro_exact_state_update",
            lambda m, a, c, l, s: ops.kl_dro_exact_state_update(m, a, c, l, 0.7, s),
            (*state, losses, weights),
            ((), (), (), b0, b0),
            3,
        ),
        (  # no batch axis: scalars of the streaming state
            "kl_dro_exact_state_result",
            lambda m, a, c: ops.kl_dro_exact_state_result(m, a, c, 0.7),
            state,
            ((), (), ()),
            1,
        ),
        (
            "safe_kl_dro_risk",
            lambda l, s: ops.safe_kl_dro_risk(l, 1.2, 0.7, 0.2, s),
            (losses, weights),
            (b0, b0),
            0,
        ),
        (
            "safe_kl_dro_risk_and_stats",
            lambda l, s: ops.safe_kl_dro_risk_and_stats(l, 1.2, 0.7, 0.2, s),
            (losses, weights),
            (b0, b0),
            0,
        ),
        (
            "safe_kl_dro_solve_alpha",
            lambda l, s: ops.safe_kl_dro_solve_alpha(l, 0.7, 0.2, s),
            (losses, weights),
            (b0, b0),
            None,
        ),
        (
            "safe_kl_dro_weights",
            lambda l: ops.safe_kl_dro_weights(l, 1.2, 0.7, 0.2),
            (losses,),
            (b0,),
            0,
        ),
    ]


OP_CASES = _op_cases()


def test_every_public_op_has_a_seam_case():
    public = {n for n in dir(ops) if not n.startswith("_") and callable(getattr(ops, n))}
    public -= {"check_rankmax_arguments"}  # checks Python hyper-parameters: no tensor input
    # possibilistic_projection_info(...) is possibilistic_projection_loss(..., return_info=True)
    # [1]: the loss case runs it (one program of the projection instead of two)
    public -= {"possibilistic_projection_info"}
    covered = {case[0].split("[")[0] for case in OP_CASES}
    assert public <= covered, f"ops without a None-batch seam case: {sorted(public - covered)}"


def _value_and_grad(fn, wrt):
    def run(*args):
        with tf.GradientTape() as tape:
            if wrt is not None:
                tape.watch(args[wrt])
            out = fn(*args)
            total = weighted_output_sum(out)
        if wrt is None:
            return out, ()
        grad = tape.gradient(total, args[wrt], unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return out, (grad,)

    return run


@pytest.mark.parametrize("jit", [True, False], ids=lambda j: f"jit={j}")
@pytest.mark.parametrize(
    ("op", "fn", "args", "dynamic", "wrt"), OP_CASES, ids=[case[0] for case in OP_CASES]
)
def test_op_under_tf_function_with_unknown_batch(op, fn, args, dynamic, wrt, jit):
    args = tuple(tf.constant(a) for a in args)
    signature = [_spec(a, d) for a, d in zip(args, dynamic)]
    run = _value_and_grad(fn, wrt)
    eager = run(*args)
    traced = tf.function(run, input_signature=signature, jit_compile=jit)
    assert_nests_close(traced(*args), eager, atol=1e-5, rtol=1e-5, err_msg=f"{op} (jit={jit})")
