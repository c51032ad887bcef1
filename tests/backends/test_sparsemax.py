"""Sparsemax and its loss on the running backend: values against the spec's numpy oracle,
gradients against the closed form, NaN rows, errors naming the argument."""

import numpy as np
import pytest

import losszoo
from tests.harness import MODES, compiled, numpy, value_and_grad
from tests.references import load_reference


def _rows(f, *arrays):
    """The spec's per-row oracle ``f`` stacked over a batch, in float64."""
    return np.stack([f(*(np.float64(a) for a in row)) for row in zip(*arrays)])


def _sparsemax_ref(z):
    return load_reference("rankmax_sparsemax").sparsemax(z)[0]


def _data(n=5, k=9, seed=0):
    r = np.random.default_rng(seed)
    z = (r.normal(size=(n, k)) * 2).astype(np.float32)
    q = np.zeros((n, k), np.float32)  # one-hot rows (np.eye(k) would be k^2 floats: 4 GB)
    q[np.arange(n), r.integers(0, k, n)] = 1.0
    return z, q


@pytest.mark.parametrize("mode", MODES)
def test_sparsemax_matches_reference_with_jacobian_gradient(mode):
    z, _ = _data()
    p, (g,) = value_and_grad(losszoo.ops.sparsemax, z, mode=mode)
    np.testing.assert_allclose(p, _rows(_sparsemax_ref, z), atol=1e-6)
    upstream = np.random.default_rng(7).uniform(0.5, 1.5, size=p.shape)
    s = (p > 0).astype(np.float64)
    expected = s * (upstream - (s * upstream).sum(-1, keepdims=True) / s.sum(-1, keepdims=True))
    np.testing.assert_allclose(g, expected, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_sparsemax_loss_value_and_gradient(mode):
    ref = load_reference("rankmax_sparsemax")
    z, q = _data(seed=1)
    loss, (g,) = value_and_grad(lambda z: losszoo.ops.sparsemax_loss(q, z), z, mode=mode)
    p = _rows(_sparsemax_ref, z)
    np.testing.assert_allclose(loss, _rows(ref.sparsemax_loss, z, q), atol=1e-5)
    upstream = np.random.default_rng(7).uniform(0.5, 1.5, size=loss.shape)
    np.testing.assert_allclose(g, upstream[:, None] * (p - q), atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_bad_rows_are_nan_and_others_untouched(mode):
    z, q = _data(seed=2)
    z[1, 3] = np.nan
    z[3] = -np.inf
    with losszoo.validation(False):
        p = numpy(compiled(losszoo.ops.sparsemax, mode)(z))
    assert np.isnan(p[[1, 3]]).all()
    assert np.isfinite(p[[0, 2, 4]]).all()


def test_eager_labels_not_summing_to_one_name_the_argument():
    z, q = _data()
    with pytest.raises(ValueError, match="`labels` rows must sum to 1"):
        losszoo.ops.sparsemax_loss(2 * q, z)


def test_half_precision_computes_in_float32():
    z, _ = _data()
    p = numpy(losszoo.ops.sparsemax(z.astype(np.float16)))
    assert p.dtype == np.float16
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=2e-3)


@pytest.mark.parametrize("mode", MODES)
def test_candidate_chunks_and_full_search_at_32768_classes(mode):
    """At 32768 classes the threshold is searched on the 64 chunks (of 32) with the largest
    maxima, or on the whole row when the support spans more: both kinds, tied maxima across
    the 64th place and a NaN row in one batch."""
    ref = load_reference("rankmax_sparsemax")
    z, q = _data(n=4, k=32768, seed=3)
    z[1] *= 0.005  # support across hundreds of chunks
    z[2] *= 0.05
    z[2, :2] = [5.0, 4.5]
    z[2, 64 * np.arange(1, 101)] = 1.0  # 100 tied chunk maxima below the threshold
    z[3, 9] = np.nan
    loss, (g,) = value_and_grad(lambda z: losszoo.ops.sparsemax_loss(q, z), z, mode=mode)
    p = _rows(_sparsemax_ref, z[:3])
    assert np.sum(p[1].reshape(-1, 32).max(-1) > 0) > 64
    np.testing.assert_allclose(numpy(compiled(losszoo.ops.sparsemax, mode)(z))[:3], p, atol=1e-6)
    np.testing.assert_allclose(loss[:3], _rows(ref.sparsemax_loss, z[:3], q[:3]), atol=1e-5)
    upstream = np.random.default_rng(7).uniform(0.5, 1.5, size=loss.shape)
    np.testing.assert_allclose(g[:3], upstream[:3, None] * (p - q[:3]), atol=1e-5)
    assert np.isnan(loss[3]) and np.isnan(g[3]).all()
