"""Name registry: names -> classes, Keras string lookup, entry-point plugins.

A class joins the registry with the :func:`register` decorator::

    @register("sparsemax", kind="loss", description="Sparsemax (Fenchel-Young) loss")
    class SparsemaxLoss(keras.losses.Loss): ...

Registering does three things:

1. records the class under its name and aliases for :func:`get`, :func:`names` and
   ``python -m losszoo list``;
2. registers it for Keras serialization under the package ``"losszoo"``, so saved models
   load without ``custom_objects``;
3. exposes it in the lookup tables of the subscribers (:func:`subscribe`): for losses and
   metrics the Keras glue makes the plain string usable in ``model.compile`` of Keras 3
   (:mod:`losszoo.registry._keras`) and, when ``tf_keras`` is installed, of Keras 2
   (:mod:`losszoo.registry._tf_keras`). This module imports neither; they import it.

A loss whose value is one risk of the whole batch (the DRO losses) declares it with
``register(..., batch_risk=True)``: its ``__call__`` computes the risk (sample weights as
reference probabilities) while its ``call`` gives the per-example base losses, so wrappers
(tf_keras, the retrieval task) must call the loss, never reduce ``call``.

Third-party packages add entries through the entry-point group ``losszoo.plugins``: each
entry point names a module (or a callable) whose import registers classes. ``import losszoo``
loads every installed plugin (so a plugin's name works in ``compile`` and ``load_model`` right
away); one that fails to load is skipped with a ``RuntimeWarning`` naming it, and the import
of losszoo goes on.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import keras

from losszoo.contract import check_bool, check_choice

#: The kinds of object the registry holds. Keras integration exists for "loss" and "metric".
KINDS = ("loss", "head", "metric")

PLUGIN_GROUP = "losszoo.plugins"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One registered class.

    Attributes:
      name: canonical name (what ``model.compile(loss=name)`` accepts).
      kind: one of :data:`KINDS`.
      cls: the registered class.
      aliases: further names that resolve to the same class.
      description: one line shown by ``python -m losszoo list``.
      source: ``"losszoo"`` or the plugin (entry point) that registered it.
      batch_risk: for a loss, whether it is one risk of the whole batch (see the module
        docstring); subclasses of the class share the declaration (:func:`entry_of`).

    Example:
      >>> e = losszoo.registry.entry("sparsemax")
      >>> e.name, e.kind, e.cls.__name__, e.aliases, e.source
      ('sparsemax', 'loss', 'SparsemaxLoss', ('sparsemax_loss',), 'losszoo')
    """

    name: str
    kind: str
    cls: type
    aliases: tuple[str, ...]
    description: str
    source: str
    batch_risk: bool = False


_entries: dict[tuple[str, str], Entry] = {}  # (kind, canonical name) -> entry
_lookup: dict[tuple[str, str], str] = {}  # (kind, name or alias) -> canonical name
_lock = threading.RLock()
_current_source = "losszoo"
_plugins_loaded = False
_subscribers: list[Callable[[Entry], list[tuple[dict, dict]]]] = []


def subscribe(tables: Callable[[Entry], list[tuple[dict, dict]]]):
    """Expose every entry, registered so far and from now on, through ``tables(entry)``:
    ``(lookup table, {key: object})`` pairs (the Keras glue modules subscribe). A key a table
    already holds keeps its meaning; removing an entry takes its keys out again."""
    with _lock:
        _subscribers.append(tables)
        for entry in list(_entries.values()):
            _install(tables, entry)


def _install(tables, entry: Entry) -> None:
    for table, objects in tables(entry):
        for key, obj in objects.items():
            table.setdefault(key, obj)


def register(
    name: str,
    kind: str = "loss",
    aliases: tuple[str, ...] | list[str] = (),
    description: str | None = None,
    batch_risk: bool = False,
) -> Callable[[type], type]:
    """Class decorator that registers a loss, head or metric by name.

    Args:
      name: the canonical name, e.g. ``"sparsemax"``. Lower-case snake case by convention.
      kind: one of ``"loss"``, ``"head"``, ``"metric"``.
      aliases: other names for the same class.
      description: a one-line description; defaults to the first docstring line.
      batch_risk: the loss is one risk of the whole batch (``__call__``), its ``call`` the
        per-example base losses (see the module docstring); only for ``kind="loss"``.

    Returns:
      The decorator, which returns the class unchanged (apart from Keras registration).

    Raises:
      ValueError: if ``kind`` is unknown or a name or alias is already taken for that kind.

    Example:
      >>> @losszoo.register("my_loss", kind="loss", description="My loss")
      ... class MyLoss(keras.losses.Loss):
      ...     def call(self, y_true, y_pred): ...
    """
    check_choice(kind, "kind", KINDS)
    if not isinstance(name, str) or not name:
        raise ValueError(f"`name` must be a non-empty string, got {name!r}.")
    aliases = tuple(aliases)
    batch_risk = check_bool(batch_risk, "batch_risk")
    if batch_risk and kind != "loss":
        raise ValueError(f"`batch_risk` applies to losses only, not to kind {kind!r}.")

    def decorator(cls: type) -> type:
        with _lock:
            for key in (name, *aliases):
                taken = _lookup.get((kind, key))
                if taken is not None:
                    owner = _entries[(kind, taken)]
                    raise ValueError(
                        f"Cannot register {cls.__module__}.{cls.__qualname__} as {kind} "
                        f"`name`={key!r}: that name is already taken by "
                        f"{owner.cls.__module__}.{owner.cls.__qualname__} "
                        f"(registered by {owner.source!r}). Choose another name or alias."
                    )
            package = cls.__module__.split(".")[0]  # "losszoo", or the plugin's package
            keras.saving.register_keras_serializable(package=package, name=cls.__name__)(cls)
            doc = (cls.__doc__ or "").strip().splitlines()
            entry = Entry(
                name=name,
                kind=kind,
                cls=cls,
                aliases=aliases,
                description=description or (doc[0] if doc else ""),
                source=_current_source,
                batch_risk=batch_risk,
            )
            _entries[(kind, name)] = entry
            for key in (name, *aliases):
                _lookup[(kind, key)] = name
            for tables in _subscribers:
                _install(tables, entry)
        return cls

    return decorator


def entry(name: str, kind: str = "loss") -> Entry:
    """Return the :class:`Entry` registered as ``name`` (or an alias) for ``kind``.

    Loads the plugins first if they are not loaded yet (:func:`load_plugins`).

    Args:
      name: a registered name or alias, e.g. ``"sparsemax"``.
      kind: ``"loss"`` (default), ``"head"`` or ``"metric"``.

    Returns:
      The :class:`Entry` (its ``name`` is the canonical name, also for an alias).

    Raises:
      TypeError, ValueError, KeyError: as :func:`get_class`.

    Example:
      >>> losszoo.registry.entry("sparsemax_loss").name  # an alias
      'sparsemax'
    """
    if not isinstance(name, str):
        raise TypeError(
            f"`name` must be a registered name (a string such as 'sparsemax'), got "
            f"{name!r} ({type(name).__name__})."
        )
    check_choice(kind, "kind", KINDS)
    load_plugins()
    canonical = _lookup.get((kind, name))
    if canonical is None:
        known = sorted(key for (k, key) in _lookup if k == kind)
        close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise KeyError(
            f"No {kind} named {name!r} in the losszoo registry.{hint} "
            f"Known {kind} names: {', '.join(known) or '(none)'}."
        )
    return _entries[(kind, canonical)]


def entry_of(cls: type, kind: str = "loss") -> Entry | None:
    """The entry of ``cls`` or of its nearest registered base class (``None`` if none).

    The classes of ``cls.__mro__`` are tried in order; a subclass of a registered loss thus
    shares its entry (e.g. its ``batch_risk``). Plugins are not loaded by this lookup.

    Args:
      cls: a class.
      kind: ``"loss"`` (default), ``"head"`` or ``"metric"`` (not checked: another value
        finds nothing).

    Returns:
      The :class:`Entry`, or ``None``.

    Example:
      >>> class MyLoss(losszoo.losses.SparsemaxLoss): ...
      >>> losszoo.registry.entry_of(MyLoss).name
      'sparsemax'
      >>> print(losszoo.registry.entry_of(MyLoss, "head"))
      None
    """
    with _lock:
        by_class = {e.cls: e for (k, _), e in _entries.items() if k == kind}
    return next((by_class[c] for c in cls.__mro__ if c in by_class), None)


def get_class(name: str, kind: str = "loss") -> type:
    """Return the class registered as ``name`` (or an alias) for ``kind``.

    Args:
      name: a registered name or alias, e.g. ``"sparsemax"``.
      kind: ``"loss"`` (default), ``"head"`` or ``"metric"``.

    Returns:
      The registered class (not an instance: :func:`get` builds one).

    Raises:
      TypeError: ``name`` is not a string.
      ValueError: ``kind`` is not one of :data:`KINDS`.
      KeyError: the name is unknown; the message lists close matches.

    Example:
      >>> losszoo.registry.get_class("ts", kind="head").__name__
      'TemperatureScaling'
    """
    return entry(name, kind).cls


def get(name: str, kind: str = "loss", **config: Any):
    """Return a configured instance of the class registered as ``name``.

    Args:
      name: a registered name or alias, e.g. ``"sparsemax"``.
      kind: ``"loss"`` (default), ``"head"`` or ``"metric"``.
      **config: constructor arguments.

    Raises:
      TypeError, ValueError, KeyError: as :func:`get_class`.

    Example:
      >>> loss = losszoo.get("sparsemax", reduction="sum")
    """
    return get_class(name, kind)(**config)


def entries(kind: str | None = None) -> list[Entry]:
    """All registered entries (of one kind, or all), sorted by kind then name.

    Kinds come in the order of :data:`KINDS`. Loads the plugins first if they are not
    loaded yet (:func:`load_plugins`).

    Args:
      kind: ``None`` (default: every kind), ``"loss"``, ``"head"`` or ``"metric"``.

    Returns:
      A new list of :class:`Entry`.

    Raises:
      ValueError: ``kind`` is not one of :data:`KINDS` or ``None``.

    Example:
      >>> batch_risks = [e.name for e in losszoo.registry.entries("loss") if e.batch_risk]
      >>> batch_risks
      ['cvar', 'kl_dro_batch_lse', 'kl_dro_sumexp', 'safe_kl_dro']
    """
    check_choice(kind, "kind", (*KINDS, None))
    load_plugins()
    with _lock:
        selected = [e for (k, _), e in _entries.items() if kind is None or k == kind]
    return sorted(selected, key=lambda e: (KINDS.index(e.kind), e.name))


def names(kind: str | None = None) -> list[str]:
    """Canonical registered names (no aliases), optionally of one kind.

    Args:
      kind: ``None`` (default: every kind), ``"loss"``, ``"head"`` or ``"metric"``.

    Returns:
      A list of names, in the order of :func:`entries` (by kind, then alphabetical).

    Raises:
      ValueError: ``kind`` is not one of :data:`KINDS` or ``None``.

    Example:
      >>> losszoo.registry.names("head")
      ['bcsoftmax', 'logit_bounding', 'probability_bounding', 'sparsemax', 'temperature_scaling']
    """
    return [e.name for e in entries(kind)]


def load_plugins(force: bool = False) -> None:
    """Import every entry point of the group ``losszoo.plugins`` (once; ``import losszoo``
    calls this).

    An entry point may name a module (importing it registers its classes) or a callable
    (called with no arguments). A plugin that raises while loading, including one that
    tries to register a taken name, is skipped with a ``RuntimeWarning`` that names it;
    whatever it registered before failing is removed, so the registry stays consistent.
    A plugin whose module is being imported right now (it imported losszoo, e.g. the user
    wrote ``import my_plugin``) is left for the next lookup, when its import has finished.

    Args:
      force: ``False`` (default): return at once if the plugins were loaded already.
        ``True``: scan the entry points again and load those that registered nothing
        yet (e.g. installed since, or failed before); a plugin with an entry is skipped.

    Returns:
      None.

    Example:
      >>> losszoo.registry.load_plugins()  # done by `import losszoo`: returns at once
    """
    global _plugins_loaded, _current_source
    with _lock:
        if _plugins_loaded and not force:
            return
        _plugins_loaded = True
        for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP):
            dist = getattr(ep, "dist", None)
            label = f"{ep.name} ({ep.value}" + (f", from {dist.name}" if dist else "") + ")"
            if any(e.source == label for e in _entries.values()):
                continue
            module = sys.modules.get(ep.module)
            if getattr(getattr(module, "__spec__", None), "_initializing", False):
                _plugins_loaded = False  # its import is still running: load it next time
                continue
            before = set(_entries)
            _current_source = label
            try:
                loaded = ep.load()
                if callable(loaded) and not isinstance(loaded, type):
                    loaded()
            except Exception as err:  # noqa: BLE001 - a broken plugin must not break losszoo
                for key in set(_entries) - before:
                    _unregister(key)
                warnings.warn(
                    f"losszoo plugin {label} failed to load and was skipped: "
                    f"{type(err).__name__}: {err}",
                    RuntimeWarning,
                    stacklevel=2,
                )
            finally:
                _current_source = "losszoo"


def _unregister(key: tuple[str, str]) -> None:
    entry = _entries.pop(key)
    for alias in (entry.name, *entry.aliases):
        _lookup.pop((entry.kind, alias), None)
    for tables in _subscribers:
        for table, objects in tables(entry):
            for key, obj in objects.items():
                if table.get(key) is obj:
                    del table[key]
