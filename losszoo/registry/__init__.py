"""Registry of losszoo's losses, heads and metrics: names, Keras lookup, plugins.

:mod:`~losszoo.registry._core` holds the names; the Keras 3 glue
(:mod:`~losszoo.registry._keras`) and the tf_keras glue (:mod:`~losszoo.registry._tf_keras`)
subscribe to it when imported here; the tf_keras glue only on the TensorFlow backend (elsewhere
:func:`tf_keras_loss` raises ImportError saying so).
"""

from losszoo import _backend
from losszoo.registry import _keras  # noqa: F401 - subscribes Keras 3's string lookup
from losszoo.registry._core import (
    KINDS,
    PLUGIN_GROUP,
    Entry,
    entries,
    entry,
    entry_of,
    get,
    get_class,
    load_plugins,
    names,
    register,
)

if _backend.TENSORFLOW:
    from losszoo.registry._tf_keras import tf_keras_loss
else:

    def tf_keras_loss(loss, **config):
        """tf_keras (Keras 2) and TFRS exist only with TensorFlow: raises ImportError.

        On TensorFlow, ``tf_keras_loss`` is :func:`losszoo.registry._tf_keras.tf_keras_loss`.

        Args:
          loss: a registered loss name, class or instance (unused).
          **config: the loss's configuration (unused).

        Raises:
          ImportError: always, naming the TensorFlow backend it needs.

        Example:
          On JAX or PyTorch::

            losszoo.tf_keras_loss("rankmax")  # ImportError: ... needs the TensorFlow backend
        """
        _backend.require_tensorflow("losszoo.tf_keras_loss (tf_keras and TFRS models)")


__all__ = [
    "KINDS",
    "PLUGIN_GROUP",
    "Entry",
    "entries",
    "entry",
    "entry_of",
    "get",
    "get_class",
    "load_plugins",
    "names",
    "register",
    "tf_keras_loss",
]
