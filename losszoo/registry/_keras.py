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

from losszoo import _backend
from losszoo.registry import _core

_KINDS = ("loss", "metric")


def _tables(entry) -> list[tuple[dict, dict]]:
    """The entry's :func:`keys` in the ``ALL_OBJECTS_DICT`` that Keras 3 looks names of its
    kind up in (none for heads). Names Keras already has (its own ``"Accuracy"``, say) keep
    their meaning."""
    if entry.kind not in _KINDS:
        return []
    table = _backend.keras_name_table(entry.kind)
    return [(table, dict.fromkeys(keys(entry), entry.cls))]


def keys(entry) -> tuple[str, ...]:
    """The registered name, its aliases, and the class name (as Keras accepts
    ``"CategoricalCrossentropy"`` beside ``"categorical_crossentropy"``)."""
    return (entry.name, *entry.aliases, entry.cls.__name__)


_core.subscribe(_tables)
