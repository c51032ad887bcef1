"""The sort the sparsemax threshold takes for small problems compiled for a GPU
(``ops/_sparsemax.py::_sorts``), run on this CPU by answering ``compiles_for_gpu`` with True:
the same values, losses, gradients and NaN rows as the sort-based reference, in every mode."""

import keras
import numpy as np
import pytest
from keras import ops as kops

from losszoo import ops
from losszoo.ops import _sparsemax
from tests.harness import MODES, upstream, value_and_grad
from tests.ops.test_sparsemax import ref, ref_sparsemax, sparsemax_vjp


def _clear_compiled():
    """Forget JAX's compiled kernels, so that no program traced under one answer of
    ``compiles_for_gpu`` serves the other (``jit_on_jax`` caches by shape)."""
    if keras.backend.backend() == "jax":
        import jax

        jax.clear_caches()


@pytest.fixture
def on_gpu(monkeypatch):
    """Pretend programs run on a GPU; count the calls of the sort threshold (at trace time)."""
    calls = []
    sort = _sparsemax._sorted_threshold

    def counted(z):
        calls.append(tuple(z.shape))
        return sort(z)

    _clear_compiled()
    monkeypatch.setattr(_sparsemax, "compiles_for_gpu", lambda: True)
    monkeypatch.setattr(_sparsemax, "_sorted_threshold", counted)
    yield calls
    monkeypatch.undo()
    _clear_compiled()


def test_dispatch_by_shape(on_gpu, monkeypatch):
    sorts = _sparsemax._sorts
    assert sorts((256, 1000)) and sorts((128, 16384)) and sorts((2, 3, 10))
    assert not sorts((128, 32768))  # 2^22 scores: the Newton search is faster
    assert not sorts((2048, 32768))
    whole = _sparsemax._whole_rows
    assert whole((128, 32768)) and whole((32, 100_000)) and not whole((2048, 32768))
    assert not whole((None, 1000))
    assert not sorts((32, 100_000))  # more classes than the sort limit
    assert not sorts((None, 1000))  # unknown batch: no bound on the sort's cost
    if keras.backend.backend() == "jax":  # a shape-polymorphic export's symbolic batch
        from jax import export

        assert not sorts(tuple(export.symbolic_shape("b, 1000")))
    monkeypatch.setattr(_sparsemax, "compiles_for_gpu", lambda: False)
    assert not sorts((256, 1000))


def bad_and_hard_rows(num_classes):
    """Rows: Gaussian, ties at the top, a -inf mask, offset 1e4, then NaN, +inf and all -inf."""
    rng = np.random.default_rng(11)
    z = rng.normal(size=(7, num_classes)).astype(np.float32)
    z[1, :5] = 2.5
    z[2, ::3] = -np.inf
    z[3] += 1e4
    z[4, 3] = np.nan
    z[5, 1] = np.inf
    z[6] = -np.inf
    q = np.zeros_like(z)
    q[np.arange(7), [0, 1, 4, 2, 0, 0, 0]] = 1.0
    return z, q


@pytest.mark.parametrize("num_classes", [10, 1000, 32768])
def test_sort_path_matches_the_reference_in_every_mode(on_gpu, num_classes):
    z, q = bad_and_hard_rows(num_classes)
    good = slice(0, 4)
    finite = np.where(np.isinf(z[good]), -1e30, z[good]).astype(np.float64)
    p_want = np.stack([ref.sparsemax(row)[0] for row in finite])
    loss_want = [ref.sparsemax_loss(a, b) for a, b in zip(finite, q[good].astype(np.float64))]

    def both(z):
        return kops.concatenate([ops.sparsemax(z), ops.sparsemax_loss(q, z)[:, None]], -1)

    u = upstream((7, num_classes + 1))
    g_want = sparsemax_vjp(p_want, u[good, :-1]) + u[good, -1:] * (p_want - q[good])
    for mode in MODES:
        on_gpu.clear()
        out, (g,) = value_and_grad(both, z, mode=mode)
        # PyTorch has its own search (ops/_sparsemax.py::_top_threshold): no sort to take
        assert on_gpu or keras.backend.backend() == "torch", f"{mode}: the sort was not taken"
        np.testing.assert_allclose(out[good, :-1], p_want, atol=2e-6, err_msg=mode)
        np.testing.assert_allclose(out[good, -1], loss_want, rtol=1e-5, atol=1e-5, err_msg=mode)
        np.testing.assert_allclose(g[good], g_want, atol=1e-5, err_msg=mode)
        assert np.all(np.isnan(out[4:])) and np.all(np.isnan(g[4:])), mode


def test_large_problems_keep_the_newton_search(on_gpu, monkeypatch):
    """Rows of 10^5 classes in a problem larger than ``_WHOLE_ROW_MAX_ENTRIES`` (lowered here
    to 10^5 scores, so that two rows stand for a large batch) are searched by Newton from the
    chunk maxima's threshold; only that small problem (3,125 maxima per row) may be sorted."""
    monkeypatch.setattr(_sparsemax, "_WHOLE_ROW_MAX_ENTRIES", 100_000)
    z = np.random.default_rng(2).normal(size=(2, 100_000)).astype(np.float32)
    np.testing.assert_allclose(kops.convert_to_numpy(ops.sparsemax(z)), ref_sparsemax(z), atol=1e-6)
    assert on_gpu == [(2, 3125)] or keras.backend.backend() == "torch"


@pytest.mark.parametrize("num_classes,whole_rows", [(1009, True), (40_000, True), (40_000, False)])
def test_newton_search_with_its_unrolled_start_matches_the_reference(
    on_gpu, monkeypatch, num_classes, whole_rows
):
    """Compiled for a GPU, the Newton search runs some steps unrolled, then its loop only for
    rows that have not converged: a ramp row needs 7 steps from -1 (the loop runs on after
    ``_GPU_NEWTON_STEPS``), the others fewer; NaN rows stay NaN. Whole rows (what a GPU
    does up to ``_WHOLE_ROW_MAX_ENTRIES`` scores, ``_WHOLE_ROW_STEPS`` unrolled), and the
    candidate-chunk search (40,000 classes: 1,250 chunks of 32) that larger problems take."""
    z, q = bad_and_hard_rows(num_classes)
    z[0] = -np.arange(num_classes) * 1e-3
    starts = []
    unrolled = _sparsemax._newton_unrolled

    def counted(z, tau, steps):
        starts.append(steps)
        return unrolled(z, tau, steps)

    monkeypatch.setattr(_sparsemax, "_newton_unrolled", counted)
    monkeypatch.setattr(_sparsemax, "_sorts", lambda shape: False)
    monkeypatch.setattr(_sparsemax, "_WHOLE_ROW_MAX_ENTRIES", 2**22 if whole_rows else 0)
    monkeypatch.setattr(_sparsemax, "_WHOLE_ROW_STEPS", 4)  # < 7: the ramp needs the loop
    steps = 4 if whole_rows else _sparsemax._GPU_NEWTON_STEPS
    good = slice(0, 4)
    finite = np.where(np.isinf(z[good]), -1e30, z[good]).astype(np.float64)
    p_want = np.stack([ref.sparsemax(row)[0] for row in finite])
    loss_want = [ref.sparsemax_loss(a, b) for a, b in zip(finite, q[good].astype(np.float64))]
    u = upstream((7, num_classes))
    g_want = sparsemax_vjp(p_want, u[good])
    for mode in MODES:
        starts.clear()
        _clear_compiled()
        out, (g,) = value_and_grad(ops.sparsemax, z, mode=mode)
        loss = kops.convert_to_numpy(ops.sparsemax_loss(q, z))
        if keras.backend.backend() != "torch":  # PyTorch: its own rounds (_newton_rounds)
            assert steps in starts, f"{mode}: no unrolled start of {steps} steps ({starts})"
        np.testing.assert_allclose(out[good], p_want, atol=2e-6, err_msg=mode)
        np.testing.assert_allclose(loss[good], loss_want, rtol=1e-5, atol=1e-5, err_msg=mode)
        np.testing.assert_allclose(g[good], g_want, atol=1e-5, err_msg=mode)
        assert np.all(np.isnan(out[4:])) and np.all(np.isnan(g[4:])), mode
        assert np.all(np.isnan(loss[4:])), mode
