"""The fail-loud contract: losszoo's input rules, written once, and the validation switch.

README, "Bad input": bad input raises before any work, naming the argument; under XLA (and on
JAX inside ``jit``), where assertions do not exist, invalid values make the affected rows NaN;
NaN in never becomes a finite number out; eager, graph and XLA agree.

A :class:`Rule` is one definition of what valid input looks like, written with ``keras.ops``.
From it come all three forms of the check:

* eager (a known value): ``ValueError`` naming the argument (:meth:`Rule.check`);
* a TensorFlow graph without XLA: an assertion op with the same message (:meth:`Rule.check`);
* traced under XLA / ``jax.jit``: the mask of invalid entries or rows, which the kernel
  turns into NaN (:meth:`Rule.invalid` and :func:`nan_where`).

An op checking several inputs in a row calls :func:`check_rules`: the same checks, with one
host read for all of them on PyTorch.

The rules: :data:`LOGITS`, :data:`CLASS_IDS`, :data:`PADDED_CLASS_IDS`, :data:`ONE_HOT`,
:data:`TARGETS`, :data:`PROBABILITIES`, :data:`PROBABILITY_BOUNDS`, :data:`POSITIVE`,
:data:`NON_NEGATIVE`, :data:`NON_NEGATIVE_OR_NAN`, :data:`POSSIBILITY`,
:data:`SCALED_POSSIBILITY`, :data:`VOTES`, plus :func:`check_number` /
:func:`check_choice` for hyper-parameters. Checks that cost time per step (host reads of
eager values, graph assertions) are switched off with :func:`set_validation` /
:func:`validation`; NaN poisoning folded into the kernels always stays. Every kernel computes
in float32 or wider (:func:`to_compute_dtype`).

Example:
  >>> from losszoo import contract
  >>> contract.CLASS_IDS.check(np.array([0, 3]), "y_true", 3)
  Traceback (most recent call last):
  ...
  ValueError: `y_true` holds class ids, which must be whole numbers in [0, K); rows [1] are not.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import keras
import numpy as np
from keras import ops

from losszoo import _backend
from losszoo._backend import static_value

__all__ = [
    "CLASS_IDS",
    "LOGITS",
    "NON_NEGATIVE",
    "NON_NEGATIVE_OR_NAN",
    "ONE_HOT",
    "POSITIVE",
    "PROBABILITIES",
    "PROBABILITY_BOUNDS",
    "PADDED_CLASS_IDS",
    "POSSIBILITY",
    "SCALED_POSSIBILITY",
    "TARGETS",
    "VOTES",
    "Rule",
    "check_choice",
    "check_rules",
    "check_number",
    "nan_where",
    "set_validation",
    "validation",
    "validation_enabled",
]

# Process-wide (not thread-local): MirroredStrategy traces replica functions in threads.
_VALIDATION = {"enabled": True}


def validation_enabled() -> bool:
    """Whether run-time input checks (eager host reads, graph assertions) are on (default).

    Read at trace time: a function traced with validation off keeps no assertions.
    """
    return _VALIDATION["enabled"]


def set_validation(enabled: bool) -> None:
    """Switch run-time input checks on or off (process-wide; read when ops are traced).

    Off, ops skip the eager value checks and graph assertions on their tensor inputs (labels,
    logits, bounds); invalid values then still make results NaN wherever the kernels can tell
    (as under XLA), but errors are no longer raised. Hyper-parameter checks (Python numbers at
    construction) always run: they cost nothing per step.

    Args:
      enabled: ``True`` (default state) to check, ``False`` to skip.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"`enabled` must be a bool, got {enabled!r}.")
    _VALIDATION["enabled"] = enabled


@contextlib.contextmanager
def validation(enabled: bool):
    """Context manager form of :func:`set_validation`; restores the previous state on exit.

    Example:
      >>> with losszoo.validation(False):      # trusted inputs: no host reads, no asserts
      ...     print(losszoo.validation_enabled())
      False
      >>> losszoo.validation_enabled()
      True
    """
    previous = validation_enabled()
    set_validation(enabled)
    try:
        yield
    finally:
        _VALIDATION["enabled"] = previous


# --------------------------------------------------------------------------------------------
# Rules


@dataclass(frozen=True)
class Rule:
    """One input rule: ``text`` says what valid input is, ``mask`` finds what breaks it.

    Attributes:
      text: completes "`name` ..." in messages, e.g. ``"must be >= 0"``.
      mask: ``mask(xp, x, *others) -> bool array``, true where ``x`` breaks the rule: per
        entry or per row (the last axis reduced), as the rule defines. ``xp`` is the array
        namespace: ``keras.ops`` for tensors, ``numpy`` for known values (one definition for
        the error, the assertion and the NaN mask).
    """

    text: str
    mask: Callable

    def invalid(self, x, *others):
        """The rule's mask of ``x``: what a kernel poisons with :func:`nan_where`."""
        return self.mask(ops, x, *others)

    def check(self, x, name: str, *others):
        """Raise (known values) or assert (TensorFlow graphs) that ``x`` keeps the rule.

        Returns ``x`` (inside a TensorFlow graph, with a dependency on the assertion). A no-op
        when validation is off, and where values are traced for XLA (TensorFlow
        ``jit_compile=True``, ``jax.jit``): there the kernel poisons with :meth:`invalid`.
        ``others`` are the extra tensors the mask reads (e.g. the number of classes).
        """
        if not validation_enabled():
            return x
        if _reads_one_flag(x, *others) and not _any_on_device(self.mask(ops, x, *others)):
            return x  # valid; else the host values below name the rows
        value = static_value(x)
        known = [static_value(o) for o in others]
        if value is not None and all(k is not None for k in known):
            with np.errstate(invalid="ignore"):
                bad = np.asarray(self.mask(np, value, *known))
            if bad.any():
                rows = ""
                if bad.ndim:
                    shown = sorted({int(i[0]) for i in np.argwhere(bad)})[:5]
                    rows = f"; rows {shown} are not"
                raise ValueError(f"`{name}` {self.text}{rows}.")
            return x
        return _backend.assert_all(
            ops.logical_not(ops.any(self.mask(ops, x, *others))), f"`{name}` {self.text}.", x
        )


def check_rules(*checks):
    """Several :meth:`Rule.check` calls at once: ``checks`` are tuples
    ``(rule, x, name, *others)``; returns the checked ``x`` of each, in order.

    Where each check would read one flag (PyTorch tensors with values) the rules' flags are
    stacked on the device and read in ONE host read; only when one is set do the checks run
    one by one, so the first broken rule raises its own message, as in sequence. Elsewhere
    (NumPy, TensorFlow, JAX, traced code) exactly the checks in sequence.

    Example:
      >>> from losszoo import contract
      >>> x, t = contract.check_rules(
      ...     (contract.LOGITS, np.zeros((2, 3)), "logits"),
      ...     (contract.POSITIVE, np.array([0.5, -1.0]), "temperature"),
      ... )
      Traceback (most recent call last):
      ...
      ValueError: `temperature` must be finite and > 0; rows [1] are not.
    """
    if validation_enabled() and all(_reads_one_flag(c[1], *c[3:]) for c in checks):
        flags = [ops.any(rule.mask(ops, x, *others)) for rule, x, _, *others in checks]
        if not _any_on_device(ops.stack(flags)):
            return tuple(c[1] for c in checks)
    return tuple(rule.check(x, name, *others) for rule, x, name, *others in checks)


def _reads_one_flag(*values) -> bool:
    """Whether a check of these values reduces on the device and reads one flag instead of
    copying them to the host: PyTorch tensors holding values (the others Python numbers or
    such tensors). A tensor's copy to the host is a sync and ``numel`` bytes on a GPU; the
    flag is one byte. Elsewhere (NumPy input, TensorFlow eager, JAX arrays) values are read
    as before."""
    return (
        _backend.NAME == "torch"
        and _backend.is_concrete(values[0])
        and all(isinstance(v, (int, float)) or _backend.is_concrete(v) for v in values[1:])
    )


def _any_on_device(mask) -> bool:
    """Whether any entry of a boolean tensor is true: reduced where it lives, one read."""
    return bool(ops.any(mask))


def rules_enforced(*tensors) -> bool:
    """Whether :meth:`Rule.check` stops bad values of these tensors here: validation is on and
    either their values are known (it raises) or a TensorFlow graph without XLA runs (it
    asserts). Where this holds a kernel can skip its NaN mask of bad rows (the half of the
    contract for traced code): valid input leaves that mask empty."""
    if not validation_enabled():
        return False
    return _backend.in_graph_without_xla() or all(map(_backend.is_concrete, tensors))


def _row_max(xp, x):
    """The maximum over the last axis: NumPy's, else :func:`losszoo._backend.reduce_max`
    (Keras' ``max`` refuses a batch of 0 rows on TensorFlow and PyTorch)."""
    if xp is np:
        return np.max(x, axis=-1, initial=-np.inf)
    return _backend.reduce_max(x, axis=-1)


def _logits_mask(xp, z):
    """Rows holding NaN or +inf, or only -inf (``[...]``, the class axis reduced): the row max
    is NaN, +inf or -inf there. NumPy's and TensorFlow's max propagate NaN, so one reduction
    that reads ``z`` directly; elsewhere (XLA's max may skip NaN) NaN is tested on its own."""
    bad = xp.logical_not(xp.isfinite(_row_max(xp, z)))
    if xp is np or _backend.max_propagates_nan():
        return bad
    return bad | xp.any(xp.isnan(z), axis=-1)


LOGITS = Rule(
    "must not hold NaN or +inf, nor rows that are all -inf (-inf masks a class)", _logits_mask
)
"""Scores of classes (class axis last): finite, or ``-inf`` to mask a class, and at least
one class left per row. Under XLA a row breaking it comes out NaN.

The logits policy of every op: its logits keep this rule, a row breaking it comes out NaN
in every mode, and eagerly and in graphs the op raises naming the argument (the checked
form: Rankmax, BCSoftmax, the possibilistic ops), unless its docstring names the cheaper
form kept for speed: ``sparsemax`` / ``sparsemax_loss`` only poison (folded into the
threshold's passes, no host read); ``softmax_cross_entropy`` raises for NaN and poisons
``+inf`` and all ``-inf`` rows."""


def _ids_mask(xp, ids, num_classes, low=0):
    """Ids outside ``[low, num_classes)``, or (floating ids) not whole numbers."""
    if not _is_integer(ids):
        whole = xp.logical_and(xp.isfinite(ids), xp.equal(ids, xp.round(ids)))
        ids = xp.where(whole, ids, low - 1)
    return xp.logical_or(xp.less(ids, low), xp.greater_equal(ids, num_classes))


CLASS_IDS = Rule("holds class ids, which must be whole numbers in [0, K)", _ids_mask)
"""Class ids (entry-wise): whole numbers in ``[0, num_classes)``; pass ``num_classes``."""


def _non_negative_mask(xp, x):
    return xp.logical_not(xp.isfinite(x)) | (x < 0)


def _row_min(xp, x):
    """The minimum over the last axis (see :func:`_row_max`)."""
    if xp is np:
        return np.min(x, axis=-1, initial=np.inf)
    return _backend.reduce_min(x, axis=-1)


def _targets_mask(xp, q, tol):
    """Rows breaking :data:`TARGETS` from two reductions of ``q`` (the same verdicts as
    testing every entry, in fewer passes): ``min < 0`` finds negative entries and ``-inf``;
    the row sum is NaN where an entry is NaN (or both infinities meet) and farther than
    ``tol`` from 1 where one is ``+inf``. NaN is tested on the sum, never on the minimum (XLA's
    and PyTorch's min need not propagate it), and without ``not`` (TensorFlow's graph
    optimizer rewrites ``not(t <= c)`` as ``t > c``)."""
    total = xp.sum(q, axis=-1)
    return (_row_min(xp, q) < 0) | xp.isnan(total) | (xp.abs(total - 1.0) > tol)


TARGETS = Rule(
    "rows must sum to 1 and hold finite values >= 0 (target distributions; sums within tolerance)",
    _targets_mask,
)
"""Target distributions, per row: finite, non-negative, summing to 1 within ``tol``."""


# Element-wise range rules of probability bounds (0 <= lower, upper <= 1) are checked with
# this slack; kernels clamp values inside it (the spec's random-problem recipe produces
# upper = 1 + 1e-6).
BOUND_RANGE_TOL = 1e-5


def _bounds_mask(xp, bound, other, tol, num_classes, is_lower):
    """Rows (class axis last, reduced) where ``bound`` breaks its half of the box rule.

    ``is_lower``: ``bound`` is ``lower`` (range ``>= 0``, ``sum <= 1 + tol``, and
    ``max(lower, 0) <= clip(other, 0, 1)`` with ``other`` the upper bound); else ``upper``
    (range ``[0, 1]``, ``sum >= 1 - tol``). Range tests allow :data:`BOUND_RANGE_TOL`.
    A class axis of size 1 stands for ``num_classes`` equal entries. NaN breaks the rule.
    """
    if len(bound.shape) == 0:
        bound = xp.reshape(bound, (1,))
    size = bound.shape[-1]
    scale = 1 if size in (None, num_classes) else num_classes / size
    if is_lower:
        clamped = xp.maximum(bound, xp.zeros_like(bound))
        total = xp.sum(clamped, axis=-1)
        ok = (total * scale if scale != 1 else total) <= 1.0 + tol
        cap = other if isinstance(other, float) else xp.clip(other, 0.0, 1.0)
        entry = (bound < -BOUND_RANGE_TOL) | xp.greater(clamped, cap)
    else:
        total = xp.sum(xp.clip(bound, 0.0, 1.0), axis=-1)
        ok = (total * scale if scale != 1 else total) >= 1.0 - tol
        entry = (bound < -BOUND_RANGE_TOL) | (bound > 1.0 + BOUND_RANGE_TOL)
    # NaN: explicitly (TensorFlow's CPU minimum/maximum need not propagate it into the sums,
    # and its graph optimizer rewrites not(t <= c) as t > c)
    return xp.logical_not(ok) | xp.any(entry | xp.isnan(bound), axis=-1)


PROBABILITY_BOUNDS = Rule(
    "must hold feasible probability bounds: no NaN, 0 <= lower <= upper <= 1 and "
    "sum(lower) <= 1 <= sum(upper) along the class axis (entries within 1e-5, sums within "
    "10 eps K)",
    _bounds_mask,
)
"""Box constraints of a probability vector, per row (class axis last): checked as
``check(lower, "lower", upper, tol, K, True)`` and ``check(upper, "upper", lower, tol, K,
False)``; a missing bound is passed as ``0.0`` / ``1.0``."""

POSITIVE = Rule("must be finite and > 0", lambda xp, t: xp.logical_not(xp.isfinite(t) & (t > 0)))
"""Finite, strictly positive values (entry-wise): temperatures, scales."""

#: Rows of probabilities must sum to 1 within this tolerance (float16 softmax outputs pass).
PROBABILITY_SUM_TOL = 1e-3

PROBABILITIES = Rule(
    f"must hold probability rows: finite, non-negative, summing to 1 (within "
    f"{PROBABILITY_SUM_TOL}); pass probabilities, not logits",
    lambda xp, p: _targets_mask(xp, p, PROBABILITY_SUM_TOL),
)
"""Rows of class probabilities ``[..., K]``: finite, ``>= 0``, summing to 1 within
:data:`PROBABILITY_SUM_TOL` (per row)."""


def _one_hot_mask(xp, y):
    binary = xp.all(xp.equal(y, 0) | xp.equal(y, 1), axis=-1)
    return xp.logical_not(binary & xp.equal(xp.sum(y, axis=-1), 1))


ONE_HOT = Rule("of shape [N, K] must be one-hot rows (one 1, zeros elsewhere)", _one_hot_mask)
"""One-hot label rows ``[..., K]``: entries 0 or 1, exactly one 1 (per row)."""


NON_NEGATIVE = Rule("must be finite and >= 0", _non_negative_mask)
"""Finite, non-negative values (entry-wise): losses, weights, counts."""


PADDED_CLASS_IDS = Rule(
    "holds class ids, which must be whole numbers in [0, K) (K = the logits' last axis), "
    "or -1 for padding",
    lambda xp, ids, n: _ids_mask(xp, ids, n, low=-1),
)
"""Lists of class ids padded with -1 (entry-wise): ``CLASS_IDS`` plus the padding value;
pass the number of classes."""


NON_NEGATIVE_OR_NAN = Rule(
    "must be finite and >= 0 (NaN passes: a state that NaN losses made NaN)",
    lambda xp, x: xp.isinf(x) | (x < 0),
)
"""A streaming state's sums (entry-wise): finite and >= 0, or NaN (NaN in, NaN out)."""

_MAX_ONE_TOL = 1e-6


def _possibility_mask(xp, pi, normalised=True):
    finite = xp.isfinite(pi)
    ok = finite & (pi >= 0)
    if normalised:
        ok = ok & (pi <= 1.0)
    top = _row_max(xp, xp.where(finite, pi, 0.0))
    low_top = top < 1.0 - _MAX_ONE_TOL if normalised else top <= 0.0
    return xp.logical_not(xp.all(ok, axis=-1)) | low_top


POSSIBILITY = Rule(
    "must hold possibility distributions: rows of finite values in [0, 1] whose maximum is 1",
    _possibility_mask,
)
"""Possibility distributions, per row: values in ``[0, 1]``, maximum 1 (within 1e-6)."""

SCALED_POSSIBILITY = Rule(
    "must hold finite, non-negative rows with a positive maximum (scaled possibility)",
    lambda xp, pi: _possibility_mask(xp, pi, normalised=False),
)
"""Possibility distributions up to scale, per row: finite, >= 0, with a positive maximum."""


def _votes_mask(xp, v):
    bad = _non_negative_mask(xp, v)
    return xp.any(bad, axis=-1) | xp.logical_not(xp.sum(xp.where(bad, 0.0, v), axis=-1) > 0)


VOTES = Rule("must hold finite, non-negative vote counts with a positive row sum", _votes_mask)
"""Vote counts, per row: finite, non-negative, with a positive sum."""


def nan_where(invalid, x):
    """``x`` with NaN wherever ``invalid`` (broadcast against ``x``) is true.

    The XLA half of the contract: a kernel computes a boolean mask of inputs it cannot use
    (ids out of range, NaN labels, infeasible bounds) and poisons the affected rows with this,
    so ``TerminateOnNaN`` and NaN checks catch what assertions (absent under XLA) would have.
    NaN also propagates through gradients that multiply the result.
    """
    x = ops.convert_to_tensor(x)
    return ops.where(invalid, ops.cast(np.nan, x.dtype), x)


def row_has_nan(x, axis: int = -1, keepdims: bool = False):
    """Boolean mask of the rows (reduced over ``axis``) of ``x`` that hold a NaN."""
    return ops.any(ops.isnan(x), axis=axis, keepdims=keepdims)


def check_finite(x, name: str):
    """Reject NaN/Inf early: eagerly with ValueError, in TensorFlow graphs with an assertion.

    Returns ``x`` (with a dependency on the check inside graphs), so callers write
    ``x = check_finite(x, "labels")``.
    """
    text = "contains NaN or Inf values"
    return _check_all(x, name, text, lambda xp, v: xp.isfinite(v), _backend.assert_finite)


def check_not_nan(x, name: str):
    """Like :func:`check_finite` but allows +-Inf (e.g. -inf logits used as masks)."""
    return _check_all(x, name, "contains NaN values", lambda xp, v: xp.logical_not(xp.isnan(v)))


def _check_all(x, name, text, ok, graph_check=None):
    """``x``, checked to keep ``ok`` everywhere: raises if its value is known and breaks it,
    else asserts it (TensorFlow graphs; ``graph_check(x, message)`` when given, one fused op
    where TensorFlow has one); a no-op when validation is off."""
    if not validation_enabled():
        return x
    if _reads_one_flag(x) and not _any_on_device(ops.logical_not(ok(ops, x))):
        return x
    value = static_value(x)
    if value is None:
        if graph_check is not None:
            return graph_check(x, f"`{name}` {text}.")
        return _backend.assert_all(ok(ops, x), f"`{name}` {text}.", x)
    if value.size and not np.all(ok(np, value)):
        raise ValueError(f"`{name}` {text}.")
    return x


# --------------------------------------------------------------------------------------------
# Hyper-parameters


def check_number(
    value,
    name: str,
    *,
    low=None,
    high=None,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
    allow_none: bool = False,
    tensor_ok: bool = True,
):
    """Validate a hyper-parameter given as a Python/numpy number; return it as int or float.

    Tensors and variables (e.g. a learned temperature) are returned unchanged: they are
    checked where the op reads them (``tensor_ok=False``: a TypeError instead). Everything
    else must be a real, finite number within ``[low, high]`` (open ends with ``low_open`` /
    ``high_open``); ``integer=True`` also rejects non-integral values and booleans.

    Raises:
      TypeError: naming ``name``, for a value that is not a real (or integer) number.
      ValueError: naming ``name`` and the rule broken, for a number out of range.
    """
    if value is None and allow_none:
        return None
    if is_tensor(value):
        if not tensor_ok:
            raise TypeError(f"`{name}` must be a Python number, not a tensor.")
        return value
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        kind = "an integer" if integer else "a real number"
        raise TypeError(f"`{name}` must be {kind}, got {value!r} ({type(value).__name__}).")
    if integer:
        if not float(value).is_integer():
            raise ValueError(f"`{name}` must be an integer, got {value!r}.")
        value = int(value)
    else:
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"`{name}` must be a finite number, got {value!r}.")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"`{name}` must be {'>' if low_open else '>='} {low}, got {value!r}.")
    if high is not None and (value >= high if high_open else value > high):
        raise ValueError(f"`{name}` must be {'<' if high_open else '<='} {high}, got {value!r}.")
    return value


def check_choice(value, name: str, choices):
    """Raise ValueError unless ``value`` is one of ``choices`` (listed in the message)."""
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"`{name}` must be one of {listed}; got {value!r}.")
    return value


def check_bool(value, name: str) -> bool:
    """``value`` as a bool; TypeError unless it is a Python or numpy bool (0 and 1 are not)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be a bool, got {value!r}.")
    return bool(value)


def shapes_compatible(a, b) -> bool:
    """Whether two static shapes (``None`` = unknown size) can be the same."""
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


# --------------------------------------------------------------------------------------------
# Tensors: dtype, rank, axis, label forms


def is_tensor(x) -> bool:
    """Whether ``x`` is a tensor or variable of the backend (or a Keras symbolic tensor)."""
    return ops.is_tensor(x) or isinstance(x, (keras.Variable, keras.KerasTensor))


def dtype_name(x) -> str:
    """The standardized dtype name of a tensor (``"float32"``, ``"int64"``, ...)."""
    return keras.backend.standardize_dtype(x.dtype)


def _is_integer(x) -> bool:
    return dtype_name(x).startswith(("int", "uint"))


def is_floating(x) -> bool:
    return dtype_name(x) in ("float16", "bfloat16", "float32", "float64")


def check_real(x, name: str, bool_ok: bool = True) -> str:
    """``x``'s dtype name; TypeError naming ``name`` unless it is floating, integer or (with
    ``bool_ok``) bool."""
    kind = dtype_name(x)
    if not (is_floating(x) or _is_integer(x) or (bool_ok and kind == "bool")):
        allowed = "integer, floating or bool" if bool_ok else "integer or floating"
        raise TypeError(f"`{name}` must hold real numbers ({allowed}), got dtype {kind}.")
    return kind


def to_compute_dtype(x, name: str = "x"):
    """Convert ``x`` to a floating tensor in a dtype safe to compute in.

    Returns:
      ``(x, original_dtype)``: float16/bfloat16 become float32, float32/float64 are kept.
      Integer and bool inputs are converted to float32 and reported as float32. Text raises
      ``TypeError`` naming ``name`` (:func:`check_array_form`).
    """
    check_array_form(x, name)
    x = ops.convert_to_tensor(x)
    kind = check_real(x, name)
    if kind in ("float32", "float64"):
        return x, kind
    return ops.cast(x, "float32"), (kind if is_floating(x) else "float32")


def static_rank(x):
    """The rank of ``x`` when known (a TensorFlow tensor may have unknown rank), else None."""
    shape = x.shape
    return shape.rank if hasattr(shape, "rank") else len(shape)


def check_static_rank(x, min_rank: int, name: str) -> None:
    """Raise ValueError if the static rank of ``x`` is known and below ``min_rank``."""
    rank = static_rank(x)
    if rank is not None and rank < min_rank:
        raise ValueError(
            f"`{name}` must have rank >= {min_rank}, got rank {rank} with shape {x.shape}."
        )


def move_axis_last(x, axis: int):
    """Transpose ``axis`` of ``x`` to the end. Returns ``(x_t, undo)`` with ``undo(y)``."""
    rank = static_rank(x)
    if rank is None:
        raise ValueError("The rank of the input must be known statically.")
    if not -rank <= axis < rank:
        raise ValueError(f"`axis`={axis} is out of range for a tensor of rank {rank}.")
    axis %= rank
    if axis == rank - 1:
        return x, lambda y: y
    perm = [i for i in range(rank) if i != axis] + [axis]
    inverse = np.argsort(perm).tolist()
    return ops.transpose(x, perm), lambda y: ops.transpose(y, inverse)


def dense_labels(labels, name: str, *, sparse_fill=0, ragged_fill=None):
    """``labels`` as a dense tensor: the label forms that mean something, else a TypeError.

    On TensorFlow a ``tf.SparseTensor`` is densified with ``sparse_fill`` in its absent
    entries (0 for multi-hot / dense targets, -1 for padded id lists), and a
    ``tf.RaggedTensor`` (e.g. a list of positive ids per row) is padded with ``ragged_fill``;
    callers that have no padded form pass ``None`` and ragged labels raise ``TypeError``
    naming ``name``. XLA cannot compile the sparse and ragged ops that densify, so under
    ``jit_compile=True`` both forms raise ``TypeError`` naming ``name`` (densify them in the
    input pipeline, or compile with ``jit_compile=False`` / ``"auto"``). Anything else goes
    through ``keras.ops.convert_to_tensor``; text raises ``TypeError`` naming ``name``
    (:func:`check_array_form`).
    """
    check_array_form(labels, name)
    if _backend.TENSORFLOW:
        import tensorflow as tf

        if isinstance(labels, (tf.SparseTensor, tf.RaggedTensor)) and _backend.in_xla_context():
            raise TypeError(
                f"`{name}` is a {type(labels).__name__}, which XLA (jit_compile=True) cannot "
                "densify: densify it in the input pipeline, or compile with jit_compile=False "
                "or 'auto'."
            )
        if isinstance(labels, tf.SparseTensor):
            fill = tf.cast(sparse_fill, labels.dtype)
            return tf.sparse.to_dense(tf.sparse.reorder(labels), default_value=fill)
        if isinstance(labels, tf.RaggedTensor):
            if ragged_fill is None:
                raise TypeError(
                    f"`{name}` must be a dense tensor or a tf.SparseTensor (multi-hot or dense "
                    "targets), got a tf.RaggedTensor: convert it with `.to_tensor()` or build "
                    "the targets it stands for."
                )
            return labels.to_tensor(default_value=tf.cast(ragged_fill, labels.dtype))
    labels = ops.convert_to_tensor(labels)
    check_real(labels, name)
    return labels


def check_array_form(labels, name: str) -> None:
    """``TypeError`` naming ``name`` for arrays no backend can read as numbers: a
    ``tf.SparseTensor`` / ``tf.RaggedTensor`` on JAX or PyTorch (TensorFlow-only forms), text,
    or ragged Python lists (before Keras' own float conversion fails less clearly)."""
    kind, module = type(labels).__name__, type(labels).__module__
    if kind in ("SparseTensor", "RaggedTensor") and module.startswith("tensorflow"):
        if not _backend.TENSORFLOW:
            raise TypeError(
                f"`{name}` is a tf.{kind}, which only the TensorFlow backend takes (Keras runs "
                f"on {_backend.NAME}): pass a dense array (tf.sparse.to_dense / .to_tensor())."
            )
    elif isinstance(labels, (np.ndarray, list, tuple, str)):
        try:
            dtype = np.asarray(labels).dtype
        except ValueError:  # ragged nested lists
            dtype = np.dtype(object)
        except (TypeError, NotImplementedError):  # e.g. a list of graph tensors: Keras decides
            return
        if dtype.kind in "USO":
            raise TypeError(f"`{name}` must hold real numbers, got {dtype} (text or ragged).")


# --------------------------------------------------------------------------------------------
# Labels in the Keras forms: class ids [B] / [B, 1] or dense targets [B, K], read once, by the op


def is_class_ids(labels, logits) -> bool:
    """True when ``labels`` holds class ids: one rank below ``logits``, or a trailing 1.

    Keras' rule (``SparseCategoricalCrossentropy`` takes ids ``[B]`` or ``[B, 1]``,
    ``CategoricalCrossentropy`` targets ``[B, K]``), by shape, never by dtype. Labels of the
    logits' rank whose last axis has no static size are dense (TFRS's ``tf.eye(B)``).
    """
    true_rank, pred_rank = static_rank(labels), static_rank(logits)
    if true_rank is None or pred_rank is None:
        raise ValueError("`y_true` and `y_pred` must have a known rank.")
    if true_rank == pred_rank - 1:
        return True
    return true_rank == pred_rank and labels.shape[-1] == 1 and logits.shape[-1] != 1


def num_classes(logits):
    """The size of ``logits``' last axis: a Python int when static, else a scalar tensor."""
    n = logits.shape[-1]
    return int(n) if n is not None else ops.shape(logits)[-1]


def class_ids_and_invalid(labels, logits, name: str = "labels"):
    """Class ids (``[...]`` or ``[..., 1]``) as int32 ``logits.shape[:-1]``, and the mask of
    ids breaking :data:`CLASS_IDS` (tested in their own dtype, before a cast could wrap them;
    ``K`` may be dynamic). Those ids are 0 in the result (safe to gather) and the callers
    poison their rows (:func:`nan_where`); eagerly and in graphs they raise first."""
    labels = ops.convert_to_tensor(labels)
    if static_rank(labels) is not None and static_rank(labels) == static_rank(logits):
        labels = ops.squeeze(labels, -1)
    check_real(labels, name, bool_ok=False)
    n = num_classes(logits)
    if not isinstance(n, int):  # a tensor must match the ids' dtype
        n = ops.cast(n, labels.dtype)
    labels = CLASS_IDS.check(labels, name, n)
    bad = CLASS_IDS.invalid(labels, n)
    return ops.cast(ops.where(bad, ops.zeros_like(labels), labels), "int32"), bad


def one_hot_targets(labels, logits, name: str = "labels"):
    """One-hot rows in ``logits``' dtype for class ids (a dynamic ``K`` works under XLA);
    rows of invalid ids are all NaN."""
    ids, invalid = class_ids_and_invalid(labels, logits, name)
    classes = ops.arange(num_classes(logits), dtype=ids.dtype)
    one_hot = ops.cast(ops.equal(ids[..., None], classes), logits.dtype)
    return nan_where(invalid[..., None], one_hot)


def target_distribution(labels, logits, normalize: bool = True, name: str = "labels"):
    """Ids or dense targets (a ``tf.SparseTensor`` densified) as ``(q, has_target)``.

    ``q`` has ``logits``' shape and dtype: one-hot rows for ids, dense rows checked by
    :data:`NON_NEGATIVE` and divided by their sum when ``normalize`` (a row summing to 0
    stays 0). ``has_target`` (``logits.shape[:-1]``) is 1 for rows with a positive total,
    else 0. Rows of invalid ids or dense entries are NaN in both (what survives under XLA;
    eagerly and in graphs they raise first, naming ``name``).
    """
    labels = dense_labels(labels, name)
    if is_class_ids(labels, logits):
        q = one_hot_targets(labels, logits, name)
        return q, ops.sum(q, axis=-1)  # 1, or NaN for an invalid id
    if not shapes_compatible(tuple(labels.shape), tuple(logits.shape)):
        raise ValueError(
            f"`{name}` must hold class ids of shape {tuple(logits.shape[:-1])} (or with a "
            f"trailing 1) or targets of the shape of the scores {tuple(logits.shape)}; got "
            f"shape {tuple(labels.shape)}."
        )
    q = NON_NEGATIVE.check(ops.cast(labels, logits.dtype), name)
    bad = ops.any(NON_NEGATIVE.invalid(q), axis=-1)
    total = ops.sum(q, axis=-1, keepdims=True)
    has_target = nan_where(bad, ops.cast(total[..., 0] > 0, q.dtype))
    if normalize:
        q = ops.divide_no_nan(q, total)
    return nan_where(bad[..., None], q), has_target


# --------------------------------------------------------------------------------------------
# Retrieval: shapes known only at run time, catalogue ids, sampling probabilities


def check_shape(x, shape, name: str, what: str = ""):
    """``x``, checked to have ``shape`` (ints, ``None`` for any size, or scalar tensors).

    Sizes known statically are compared at once (a ``ValueError`` naming ``name``, also when
    tracing for XLA); the others get a graph assertion on TensorFlow (validation on). ``what``
    completes the message, e.g. ``" ([B, D])"``.
    """
    expected = tuple(shape)
    if len(x.shape) != len(expected):
        raise ValueError(
            f"`{name}` must have rank {len(expected)}{what}; got shape {tuple(x.shape)}."
        )
    static = [None if w is None else static_value(w) for w in expected]
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
        x = _backend.assert_all(ok, f"`{name}` has the wrong shape{what}.", x)
    return x


SAMPLING_PROBABILITY = Rule(
    "must lie in (0, 1]", lambda xp, p: xp.logical_not(xp.logical_and(p > 0, p <= 1))
)
"""Sampling probabilities (entry-wise) in ``(0, 1]``; spelt as a negation so NaN breaks it."""


def _item_ids_rule(num_items):
    if num_items is None:
        return Rule("must hold ids >= 0", lambda xp, i: i < 0)
    return Rule(
        f"must hold ids in [0, {num_items}) (the catalogue)",
        lambda xp, i: (i < 0) | (i >= num_items),
    )


def check_item_ids(ids, name: str, num_items=None):
    """Integer item ids checked (``>= 0``, and ``< num_items`` when given), as int32.

    Returns ``(ids, bad)``: bad ids are 0 in ``ids`` and true in ``bad``, which callers turn
    into NaN (:func:`nan_where`). The range test runs in the ids' own dtype, before the cast
    could wrap an int64 id.

    Raises:
      TypeError: ``ids`` is not of an integer dtype.
      ValueError: (known values) an id is out of range.
    """
    ids = ops.convert_to_tensor(ids)
    if not _is_integer(ids):
        raise TypeError(f"`{name}` must hold integer ids, got dtype {dtype_name(ids)}.")
    rule = _item_ids_rule(num_items)
    ids = rule.check(ids, name)
    bad = rule.invalid(ids)
    return ops.where(bad, 0, ops.cast(ids, "int32")), bad
