"""The projection's options, validated once (:class:`ProjectionConfig`), and its diagnostics
(:class:`ProjectionInfo`).

Each option is checked where the config is built (a ``TypeError`` / ``ValueError`` naming
it); the solvers then read plain Python numbers and choices. The Keras loss stores the same
object's fields as its ``get_config`` payload. The solvers run in float64: on JAX that needs
``jax_enable_x64`` (:func:`require_float64` raises a clear error without it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from losszoo.contract import check_choice, check_number

F64 = "float64"
_0, _1 = np.float64(0.0), np.float64(1.0)  # float64 scalars
STOPPING_CODE = {"certified": 1, "paper": 0, "fixed": 2}  # the choices, in message order


def _resolve_method(method, stopping):
    """``None`` -> interior point for the certified rule, Dykstra for "paper" / "fixed"."""
    if method is None:
        return "interior_point" if stopping == "certified" else "dykstra"
    check_choice(method, "method", ("interior_point", "dykstra"))
    if method == "interior_point" and stopping != "certified":
        raise ValueError(
            f"`method`='interior_point' only supports stopping='certified' (the 'paper' and "
            f"'fixed' rules count Dykstra cycles); got `stopping`={stopping!r}. Use "
            "method='dykstra'."
        )
    return method


@dataclasses.dataclass(frozen=True)
class ProjectionConfig:
    """Options of :func:`~losszoo.ops.possibilistic_projection`, checked at construction.

    Attributes:
      tol: feasibility tolerance on the max violation ``V``, in ``(0, 1)``.
      max_cycles: most Dykstra cycles (each visits all ``3(K-1)`` constraints); with the
        interior point, the budget of its Dykstra finish.
      stopping: ``"certified"`` (``V <= tol`` and ``|gap| <= gap_tol``), ``"paper"``
        (``V <= tol``) or ``"fixed"`` (exactly ``max_cycles`` cycles).
      support_mode: ``"floor"`` (``pi <- max(pi, floor)``) or ``"restrict"`` (zero-``pi``
        classes excluded; ``q`` renormalised on the support).
      gap_tol: duality-gap tolerance of the certified rule, in ``(0, 1)``.
      floor: ``rho`` of the floor mode, in ``(0, 1)``.
      eps_cap: cap on the strict-drop margin ``eps``, in ``[0, 0.5)``.
      tie_tol: sorted neighbours closer than this are tied, in ``[0, 1)``.
      gap_policy: ``"wide"`` (``up = 1 - eps``) or ``"antipignistic_tight"`` (``up_r = g_r``).
      q_clip: ``q`` is clipped at this probability (and renormalised) before projecting.
      method: ``None`` (interior point for ``"certified"``, Dykstra for the other rules),
        ``"interior_point"`` or ``"dykstra"``.

    Numbers are stored as Python ``float`` / ``int``; ``dataclasses.asdict(config)`` is the
    loss's ``get_config`` payload.

    Raises:
      TypeError: an option of the wrong type (the message names it).
      ValueError: an option outside its range or choices (the message names it).

    Example:
      >>> ProjectionConfig(eps_cap=0.05, tol=1e-6).solver
      'interior_point'
    """

    tol: float = 1e-8
    max_cycles: int = 2000
    stopping: str = "certified"
    support_mode: str = "floor"
    gap_tol: float = 1e-10
    floor: float = 1e-6
    eps_cap: float = 1e-9
    tie_tol: float = 0.0
    gap_policy: str = "wide"
    q_clip: float = 1e-15
    method: str | None = None

    def __post_init__(self):
        check_choice(self.stopping, "stopping", tuple(STOPPING_CODE))
        check_choice(self.support_mode, "support_mode", ("floor", "restrict"))
        check_choice(self.gap_policy, "gap_policy", ("wide", "antipignistic_tight"))
        unit = dict(low=0.0, low_open=True, high=1.0, high_open=True)
        checked = {
            "tol": check_number(self.tol, "tol", **unit),
            "gap_tol": check_number(self.gap_tol, "gap_tol", **unit),
            "q_clip": check_number(self.q_clip, "q_clip", **unit),
            "max_cycles": check_number(self.max_cycles, "max_cycles", low=1, integer=True),
            "floor": check_number(self.floor, "floor", **unit),
            "tie_tol": check_number(self.tie_tol, "tie_tol", low=0.0, high=1.0, high_open=True),
            "eps_cap": check_number(self.eps_cap, "eps_cap", low=0.0, high=0.5, high_open=True),
        }
        _resolve_method(self.method, self.stopping)
        for key, value in checked.items():
            object.__setattr__(self, key, value)

    @property
    def solver(self) -> str:
        """The solver that runs: ``method``, or its default for ``stopping``."""
        return _resolve_method(self.method, self.stopping)


def resolve_config(config, options) -> ProjectionConfig:
    """``config``, or a :class:`ProjectionConfig` built from the keyword ``options``."""
    if config is None:
        config = ProjectionConfig(**options)
    elif options:
        raise TypeError(
            f"Pass the projection options either as `config` or as keywords, not both; got "
            f"`config` and {sorted(options)}."
        )
    elif not isinstance(config, ProjectionConfig):
        raise TypeError(f"`config` must be a ProjectionConfig, got {type(config).__name__}.")
    return config


class ProjectionInfo(NamedTuple):
    """Diagnostics of a projection, per example (leading dims ``[...]``; no gradient).

    Attributes:
      iterations: int32, interior-point iterations (0 for closed-form rows); Dykstra cycles
        when Dykstra alone runs.
      cycles: int32, Dykstra cycles (with the interior point: those of its finish).
      max_violation: float64, ``V = max_h (b_h - <a_h, p>)_+``.
      duality_gap: float64, ``KL(p || q) - g(lambda)``.
      residual: float64, ``max(V, |gap|)``.
      converged: bool, certified (``V <= tol`` and ``|gap| <= gap_tol``; ``V <= tol`` alone
        for ``stopping="paper"``) on a valid row.
      valid: bool, the row's inputs keep the contract rules.
      multipliers: float64 ``[..., 3, K-1]``, the dual variables of the prefix, lower and
        upper shape constraints, in sorted order.
    """

    iterations: Any
    cycles: Any
    max_violation: Any
    duality_gap: Any
    residual: Any
    converged: Any
    valid: Any
    multipliers: Any
