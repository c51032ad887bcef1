"""KL projection onto the credal set of a possibility distribution (Baaj & Marquis, 2026).

``p* = argmin_{p in F(pi)} KL(p || q)``, ``q = softmax(z)``; the loss ``KL(p* || q)`` has the
exact gradient ``q - p*`` (Danskin). ``F(pi)`` in sorted coordinates (spec 1.4)::

    F(pi) = { p in simplex :  sum_{k<=r} p_k >= 1 - pt_{r+1},  lo_r <= p_r - p_{r+1} <= up_r }

Solvers: an interior point on the tie-reduced chain (default, ``stopping="certified"``) and
Dykstra's algorithm in its dual form (``method="dykstra"``; the ``"paper"`` / ``"fixed"``
rules); every row is certified by its max violation and exact duality gap
(:class:`ProjectionInfo`). Options: one :class:`ProjectionConfig`.

Written once with ``keras.ops`` for TensorFlow, JAX and PyTorch. Everything runs in float64
(outputs take the input's dtype): on JAX that needs 64-bit mode,
``jax.config.update("jax_enable_x64", True)`` before building tensors; without it the ops
raise a RuntimeError saying so. PyTorch and TensorFlow have float64 built in.

Contract rules (fail loud): ``contract.POSSIBILITY`` (labels / possibility),
``contract.SCALED_POSSIBILITY`` (:func:`antipignistic`), ``contract.LOGITS``, ``contract.VOTES``;
eagerly (and in TensorFlow graphs) an error names the argument; traced under XLA /
``jax.jit`` the row is NaN. Batch sizes may be unknown (``None``, TensorFlow); ``K`` must
be static for the projection.

Modules: ``_constraints`` (``F(pi)``, antipignistic), ``_banded`` (pentadiagonal cyclic
reduction), ``_interior_point``, ``_dykstra``, ``_certificates`` (violation, duality gap),
``_config`` (:class:`ProjectionConfig`, :class:`ProjectionInfo`), ``_inputs`` (shapes,
``VOTES``), ``_projection`` and ``_losses`` (the public ops). Derivation:
``docs/design/possibilistic_solver.md``; spec: ``shared/specs/possibilistic_projection.md``.
"""

from losszoo.ops.possibilistic._config import ProjectionConfig, ProjectionInfo
from losszoo.ops.possibilistic._constraints import (
    PossibilityConstraints,
    antipignistic,
    possibility_constraints,
)
from losszoo.ops.possibilistic._losses import (
    antipignistic_kl_loss,
    possibilistic_projection_info,
    possibilistic_projection_loss,
    vote_kl_loss,
)
from losszoo.ops.possibilistic._projection import possibilistic_projection

__all__ = [
    "PossibilityConstraints",
    "ProjectionConfig",
    "ProjectionInfo",
    "antipignistic",
    "antipignistic_kl_loss",
    "possibilistic_projection",
    "possibilistic_projection_info",
    "possibilistic_projection_loss",
    "possibility_constraints",
    "vote_kl_loss",
]
