"""Keras 3 metrics over losszoo's ops; each is registered by name (kind ``"metric"``)."""

from losszoo.metrics.dro import ExactKLDRORisk
