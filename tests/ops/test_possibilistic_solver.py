"""The default solver of ``possibilistic_projection`` (issue 11): interior point on the
tie-reduced chain, closed form for two-block rows, certificate on the original constraints.

The oracle is the duality certificate itself, recomputed here in NumPy from the spec's
constraint matrix: for the returned ``p`` and multipliers ``lam``,
``gap = KL(p||q) - (lam.b - logsumexp(log q + A^T lam))`` and ``V = max (b - A p)_+``.
``V = 0`` and ``gap = 0`` hold only at the projection (weak duality), so a small certificate
computed independently of the op proves the answer; Dykstra is a second oracle where it is
fast enough.
"""

from __future__ import annotations

import numpy as np
import pytest

from losszoo.ops import possibilistic_projection
from tests.ops.test_possibilistic_tensorflow import ref_constraints

pytestmark = pytest.mark.tensorflow_only(
    reason="tf.function checks; references from tests/ops/test_possibilistic_tensorflow.py"
)


def numpy_certificate(p, q, pi, lam, eps_cap=1e-9):
    """(V, gap) of one row from the spec's A p >= b (rows: prefix, lower, upper)."""
    a_mat, b = ref_constraints(pi, eps_cap)
    lam = np.asarray(lam, np.float64).reshape(-1)
    x = np.log(q) + a_mat.T @ lam
    lse = x.max() + np.log(np.sum(np.exp(x - x.max())))
    dual = lam @ b - lse
    pos = p > 0
    primal = np.sum(p[pos] * (np.log(p[pos]) - np.log(q[pos])))
    return max(np.max(b - a_mat @ p), 0.0), primal - dual


def softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def graded(rng, batch, k, levels=100):
    """Ratings-like possibilities: ``levels + 1`` grades, one certain class, floored."""
    pi = np.round(rng.random((batch, k)) * levels) / levels
    pi[np.arange(batch), rng.integers(k, size=batch)] = 1.0
    return np.maximum(pi, 1e-6)


def assert_certified(p, q, pi, info, gap_tol=1e-10, tol=1e-8):
    for i in range(len(q)):
        v, gap = numpy_certificate(p[i], q[i], pi[i], info.multipliers[i])
        assert v <= tol, (i, v)
        assert abs(gap) <= gap_tol, (i, gap)  # may be < 0 by lam . (violation <= tol)
        # The op reports the same gap (KL(p || p(lam)) + lam.slack, the stable form).
        assert abs(gap - info.duality_gap[i]) <= 1e-11, (i, gap, info.duality_gap[i])
    assert info.converged.all()


def run(z, pi, pad_to=None, **kw):
    """The projection as numpy. ``pad_to``: the batch padded to that many rows with all-ones
    possibilities (they short-circuit: uniform, no iteration), so that tests share the kernels
    compiled for one shape; the results are those of the given rows."""
    z, pi = np.asarray(z, np.float64), np.asarray(pi, np.float64)
    b = len(z)
    if pad_to is not None:
        z = np.concatenate([z, np.zeros((pad_to - b, z.shape[1]))])
        pi = np.concatenate([pi, np.ones((pad_to - b, z.shape[1]))])
    p, info = possibilistic_projection(z, pi, **kw)
    return p.numpy()[:b], type(info)(*(v.numpy()[:b] for v in info))


@pytest.mark.parametrize(
    "pi, q, policy, binding",
    [
        # one-hot label (floored): the ceiling on the tail block binds
        ([1.0, 1e-6, 1e-6, 1e-6], [0.1, 0.3, 0.3, 0.3], "wide", "ceiling"),
        # a high tail possibility: the lower shape bound p_top - p_tail >= eps binds
        ([1.0, 0.9, 0.9, 0.9], [0.01, 0.33, 0.33, 0.33], "wide", "lower"),
        # tight policy, top-heavy q: the upper shape bound p_top - p_tail <= 0.1 binds
        ([1.0, 0.9, 0.9, 0.9], [0.97, 0.01, 0.01, 0.01], "antipignistic_tight", "upper"),
        # q already admissible: nothing binds, p* = q
        ([1.0, 0.5, 0.5, 0.5], [0.7, 0.1, 0.1, 0.1], "wide", "none"),
    ],
)
def test_two_block_rows_are_solved_in_closed_form(pi, q, policy, binding):
    # A batch of 3 rows (K = 4): the kernels' shape of the contract tests' valid inputs
    # (tests/contract/test_possibilistic_contract.py), compiled once for both.
    pi, q = np.array([pi]), np.array([q])
    p, info = run(np.log(q), pi, pad_to=3, gap_policy=policy)
    assert info.iterations[0] == 0 and info.cycles[0] == 0  # no iteration at all
    ref, ref_info = run(np.log(q), pi, pad_to=3, gap_policy=policy, method="dykstra", tol=1e-13)
    assert ref_info.converged.all()
    np.testing.assert_allclose(p, ref, atol=1e-12, rtol=0)
    lam = info.multipliers[0]  # [3, m1]: prefix, lower, upper
    which = {"ceiling": 0, "lower": 1, "upper": 2}
    if binding == "none":
        assert np.all(lam == 0.0)
        np.testing.assert_allclose(p[0], q[0], atol=1e-15)
    else:
        assert lam[which[binding]].max() > 0.0
        others = [f for f in range(3) if f != which[binding]]
        assert np.all(lam[others][:, 0] == 0.0)
    if policy == "wide":  # numpy_certificate builds the wide-policy bounds
        assert_certified(p, q, pi, info, gap_tol=1e-13, tol=1e-14)


def test_interior_point_certifies_graded_rows_without_dykstra():
    """Graded labels at logits of scale 3 (the rows that used to need thousands of Dykstra
    cycles or a Dykstra finish): every row certified by the interior point alone."""
    rng = np.random.default_rng(11)
    k, batch = 64, 32
    z = 3.0 * rng.normal(size=(batch, k))
    pi = graded(rng, batch, k)
    p, info = run(z, pi, max_cycles=1)
    assert np.all(info.cycles == 0)
    assert np.all((info.iterations > 0) & (info.iterations <= 30))
    assert_certified(p, softmax(z), pi, info)


@pytest.mark.parametrize("levels", [10, None])
def test_long_rows_few_or_many_levels(levels):
    """K > 128: a batch with few possibility levels runs on a 128-block chain, one with
    distinct levels on the full chain; both certified against the NumPy certificate."""
    rng = np.random.default_rng(12)
    k, batch = 200, 4
    z = 2.0 * rng.normal(size=(batch, k))
    if levels is None:
        pi = rng.random((batch, k))
        pi /= pi.max(axis=1, keepdims=True)
    else:
        pi = graded(rng, batch, k, levels=levels)
    p, info = run(z, pi, max_cycles=1)
    assert np.all(info.cycles == 0)
    assert_certified(p, softmax(z), pi, info)


def test_interior_point_agrees_with_certified_dykstra():
    rng = np.random.default_rng(13)
    k, batch = 12, 16
    z = 2.0 * rng.normal(size=(batch, k))
    pi = graded(rng, batch, k, levels=5)
    p, info = run(z, pi)
    ref, ref_info = run(z, pi, method="dykstra", tol=1e-11, gap_tol=1e-13, max_cycles=200000)
    assert ref_info.converged.all()
    np.testing.assert_allclose(p, ref, atol=1e-8, rtol=0)
    assert_certified(p, softmax(z), pi, info)


def random_spd_pentadiagonal(rng, n, batch, log_weight_range):
    """``S^T W S + D`` with ``S`` of three bands: SPD, pentadiagonal, condition set by
    the spread of the weights (the interior point's matrices reach 1e12 and more)."""
    mats = []
    for _ in range(batch):
        s = np.zeros((n + 2, n))
        for i in range(n):
            s[i : i + 3, i] = rng.normal(size=3)
        w = np.exp(rng.uniform(*log_weight_range, size=n + 2))
        mats.append(s.T @ (w[:, None] * s) + np.diag(np.exp(rng.uniform(-5, 5, size=n))))
    return np.stack(mats)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 63, 64, 200])
@pytest.mark.parametrize("log_weight_range", [(-2.0, 2.0), (-10.0, 25.0)])
def test_cyclic_reduction_solves_pentadiagonal_systems(n, log_weight_range):
    """The Newton solve (cyclic reduction in 2x2 blocks) against NumPy's dense solve:
    backward error at rounding level at any condition, forward error within cond * eps."""
    tf = pytest.importorskip("tensorflow")
    from losszoo.ops.possibilistic._banded import penta_factor, penta_solve

    rng = np.random.default_rng(n)
    batch = 3
    h = random_spd_pentadiagonal(rng, n, batch, log_weight_range)
    # d_j[i] = H[i, i + j], zero past the last row
    band = [
        np.stack([np.append(np.diagonal(m, j), np.zeros(j))[:n] for m in h], 1) for j in range(3)
    ]
    rhs = rng.normal(size=(n, batch))
    factors, dropped = penta_factor(*(tf.constant(b) for b in band))
    assert not dropped.numpy().any()
    x = penta_solve(factors, tf.constant(rhs)).numpy()
    for i in range(batch):
        ref = np.linalg.solve(h[i], rhs[:, i])
        norm_h = np.linalg.norm(h[i], 2)
        backward = np.linalg.norm(h[i] @ x[:, i] - rhs[:, i]) / (norm_h * np.linalg.norm(x[:, i]))
        assert backward <= 1e-15, (i, backward)
        forward = np.max(np.abs(x[:, i] - ref)) / np.max(np.abs(ref))
        assert forward <= 1e-13 * np.linalg.cond(h[i]) + 1e-14, (i, forward)


def test_batch_compaction_keeps_every_row(monkeypatch):
    """Once a quarter of the rows are left they continue in a narrower batch; the rows
    must come back to their places with the answer of an uncompacted run."""
    tf = pytest.importorskip("tensorflow")
    from losszoo.ops.possibilistic import _interior_point, _projection

    rng = np.random.default_rng(14)
    k, batch = 12, 40
    z = 3.0 * rng.normal(size=(batch, k))
    pi = graded(rng, batch, k)
    # The reference: the default kernel (no compaction below 128 rows), compiled once for
    # this shape and shared with the eager references of
    # tests/ops/test_possibilistic_tensorflow.py's None-batch test.
    assert _interior_point._IPM_COMPACT_MIN_BATCH > batch
    ref, ref_info = run(z, pi, max_cycles=1)
    # Compacted from 32 rows on here (the default, 128, keeps small batches in one copy).
    monkeypatch.setattr(_interior_point, "_IPM_COMPACT_MIN_BATCH", 32)
    compacted = tf.function(_interior_point._ipm_solve, jit_compile=True)
    monkeypatch.setattr(_projection, "IPM_JIT", compacted)
    p, info = run(z, pi, max_cycles=1)
    iters = info.iterations
    assert len(set(iters.tolist())) > 2  # rows finish at different times
    assert np.sum(iters == iters.max()) <= batch // 4  # the last iterations are compacted
    np.testing.assert_array_equal(info.iterations, ref_info.iterations)
    np.testing.assert_allclose(p, ref, atol=1e-13, rtol=0)
    assert_certified(p, softmax(z), pi, info)


def test_cyclic_reduction_drops_a_zero_pivot_and_solves_the_rest():
    """A singular Newton matrix (one variable decoupled with zero curvature, as when
    float64 runs out): its pivot is dropped, that component of the step is 0 and the
    other components solve their own system exactly; nothing becomes inf or NaN."""
    tf = pytest.importorskip("tensorflow")
    from losszoo.ops.possibilistic._banded import penta_factor, penta_solve

    rng = np.random.default_rng(15)
    n, dead = 9, 4
    h = random_spd_pentadiagonal(rng, n, 1, (-2.0, 2.0))[0]
    h[dead, :] = 0.0
    h[:, dead] = 0.0
    band = [np.append(np.diagonal(h, j), np.zeros(j))[:n, None] for j in range(3)]
    rhs = rng.normal(size=(n, 1))
    factors, dropped = penta_factor(*(tf.constant(b) for b in band))
    x = penta_solve(factors, tf.constant(rhs)).numpy()[:, 0]
    assert dropped.numpy().all()
    assert np.all(np.isfinite(x)) and x[dead] == 0.0
    keep = np.arange(n) != dead
    ref = np.linalg.solve(h[np.ix_(keep, keep)], rhs[keep, 0])
    np.testing.assert_allclose(x[keep], ref, rtol=1e-12, atol=1e-12)
