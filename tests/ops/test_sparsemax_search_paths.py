"""Sparsemax's threshold search off its common path, against the spec's numpy reference:
supports larger than the 64 scores PyTorch's search starts from (small logits, as at the start
of training), rows that take different paths in one batch, and the labels' NaN mask with
validation off. Eager only, small shapes. On PyTorch also: no sort and at most 2 host reads
per call for typical logits, and the last-resort sort stays exact."""

import keras
import numpy as np
import pytest

import losszoo
from losszoo import ops
from tests.harness import BACKEND, numpy, upstream, value_and_grad
from tests.ops.test_sparsemax import ref_losses, ref_sparsemax, sparsemax_vjp

torch_only = pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's threshold search")


def _mixed_rows(k=1000, seed=0):
    """Rows whose supports hold ~3, ~40, ~200 and ~800 classes, and a tied row."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(5, k)) * np.array([[3.0], [0.1], [0.01], [0.001], [1.0]])
    z[4] = np.round(z[4])  # ties, at the threshold too
    return z.astype(np.float32)


def test_large_and_small_supports_in_one_batch():
    z = _mixed_rows()
    sizes = (ref_sparsemax(z) > 0).sum(-1)
    assert sizes[0] < 64 < sizes[2] < sizes[3]  # both sides of the 64-score start
    q = np.eye(z.shape[-1], dtype=np.float32)[[0, 5, 9, 17, 3]]
    q[1] = np.random.default_rng(1).dirichlet(np.ones(z.shape[-1]))

    def both(z):
        return keras.ops.concatenate([ops.sparsemax(z), ops.sparsemax_loss(q, z)[:, None]], -1)

    out, (g,) = value_and_grad(both, z)
    p = ref_sparsemax(z)
    np.testing.assert_allclose(out[:, :-1], p, atol=1e-6)
    np.testing.assert_allclose(out[:, -1], ref_losses(z, q), atol=1e-5)
    u = upstream(out.shape)
    np.testing.assert_allclose(g, sparsemax_vjp(p, u[:, :-1]) + u[:, -1:] * (p - q), atol=1e-5)


def test_bad_labels_poison_their_rows_with_validation_off():
    """The kernel's half of the labels' contract: NaN, negative, +inf entries and rows not
    summing to 1 give NaN loss and gradient rows; the other rows are unaffected."""
    z = np.random.default_rng(2).normal(size=(6, 100)).astype(np.float32)
    q = np.eye(100, dtype=np.float32)[:6].copy()
    q[1, 4] = np.nan
    q[2, 4] = -0.5
    q[2, 5] = 0.5
    q[3, 4] = np.inf
    q[4, 0] = 0.9  # sums to 0.9
    with losszoo.validation(False):
        loss, (g,) = value_and_grad(lambda z: ops.sparsemax_loss(q, z), z)
    bad = np.array([False, True, True, True, True, False])
    assert np.isnan(loss[bad]).all() and np.isnan(g[bad]).all()
    np.testing.assert_allclose(loss[~bad], ref_losses(z[~bad], q[~bad]), atol=1e-5)
    assert np.isfinite(g[~bad]).all()


@torch_only
def test_torch_sorts_only_as_a_last_resort(monkeypatch):
    """Typical logits take no sort and at most 2 host reads per fwd+bwd (validation on);
    with too few Newton steps allowed, the sort gives the same exact result."""
    import torch

    from losszoo.ops import _sparsemax

    sorts = []
    sort = _sparsemax._sorted_threshold
    monkeypatch.setattr(_sparsemax, "_sorted_threshold", lambda z: sorts.append(1) or sort(z))
    reads = []
    real_bool = torch.Tensor.__bool__
    z = np.random.default_rng(3).normal(size=(4, 1000)).astype(np.float32)
    q = np.eye(1000, dtype=np.float32)[:4]
    zt = torch.tensor(z, requires_grad=True)
    monkeypatch.setattr(torch.Tensor, "__bool__", lambda t: reads.append(1) or real_bool(t))
    ops.sparsemax_loss(q, zt).sum().backward()
    ops.sparsemax(zt).sum().backward()
    monkeypatch.setattr(torch.Tensor, "__bool__", real_bool)
    assert (sorts, len(reads)) == ([], 3)  # loss: labels' check + search; head: search

    z = _mixed_rows()
    expected = numpy(ops.sparsemax(z))
    np.testing.assert_allclose(expected, ref_sparsemax(z), atol=1e-6)
    monkeypatch.setattr(_sparsemax, "_UNROLLED_ROUNDS", (1,))
    np.testing.assert_allclose(numpy(ops.sparsemax(z)), expected, atol=1e-7)
    assert sorts == [1]


def test_class_ids_match_one_hot_targets():
    """Ids (PyTorch gathers them instead of building one-hot rows) against the numpy
    reference, rank 3, a target on a masked class (+inf loss), and with validation off an
    invalid id's row NaN."""
    rng = np.random.default_rng(4)
    z = rng.normal(size=(2, 3, 50)).astype(np.float32)
    ids = rng.integers(1, 50, (2, 3))
    z[0, 0, 0] = -np.inf
    ids[0, 1] = 0
    z[0, 1, 0] = -np.inf  # target on a masked class
    q = np.eye(50, dtype=np.float32)[ids]
    loss, (g,) = value_and_grad(lambda z: ops.sparsemax_loss(ids, z), z)
    finite = np.where(np.isinf(z), -1e30, z)
    expected = ref_losses(finite.reshape(6, 50), q.reshape(6, 50)).reshape(2, 3)
    assert np.isposinf(loss[0, 1])
    ok = np.isfinite(expected) & (expected < 1e29)
    np.testing.assert_allclose(loss[ok], expected[ok], atol=1e-5)
    p = ref_sparsemax(z.reshape(6, 50)).reshape(2, 3, 50)
    u = upstream(loss.shape)[..., None]
    np.testing.assert_allclose(g, u * (p - q), atol=1e-5)
    bad = ids.copy()
    bad[1, 2] = 50
    with losszoo.validation(False):
        out, (g,) = value_and_grad(lambda z: ops.sparsemax_loss(bad, z), z)
    assert np.isnan(out[1, 2]) and np.isnan(g[1, 2]).all()
    np.testing.assert_allclose(out[1, :2], loss[1, :2], atol=1e-6)


@torch_only
def test_torch_nan_row_even_when_top_k_ranks_nan_last(monkeypatch):
    """On CUDA, ``topk`` may rank a NaN with its sign bit set last (pytorch/pytorch#117617):
    the row still comes out NaN (output, loss, gradient), the other rows unaffected."""
    from losszoo.ops import _sparsemax

    top_k = keras.ops.top_k

    def nan_last(x, k, sorted=True):
        return top_k(keras.ops.where(keras.ops.isnan(x), -np.inf, x), k, sorted=sorted)

    monkeypatch.setattr(_sparsemax.ops, "top_k", nan_last)
    z = np.random.default_rng(5).normal(size=(3, 200)).astype(np.float32)
    z[1, 7] = np.nan
    q = np.eye(200, dtype=np.float32)[[0, 1, 2]]
    for fn in (
        ops.sparsemax,
        lambda z: ops.sparsemax_loss(q, z),
        lambda z: ops.sparsemax_loss([0, 1, 2], z),
    ):
        out, (g,) = value_and_grad(fn, z)
        assert np.isnan(out[1]).all() and np.isnan(g[1]).all()
        assert np.isfinite(out[[0, 2]]).all() and np.isfinite(g[[0, 2]]).all()
