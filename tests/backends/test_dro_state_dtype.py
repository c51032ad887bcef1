"""Issue 31 item 14 (part): ``kl_dro_exact_state_update`` took a float32 ``m`` beside a
float64 ``acc``, or Python floats, silently (the state was cast to ``m``'s dtype, or to the
backend's guess for a Python number). It now raises a TypeError naming the argument."""

import numpy as np
import pytest

from losszoo import ops
from tests.harness import float64, numpy
from tests.references import load_reference

R = load_reference("safe_kl_dro")


def _batch():
    r = np.random.default_rng(3)
    return r.gamma(2.0, size=9), r.uniform(0.2, 2.0, size=9)


@pytest.mark.parametrize(
    "state, name",
    [
        ((-np.inf, 0.0, 0.0), "m"),  # Python floats
        ((np.float64(-np.inf), 0.0, np.float64(0.0)), "acc"),
        ((np.float64(-np.inf), np.float64(0.0), 0), "n"),
        ((np.float32(-np.inf), np.float64(0.0), np.float64(0.0)), "acc"),  # mixed dtypes
        ((np.float32(-np.inf), np.float32(0.0), np.float64(0.0)), "n"),
        ((np.int32(0), np.int32(0), np.int32(0)), "m"),  # not floating
    ],
)
def test_state_of_mixed_or_unknown_dtype_raises_naming_the_argument(state, name):
    l, s = _batch()
    with float64():
        with pytest.raises(TypeError, match=f"`{name}`"):
            ops.kl_dro_exact_state_update(*state, l, 2.0, s)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_state_of_one_dtype_streams_the_exact_risk(dtype):
    l, s = _batch()
    with float64():
        state = tuple(np.array(v, dtype) for v in (-np.inf, 0.0, 0.0))
        for part in np.array_split(np.arange(l.size), 3):
            state = ops.kl_dro_exact_state_update(*state, l[part], 2.0, s[part])
        assert {str(numpy(x).dtype) for x in state} == {dtype}
        got = numpy(ops.kl_dro_exact_state_result(*state, 2.0))
    rtol = 1e-6 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, R.exact_risk(l, 2.0, s), rtol=rtol)
