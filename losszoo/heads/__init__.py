"""Keras 3 layers that map scores onto the probability simplex (thin wrappers over ops)."""

from losszoo.heads.bcsoftmax import BCSoftmax
from losszoo.heads.calibration import LogitBounding, ProbabilityBounding, TemperatureScaling
from losszoo.heads.sparsemax import Sparsemax
