"""Fail-loud checks for the retrieval code, written over ``keras.ops``.

The rule is the README's: a bad tensor argument raises naming it, eagerly (a ``ValueError``
from the host value) and in graphs (an assertion op, TensorFlow backend); traced for XLA /
``jax.jit``, where assertions do not exist, the caller makes the affected values NaN with
``contract.nan_where``. Host values and assertions come from ``losszoo._backend``; the checks
share ``losszoo.set_validation`` with the rest of losszoo; NaN poisoning always stays.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from losszoo._backend import assert_all
from losszoo._backend import static_value as host_value
from losszoo.contract import validation_enabled


def checked(x, bad, name: str, rule: str):
    """Return ``x``, raising (eagerly) or asserting (graphs) unless ``bad`` is all false.

    Args:
      x: the argument's tensor (returned, with the graph assertion attached).
      bad: boolean tensor broadcastable to ``x``: true where ``x`` breaks ``rule``. The
        caller also uses it for NaN poisoning, so eager, graph and XLA agree on what is bad.
      name: the argument's name, quoted in the message.
      rule: what the values must satisfy, e.g. ``"must lie in (0, 1]"``.
    """
    if not validation_enabled():
        return x
    message = f"`{name}` {rule}"
    flags = host_value(bad)
    if flags is not None:
        if np.any(flags):
            values = host_value(x)
            shown = ""
            if values is not None:
                offending = np.broadcast_to(values, np.shape(flags))[flags]
                shown = f"; got {offending[:5].tolist()}" + (" ..." if offending.size > 5 else "")
            raise ValueError(message + shown + ".")
        return x
    return assert_all(ops.logical_not(ops.any(bad)), message + ".", x)


def check_shape(x, shape, name: str, what: str = ""):
    """Raise unless ``x`` has ``shape`` (ints, ``None`` for any, or scalar tensors).

    Dimensions known statically are compared at once (a ``ValueError`` naming ``name``,
    also when tracing for XLA); dynamic ones get a graph assertion on the TensorFlow backend.
    """
    expected = tuple(shape)
    if len(x.shape) != len(expected):
        raise ValueError(
            f"`{name}` must have rank {len(expected)}{what}; got shape {tuple(x.shape)}."
        )
    dynamic = []
    for axis, (got, want) in enumerate(zip(x.shape, expected)):
        if want is None:
            continue
        static = host_value(want)
        if got is not None and static is not None:
            if int(got) != int(static):
                shown = tuple(host_value(w) if w is not None else None for w in expected)
                shown = tuple(None if s is None else int(s) for s in shown)
                raise ValueError(
                    f"`{name}` must have shape {shown}{what} (None: any); got {tuple(x.shape)}."
                )
        else:
            dynamic.append((axis, want))
    if dynamic and validation_enabled():
        sizes = ops.shape(x)
        ok = ops.all(ops.stack([ops.equal(sizes[a], ops.cast(w, "int32")) for a, w in dynamic]))
        x = assert_all(ok, f"`{name}` has the wrong shape{what}.", x)
    return x


def checked_ids(ids, name: str, num_items=None):
    """Validate integer ids (``>= 0``, and ``< num_items`` when given); return int32 ids and
    the mask of bad ones (those are 0 in the ids; callers poison their results with NaN).

    The range test runs in the ids' own dtype, before the cast could wrap an int64 id.

    Raises:
      TypeError: ``ids`` is not of an integer dtype.
    """
    ids = ops.convert_to_tensor(ids)
    if "int" not in str(ids.dtype):
        raise TypeError(f"`{name}` must hold integer ids, got dtype {ids.dtype}.")
    bad = ops.less(ids, 0)
    rule = "must hold ids >= 0"
    if num_items is not None:
        bad = ops.logical_or(bad, ops.greater_equal(ids, num_items))
        rule = f"must hold ids in [0, {num_items}) (the catalogue)"
    ids = checked(ids, bad, name, rule)
    return ops.where(bad, 0, ops.cast(ids, "int32")), bad
