"""contract.TARGETS from two reductions (min and row sum) gives the verdicts of the per-entry
rule (finite, >= 0, row sum within tol of 1) in every mode and dtype of the backend.

The reference is that per-entry rule in NumPy float64 on the values as the dtype rounds them.
Rows: valid ones, NaN, +-inf (alone and together), negative entries (also with a row sum of
exactly 1), sums off by more / less than the tolerance, all-zero rows, -0.0, and entries whose
sum overflows.
"""

import numpy as np
import pytest
from keras import ops

from losszoo import contract
from losszoo.contract import TARGETS
from tests.contract import MODES, Modes

K = 8
TOL = 3.5e-4  # sparsemax_loss' float32 tolerance


def _rows():
    def row(*entries):
        r = np.zeros(K)
        r[: len(entries)] = entries
        return r

    rows = [
        row(1.0),  # one-hot
        row(0.5, 0.5),
        row(0.25, 0.25, 0.25, 0.25),
        row(0.125, 0.375, 0.5),
        row(-0.0, 1.0),  # -0.0 is >= 0
        row(1.0 + 1e-4),  # within the tolerance (float32)
        row(1.0 + 1e-3),  # beyond it (float32; bfloat16 rounds it to 1)
        row(),  # all zero: sums to 0
        row(1.5),
        row(0.875),
        row(np.nan, 1.0),
        row(np.nan),
        row(np.inf),
        row(np.inf, 1.0),
        row(-np.inf, 1.0),
        row(np.inf, -np.inf, 1.0),
        row(-0.25, 1.25),  # negative entry, sum exactly 1
        row(-1e-30, 1.0),  # tiny negative (rounds to -0.0 in half precision)
        row(3e38, 3e38),  # the sum overflows (float16: the entries already do)
        row(np.nan, np.inf, -np.inf),
    ]
    return np.stack(rows)


def _per_entry_reference(q):
    """The rule written entry by entry, in float64 on the (rounded) values."""
    with np.errstate(invalid="ignore", over="ignore"):
        bad_entry = np.any(~np.isfinite(q) | (q < 0), axis=-1)
        return bad_entry | (np.abs(np.sum(q, axis=-1) - 1.0) > TOL)


def _rounded(q, dtype):
    """``q`` as ``dtype`` rounds it, back in float64 (on the backend: bfloat16 too)."""
    as_dtype = ops.cast(ops.convert_to_tensor(q.astype(np.float32)), dtype)
    return np.asarray(ops.convert_to_numpy(ops.cast(as_dtype, "float32")), np.float64)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_targets_mask_matches_the_per_entry_rule(dtype):
    q = _rows()
    want = _per_entry_reference(_rounded(q, dtype) if dtype != "float64" else q)
    assert want.any() and not want.all()
    runner = Modes(lambda t: TARGETS.invalid(ops.cast(t, dtype), TOL))
    # float64 input stays float64 (JAX's contract tests run in x64 mode); the rest go in as
    # float32 and are cast inside
    given = q if dtype == "float64" else q.astype(np.float32)
    for mode in MODES:
        got = np.asarray(ops.convert_to_numpy(runner(mode, given)))
        np.testing.assert_array_equal(got, want, err_msg=f"{dtype} {mode}")


def test_targets_check_raises_for_exactly_the_bad_rows():
    q = _rows().astype(np.float32)
    want = _per_entry_reference(q.astype(np.float64))
    bad_rows = [int(i) for i in np.flatnonzero(want)]
    # known values (NumPy) and backend tensors (PyTorch: one flag read on the device first)
    for value in (q, ops.convert_to_tensor(q)):
        with pytest.raises(ValueError, match=r"`labels` rows must sum to 1") as info:
            TARGETS.check(value, "labels", TOL)
        assert f"rows {bad_rows[:5]} are not" in str(info.value)
    good = q[~want]
    assert TARGETS.check(good, "labels", TOL) is good
    for i in bad_rows:
        with pytest.raises(ValueError, match=r"rows \[0\] are not"):
            TARGETS.check(ops.convert_to_tensor(q[i : i + 1]), "labels", TOL)


def test_check_rules_raises_the_first_broken_rule_as_in_sequence():
    z = ops.convert_to_tensor(np.zeros((2, 3), np.float32))
    bad_z = ops.convert_to_tensor(np.array([[0.0, 1.0, 2.0], [np.nan, 0.0, 0.0]], np.float32))
    t = ops.convert_to_tensor(np.array([0.5, 1.0], np.float32))
    bad_t = ops.convert_to_tensor(np.array([0.5, -1.0], np.float32))
    got = contract.check_rules(
        (contract.LOGITS, z, "logits"), (contract.POSITIVE, t, "temperature")
    )
    assert got[0] is z and got[1] is t
    for first, second, message in (
        (bad_z, bad_t, r"`logits` must not hold NaN .*; rows \[1\] are not\."),
        (z, bad_t, r"`temperature` must be finite and > 0; rows \[1\] are not\."),
        (bad_z, t, r"`logits` must not hold NaN"),
    ):
        with pytest.raises(ValueError, match=message):
            contract.check_rules(
                (contract.LOGITS, first, "logits"), (contract.POSITIVE, second, "temperature")
            )
    with contract.validation(False):
        contract.check_rules((contract.LOGITS, bad_z, "logits"))
