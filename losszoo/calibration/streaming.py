"""Backward-compatible home of the streaming calibration metrics, now in
:mod:`losszoo.metrics.calibration` (import them from :mod:`losszoo.metrics`). Their Keras
registered names (``losszoo>ExpectedCalibrationError``, ...) did not change, so saved models
load either way."""

from losszoo.metrics.calibration import (
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
]
