"""losszoo: output heads and training losses beyond the softmax, for TensorFlow / Keras 3.

Importing losszoo registers every loss and head by name, so that
``model.compile(loss="sparsemax")`` works in Keras 3 (and in tf_keras when installed).

Subpackages:
  ops: pure TensorFlow kernels with hand-derived gradients (no Keras).
  heads: Keras layers over the ops.
  losses: Keras losses over the ops.
  calibration: post-hoc calibrators (fit_calibrator), calibration metrics, reliability plots.
  metrics: Keras metrics (e.g. the exact full-data KL-DRO risk).
  registry: names -> classes, Keras string lookup, entry-point plugins.
"""

from losszoo._backend import require_tensorflow_backend

require_tensorflow_backend()

from losszoo import (  # noqa: E402
    calibration,  # noqa: E402  (needs heads)
    heads,
    losses,
    metrics,
    ops,  # noqa: E402
)
from losszoo.ops._common import set_validation, validation, validation_enabled  # noqa: E402
from losszoo.registry import entries, get, get_class, names, register, tf_keras_loss  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "calibration",
    "entries",
    "get",
    "get_class",
    "heads",
    "losses",
    "metrics",
    "names",
    "ops",
    "register",
    "set_validation",
    "tf_keras_loss",
    "validation",
    "validation_enabled",
]
