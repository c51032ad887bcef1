"""KL projection onto the credal set of a possibility distribution (Baaj & Marquis, 2026).

``p* = argmin_{p in F(pi)} KL(p || q)``, ``q = softmax(z)``; the loss ``KL(p* || q)`` has the
exact gradient ``q - p*`` (Danskin). ``F(pi)`` in sorted coordinates (spec 1.4)::

    F(pi) = { p in simplex :  sum_{k<=r} p_k >= 1 - pt_{r+1},  lo_r <= p_r - p_{r+1} <= up_r }

Solvers: an interior point on the tie-reduced chain (default, ``stopping="certified"``) and
Dykstra's algorithm in its dual form (``method="dykstra"``; the ``"paper"`` / ``"fixed"``
rules); every row is certified by its max violation and exact duality gap. Everything runs
in float64; outputs take the input's dtype.

Contract rules (fail loud): possibility rows (finite, in ``[0, 1]``, maximum 1), logits (no
NaN / +inf, not all -inf), vote counts (finite, non-negative, positive sum); eagerly and in
graphs an error names the argument, under XLA the row is NaN. Batch sizes may be unknown
(``None``); ``K`` must be static for the projection.

Modules: ``_constraints`` (``F(pi)``, antipignistic), ``_banded`` (pentadiagonal cyclic
reduction), ``_interior_point``, ``_dykstra``, ``_certificates`` (violation, duality gap),
``_config`` (:class:`ProjectionConfig`), ``_inputs`` (the rules), ``_projection`` and
``_losses`` (the public ops). Derivation: ``docs/design/possibilistic_solver.md``; spec:
``shared/specs/possibilistic_projection.md``.
"""

from losszoo.ops.possibilistic._config import ProjectionConfig
from losszoo.ops.possibilistic._constraints import (
    PossibilityConstraints,
    antipignistic,
    possibility_constraints,
)
from losszoo.ops.possibilistic._inputs import _validate_possibility as validate_possibility
from losszoo.ops.possibilistic._losses import (
    antipignistic_kl_loss,
    possibilistic_projection_loss,
    vote_kl_loss,
)
from losszoo.ops.possibilistic._projection import possibilistic_projection

__all__ = [
    "PossibilityConstraints",
    "ProjectionConfig",
    "antipignistic",
    "antipignistic_kl_loss",
    "possibilistic_projection",
    "possibilistic_projection_loss",
    "possibility_constraints",
    "validate_possibility",
    "vote_kl_loss",
]
