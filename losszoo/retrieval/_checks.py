"""Fail-loud checks for the retrieval code, written over ``keras.ops``.

The rule is the README's: a bad tensor argument raises naming it, eagerly (a ``ValueError``
from the host value) and in graphs (an assertion op, TensorFlow backend); traced for XLA /
``jax.jit``, where assertions do not exist, the caller makes the affected values NaN with
``contract.nan_where``. Host values and assertions come from ``losszoo._backend``; the checks
share ``losszoo.set_validation`` with the rest of losszoo; NaN poisoning always stays.
"""

from __future__ import annotations

from keras import ops

from losszoo._backend import assert_all
from losszoo._backend import static_value as host_value
from losszoo.contract import Rule, validation_enabled


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
    static = [None if w is None else host_value(w) for w in expected]
    dynamic = []
    for axis, (got, want, size) in enumerate(zip(x.shape, expected, static)):
        if want is None:
            continue
        if got is None or size is None:
            dynamic.append((axis, want))
        elif int(got) != int(size):
            shown = tuple(None if s is None else int(s) for s in static)
            raise ValueError(
                f"`{name}` must have shape {shown}{what} (None: any); got {tuple(x.shape)}."
            )
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
    rule = Rule("must hold ids >= 0", lambda xp, i: i < 0)
    if num_items is not None:
        rule = Rule(
            f"must hold ids in [0, {num_items}) (the catalogue)",
            lambda xp, i: (i < 0) | (i >= num_items),
        )
    ids = rule.check(ids, name)
    bad = rule.invalid(ids)
    return ops.where(bad, 0, ops.cast(ids, "int32")), bad
