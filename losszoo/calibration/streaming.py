"""Backward-compatible home of the streaming calibration metrics, now in
:mod:`losszoo.metrics.calibration` (import them from :mod:`losszoo.metrics`). Their Keras
registered names (``losszoo>ExpectedCalibrationError``, ...) did not change, so saved models
load either way."""

from losszoo.metrics.calibration import *  # noqa: F403
from losszoo.metrics.calibration import __all__  # noqa: F401 - the same public names
