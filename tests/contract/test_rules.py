"""contract.LOGITS in every mode of the backend against an independent NumPy reference.

On TensorFlow outside XLA the rule is one max reduction (TensorFlow's Max propagates NaN);
under XLA, on JAX and on PyTorch it adds a NaN pass. Every mode must flag exactly the rows
holding a NaN or a +inf, or only -inf, wherever those sit in the row.
"""

import numpy as np
import pytest

from losszoo.contract import LOGITS
from tests.contract import MODES, Modes


def _rows(k, rng):
    """Rows of K scores with NaN, +inf and -inf placed at random, and the reference mask."""
    rows, bad = [], []
    for kind in ("finite", "nan", "pinf", "all_ninf", "some_ninf", "nan_in_ninf", "big_nan"):
        for _ in range(4):
            z = rng.normal(size=k).astype(np.float32)
            pos = rng.integers(0, k)
            if kind == "nan":
                z[pos] = np.nan
            elif kind == "pinf":
                z[pos] = np.inf
            elif kind == "all_ninf":
                z[:] = -np.inf
            elif kind == "some_ninf":
                z[rng.random(k) < 0.5] = -np.inf
                z[pos] = 0.0  # one class left
            elif kind == "nan_in_ninf":
                z[:] = -np.inf
                z[pos] = np.nan
            elif kind == "big_nan":
                z[:] = 3e38
                z[pos] = np.nan
            rows.append(z)
            bad.append(np.isnan(z).any() or np.isposinf(z).any() or np.isneginf(z).all())
    return np.stack(rows), np.array(bad)


@pytest.mark.parametrize("k", [1, 2, 7, 33, 1000])
def test_logits_mask_matches_numpy_in_every_mode(k):
    z, want = _rows(k, np.random.default_rng(k))
    assert want.any() and not want.all()
    runner = Modes(LOGITS.invalid)
    for mode in MODES:
        got = runner(mode, z)
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=mode)


@pytest.mark.tensorflow_only(reason="graph assertions exist only in TensorFlow graphs")
def test_logits_graph_assertion_names_the_argument_for_each_bad_kind():
    import tensorflow as tf

    check = tf.function(
        lambda z: LOGITS.check(z, "logits"), input_signature=[tf.TensorSpec([None, None])]
    )
    check(tf.constant([[0.0, -np.inf, 1.0]], tf.float32))  # a masked class is fine
    for row in ([0.0, np.nan, 1.0], [0.0, np.inf, 1.0], [-np.inf, -np.inf, -np.inf]):
        with pytest.raises(tf.errors.InvalidArgumentError, match="`logits`"):
            check(tf.constant([row], tf.float32))
