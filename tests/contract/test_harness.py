"""The contract harness itself: it must catch silent functions and pass loud ones."""

import numpy as np
import pytest
import tensorflow as tf

from losszoo.contract import check_finite, nan_where, row_has_nan
from tests.contract import Modes, assert_modes_agree, assert_rejects

pytestmark = pytest.mark.tensorflow_only(
    reason="the fail-loud contract harness (tests/contract) runs eager, tf.function and XLA"
)


def _loud_row_sum(x):
    x = check_finite(x, "x")
    return nan_where(row_has_nan(x), tf.reduce_sum(x, -1))


def _silent_row_sum(x):
    return tf.reduce_sum(tf.where(tf.math.is_nan(x), 0.0, x), -1)


def test_loud_function_passes():
    bad = np.array([[1.0, np.nan], [2.0, 3.0]], np.float32)
    assert_rejects(Modes(_loud_row_sum), bad, name="x", rows=[0], suite="_harness")


def test_silent_function_is_caught():
    bad = np.array([[1.0, np.nan], [2.0, 3.0]], np.float32)
    with pytest.raises(AssertionError, match="accepted"):
        assert_rejects(Modes(_silent_row_sum), bad, name="x", rows=[0], suite="_harness")


def test_error_must_name_the_argument():
    def unnamed(x):
        return tf.debugging.assert_all_finite(x, "bad values")

    with pytest.raises(AssertionError, match="does not name"):
        assert_rejects(
            Modes(unnamed), np.array([np.nan], np.float32), name="x", rows=(), modes=("eager",)
        )


def test_modes_agree_with_reference_and_gradients():
    x = np.array([[1.0, 2.0], [3.0, -4.0]])
    out = assert_modes_agree(Modes(_loud_row_sum), x, reference=x.sum(-1), grad_wrt=(0,))
    np.testing.assert_allclose(out, [3.0, -1.0])
