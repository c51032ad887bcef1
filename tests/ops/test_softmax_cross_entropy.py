"""losszoo.ops.softmax_cross_entropy against numpy: values, its custom gradient, the Keras
label forms, -inf masks and the fail-loud contract, in every mode of the running backend."""

import numpy as np
import pytest

import losszoo
from tests.harness import MODES, compiled, numpy, value_and_grad

rng = np.random.default_rng(0)
Z = rng.normal(size=(4, 5)).astype(np.float32)
IDS = np.array([1, 0, 4, 2])


def _reference(z, q):
    """-sum_{q > 0} q log softmax(z) and its gradient sum(q) softmax(z) - q, float64."""
    z, q = np.asarray(z, np.float64), np.asarray(q, np.float64)
    keep = np.isfinite(z)
    m = z.max(-1, keepdims=True)
    log_p = np.where(
        keep,
        z - m - np.log(np.sum(np.exp(np.where(keep, z - m, -np.inf)), -1, keepdims=True)),
        -np.inf,
    )
    loss = -np.sum(np.where(q > 0, q * np.where(q > 0, log_p, 0.0), 0.0), -1)
    return loss, q.sum(-1, keepdims=True) * np.exp(log_p) - q


@pytest.mark.parametrize("mode", MODES)
def test_values_and_gradient_match_numpy_for_every_label_form(mode):
    soft = rng.uniform(size=(4, 5)).astype(np.float32)
    soft[2] = 0.0  # a row without any target: loss 0, gradient 0
    z = Z.copy()
    z[0, 3] = -np.inf  # not a candidate
    cases = [
        (IDS, np.eye(5)[IDS], True),
        (IDS[:, None].astype(np.float32), np.eye(5)[IDS], True),  # [B, 1] float ids
        (soft, soft / np.maximum(soft.sum(-1, keepdims=True), 1e-30), True),
        (soft, soft.astype(np.float64), False),
    ]
    for labels, q, normalize in cases:

        def fn(z, labels=labels, normalize=normalize):
            return losszoo.ops.softmax_cross_entropy(labels, z, normalize)

        value, (grad,) = value_and_grad(fn, z, mode=mode)
        want, want_grad = _reference(z, q)
        upstream = np.random.default_rng(7).uniform(0.5, 1.5, size=want.shape)
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grad, upstream[:, None] * want_grad, rtol=1e-5, atol=1e-6)


def test_masked_target_is_inf_and_plus_inf_row_is_nan():
    z = np.array([[0.0, -np.inf, 1.0], [np.inf, 0.0, 0.0]], np.float32)
    out = numpy(losszoo.ops.softmax_cross_entropy([1, 0], z))
    assert out[0] == np.inf and np.isnan(out[1])


def test_bad_labels_and_nan_logits_raise_naming_the_argument():
    with pytest.raises(ValueError, match="`labels` holds class ids"):
        losszoo.ops.softmax_cross_entropy([1, 0, 5, 2], Z)
    with pytest.raises(ValueError, match="`targets`"):
        losszoo.ops.softmax_cross_entropy(-np.eye(5)[IDS], Z, labels_name="targets")
    with pytest.raises(ValueError, match="`scores` contains NaN"):
        losszoo.ops.softmax_cross_entropy(IDS, np.where(Z > 1, np.nan, Z), logits_name="scores")


@pytest.mark.parametrize("mode", MODES[1:])
def test_compiled_bad_rows_are_nan_and_the_others_untouched(mode):
    z = Z.copy()
    z[3, 0] = np.nan
    with losszoo.validation(False):
        out = numpy(
            compiled(losszoo.ops.softmax_cross_entropy, mode)(np.array([1.0, 7.0, 4.0, 2.0]), z)
        )
    want, _ = _reference(Z, np.eye(5)[IDS])
    assert np.isnan(out[[1, 3]]).all()
    np.testing.assert_allclose(out[[0, 2]], want[[0, 2]], rtol=1e-5)
