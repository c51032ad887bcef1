"""The fail-loud contract (README, "Bad input"), as reusable test assertions.

Every public function is run three ways: eagerly, inside a ``tf.function`` graph, and under
``tf.function(jit_compile=True)``. The contract:

* bad input -> eager and graph raise an error whose message names the argument (in
  backticks, as losszoo's messages do); under XLA, where assertions vanish, the call either
  raises or the affected rows come back entirely NaN (never a finite, plausible number);
* valid input -> the three modes agree with each other (and with a reference, if given),
  on values and on gradients.

Use :class:`Modes` to keep one traced graph and one XLA program per function and input
signature, so hypothesis examples of the same shape do not recompile. Each assertion records
its outcome in :data:`OUTCOMES` under a ``suite`` label (labels starting with ``_`` are
left out of the totals); ``tests/conftest.py`` prints the totals at the end of the run
(and writes them as JSON to ``$LOSSZOO_CONTRACT_REPORT`` if set).
"""

from __future__ import annotations

import collections
import re

import hypothesis
import numpy as np
import tensorflow as tf

from tests.helpers import assert_nests_close, weighted_output_sum

MODES = ("eager", "graph", "xla")

#: (suite, input kind, mode, outcome) -> count; input kind is "bad" or "valid".
OUTCOMES: collections.Counter = collections.Counter()

#: Hypothesis settings for contract tests: no deadline (XLA compiles), few examples.
CONTRACT_SETTINGS = hypothesis.settings(
    deadline=None,
    max_examples=15,
    derandomize=True,
    suppress_health_check=[
        hypothesis.HealthCheck.too_slow,
        hypothesis.HealthCheck.function_scoped_fixture,
        hypothesis.HealthCheck.data_too_large,
    ],
)

_ERRORS = (ValueError, TypeError, tf.errors.InvalidArgumentError, tf.errors.OutOfRangeError)


def _to_tensor(a):
    if isinstance(a, (np.ndarray, list, tuple, float, int, np.generic)) and not isinstance(a, bool):
        return tf.convert_to_tensor(np.asarray(a))
    return a


class Modes:
    """Run ``fn(*tensors, **static)`` eagerly, as a traced graph, and under XLA.

    Positional arguments are converted to tensors (so graph and XLA see symbolic inputs and
    take their assertion / NaN paths, never the eager numpy checks); keyword arguments are
    passed through as Python values (hyper-parameters).
    """

    def __init__(self, fn, **static):
        self.fn = fn
        self.static = static
        self._graph = tf.function(lambda *a: fn(*a, **static), autograph=False)
        self._xla = tf.function(lambda *a: fn(*a, **static), jit_compile=True, autograph=False)
        self._grad_fns = {}  # (mode, wrt) -> the traced gradient function, reused

    def __call__(self, mode, *args):
        args = [_to_tensor(a) for a in args]
        if mode == "eager":
            return self.fn(*args, **self.static)
        if mode == "graph":
            return self._graph(*args)
        if mode == "xla":
            return self._xla(*args)
        raise ValueError(f"unknown mode {mode!r}")

    def with_gradient(self, mode, args, wrt=(0,)):
        """``(outputs, gradients)`` of a fixed random weighting of the float outputs.

        The traced function is kept per ``(mode, wrt)``, like the graph and XLA programs.
        """
        args = [_to_tensor(a) for a in args]
        wrt = tuple(wrt)
        key = (mode, wrt)
        if key not in self._grad_fns:

            def run(*a):
                watched = [a[i] for i in wrt]
                with tf.GradientTape() as tape:
                    tape.watch(watched)
                    out = self.fn(*a, **self.static)
                    total = weighted_output_sum(out)
                return out, tape.gradient(total, watched)

            self._grad_fns[key] = (
                run
                if mode == "eager"
                else tf.function(run, jit_compile=(mode == "xla"), autograph=False)
            )
        return self._grad_fns[key](*args)


def _first_float(out):
    for o in tf.nest.flatten(out):
        if o is not None and o.dtype.is_floating:
            return np.asarray(o)
    raise AssertionError(f"no floating output in {out!r}")


def assert_rejects(
    runner: Modes,
    *args,
    name: str,
    rows=None,
    select=_first_float,
    modes=MODES,
    suite: str = "",
    match: str | None = None,
):
    """Bad input: eager/graph raise naming ``name``; XLA raises or returns NaN rows.

    Args:
      runner: a :class:`Modes` wrapping the function under test.
      *args: the (bad) positional inputs.
      name: the argument the message must name, e.g. ``"y_true"`` (matched as ``\\`y_true\\```).
      rows: indices (along axis 0 of the selected output) of the rows the bad values affect;
        under XLA those rows must be entirely NaN. ``None``: every row must be NaN.
        Pass ``rows=()`` for outputs without a row structure where any NaN suffices.
      select: picks the array to inspect from the function's output.
      modes: which modes to run.
      suite: label for the outcome counts.
      match: an extra regular expression the error message must match (eager and graph).
    """
    for mode in modes:
        try:
            out = runner(mode, *args)
        except _ERRORS as e:
            message = str(e)
            assert f"`{name}`" in message, (
                f"[{mode}] error does not name `{name}`: {type(e).__name__}: {message[:400]}"
            )
            if match is not None:
                assert re.search(match, message), f"[{mode}] message {message[:300]!r} !~ {match}"
            OUTCOMES[(suite, "bad", mode, "error")] += 1
            continue
        if mode != "xla":
            OUTCOMES[(suite, "bad", mode, "silent")] += 1
            raise AssertionError(f"[{mode}] bad `{name}` was accepted: {out!r}")
        value = select(out)
        if rows == ():
            ok = bool(np.any(np.isnan(value)))
        else:
            picked = value if rows is None else value[np.asarray(rows, dtype=int)]
            ok = picked.size > 0 and bool(np.all(np.isnan(picked)))
        OUTCOMES[(suite, "bad", mode, "nan" if ok else "silent")] += 1
        assert ok, f"[xla] bad `{name}` gave non-NaN rows {rows}: {value!r}"


def assert_modes_agree(
    runner: Modes,
    *args,
    reference=None,
    atol=1e-5,
    rtol=1e-5,
    grad_wrt=None,
    modes=MODES,
    suite: str = "",
):
    """Valid input: every mode gives the same outputs (and gradients), equal to ``reference``.

    Args:
      runner: a :class:`Modes` wrapping the function under test.
      *args: the valid inputs.
      reference: expected first floating output (numpy), or ``None`` to only compare modes.
      grad_wrt: indices of ``args`` to differentiate; ``None`` compares outputs only.
    Returns:
      The eager output.
    """
    results = {}
    for mode in modes:
        try:
            if grad_wrt is None:
                results[mode] = (runner(mode, *args), [])
            else:
                results[mode] = runner.with_gradient(mode, args, grad_wrt)
        except _ERRORS as e:
            OUTCOMES[(suite, "valid", mode, "rejected")] += 1
            raise AssertionError(f"[{mode}] valid input rejected: {type(e).__name__}: {e}") from e
    base_mode = modes[0]
    base_out, base_grads = results[base_mode]
    if reference is not None:
        got = _first_float(base_out)
        ok = np.allclose(got, reference, atol=atol, rtol=rtol, equal_nan=True)
        OUTCOMES[(suite, "valid", base_mode, "right" if ok else "wrong")] += 1
        np.testing.assert_allclose(
            got,
            reference,
            atol=atol,
            rtol=rtol,
            err_msg=f"[{base_mode}] differs from the reference",
        )
    for mode in modes[1:]:
        out, grads = results[mode]
        message = f"[{mode}] differs from {base_mode}"
        assert_nests_close(out, base_out, atol=atol, rtol=rtol, err_msg=message)
        assert_nests_close(
            list(grads), list(base_grads), atol=atol, rtol=rtol, err_msg=f"{message} (gradient)"
        )
        OUTCOMES[(suite, "valid", mode, "agree")] += 1
    return base_out


def assert_hparam_rejected(build, name: str, values, suite: str = ""):
    """``build(value)`` raises TypeError/ValueError naming ``name`` for every bad value."""
    for value in values:
        try:
            build(value)
        except (TypeError, ValueError) as e:
            assert f"`{name}`" in str(e), f"error for {name}={value!r} does not name it: {e}"
            OUTCOMES[(suite, "bad", "construct", "error")] += 1
        else:
            OUTCOMES[(suite, "bad", "construct", "silent")] += 1
            raise AssertionError(f"`{name}`={value!r} was accepted")


BAD_NUMBERS = (float("nan"), float("inf"), -float("inf"))


def outcome_table() -> dict:
    """The recorded outcomes as ``{input kind: {outcome: count}}`` plus per-suite detail."""
    summary: dict = {"bad": collections.Counter(), "valid": collections.Counter()}
    per_suite: dict = collections.defaultdict(collections.Counter)
    for (suite, kind, mode, outcome), n in OUTCOMES.items():
        if suite.startswith("_"):  # the harness' own self-tests
            continue
        summary[kind][f"{mode}:{outcome}"] += n
        per_suite[suite][f"{kind}:{outcome}"] += n
    return {
        "summary": {k: dict(v) for k, v in summary.items()},
        "per_suite": {k: dict(v) for k, v in per_suite.items()},
    }
