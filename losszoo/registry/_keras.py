"""Make registered loss and metric names work as strings in ``compile`` of Keras 3.

Keras 3's ``keras.losses.get`` resolves a plain string only against the module-level table
``keras.src.losses.ALL_OBJECTS_DICT`` (the global custom-object registry is consulted only
for dict identifiers), and ``keras.metrics.get`` does the same with its own table. We add
our names to those tables. This touches a private Keras module, so
``tests/registry/test_keras_integration.py`` pins the behaviour: a Keras upgrade that moves
the table fails that test loudly instead of silently breaking ``compile(loss="rankmax")``.

Importing this module subscribes it to the registry (:func:`losszoo.registry._core.subscribe`);
tf_keras (Keras 2) has its own glue, :mod:`losszoo.registry._tf_keras`.
"""

from __future__ import annotations

import importlib

from losszoo.registry import _core

_KERAS3_MODULES = {"loss": "keras.src.losses", "metric": "keras.src.metrics"}


def _keras3_table(kind: str) -> dict | None:
    """The module's ``ALL_OBJECTS_DICT`` that Keras 3 looks names of ``kind`` up in."""
    if kind not in _KERAS3_MODULES:
        return None
    table = getattr(importlib.import_module(_KERAS3_MODULES[kind]), "ALL_OBJECTS_DICT", None)
    if not isinstance(table, dict):
        raise ImportError(
            f"losszoo cannot find {_KERAS3_MODULES[kind]}.ALL_OBJECTS_DICT in this Keras version "
            "(string lookup in compile() would not find losszoo names). Please report this "
            "together with your Keras version."
        )
    return table


def keys(entry) -> tuple[str, ...]:
    """The registered name, its aliases, and the class name (as Keras accepts
    ``"CategoricalCrossentropy"`` beside ``"categorical_crossentropy"``)."""
    return (entry.name, *entry.aliases, entry.cls.__name__)


def install(entry) -> None:
    """Expose one registry entry to Keras 3's string lookup (none for heads).

    Names Keras already has (its own ``"Accuracy"``, say) keep their meaning.
    """
    table = _keras3_table(entry.kind)
    for key in keys(entry) if table is not None else ():
        table.setdefault(key, entry.cls)


def uninstall(entry) -> None:
    """Undo :func:`install` (used when a plugin fails half-way)."""
    table = _keras3_table(entry.kind)
    for key in keys(entry) if table is not None else ():
        if table.get(key) is entry.cls:
            del table[key]


_core.subscribe(install, uninstall)
