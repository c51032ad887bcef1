"""BCSoftmax at tiny and subnormal temperatures (issue 31 item 4), on every backend and mode.

At ``tau = 1e-10 .. 1e-30`` the result is the ``tau -> 0`` limit (the bounds' linear program,
ties sharing by water filling), computed here in numpy; a subnormal ``tau`` (which TensorFlow
and XLA flush to 0) raises naming ``temperature`` where the value is known, and gives NaN rows
where it is traced. Never a finite row that is not a distribution.

CI time (issue 32): the issue's cases with the same bounds are rows of one batch, and the
subnormal temperature runs through the program of its upper-bound cases: those programs are
built once per mode and bound pattern (module level).
"""

import numpy as np
import pytest

from losszoo.ops import bcsoftmax
from tests.harness import BACKEND, MODES, compiled, numpy, value_and_grad

TINY = (1e-10, 1e-20, 1e-30)
SUBNORMAL = (1e-38, 1e-44)


def limit_row(x, a, b):
    """The ``tau -> 0`` limit for one row: ``y = a``, then the mass left to the classes in
    decreasing order of ``x`` up to ``b``; the tied group where it runs out shares it as
    ``clip(lam, a, b)``."""
    x, a, b = (np.asarray(t, np.float64) for t in (x, a, b))
    y, rem = a.copy(), 1.0 - a.sum()
    for v in np.unique(x[np.isfinite(x)])[::-1]:
        g = x == v
        cap = (b[g] - a[g]).sum()
        if cap <= rem:
            y[g], rem = b[g], rem - cap
            continue
        lo, hi, m = 0.0, 1.0, a[g].sum() + rem
        for _ in range(200):
            lam = 0.5 * (lo + hi)
            lo, hi = (lam, hi) if np.clip(lam, a[g], b[g]).sum() < m else (lo, lam)
        y[g] = np.clip(0.5 * (lo + hi), a[g], b[g])
        break
    return y


def limit(x, a=0.0, b=1.0):
    x = np.atleast_2d(x)
    a, b = np.broadcast_to(a, x.shape), np.broadcast_to(b, x.shape)
    return np.stack([limit_row(*row) for row in zip(x, a, b)])


ISSUE_CASES = {
    "upper": ([[0.1, 0.2, 0.3]], {"upper": 0.6}, [[0.0, 0.4, 0.6]]),
    "no_bounds": ([[0.1, 0.2, 0.3]], {}, [[0.0, 0.0, 1.0]]),
    "ties": ([[0.1, 0.3, 0.3]], {"upper": 0.6}, [[0.0, 0.5, 0.5]]),
    "masked": ([[-np.inf, 0.2, 0.3]], {"upper": 0.6}, [[0.0, 0.4, 0.6]]),
    "both": ([[0.1, 0.2, 0.3]], {"lower": 0.1, "upper": 0.6}, [[0.1, 0.3, 0.6]]),
}


# The issue's cases by bounds: the cases of one group are rows of one batch.
GROUPS = {"upper": ("upper", "ties", "masked"), "no_bounds": ("no_bounds",), "both": ("both",)}
_PROGRAMS = {}


def _limit_program(group, mode, constant=False):
    """``bcsoftmax`` with ``group``'s bounds in ``mode``, built once: of ``(x, t)``, or of ``x``
    at the constant temperature 1e-10 (``constant``)."""
    key = (group, mode, constant)
    if key not in _PROGRAMS:
        bounds = ISSUE_CASES[GROUPS[group][0]][1]
        if constant:
            fn = compiled(lambda x: bcsoftmax(x, temperature=1e-10, **bounds), mode)
        else:
            fn = compiled(lambda x, t: bcsoftmax(x, temperature=t, **bounds), mode)
        _PROGRAMS[key] = fn
    return _PROGRAMS[key]


def _group_rows(group):
    cases = [ISSUE_CASES[c] for c in GROUPS[group]]
    assert all(c[1] == cases[0][1] for c in cases)
    x = np.concatenate([np.asarray(c[0], np.float32) for c in cases])
    return x, np.concatenate([np.asarray(c[2], np.float64) for c in cases])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_tiny_temperature_gives_the_limit(group, mode):
    x, expected = _group_rows(group)
    traced = _limit_program(group, mode)
    for tau in TINY:
        np.testing.assert_allclose(numpy(traced(x, np.float32(tau))), expected, atol=1e-6)
    # a constant temperature: XLA folds x / tau into x * (1 / tau) (the issue's failure)
    const = _limit_program(group, mode, constant=True)
    np.testing.assert_allclose(numpy(const(x)), expected, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_tiny_temperature_gradient_is_finite(mode):
    def fn(x):
        return bcsoftmax(x, upper=0.6, temperature=1e-10)

    x = np.array([[0.1, 0.2, 0.3], [0.1, 0.3, 0.3]], np.float32)
    y, (g,) = value_and_grad(fn, x, mode=mode)
    np.testing.assert_allclose(y, [[0.0, 0.4, 0.6], [0.0, 0.5, 0.5]], atol=1e-6)
    assert np.isfinite(g).all()


@pytest.mark.parametrize("tau", SUBNORMAL)
def test_subnormal_temperature_raises_naming_it(tau):
    with pytest.raises(ValueError, match="`temperature`"):
        bcsoftmax(np.array([[0.1, 0.2, 0.3]], np.float32), upper=0.6, temperature=tau)


@pytest.mark.parametrize("mode", [m for m in MODES if m != "eager"])
@pytest.mark.parametrize("tau", SUBNORMAL)
def test_subnormal_temperature_traced_is_nan(tau, mode):
    """The program of the upper-bound cases (``upper=0.6``, the temperature an argument)."""
    fn = _limit_program("upper", mode)
    x, _ = _group_rows("upper")
    try:
        y = numpy(fn(x, np.float32(tau)))
    except Exception as err:  # a TensorFlow graph asserts
        assert "temperature" in str(err)
        return
    if BACKEND == "torch":  # no tracing: the value is known and raised above
        pytest.fail("expected an error")
    assert np.isnan(y).all()


@pytest.mark.parametrize("mode", MODES)
def test_tiny_temperature_random_rows_match_the_limit(mode):
    """Tie-heavy integer logits, both bounds, upper only, lower only, masked classes:
    every row is the limit (a distribution)."""
    rng = np.random.default_rng(0)
    n, k = 24, 6
    x = rng.integers(-3, 4, (n, k)).astype(np.float32)
    x[::4, 0] = -np.inf
    a = (rng.uniform(size=(n, k)) * rng.uniform(0, 0.5, (n, 1))).astype(np.float32)
    a /= k
    a[::4, 0] = 0.0
    b = rng.uniform(0.1, 0.9, (n, k)).astype(np.float32)
    b = np.minimum(b / np.minimum(1.0, b.sum(-1, keepdims=True) - 1e-3), 1.0).astype(np.float32)
    b = np.maximum(a, b)
    for bounds in ({"lower": a, "upper": b}, {"upper": b}, {"lower": a}):
        fn = compiled(lambda x, t: bcsoftmax(x, temperature=t, **bounds), mode)
        expected = limit(x, bounds.get("lower", 0.0), bounds.get("upper", 1.0))
        for tau in TINY:
            y = numpy(fn(x, np.float32(tau)))
            np.testing.assert_allclose(y, expected, atol=2e-6)
            np.testing.assert_allclose(y.sum(-1), 1.0, atol=1e-5)
