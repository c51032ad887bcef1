"""Keras 3 losses over losszoo's ops; each is registered by name for ``model.compile``."""

from losszoo.losses.sparsemax import SparsemaxLoss
