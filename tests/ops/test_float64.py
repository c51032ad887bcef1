"""Float64 on every backend (issue 31 item 6): sparsemax, its loss, rankmax and rankmax_loss
compute float64 inputs in float64, eager and compiled, with gradients that central
differences in float64 confirm to 1e-7 (float32 arithmetic inside would miss by 1e-3 or more).

On PyTorch Keras' ``maximum`` / ``minimum`` / ``cumsum`` / ``matmul`` / ``divide_no_nan`` of
float64 tensors return float32; the kernels use ``losszoo._backend``'s dtype-preserving ops.
"""

import numpy as np
import pytest

import losszoo
from tests.harness import (
    MODES,
    compiled,
    finite_difference,
    float64,
    numpy,
    value_and_grad,
)
from tests.references import load_reference


@pytest.fixture(autouse=True)
def _x64():
    with float64():
        yield


def _logits(n=3, k=7, seed=0):
    # spread so that no score sits within 1e-5 of a threshold (kinks of the piecewise forms)
    r = np.random.default_rng(seed)
    return r.permutation(np.linspace(-1.5, 1.5, n * k)).reshape(n, k) + r.normal(size=(n, 1))


def _ops():
    ids = np.array([2, 0, 5])
    onehot = np.eye(7)[ids]
    dense = np.where(np.random.default_rng(3).uniform(size=(3, 7)) < 0.3, 1.0, 0.0)
    dense[:, 1] = 1.0
    return {
        "sparsemax": losszoo.ops.sparsemax,
        "sparsemax_loss": lambda z: losszoo.ops.sparsemax_loss(onehot, z),
        "sparsemax_loss_soft": lambda z: losszoo.ops.sparsemax_loss(np.full((3, 7), 1 / 7), z),
        "rankmax_k1": lambda z: losszoo.ops.rankmax(ids, z, k=1),
        "rankmax_k3": lambda z: losszoo.ops.rankmax(ids, z, k=3, margin=0.7),
        "rankmax_loss_ids_k3": lambda z: losszoo.ops.rankmax_loss(ids, z, k=3, margin=0.7),
        "rankmax_loss_onehot_k2": lambda z: losszoo.ops.rankmax_loss(onehot, z, k=2),
        "rankmax_loss_dense_k2": lambda z: losszoo.ops.rankmax_loss(
            dense, z, k=2, max_positives=None
        ),
    }


NAMES = sorted(_ops())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
def test_float64_values_and_gradients_match_central_differences(name, mode):
    fn = _ops()[name]
    z = _logits()
    out, (g,) = value_and_grad(fn, z, mode=mode)
    assert out.dtype == np.float64 and g.dtype == np.float64
    # float64 central differences (step 1e-6) of the compiled function: one compile, not
    # 2 * size eager calls (slow on JAX)
    fd = finite_difference(compiled(fn, MODES[-1]), z)
    np.testing.assert_allclose(g, fd, rtol=0, atol=1e-7)


@pytest.mark.parametrize("mode", MODES)
def test_float64_sparsemax_is_exact_to_float64_rounding(mode):
    """Scores that differ below float32's resolution: only float64 arithmetic separates
    them (the reference is the spec's sort-based oracle in float64)."""
    ref = load_reference("rankmax_sparsemax")
    z = 1.0 + np.random.default_rng(1).normal(size=(4, 50)) * 1e-9
    z[:, 0] += 0.5
    p = numpy(compiled(losszoo.ops.sparsemax, mode)(z))
    assert p.dtype == np.float64
    expected = np.stack([ref.sparsemax(row)[0] for row in z])
    np.testing.assert_allclose(p, expected, rtol=0, atol=1e-14)


@pytest.mark.parametrize("mode", MODES)
def test_float64_rankmax_loss_keeps_float64_resolution(mode):
    """k = 1: ``log sum_i (z_i - z_y + margin)_+ - log margin`` with offsets of 1e-12 that
    float32 rounds away."""
    z = np.zeros((2, 6)) + np.arange(6) * 1e-12
    ids = np.array([5, 0])
    loss = numpy(compiled(lambda z: losszoo.ops.rankmax_loss(ids, z, k=1), mode)(z))
    assert loss.dtype == np.float64
    d = np.maximum(z - z[np.arange(2), ids][:, None] + 1.0, 0.0)
    np.testing.assert_allclose(loss, np.log(d.sum(-1)), rtol=1e-12, atol=1e-15)
