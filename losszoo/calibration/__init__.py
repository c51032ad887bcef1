"""Post-hoc calibration: fitting calibrators (TS, PB, LB), calibration metrics (plain functions
and streaming Keras metrics) and reliability diagrams. Spec ``shared/specs/bcsoftmax.md``
sections 5-6."""

from losszoo.calibration.fit import fit_calibrator, make_calibrator
from losszoo.calibration.metrics import accuracy, adaptive_ece, brier_score, classwise_ece, ece, nll
from losszoo.calibration.plot import reliability_curve, reliability_diagram
from losszoo.metrics.calibration import *  # noqa: F403 - the streaming metrics
from losszoo.metrics.calibration import __all__ as _streaming

__all__ = [
    *_streaming,
    "accuracy",
    "adaptive_ece",
    "brier_score",
    "classwise_ece",
    "ece",
    "fit_calibrator",
    "make_calibrator",
    "nll",
    "reliability_curve",
    "reliability_diagram",
]
