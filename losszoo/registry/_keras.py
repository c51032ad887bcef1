"""Make registered names work as strings in ``compile`` of Keras 3 and of tf_keras (Keras 2).

Keras 3's ``keras.losses.get`` resolves a plain string only against the module-level table
``keras.src.losses.ALL_OBJECTS_DICT`` (the global custom-object registry is consulted only
for dict identifiers), and ``keras.metrics.get`` does the same with its own table. We add
our names to those tables. This touches a private Keras module, so
``tests/registry/test_keras_integration.py`` pins the behaviour: a Keras upgrade that moves
the table fails that test loudly instead of silently breaking ``compile(loss="rankmax")``.

tf_keras resolves strings through its global custom objects, where we install a tf_keras
``Loss`` adapter per registered loss (see :func:`tf_keras_loss`). TensorFlow Recommenders
0.7 uses tf_keras, so this is what makes ``tfrs.tasks.Retrieval(loss="rankmax")``-style
code and ``tf.keras`` models (with ``TF_USE_LEGACY_KERAS=1``) work.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

_KERAS3_TABLES = {
    "loss": ("keras.src.losses", "ALL_OBJECTS_DICT"),
    "metric": ("keras.src.metrics", "ALL_OBJECTS_DICT"),
}


def _keras3_table(kind: str) -> dict | None:
    location = _KERAS3_TABLES.get(kind)
    if location is None:
        return None
    module = importlib.import_module(location[0])
    table = getattr(module, location[1], None)
    if not isinstance(table, dict):
        raise ImportError(
            f"losszoo cannot find {location[0]}.{location[1]} in this Keras version "
            "(string lookup in compile() would not find losszoo names). Please report this "
            "together with your Keras version."
        )
    return table


def _keys(entry) -> tuple[str, ...]:
    # The registered name, its aliases, and the class name (as Keras accepts
    # "CategoricalCrossentropy" beside "categorical_crossentropy").
    return (entry.name, *entry.aliases, entry.cls.__name__)


def install(entry) -> None:
    """Expose one registry entry to the string lookups of Keras 3 and tf_keras."""
    table = _keras3_table(entry.kind)
    if table is not None:
        for key in _keys(entry):
            table.setdefault(key, entry.cls)
    if entry.kind == "loss" and tf_keras_available():
        custom = _tf_keras().utils.get_custom_objects()
        adapter = _tf_keras_adapter(entry.cls)
        for key in _keys(entry):
            custom.setdefault(key, adapter)


def uninstall(entry) -> None:
    """Undo :func:`install` (used when a plugin fails half-way)."""
    table = _keras3_table(entry.kind)
    for key in _keys(entry):
        if table is not None and table.get(key) is entry.cls:
            del table[key]
        if entry.kind == "loss" and tf_keras_available():
            custom = _tf_keras().utils.get_custom_objects()
            if custom.get(key) is _tf_keras_adapter(entry.cls):
                del custom[key]


@functools.cache
def tf_keras_available() -> bool:
    return importlib.util.find_spec("tf_keras") is not None


def _tf_keras():
    import tf_keras

    return tf_keras


@functools.cache
def _tf_keras_adapter(keras3_loss_cls: type) -> type:
    """A tf_keras ``Loss`` subclass computing the same per-example values as a Keras 3 loss.

    tf_keras applies sample weights and its reduction to what ``call`` returns, exactly as
    Keras 3 does for the original class, and the op underneath is the same TensorFlow code.
    """
    tf_keras = _tf_keras()
    base = tf_keras.losses.Loss

    class Adapter(base):
        def __init__(self, reduction=tf_keras.losses.Reduction.AUTO, name=None, **config: Any):
            self._losszoo_config = dict(config)
            self.losszoo_loss = keras3_loss_cls(**config)
            super().__init__(reduction=reduction, name=name or self.losszoo_loss.name)

        def call(self, y_true, y_pred):
            return self.losszoo_loss.call(y_true, y_pred)

        def get_config(self):
            return {**super().get_config(), **self._losszoo_config}

    # A loss class may refine the adapter (e.g. batch risks that must see the whole batch).
    refine = getattr(keras3_loss_cls, "_refine_tf_keras_adapter", None)
    if refine is not None:
        Adapter = refine(Adapter)

    Adapter.__name__ = Adapter.__qualname__ = keras3_loss_cls.__name__
    Adapter.__module__ = keras3_loss_cls.__module__
    Adapter.__doc__ = (
        f"tf_keras (Keras 2) version of :class:`{keras3_loss_cls.__module__}."
        f"{keras3_loss_cls.__name__}`; same arguments plus tf_keras' `reduction` and `name`."
    )
    package = keras3_loss_cls.__module__.split(".")[0]
    return tf_keras.utils.register_keras_serializable(package=package)(Adapter)


def tf_keras_loss(loss, **config: Any):
    """Return a tf_keras (Keras 2) loss computing a registered losszoo loss.

    Use it where a Keras 2 loss object is required, e.g. ``tfrs.tasks.Retrieval(loss=...)``
    in TensorFlow Recommenders 0.7. A plain string also works in a tf_keras ``compile``.

    Args:
      loss: a registered loss name (``"rankmax"``), a losszoo Keras 3 loss class, or an
        instance (whose config is copied; ``config`` then overrides it).
      **config: constructor arguments of the losszoo loss, plus tf_keras' ``reduction``.

    Example:
      >>> task = tfrs.tasks.Retrieval(loss=losszoo.tf_keras_loss("rankmax", k=1))
    """
    if not tf_keras_available():
        raise ImportError(
            "tf_keras_loss needs the `tf_keras` package: pip install 'losszoo[retrieval]'."
        )
    from losszoo.registry import _core

    reduction = config.pop("reduction", _tf_keras().losses.Reduction.AUTO)
    if isinstance(loss, str):
        cls = _core.get_class(loss, "loss")
    elif isinstance(loss, type):
        cls = loss
    else:
        cls = type(loss)
        base = loss.get_config()
        for key in ("reduction", "dtype"):
            base.pop(key, None)
        config = {**base, **config}
    return _tf_keras_adapter(cls)(reduction=reduction, **config)
