"""Kernels written once with ``keras.ops``: TensorFlow, JAX and PyTorch run the same code.

Each method's maths lives in one private module or small package beside this file. Every op
has a hand-derived gradient (``losszoo._backend.custom_gradient``), compiles under XLA
(``jit_compile=True`` on TensorFlow, ``jax.jit``), computes in float32 or wider, and checks
its inputs with the rules of :mod:`losszoo.contract`. :mod:`losszoo.ops.dro` holds the DRO
risks, its :mod:`~losszoo.ops.dro.distribute` (also ``losszoo.ops.distribute``) those of the
global batch (the ``*_global`` ops: ``tf.distribute`` replicas on TensorFlow; on JAX and
PyTorch ``keras.distribution`` computes one global batch already).
"""

from losszoo.ops import distribute  # the old path of losszoo.ops.dro.distribute
from losszoo.ops._bcsoftmax import METHODS as bcsoftmax_methods
from losszoo.ops._bcsoftmax import bcsoftmax
from losszoo.ops._catalogue import catalogue_loss
from losszoo.ops._rankmax import check_rankmax_arguments, rankmax, rankmax_loss
from losszoo.ops._softmax import softmax_cross_entropy
from losszoo.ops._sparsemax import sparsemax, sparsemax_loss
from losszoo.ops.dro import (
    cvar_risk,
    cvar_risk_global,
    kl_dro_batch_lse,
    kl_dro_batch_lse_global,
    kl_dro_exact_batch_max,
    kl_dro_exact_state_result,
    kl_dro_exact_state_update,
    kl_dro_sumexp,
    kl_dro_sumexp_global,
    safe_kl_dro_risk,
    safe_kl_dro_risk_and_stats,
    safe_kl_dro_solve_alpha,
    safe_kl_dro_weights,
)
from losszoo.ops.possibilistic import (
    antipignistic,
    antipignistic_kl_loss,
    possibilistic_projection,
    possibilistic_projection_info,
    possibilistic_projection_loss,
    possibility_constraints,
    vote_kl_loss,
)
