"""The projection's options, validated once: :class:`ProjectionConfig`.

Each option is checked where the config is built (a ``TypeError`` / ``ValueError`` naming
it); the solvers then read plain Python numbers and choices. The Keras loss stores the same
object's fields as its ``get_config`` payload.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from losszoo.contract import check_number

_F64 = tf.float64
_STOPPING = ("certified", "paper", "fixed")
_STOPPING_CODE = {"paper": 0, "certified": 1, "fixed": 2}
_SUPPORT = ("floor", "restrict")
_GAP_POLICY = ("wide", "antipignistic_tight")
_METHODS = ("interior_point", "dykstra")


def _check_choice(value, choices, name):
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {choices}, got {value!r}.")


def _check_constraint_options(eps_cap, tie_tol, support_mode, floor, gap_policy):
    """Validate the options of :func:`possibility_constraints`; returns the numbers."""
    _check_choice(support_mode, _SUPPORT, "support_mode")
    _check_choice(gap_policy, _GAP_POLICY, "gap_policy")
    return {
        "floor": check_number(floor, "floor", low=0.0, low_open=True, high=1.0, high_open=True),
        "tie_tol": check_number(tie_tol, "tie_tol", low=0.0, high=1.0, high_open=True),
        "eps_cap": check_number(eps_cap, "eps_cap", low=0.0, high=0.5, high_open=True),
    }


def _resolve_method(method, stopping):
    """``None`` -> interior point for the certified rule, Dykstra for "paper" / "fixed"."""
    if method is None:
        return "interior_point" if stopping == "certified" else "dykstra"
    _check_choice(method, _METHODS, "method")
    if method == "interior_point" and stopping != "certified":
        raise ValueError(
            f"`method`='interior_point' only supports stopping='certified' (the 'paper' and "
            f"'fixed' rules count Dykstra cycles); got `stopping`={stopping!r}. Use "
            "method='dykstra'."
        )
    return method


@dataclasses.dataclass(frozen=True)
class ProjectionConfig:
    """Options of :func:`possibilistic_projection`, checked at construction.

    The fields are the arguments of the same names (see
    :func:`~losszoo.ops.possibilistic_projection`); numbers are stored as Python ``float`` /
    ``int``. ``dataclasses.asdict(config)`` is the loss's ``get_config`` payload.

    Raises:
      TypeError: an option of the wrong type (the message names it).
      ValueError: an option outside its range or choices (the message names it).
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
        _check_choice(self.stopping, _STOPPING, "stopping")
        unit = dict(low=0.0, low_open=True, high=1.0, high_open=True)
        checked = {
            "tol": check_number(self.tol, "tol", **unit),
            "gap_tol": check_number(self.gap_tol, "gap_tol", **unit),
            "q_clip": check_number(self.q_clip, "q_clip", **unit),
            "max_cycles": check_number(self.max_cycles, "max_cycles", low=1, integer=True),
        }
        checked.update(
            _check_constraint_options(
                self.eps_cap, self.tie_tol, self.support_mode, self.floor, self.gap_policy
            )
        )
        _resolve_method(self.method, self.stopping)
        for key, value in checked.items():
            object.__setattr__(self, key, value)

    @property
    def solver(self) -> str:
        """The solver that runs: ``method``, or its default for ``stopping``."""
        return _resolve_method(self.method, self.stopping)


def _check_compute_dtype(compute_dtype, config):
    """``compute_dtype`` is ``"float64"``, or ``"float32"`` with ``tol`` and ``eps_cap`` >= 1e-5
    (the kernels run in float64 either way)."""
    _check_choice(compute_dtype, ("float64", "float32"), "compute_dtype")
    if compute_dtype == "float32" and (config.tol < 1e-5 or config.eps_cap < 1e-5):
        raise ValueError(
            "compute_dtype='float32' needs `tol` >= 1e-5 and `eps_cap` >= 1e-5 (eps=1e-9 and "
            f"tol=1e-8 are below float32 resolution); got tol={config.tol!r}, "
            f"eps_cap={config.eps_cap!r}. Use the default compute_dtype='float64'."
        )
