"""Registry of losszoo's losses, heads and metrics: names, Keras lookup, plugins."""

from losszoo.registry._core import (
    KINDS,
    PLUGIN_GROUP,
    Entry,
    entries,
    get,
    get_class,
    load_plugins,
    names,
    register,
)
from losszoo.registry._keras import tf_keras_loss

__all__ = [
    "KINDS",
    "PLUGIN_GROUP",
    "Entry",
    "entries",
    "get",
    "get_class",
    "load_plugins",
    "names",
    "register",
    "tf_keras_loss",
]
