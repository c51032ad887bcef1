"""Keras 3 metrics over losszoo's ops; each is registered by name (kind ``"metric"``).

The streaming calibration metrics (:mod:`losszoo.metrics.calibration`) are also exported from
:mod:`losszoo.calibration`, beside the array functions they agree with.
"""

from losszoo.metrics import calibration
from losszoo.metrics.calibration import *  # noqa: F403
from losszoo.metrics.dro import ExactKLDRORisk

__all__ = sorted([*calibration.__all__, "ExactKLDRORisk"])
