"""The contract harness itself: it must catch silent functions and pass loud ones."""

import numpy as np
import pytest
from keras import ops

from losszoo.contract import check_finite, nan_where, row_has_nan
from tests.contract import MODES, Modes, assert_modes_agree, assert_rejects


def _loud_row_sum(x):
    x = check_finite(x, "x")
    return nan_where(row_has_nan(x), ops.sum(x, -1))


def _silent_row_sum(x):
    return ops.sum(ops.where(ops.isnan(x), 0.0, x), -1)


def test_loud_function_passes():
    bad = np.array([[1.0, np.nan], [2.0, 3.0]], np.float32)
    assert_rejects(Modes(_loud_row_sum), bad, name="x", rows=[0], suite="_harness")


def test_silent_function_is_caught():
    bad = np.array([[1.0, np.nan], [2.0, 3.0]], np.float32)
    with pytest.raises(AssertionError, match="accepted"):
        assert_rejects(Modes(_silent_row_sum), bad, name="x", rows=[0], suite="_harness")


def test_silent_function_is_caught_in_every_mode():
    # each mode on its own: eager / graph must raise, XLA / jax.jit must give NaN rows
    bad = np.array([[1.0, np.nan], [2.0, 3.0]], np.float32)
    for mode in MODES:
        with pytest.raises(AssertionError, match="accepted|non-NaN"):
            assert_rejects(
                Modes(_silent_row_sum), bad, name="x", rows=[0], modes=(mode,), suite="_harness"
            )


def test_error_must_name_the_argument():
    def unnamed(x):
        raise ValueError("bad values")

    with pytest.raises(AssertionError, match="does not name"):
        assert_rejects(
            Modes(unnamed), np.array([np.nan], np.float32), name="x", rows=(), modes=("eager",)
        )


def test_modes_agree_with_reference_and_gradients():
    x = np.array([[1.0, 2.0], [3.0, -4.0]])
    out = assert_modes_agree(Modes(_loud_row_sum), x, reference=x.sum(-1), grad_wrt=(0,))
    np.testing.assert_allclose(out, [3.0, -1.0])


def test_gradients_are_the_weighted_vector_jacobian_product():
    # d/dx sum_i w_i * rowsum(x)_i = w_row for every entry of the row (w = 1 + 0.5 sin(i))
    x = np.array([[1.0, 2.0], [3.0, -4.0]])
    runner = Modes(_loud_row_sum)
    w = 1.0 + 0.5 * np.sin(np.arange(2))
    for mode in MODES:
        out, (grad,) = runner.with_gradient(mode, [x], (0,))
        np.testing.assert_allclose(np.asarray(out), [3.0, -1.0], err_msg=mode)
        np.testing.assert_allclose(np.asarray(grad), np.repeat(w[:, None], 2, 1), err_msg=mode)
