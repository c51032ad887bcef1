"""The possibilistic projection and its losses on the running backend (small K, float64).

Oracles, all numpy: the spec's worked examples (section 8), an explicit build of the
constraints ``A p >= b`` (spec 1.4) solved by SciPy's SLSQP, the antipignistic formula, the
KL of a fixed target in closed form, and central finite differences of the loss.
"""

import functools

import numpy as np
import pytest
from scipy import optimize

import losszoo
from losszoo.ops.possibilistic import ProjectionConfig
from tests.harness import (
    BACKEND,
    MODES,
    compiled,
    finite_difference,
    float64,
    numpy,
    value_and_grad,
)

TIGHT = ProjectionConfig(tol=1e-12, gap_tol=1e-14, max_cycles=20000)


@pytest.fixture(autouse=True)
def _x64():
    with float64():
        yield


def _constraints(pi, eps_cap=1e-9):
    """Explicit ``A``, ``b`` of ``F(pi)`` in the original coordinates (gap-wide, no ties)."""
    pi = np.asarray(pi, float) / np.max(pi)
    n = len(pi)
    sigma = np.argsort(-pi, kind="stable")
    pt = np.append(pi[sigma], 0.0)
    g = np.array([(pt[r] - pt[r + 1]) / (r + 1) for r in range(n - 1)])
    strict = pt[:-2] > pt[1:-1]
    eps = max(0.0, min(eps_cap, g[strict].min(), 1 - g[strict].max())) if strict.any() else 0.0
    rows, b = [], []
    for r in range(n - 1):
        a = np.zeros(n)
        a[sigma[: r + 1]] = 1.0
        rows.append(a), b.append(1.0 - pt[r + 1])
    for r in range(n - 1):
        a = np.zeros(n)
        a[sigma[r]], a[sigma[r + 1]] = 1.0, -1.0
        rows += [a, -a]
        b += [eps if strict[r] else 0.0, -(1.0 - eps) if strict[r] else 0.0]
    return np.array(rows), np.array(b)


def _slsqp(q, pi):
    a, b = _constraints(pi)
    res = optimize.minimize(
        lambda p: np.sum(p * np.log(np.maximum(p, 1e-300) / q)),
        _antipignistic(pi),
        jac=lambda p: np.log(np.maximum(p, 1e-300) / q) + 1.0,
        constraints=[
            {"type": "ineq", "fun": lambda p: a @ p - b, "jac": lambda p: a},
            {"type": "eq", "fun": lambda p: np.sum(p) - 1.0},
        ],
        bounds=[(1e-12, 1.0)] * len(q),
        method="SLSQP",
        options={"ftol": 1e-15, "maxiter": 1000},
    )
    return res.x


def _antipignistic(pi):
    pi = np.asarray(pi, float) / np.max(pi)
    sigma = np.argsort(-pi, kind="stable")
    pt = np.append(pi[sigma], 0.0)
    out = np.zeros(len(pi))
    for r in range(len(pi)):
        out[sigma[r]] = sum((pt[j] - pt[j + 1]) / (j + 1) for j in range(r, len(pi)))
    return out


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _data(seed=0, n=4, k=4):
    r = np.random.default_rng(seed)
    pi = np.round(r.uniform(0.05, 1.0, (n, k)), 3)
    pi[np.arange(n), r.integers(0, k, n)] = 1.0
    return r.normal(size=(n, k)) * 1.5, pi


def test_spec_worked_example_4_and_antipignistic():
    z, pi = np.log([[0.48, 0.261, 0.259]]), np.array([[1.0, 0.51, 0.5]])
    for kw in (
        {},  # certified (interior point)
        {"stopping": "paper"},  # the paper's Dykstra: one cycle, one binding prefix
        {"stopping": "paper", "gap_policy": "antipignistic_tight", "eps_cap": 1e-3},
    ):
        p, info = losszoo.ops.possibilistic_projection(z, pi, **kw)
        np.testing.assert_allclose(numpy(p), [[0.49, 0.25598077, 0.25401923]], atol=1e-8)
        if not kw:
            assert numpy(info.converged).all()
            continue
        assert numpy(info.cycles)[0] == 1
        lam = numpy(info.multipliers)[0]
        assert lam[0, 0] > 0 and np.all(lam.ravel()[1:] == 0)
    pdot = numpy(losszoo.ops.antipignistic(pi))
    np.testing.assert_allclose(pdot, [[0.661666667, 0.171666667, 0.166666667]], atol=1e-9)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("method", ["interior_point", "dykstra"])
def test_projection_matches_slsqp_and_is_certified(mode, method):
    z, pi = _data()
    config = ProjectionConfig(method=method)
    run = compiled(lambda z, pi: losszoo.ops.possibilistic_projection(z, pi, config), mode)
    p, info = run(z, pi)
    p = numpy(p)
    q = _softmax(z)
    for i in range(len(z)):
        a, b = _constraints(pi[i])
        assert np.min(a @ p[i] - b) >= -1e-8  # feasible
        np.testing.assert_allclose(p[i], _slsqp(q[i], pi[i]), atol=2e-6)
    assert numpy(info.converged).all()
    assert np.all(numpy(info.max_violation) <= 1e-8)
    assert np.all(np.abs(numpy(info.duality_gap)) <= 1e-10)
    assert numpy(info.multipliers).shape == (len(z), 3, z.shape[1] - 1)
    assert np.all(numpy(info.multipliers) >= -1e-12)  # dual feasible


def test_loss_gradient_matches_finite_differences():
    z, pi = _data(seed=1)

    def loss(z):
        return losszoo.ops.possibilistic_projection_loss(pi, z, TIGHT)

    value, (g,) = value_and_grad(loss, z)
    p = numpy(losszoo.ops.possibilistic_projection(z, pi, TIGHT)[0])
    q = _softmax(z)
    np.testing.assert_allclose(value, np.sum(p * np.log(p / q), -1), atol=1e-12)
    fd = finite_difference(compiled(loss, MODES[-1]), z)  # compiled: 2 calls per entry
    np.testing.assert_allclose(g, fd, atol=1e-6)
    upstream = np.random.default_rng(7).uniform(0.5, 1.5, size=value.shape)
    np.testing.assert_allclose(g, upstream[:, None] * (q - p), atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_fixed_target_losses_and_antipignistic_gradient(mode):
    z, pi = _data(seed=2)
    votes = np.random.default_rng(3).integers(0, 6, z.shape).astype(np.float64)
    votes[:, 0] += 1.0
    q = _softmax(z)
    upstream = np.random.default_rng(7).uniform(0.5, 1.5, size=len(z))
    for op, labels, target in (
        (losszoo.ops.antipignistic_kl_loss, pi, np.stack([_antipignistic(r) for r in pi])),
        (losszoo.ops.vote_kl_loss, votes, votes / votes.sum(-1, keepdims=True)),
    ):
        value, (g,) = value_and_grad(lambda z, op=op, y=labels: op(y, z), z, mode=mode)
        t = np.where(target > 0, target, 1.0)
        np.testing.assert_allclose(value, np.sum(target * np.log(t / q), -1), atol=1e-12)
        np.testing.assert_allclose(g, upstream[:, None] * (q - target), atol=1e-12)
    # antipignistic is piecewise linear in pi: its hand-derived gradient vs FD (no ties)
    for kw in ({}, {"floor": 0.3}):
        fn = functools.partial(losszoo.ops.antipignistic, **kw)
        _, (gp,) = value_and_grad(fn, pi, mode=mode)
        np.testing.assert_allclose(gp, finite_difference(fn, pi, eps=1e-7), atol=1e-7)


@pytest.mark.parametrize("mode", MODES)
def test_invalid_rows_are_nan_when_unchecked(mode):
    z, pi = _data(seed=4)
    z[1, 2] = np.nan
    pi[2] = [0.5, 0.4, 0.2, 0.1]  # maximum below 1
    short = ProjectionConfig(max_cycles=20)  # the NaN row never certifies: a short finish

    def both(z, pi):  # one program, not two: the solver's compile dominates this test
        loss = losszoo.ops.possibilistic_projection_loss(pi, z, short)
        return loss, losszoo.ops.possibilistic_projection(z, pi, short)[0]

    with losszoo.validation(False):
        out, p = numpy(compiled(both, mode)(z, pi))
    assert np.isnan(out[[1, 2]]).all() and np.isfinite(out[[0, 3]]).all()
    assert np.isnan(p[[1, 2]]).all() and np.isfinite(p[[0, 3]]).all()


def test_eager_errors_name_the_argument():
    z, pi = _data(seed=5)
    bad = pi.copy()
    bad[0, 1] = 1.5
    with pytest.raises(ValueError, match="`labels` must hold possibility distributions"):
        losszoo.ops.possibilistic_projection_loss(bad, z)
    with pytest.raises(ValueError, match="`possibility` must hold possibility"):
        losszoo.ops.possibilistic_projection(z, bad)
    z[0, 0] = np.inf
    with pytest.raises(ValueError, match="`logits` must not hold NaN or \\+inf"):
        losszoo.ops.possibilistic_projection_loss(pi, z)
    with pytest.raises(ValueError, match="`votes` must hold finite, non-negative vote counts"):
        losszoo.ops.vote_kl_loss(-pi, np.zeros_like(pi), labels_name="votes")
    with pytest.raises(ValueError, match="`tol`"):
        losszoo.ops.possibilistic_projection(z, pi, tol=0.0)


@pytest.mark.skipif(BACKEND != "jax", reason="only JAX computes float64 on request only")
def test_jax_without_x64_raises_a_clear_error():
    import jax

    z, pi = _data()
    jax.config.update("jax_enable_x64", False)
    try:
        for call in (
            lambda: losszoo.ops.possibilistic_projection(z, pi),
            lambda: losszoo.ops.possibilistic_projection_loss(pi, z),
            lambda: losszoo.ops.antipignistic(pi),
            lambda: losszoo.ops.vote_kl_loss(pi, z),
        ):
            with pytest.raises(RuntimeError, match="jax_enable_x64"):
                call()
    finally:
        jax.config.update("jax_enable_x64", True)
