"""Post-hoc calibration: fitting calibrators (TS, PB, LB), calibration metrics (plain functions
and streaming Keras metrics) and reliability diagrams. Spec ``shared/specs/bcsoftmax.md``
sections 5-6."""

from losszoo.calibration.fit import fit_calibrator, make_calibrator
from losszoo.calibration.metrics import accuracy, adaptive_ece, brier_score, classwise_ece, ece, nll
from losszoo.calibration.plot import reliability_curve, reliability_diagram
from losszoo.calibration.streaming import (
    Accuracy,
    AdaptiveECE,
    BrierScore,
    ClasswiseECE,
    ExpectedCalibrationError,
    NegativeLogLikelihood,
)

__all__ = [
    "Accuracy",
    "AdaptiveECE",
    "BrierScore",
    "ClasswiseECE",
    "ExpectedCalibrationError",
    "NegativeLogLikelihood",
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
