"""The fail-loud contract (README, "Bad input"), as reusable test assertions, on every backend.

Every public function is run in each execution mode of the running Keras backend
(:data:`MODES`, as in ``tests/harness.py``):

* TensorFlow: eagerly, inside a ``tf.function`` graph, and under
  ``tf.function(jit_compile=True)`` (``"eager"``, ``"graph"``, ``"xla"``);
* JAX: eagerly and under ``jax.jit`` (``"eager"``, ``"jit"``);
* PyTorch: eagerly (``"eager"``; Keras' torch ``jit_compile`` is ``torch.compile``, which is
  not part of the contract).

The contract:

* bad input -> the modes that run assertions (eager everywhere, TensorFlow graphs) raise an
  error whose message names the argument (in backticks, as losszoo's messages do); in the
  compiled modes without assertions (:data:`NAN_MODES`: XLA, ``jax.jit``) the call either
  raises such an error or the affected rows come back entirely NaN (never a finite,
  plausible number);
* valid input -> the modes agree with each other (and with a reference, if given), on values
  and on gradients (each backend's own autodiff: ``tf.GradientTape``, ``jax.grad``,
  ``torch.autograd``).

Use :class:`Modes` to keep one compiled program per function and input signature (traced
graph, XLA program, ``jax.jit``), so hypothesis examples of the same shape do not
recompile. Each assertion records its outcome in :data:`OUTCOMES` under a ``suite`` label
(labels starting with ``_`` are left out of the totals); ``tests/conftest.py`` prints the
totals at the end of the run (and writes them as JSON to ``$LOSSZOO_CONTRACT_REPORT`` if set).

On JAX the contract tests run with 64-bit mode on (``tests/contract/conftest.py``): their
references are float64 oracles fed float64 inputs.
"""

from __future__ import annotations

import collections
import re

import hypothesis
import keras
import numpy as np
from keras import ops

BACKEND = keras.backend.backend()

if BACKEND == "tensorflow":
    import tensorflow as tf

    MODES = ("eager", "graph", "xla")
    NAN_MODES = frozenset({"xla"})
    _ERRORS = (ValueError, TypeError, tf.errors.InvalidArgumentError, tf.errors.OutOfRangeError)
elif BACKEND == "jax":
    MODES = ("eager", "jit")
    NAN_MODES = frozenset({"jit"})
    # losszoo's kernels use no checkify / host callbacks: a traced call raises only while
    # tracing (Python errors of static checks)
    _ERRORS = (ValueError, TypeError)
else:
    MODES = ("eager",)
    NAN_MODES = frozenset()
    _ERRORS = (ValueError, TypeError)

#: The errors a "clear error" may be (its message must also name the argument).
ERRORS = _ERRORS
#: The compiled modes of this backend (TensorFlow graph and XLA; ``jax.jit``; none on torch).
COMPILED_MODES = MODES[1:]
#: The mode whose bad-input result is NaN rows rather than an error, where there is one
#: (XLA, ``jax.jit``); else eager.
LAST_MODE = MODES[-1]

#: (suite, input kind, mode, outcome) -> count; input kind is "bad" or "valid".
OUTCOMES: collections.Counter = collections.Counter()


def examples(n: int) -> int:
    """How many hypothesis examples a valid-input contract test that asks for ``n`` runs
    here: ``n`` on TensorFlow and PyTorch; on JAX a fifth (at least 2). On JAX an eager call
    of a kernel with loops runs as one cached ``jax.jit`` program per input shape
    (``losszoo._backend.jit_on_jax``), and each example brings a new shape, hence a new
    compile (seconds each on a 2-core machine); the suite must stay within minutes a
    backend. Bad-input tests keep their counts: eager raises before the kernel runs and the
    compiled mode reuses one program per signature."""
    return n if BACKEND != "jax" else max(2, round(n / 5))


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


def numpy(x):
    """A backend tensor (or numpy value) as a numpy array; ``None`` stays ``None``."""
    if x is None:
        return None
    if BACKEND == "torch" and hasattr(x, "detach"):
        x = x.detach()
    return np.asarray(ops.convert_to_numpy(x))


def is_float(x) -> bool:
    """Whether ``x`` (a tensor or array) holds floating values."""
    return x is not None and keras.backend.is_float_dtype(keras.backend.standardize_dtype(x.dtype))


def _to_tensor(a):
    if isinstance(a, (np.ndarray, list, tuple, float, int, np.generic)) and not isinstance(a, bool):
        a = np.asarray(a)
        if BACKEND == "tensorflow":
            return tf.convert_to_tensor(a)
        if BACKEND == "jax":
            import jax.numpy as jnp

            return jnp.asarray(a)
        import torch

        return torch.tensor(a)
    return a


def _float_outputs(out):
    return [o for o in keras.tree.flatten(out) if is_float(o)]


def weighted_output_sum(out):
    """One float64 scalar from every floating output of ``out`` (any nest): a fixed,
    position-dependent weighting ``1 + 0.5 sin(i)`` of the finite entries, so its gradient is
    a full vector-Jacobian product and non-finite entries do not poison it."""
    total = ops.convert_to_tensor(0.0, "float64")
    for o in _float_outputs(out):
        flat = ops.cast(ops.reshape(o, [-1]), "float64")
        if BACKEND == "tensorflow":  # the size may be unknown while tracing (None batch)
            i = tf.range(tf.size(flat), dtype=tf.float64)
        else:
            i = ops.arange(flat.shape[0], dtype="float64")
        w = 1.0 + 0.5 * ops.sin(i)
        total = total + ops.sum(ops.where(ops.isfinite(flat), w * flat, 0.0))
    return total


def assert_nests_close(got, want, atol, rtol, err_msg):
    """Two nests of arrays agree: floats to tolerance (NaN where NaN), others exactly."""
    for g, w in zip(keras.tree.flatten(got), keras.tree.flatten(want)):
        if g is None or w is None:
            assert g is None and w is None, f"{err_msg}: one side is None"
            continue
        g, w = numpy(g), numpy(w)
        if np.issubdtype(w.dtype, np.floating):
            np.testing.assert_allclose(
                g.astype(np.float64), w.astype(np.float64), atol=atol, rtol=rtol, err_msg=err_msg
            )
        else:
            np.testing.assert_array_equal(g, w, err_msg=err_msg)


class Modes:
    """Run ``fn(*tensors, **static)`` in every mode of :data:`MODES`.

    Positional arguments are converted to tensors of the backend (so compiled modes see
    traced inputs and take their assertion / NaN paths, never the eager numpy checks);
    keyword arguments are passed through as Python values (hyper-parameters). Each compiled
    mode keeps one program per input signature (``tf.function`` / ``jax.jit`` caches).
    """

    def __init__(self, fn, **static):
        self.fn = fn
        self.static = static
        self._compiled = {}  # mode -> the compiled function, built on first use
        self._grad_fns = {}  # (mode, wrt) -> the (compiled) gradient function, reused

    def _call(self, *a):
        return self.fn(*a, **self.static)

    def compile(self, fn, mode):
        """``fn`` compiled for ``mode`` (a mode of :data:`COMPILED_MODES`)."""
        if BACKEND == "tensorflow":
            return tf.function(fn, jit_compile=(mode == "xla"), autograph=False)
        if BACKEND == "jax":
            import jax

            return jax.jit(_stateless(fn))
        raise ValueError(f"unknown mode {mode!r} on {BACKEND}")

    def __call__(self, mode, *args):
        args = [_to_tensor(a) for a in args]
        if mode == "eager":
            out = self._call(*args)
            if BACKEND == "torch":  # a layer's output carries its autograd graph
                out = keras.tree.map_structure(
                    lambda t: t.detach() if hasattr(t, "detach") else t, out
                )
            return out
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} on {BACKEND}")
        if mode not in self._compiled:
            self._compiled[mode] = self.compile(self._call, mode)
        return self._compiled[mode](*args)

    def with_gradient(self, mode, args, wrt=(0,)):
        """``(outputs, gradients)`` of a fixed weighting (:func:`weighted_output_sum`) of the
        float outputs, by the backend's autodiff. The function is kept per ``(mode, wrt)``."""
        args = [_to_tensor(a) for a in args]
        wrt = tuple(wrt)
        key = (mode, wrt)
        if key not in self._grad_fns:
            run = _gradient_function(self._call, wrt)
            self._grad_fns[key] = run if mode == "eager" else self.compile(run, mode)
        return self._grad_fns[key](*args)


def _stateless(fn):
    """``fn`` run in a ``keras.StatelessScope`` (JAX tracing): a stateful Keras object (a
    metric, a loss keeping diagnostics) then keeps its variable updates inside the scope
    instead of storing JAX tracers in its variables, as Keras' own JAX trainer does."""

    def run(*a):
        with keras.StatelessScope():
            return fn(*a)

    return run


def _gradient_function(fn, wrt):
    """``run(*args) -> (fn(*args), [d weighted_output_sum / d args[i] for i in wrt])``."""
    if BACKEND == "tensorflow":

        def run(*a):
            watched = [a[i] for i in wrt]
            with tf.GradientTape() as tape:
                tape.watch(watched)
                out = fn(*a)
                total = weighted_output_sum(out)
            return out, tape.gradient(total, watched)

        return run
    if BACKEND == "jax":
        import jax

        def run(*a):
            def of(*watched):
                full = list(a)
                for i, x in zip(wrt, watched):
                    full[i] = x
                out = _stateless(fn)(*full)
                return weighted_output_sum(out), out

            grads, out = jax.grad(of, argnums=tuple(range(len(wrt))), has_aux=True)(
                *[a[i] for i in wrt]
            )
            return out, list(grads)

        return run
    import torch

    def run(*a):
        a = list(a)
        for i in wrt:
            a[i] = a[i].detach().clone().requires_grad_(True)
        out = fn(*a)
        total = weighted_output_sum(out)
        watched = [a[i] for i in wrt]
        grads = torch.autograd.grad(total, watched, allow_unused=True)
        # an input the outputs do not depend on: a zero gradient (as jax.grad gives)
        grads = [torch.zeros_like(x) if g is None else g for x, g in zip(watched, grads)]
        return keras.tree.map_structure(
            lambda t: t.detach() if hasattr(t, "detach") else t, out
        ), grads

    return run


def first_float(out):
    """The first floating output of ``out`` (any nest), as numpy."""
    for o in keras.tree.flatten(out):
        if is_float(o):
            return numpy(o)
    raise AssertionError(f"no floating output in {out!r}")


_first_float = first_float


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
    """Bad input: the modes with assertions raise naming ``name``; the modes without them
    (:data:`NAN_MODES`: XLA, ``jax.jit``) raise so or return NaN rows.

    Args:
      runner: a :class:`Modes` wrapping the function under test.
      *args: the (bad) positional inputs.
      name: the argument the message must name, e.g. ``"y_true"`` (matched as ``\\`y_true\\```).
      rows: indices (along axis 0 of the selected output) of the rows the bad values affect;
        under XLA / ``jax.jit`` those rows must be entirely NaN. ``None``: every row must be NaN.
        Pass ``rows=()`` for outputs without a row structure where any NaN suffices.
      select: picks the array to inspect from the function's output.
      modes: which modes to run.
      suite: label for the outcome counts.
      match: an extra regular expression the error message must match (when one is raised).
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
        if mode not in NAN_MODES:
            OUTCOMES[(suite, "bad", mode, "silent")] += 1
            raise AssertionError(f"[{mode}] bad `{name}` was accepted: {out!r}")
        value = select(out)
        if rows == ():
            ok = bool(np.any(np.isnan(value)))
        else:
            picked = value if rows is None else value[np.asarray(rows, dtype=int)]
            ok = picked.size > 0 and bool(np.all(np.isnan(picked)))
        OUTCOMES[(suite, "bad", mode, "nan" if ok else "silent")] += 1
        assert ok, f"[{mode}] bad `{name}` gave non-NaN rows {rows}: {value!r}"


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


def outcome_table(outcomes=None) -> dict:
    """The recorded outcomes (``outcomes``, a mapping like :data:`OUTCOMES`; this process'
    own by default) as ``{input kind: {outcome: count}}`` plus per-suite detail."""
    summary: dict = {"bad": collections.Counter(), "valid": collections.Counter()}
    per_suite: dict = collections.defaultdict(collections.Counter)
    for (suite, kind, mode, outcome), n in (OUTCOMES if outcomes is None else outcomes).items():
        if suite.startswith("_"):  # the harness' own self-tests
            continue
        summary[kind][f"{mode}:{outcome}"] += n
        per_suite[suite][f"{kind}:{outcome}"] += n
    return {
        "summary": {k: dict(v) for k, v in summary.items()},
        "per_suite": {k: dict(v) for k, v in per_suite.items()},
    }
