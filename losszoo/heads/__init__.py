"""Keras 3 layers that map scores onto the probability simplex (thin wrappers over ops)."""

from losszoo.heads.sparsemax import Sparsemax
