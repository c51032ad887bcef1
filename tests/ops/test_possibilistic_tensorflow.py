"""Tests of the possibilistic KL-projection ops against independent references.

Oracles (spec section 7): the paper's worked examples, a literal NumPy transcription of the
paper's Algorithm 1 (full correction vectors d_h), SciPy solves of the projection (dual
L-BFGS-B and primal SLSQP) on explicitly built constraints, the 2^n-event definition of
compatibility, the paper's Table 1 cycle counts, and finite differences.

Set ``LOSSZOO_POSSIBILISTIC_SCIPY_CASES=5000`` to run the SciPy cross-check on thousands of
cases (the default keeps this file fast).
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
import tensorflow as tf
from scipy import optimize

import losszoo
from losszoo.ops import (
    antipignistic,
    antipignistic_kl_loss,
    possibilistic_projection,
    possibilistic_projection_loss,
    possibility_constraints,
    vote_kl_loss,
)
from tests.helpers import assert_grad_matches_fd

pytestmark = pytest.mark.tensorflow_only(
    reason="tf.GradientTape / tf.function / XLA checks (tests/helpers.py)"
)

RHO = 1e-6


# ----------------------------------------------------------------------------------------
# Independent NumPy references (written from the spec's definitions, not from the package)
# ----------------------------------------------------------------------------------------


def ref_constraints(pi, eps_cap=1e-9):
    """Explicit A (m x n), b (m) in ORIGINAL coordinates, gap-wide bounds, tie_tol = 0."""
    pi = np.asarray(pi, float) / np.max(pi)
    n = len(pi)
    sigma = np.argsort(-pi, kind="stable")
    pt = np.append(pi[sigma], 0.0)
    g = np.array([(pt[r] - pt[r + 1]) / (r + 1) for r in range(n - 1)])
    strict = np.array([pt[r] > pt[r + 1] for r in range(n - 1)])
    if strict.any():
        eps = max(0.0, min(eps_cap, g[strict].min(), 1 - g[strict].max()))
    else:
        eps = 0.0
    rows, bounds = [], []
    for r in range(n - 1):  # dominance: sum over top-(r+1) >= 1 - pt[r+1]
        a = np.zeros(n)
        a[sigma[: r + 1]] = 1.0
        rows.append(a)
        bounds.append(1.0 - pt[r + 1])
    for sign in (1.0, -1.0):  # lower then upper shape constraints
        for r in range(n - 1):
            a = np.zeros(n)
            a[sigma[r]], a[sigma[r + 1]] = sign, -sign
            if sign > 0:
                bound = eps if strict[r] else 0.0
            else:
                bound = -min(1 - eps, np.nextafter(1, 0)) if strict[r] else 0.0
            rows.append(a)
            bounds.append(bound)
    return np.array(rows), np.array(bounds)


def ref_antipignistic(pi):
    pi = np.asarray(pi, float) / np.max(pi)
    n = len(pi)
    sigma = np.argsort(-pi, kind="stable")
    pt = np.append(pi[sigma], 0.0)
    out = np.zeros(n)
    for r in range(n):
        out[sigma[r]] = sum((pt[j] - pt[j + 1]) / (j + 1) for j in range(r, n))
    return out


def ref_literal_dykstra(q, pi, tau, k_max, eps_cap=1e-9):
    """The paper's Algorithm 1 verbatim (spec 2.3) with closed-form projections (spec 2.2)."""
    a_mat, b = ref_constraints(pi, eps_cap)
    m, n = a_mat.shape
    z = np.maximum(q, 1e-15)
    z = z / z.sum()
    d = np.zeros((m, n))
    for cycle in range(1, k_max + 1):
        for h in range(m):
            ell = np.log(z) + d[h]
            u = np.exp(ell - ell.max())
            u = u / u.sum()
            a = a_mat[h]
            if (a >= 0).all():  # prefix (P)
                s = u[a > 0].sum()
                if s >= b[h]:
                    znew = u
                else:
                    znew = np.where(a > 0, b[h] / s * u, (1 - b[h]) / (1 - s) * u)
            else:  # gap (G): x_i - x_j >= delta
                i, j = int(np.argmax(a)), int(np.argmin(a))
                delta = b[h]
                s = u[i] - u[j]
                if s >= delta:
                    znew = u
                else:
                    rest = 1.0 - u[i] - u[j]
                    disc = rest**2 * delta**2 + 4 * u[i] * u[j] * (1 - delta**2)
                    if delta > 0:
                        e = (rest * delta + np.sqrt(disc)) / (2 * u[i] * (1 - delta))
                    elif delta < 0:
                        e = 2 * u[j] * (1 + delta) / (np.sqrt(disc) - rest * delta)
                    else:
                        e = np.sqrt(u[j] / u[i])
                    znew = u.copy()
                    znew[i] *= e
                    znew[j] /= e
                    znew = znew / znew.sum()
            d[h] = d[h] + np.log(np.maximum(z, 1e-15)) - np.log(znew)
            z = znew
        viol = np.max(np.maximum(b - a_mat @ z, 0.0))
        if viol <= tau:
            return z, cycle
    return z, k_max


def scipy_dual(q, a_mat, b):
    """max_{lam>=0} lam.b - logsumexp(log q + A^T lam) by L-BFGS-B (spec 7.3 primary)."""
    lq = np.log(q)

    def neg(lam):
        x = lq + a_mat.T @ lam
        mx = x.max()
        p = np.exp(x - mx)
        lse = mx + np.log(p.sum())
        p /= p.sum()
        return lse - lam @ b, a_mat @ p - b

    res = optimize.minimize(
        neg,
        np.zeros(len(b)),
        jac=True,
        method="L-BFGS-B",
        bounds=[(0, None)] * len(b),
        options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 20000},
    )
    x = lq + a_mat.T @ res.x
    p = np.exp(x - x.max())
    return p / p.sum()


def scipy_slsqp(q, a_mat, b, start):
    """min KL(p||q) s.t. A p >= b, sum p = 1 by SLSQP from the antipignistic point."""

    def kl(p):
        return np.sum(p * (np.log(p) - np.log(q))), np.log(p) - np.log(q) + 1.0

    res = optimize.minimize(
        kl,
        start,
        jac=True,
        method="SLSQP",
        bounds=[(1e-12, 1.0)] * len(q),
        constraints=[
            {"type": "ineq", "fun": lambda p: a_mat @ p - b, "jac": lambda p: a_mat},
            {"type": "eq", "fun": lambda p: p.sum() - 1.0, "jac": lambda p: np.ones_like(p)},
        ],
        options={"ftol": 1e-15, "maxiter": 500},
    )
    return res.x, res.success


def random_cases(rng, batch, n):
    pi = rng.random((batch, n))
    pi /= pi.max(axis=1, keepdims=True)
    q = rng.dirichlet(np.ones(n), size=batch)
    return pi, q


def project_logits(logits, pi, pad_to=64, **kw):
    """possibilistic_projection on logits (dtype kept), batch padded like ``project``."""
    z = tf.convert_to_tensor(logits)
    z = tf.cast(z, tf.float64) if not z.dtype.is_floating else z
    pi = tf.convert_to_tensor(pi, tf.float64)
    b, k = z.shape
    extra = -b % pad_to
    p, info = possibilistic_projection(
        tf.concat([z, tf.zeros([extra, k], z.dtype)], 0),
        tf.concat([pi, tf.ones([extra, k], tf.float64)], 0),
        **kw,
    )
    return p[:b], type(info)(*(val[:b] for val in info))


def kl(p, q):
    p = np.asarray(p)
    return np.sum(np.where(p > 0, p * (np.log(np.where(p > 0, p, 1)) - np.log(q)), 0), -1)


def project(q, pi, pad_to=64, **kw):
    """Projection of probabilities q; the batch is padded with all-ones rows (which
    short-circuit) to a multiple of ``pad_to`` so tests share XLA compilations."""
    q, pi = np.asarray(q, np.float64), np.asarray(pi, np.float64)
    b = len(q)
    extra = -b % pad_to
    q = np.concatenate([q, np.full((extra, q.shape[1]), 1.0 / q.shape[1])])
    pi = np.concatenate([pi, np.ones((extra, pi.shape[1]))])
    p, info = possibilistic_projection(np.log(q), pi, **kw)
    return p.numpy()[:b], type(info)(*(v.numpy()[:b] for v in info))


# ----------------------------------------------------------------------------------------
# Worked examples (spec 7.1)
# ----------------------------------------------------------------------------------------


def test_worked_examples_transform_and_constraints():
    p1 = np.array([0.91] + [0.01] * 9)
    p2 = np.array([0.15, 0.14, 0.13, 0.12, 0.11, 0.09, 0.08, 0.07, 0.06, 0.05])
    for p, pi_expected in (
        (p1, [1] + [0.1] * 9),
        (p2, [1, 0.99, 0.97, 0.94, 0.90, 0.80, 0.74, 0.67, 0.59, 0.50]),
    ):
        pi = np.array([np.sum(np.minimum(p, p_i)) for p_i in p])  # forward transform
        np.testing.assert_allclose(pi, pi_expected, atol=1e-12)
        back = antipignistic(tf.constant(pi[None], tf.float64)).numpy()[0]
        np.testing.assert_allclose(back, p, atol=1e-15)
    # (its antipignistic: tests/ops/test_possibilistic.py)
    pi = tf.constant([[1.0, 0.51, 0.50]], tf.float64)
    c = possibility_constraints(pi)
    np.testing.assert_allclose(c.dominance_bound.numpy()[0], [0.49, 0.50], atol=1e-15)
    np.testing.assert_allclose(c.eps.numpy(), [1e-9])
    np.testing.assert_allclose(c.gap_lower.numpy()[0], [1e-9, 1e-9])
    np.testing.assert_allclose(c.gap_upper.numpy()[0], [1 - 1e-9, 1 - 1e-9])
    tight = possibility_constraints(pi, eps_cap=0.001, gap_policy="antipignistic_tight")
    np.testing.assert_allclose(tight.gap_upper.numpy()[0], [0.49, 0.005], atol=1e-15)
    # Example 2: dominance holds but the shape constraints fail for these two points.
    for p in ([0.49, 0.50, 0.01], [0.49, 0.01, 0.50]):
        a_mat, b = ref_constraints([1.0, 0.51, 0.50])
        assert np.all(a_mat[:2] @ p >= b[:2] - 1e-12)
        assert np.max(b - a_mat @ p) > 1e-3


def test_softmax_counterexample_and_paper_flaw():
    # pi = (1, 0.2) needs p_1 >= N({1}) = 0.8, which softmax(pi) violates.
    # (A third class with possibility rho keeps N({1}) = 0.8 and shares the K = 3 kernel.)
    p, _ = project([[0.5, 0.5 - 1e-9, 1e-9]], [[1.0, 0.2, RHO]])
    assert p[0, 0] >= 0.8 - 1e-8 and np.exp(1) / (np.exp(1) + np.exp(0.2)) < 0.7
    # Spec 2.6: the paper's rule stops at a feasible, non-optimal point.
    q, pi = [[0.0095, 0.4667, 0.5238]], [[1.0, 0.4236, 0.0643]]
    paper, info_p = project(q, pi, stopping="paper")
    cert, info_c = project(q, pi, stopping="certified", method="dykstra")
    np.testing.assert_allclose(paper[0], [0.695, 0.241, 0.0643], atol=1e-3)
    np.testing.assert_allclose(cert[0], [0.5764, 0.3593, 0.0643], atol=1e-4)
    np.testing.assert_allclose(kl(paper[0], q[0]), 2.690, atol=2e-3)
    np.testing.assert_allclose(kl(cert[0], q[0]), 2.139, atol=2e-3)
    assert info_p.cycles[0] == 1 and info_c.cycles[0] > 1
    assert info_p.duality_gap[0] > 0.1 and abs(info_c.duality_gap[0]) <= 1e-10
    a_mat, b = ref_constraints(pi[0])
    np.testing.assert_allclose(cert[0], scipy_dual(np.array(q[0]), a_mat, b), atol=1e-7)


# ----------------------------------------------------------------------------------------
# Independent solvers, feasibility, optimality (spec 7.3, 7.5, 7.6)
# ----------------------------------------------------------------------------------------


def test_matches_scipy_dual_and_slsqp_on_random_cases():
    total = int(os.environ.get("LOSSZOO_POSSIBILISTIC_SCIPY_CASES", "128"))
    rng = np.random.default_rng(1)
    # Few distinct n by default: every new n is one more XLA compilation.
    sizes = (3, 6) if total <= 500 else (2, 3, 4, 5, 6, 7, 8, 9, 10)
    per_n = max(total // len(sizes), 1)
    worst_dual = worst_slsqp = 0.0
    slsqp_ok = 0
    for n in sizes:
        pi, q = random_cases(rng, per_n, n)
        p, info = project(q, pi, max_cycles=100000)
        assert info.converged.all()
        for i in range(per_n):
            a_mat, b = ref_constraints(pi[i])
            dual = scipy_dual(q[i], a_mat, b)
            worst_dual = max(worst_dual, np.max(np.abs(p[i] - dual)))
            if i % 2 == 0:  # SLSQP is the slower, less reliable second oracle
                primal, ok = scipy_slsqp(q[i], a_mat, b, ref_antipignistic(pi[i]))
                if ok:
                    slsqp_ok += 1
                    worst_slsqp = max(worst_slsqp, np.max(np.abs(p[i] - primal)))
    print(
        f"scipy cross-check: {per_n * len(sizes)} cases, n in {sizes}: max |p - dual| = "
        f"{worst_dual:.2e}, SLSQP ok {slsqp_ok}, max |p - slsqp| = {worst_slsqp:.2e}"
    )
    assert worst_dual <= 1e-6, worst_dual
    assert worst_slsqp <= 1e-6, worst_slsqp
    assert slsqp_ok >= 0.5 * total / 2


def test_feasibility_on_all_events_and_kkt():
    rng = np.random.default_rng(2)
    n, tau = 6, 1e-8
    pi, q = random_cases(rng, 40, n)
    pi[:5, 3] = pi[:5, 1]  # some ties
    pi /= pi.max(1, keepdims=True)
    p, info = project(q, pi)
    assert info.converged.all()
    np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-12)
    assert np.all(p > 0)
    events = np.array(list(itertools.product([0, 1], repeat=n)), bool)
    for i in range(len(p)):
        pin = pi[i] / pi[i].max()
        prob = events.astype(float) @ p[i]
        poss = np.array([pin[e].max() if e.any() else 0.0 for e in events])
        nec = np.array([1.0 - (pin[~e].max() if (~e).any() else 0.0) for e in events])
        assert np.all(nec - tau <= prob) and np.all(prob <= poss + tau)
        a_mat, b = ref_constraints(pi[i])
        assert np.max(b - a_mat @ p[i]) <= tau
        # KKT: log p - log q - A^T lam is constant, lam >= 0 (lambda is in sorted order).
        lam = info.multipliers[i].ravel()
        sigma = np.argsort(-pin, kind="stable")
        assert np.all(lam >= 0)
        a_sorted = a_mat[:, sigma]
        resid = np.log(p[i][sigma]) - np.log(q[i][sigma]) - a_sorted.T @ lam
        assert np.ptp(resid) <= 1e-9
        assert abs(info.duality_gap[i]) <= 1e-10
        # Pythagoras: the projection beats the antipignistic point (Model B's target).
        assert kl(p[i], q[i]) <= kl(ref_antipignistic(pi[i]), q[i]) + 1e-12


def test_idempotence_order_and_equivariance():
    rng = np.random.default_rng(3)
    n = 6
    pi, q = random_cases(rng, 8, n)
    pi[:, 4] = pi[:, 2]  # a tie in every row
    pi /= pi.max(1, keepdims=True)
    pdot = np.stack([ref_antipignistic(row) for row in pi])
    p, info = project(pdot, pi, method="dykstra")
    assert np.all(info.cycles == 1)
    assert np.all(info.multipliers == 0)
    assert np.max(np.abs(p - pdot)) <= 1e-15
    star, info = project(q, pi)
    again, _ = project(star, pi)
    # Re-projecting a certified p* (gap <= 1e-10 bounds |p - p*|_1 by 1.4e-5 only) stays
    # within 5e-8 (the interior point aims 1e-5 below the certificate).
    assert np.max(np.abs(again - star)) <= 5e-8
    # Order: equal possibilities -> equal probabilities, larger -> larger.
    for i in range(len(pi)):
        np.testing.assert_allclose(star[i, 4], star[i, 2], atol=1e-8)
        for a, b in itertools.permutations(range(n), 2):
            if pi[i, a] > pi[i, b]:
                assert star[i, a] > star[i, b]
    # Equivariance under a class permutation and under rescaling pi.
    perm = rng.permutation(n)
    permuted, _ = project(q[:, perm], pi[:, perm])
    np.testing.assert_allclose(permuted, star[:, perm], atol=1e-8)
    # A rescaled (sub-normalised) pi is ambiguous and rejected (issue 9).
    with pytest.raises(ValueError, match="`possibility`"):
        project(q, 0.37 * pi)


@pytest.mark.parametrize("n", [3, 10])
def test_literal_algorithm_equivalence(n):
    """Dual form == the paper's Algorithm 1: same iterates, same cycle counts (spec 7.4)."""
    rng = np.random.default_rng(4)
    pi = 1e-6 + (1 - 1e-6) * rng.random((6, n))
    pi /= pi.max(1, keepdims=True)
    q = np.maximum(rng.random((6, n)), 1e-15)
    q /= q.sum(1, keepdims=True)
    for tau, k_max in ((1e-4, 300), (1e-2, 3)):
        p, info = project(q, pi, tol=tau, max_cycles=k_max, stopping="paper")
        for i in range(len(q)):
            ref, cycles = ref_literal_dykstra(q[i], pi[i], tau, k_max)
            assert info.cycles[i] == cycles
            np.testing.assert_allclose(p[i], ref, atol=1e-13, rtol=0)
    # stopping="fixed" runs exactly max_cycles cycles
    p, info = project(q, pi, max_cycles=7, stopping="fixed")
    assert np.all(info.cycles == 7)
    ref, _ = ref_literal_dykstra(q[0], pi[0], 0.0, 7)
    np.testing.assert_allclose(p[0], ref, atol=1e-13, rtol=0)


def table1_batch(rng, n=100, runs=100):
    pis, qs = [], []
    for _ in range(runs):
        pi = 1e-6 + (1 - 1e-6) * rng.random(n)
        pi /= pi.max()
        q = np.maximum(rng.random(n), 1e-15)
        q /= q.sum()
        pis.append(pi)
        qs.append(q)
    return np.array(pis), np.array(qs)


def test_table1_regression_anchor():
    """Paper Table 1 (n=100, K_max=1000, paper stop, default_rng(0) drawn sequentially)."""
    rng = np.random.default_rng(0)
    expected = {
        1e-2: (1.1, 1.0, 6.04e-3),
        1e-3: (11.9, 16.1, 9.42e-4),
        1e-4: (143.9, 215.4, 9.93e-5),
    }
    for tau, (mean, p90, v_mean) in expected.items():
        pi, q = table1_batch(rng)
        _, info = project(q, pi, tol=tau, max_cycles=1000, stopping="paper")
        cycles = info.cycles
        assert info.converged.all()
        np.testing.assert_allclose(cycles.mean(), mean, atol=0.05)
        np.testing.assert_allclose(np.percentile(cycles, 90), p90, atol=0.05)
        np.testing.assert_allclose(info.max_violation.mean(), v_mean, rtol=5e-3)


# ----------------------------------------------------------------------------------------
# Gradients and XLA (spec 7.10, 7.12)
# ----------------------------------------------------------------------------------------


def test_loss_gradient_matches_finite_differences_of_value_function():
    rng = np.random.default_rng(5)
    pi, _ = random_cases(rng, 3, 3)
    logits = rng.normal(size=(3, 3))
    _, info = padded_loss(logits, pi, tol=1e-14, gap_tol=1e-16, max_cycles=20000)
    assert info.converged.numpy().all()

    def value(z, p):
        return padded_loss(z, p, tol=1e-14, gap_tol=1e-16, max_cycles=20000)[0]

    assert_grad_matches_fd(value, [logits, pi], wrt=(0,), eps=1e-5, atol=1e-7, rtol=1e-6)
    # And the gradient equals softmax(z) - p* exactly.
    z = tf.constant(logits)
    with tf.GradientTape() as tape:
        tape.watch(z)
        loss, _ = padded_loss(z, pi)
    grad = tape.gradient(loss, z).numpy()
    star, _ = project(tf.nn.softmax(z).numpy(), pi)
    np.testing.assert_allclose(grad, tf.nn.softmax(z).numpy() - star, atol=1e-15)
    # l_A <= KL(pdot || q) (Model B's loss)
    np.testing.assert_array_less(loss.numpy(), antipignistic_kl_loss(pi, z).numpy() + 1e-12)


def test_xla_matches_eager_and_jitted_train_step():
    rng = np.random.default_rng(7)
    pi, _ = random_cases(rng, 4, 3)
    logits = tf.constant(rng.normal(size=(4, 3)))
    pi = tf.constant(pi)
    star, _ = project_logits(logits, pi)
    expected = tf.nn.softmax(logits) - star

    def f(z):  # jit=False: the solver's loops inlined in the caller's program
        loss, info = possibilistic_projection_loss(pi, z, jit=False, return_info=True)
        return loss, info.cycles, info.max_violation

    # One XLA program of the loss, differentiated by an outer tape: outputs and gradient
    # (of a position-weighted sum of the losses) agree with eager and with q - p*.
    weights = tf.constant(1.0 + 0.5 * np.sin(np.arange(4)))

    def with_gradient(fn):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            out = fn(logits)
            total = tf.reduce_sum(weights * out[0])
        return out, tape.gradient(total, logits).numpy()

    (xla, xla_grad), (eager, eager_grad) = (
        with_gradient(tf.function(f, jit_compile=True)),
        with_gradient(f),
    )
    for got, want in zip(xla, eager):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-13, rtol=1e-13)
    np.testing.assert_allclose(xla_grad, eager_grad, atol=1e-13, rtol=1e-13)
    np.testing.assert_allclose(xla_grad, weights.numpy()[:, None] * expected.numpy(), atol=1e-12)
    # A fully jitted train step (the tape inside the program).
    w = tf.Variable(tf.eye(3, dtype=tf.float64))

    @tf.function(jit_compile=True)
    def train_step(x):
        with tf.GradientTape() as tape:
            loss, info = possibilistic_projection_loss(pi, tf.matmul(x, w), return_info=True)
            total = tf.reduce_sum(loss)
        grad = tape.gradient(total, w)
        w.assign_sub(0.0 * grad)
        return grad, info.cycles

    grad, _ = train_step(logits)
    np.testing.assert_allclose(
        grad.numpy(), tf.transpose(logits).numpy() @ expected.numpy(), atol=1e-12
    )


# ----------------------------------------------------------------------------------------
# Spec section 5: every bad / edge input
# ----------------------------------------------------------------------------------------


def padded_loss(z, pi, pad_to=64, **kw):
    """The loss op on a batch padded with all-ones rows (shared XLA compilations)."""
    z, pi = tf.convert_to_tensor(z, tf.float64), tf.convert_to_tensor(pi, tf.float64)
    b, k = z.shape
    extra = -b % pad_to
    loss, info = possibilistic_projection_loss(
        tf.concat([pi, tf.ones([extra, k], tf.float64)], 0),
        tf.concat([z, tf.zeros([extra, k], tf.float64)], 0),
        return_info=True,
        **kw,
    )
    return loss[:b], type(info)(*(val[:b] for val in info))


def _loss_and_grad(logits, pi, **kw):
    z = tf.constant(np.asarray(logits, np.float64))
    with tf.GradientTape() as tape:
        tape.watch(z)
        loss, info = padded_loss(z, np.asarray(pi, np.float64), **kw)
    return loss.numpy(), tape.gradient(loss, z).numpy(), type(info)(*(v.numpy() for v in info))


def test_bad_input_unnormalized_and_out_of_range_possibility():
    # Issue 9: a possibility row must lie in [0, 1] with maximum 1; anything else is rejected
    # eagerly (naming the argument) and gives NaN rows when validation is off (as under XLA).
    rng = np.random.default_rng(8)
    pi, q = random_cases(rng, 3, 6)
    for bad in (0.3 * pi, 2.5 * pi, np.where(np.arange(6) == 5, -0.5, pi)):
        with pytest.raises(ValueError, match="`possibility`"):
            possibilistic_projection(np.log(q), bad)
        with losszoo.validation(False):  # padded: the K = 6 kernels of the other tests
            p, info = project(q, bad)
        assert np.isnan(p).all() and not info.valid.any()


def test_bad_input_nan_or_all_zero_rows_are_nan_not_zero():
    logits = np.array([[1.0, 0.0, -1.0]] * 3 + [[-1.0, 0.0, 1.0]])
    pi = np.array([[np.nan, 1.0, 0.2], [0.0, 0.0, 0.0], [-1.0, -2.0, 0.0], [1.0, 0.5, 0.1]])
    with pytest.raises(ValueError, match="`labels`"):
        possibilistic_projection_loss(pi, logits)
    with losszoo.validation(False):
        loss, grad, info = _loss_and_grad(logits, pi)
    np.testing.assert_array_equal(info.valid, [False, False, False, True])
    assert np.isnan(loss[:3]).all() and loss[3] > 0
    assert np.all(np.isfinite(grad[3]))


def test_bad_input_zero_possibility_floor_and_restrict():
    logits = np.array([[0.5, 0.2, 1.5, -0.3, 0.8, -1.0]])
    pi = np.array([[1.0, 0.4, 0.0, 0.1, 0.7, 0.25]])
    # floor (default): the impossible class gets at most rho, and its logit is pushed down.
    loss, grad, _ = _loss_and_grad(logits, pi)
    star, _ = project(np.exp(logits) / np.exp(logits).sum(), pi)
    assert star[0, 2] <= RHO + 1e-8 and grad[0, 2] > 0
    # restrict: exactly zero probability, no gradient outside the support, no NaN.
    loss_r, grad_r, info = _loss_and_grad(logits, pi, support_mode="restrict")
    star_r, _ = project_logits(logits, pi, support_mode="restrict")
    assert star_r.numpy()[0, 2] == 0.0 and grad_r[0, 2] == 0.0
    assert np.all(np.isfinite(grad_r)) and np.isfinite(loss_r).all()
    # on the support it is the projection of q renormalised on the support (SciPy oracle)
    keep = [0, 1, 3, 4, 5]
    q_keep = np.exp(logits[0, keep]) / np.exp(logits[0, keep]).sum()
    a_mat, b = ref_constraints(pi[0, keep])
    np.testing.assert_allclose(star_r.numpy()[0, keep], scipy_dual(q_keep, a_mat, b), atol=1e-7)


def test_bad_input_one_hot_possibility():
    logits = np.array([[0.3, -1.0, 2.0, 0.1, 0.5, -0.2]])
    pi = np.array([[0.0, 1.0, 0.0, 0.0, 0.0, 0.0]])
    loss, grad, _ = _loss_and_grad(logits, pi)
    star, _ = project_logits(logits, pi)
    assert star.numpy()[0, 1] >= 1 - RHO - 1e-9
    ce = -tf.nn.log_softmax(logits).numpy()[0, 1]
    assert abs(loss[0] - ce) <= 1e-4
    loss_r, grad_r, info = _loss_and_grad(logits, pi, support_mode="restrict")
    assert loss_r[0] == 0.0 and np.all(grad_r == 0.0)


def test_bad_input_total_ignorance_short_circuits_to_uniform():
    logits = np.array([[2.0, 0.0, -1.0, 0.5, 0.0, 1.0]])
    loss, grad, info = _loss_and_grad(logits, np.ones((1, 6)))
    star, _ = project(np.exp(logits) / np.exp(logits).sum(), np.ones((1, 6)))
    star = tf.constant(star)
    np.testing.assert_allclose(star.numpy(), np.full((1, 6), 1 / 6), atol=1e-15)
    q = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(loss, kl(np.full(6, 1 / 6), q[0]), atol=1e-12)
    assert info.cycles[0] == 0 and info.converged[0]


def test_bad_input_ties_and_tie_tol():
    rng = np.random.default_rng(9)
    q = rng.dirichlet(np.ones(6), size=1)
    pi = np.array([[1.0, 0.6, 0.3, 0.6, 0.3 + 1e-7, 0.1]])
    p, _ = project(q, pi)
    np.testing.assert_allclose(p[0, 1], p[0, 3], atol=1e-8)  # exact tie -> equal
    assert p[0, 4] - p[0, 2] >= 1e-9 - 1e-8  # near-tie stays strict with tie_tol = 0
    merged, _ = project(q, pi, tie_tol=1e-6)
    np.testing.assert_allclose(merged[0, 4], merged[0, 2], atol=1e-8)
    # tied-class order does not change p*
    perm = [0, 3, 2, 1, 4, 5]
    p2, _ = project(q[:, perm], pi[:, perm])
    np.testing.assert_allclose(p2, p[:, perm], atol=1e-7)


def test_bad_input_zero_or_underflowing_q():
    logits = np.array([[0.0, -1e4, -np.inf, 3.0, 1.0, -2.0], [800.0, 0.0, 0.0, -800.0, 5.0, -3.0]])
    pi = np.array([[1.0, 0.9, 0.5, 0.2, 0.7, 0.3], [0.1, 1.0, 0.3, 0.9, 0.6, 0.05]])
    loss, grad, info = _loss_and_grad(logits, pi)
    p, _ = project_logits(logits, pi)
    assert np.all(np.isfinite(loss)) and np.all(np.isfinite(grad))
    assert np.all(np.isfinite(p.numpy())) and info.converged.all()
    a_mat, b = ref_constraints(pi[0])
    assert np.max(b - a_mat @ p.numpy()[0]) <= 1e-8


def test_bad_input_float32_and_half_precision():
    rng = np.random.default_rng(10)
    pi, q = random_cases(rng, 3, 3)
    logits = np.log(q)
    p64, _ = project_logits(logits, pi)
    for dtype in (tf.float32, tf.float16, tf.bfloat16):
        p, info = project_logits(tf.constant(logits, dtype), pi)
        assert p.dtype == dtype and info.max_violation.dtype == tf.float64
    p32, _ = project_logits(tf.constant(logits, tf.float32), pi)
    np.testing.assert_allclose(p32.numpy(), p64.numpy(), atol=1e-6)
    # the solver is float64 whatever the input: there is no float32 mode to ask for
    with pytest.raises(TypeError, match="compute_dtype"):
        possibilistic_projection(logits, pi, compute_dtype="float32")


def test_bad_input_single_class_and_support_size_one():
    loss, grad, info = _loss_and_grad([[3.0], [-2.0]], [[1.0], [1.0]])
    np.testing.assert_array_equal(loss, 0.0)
    np.testing.assert_array_equal(grad, 0.0)
    p, _ = possibilistic_projection([[3.0]], [[1.0]])
    np.testing.assert_allclose(p.numpy(), [[1.0]])
    # n_b = 1 in restrict mode: p* = q renormalised on the support = one-hot.
    p, info = project_logits([[0.0, 1.0, 2.0]], [[0.0, 1.0, 0.0]], support_mode="restrict")
    np.testing.assert_allclose(p.numpy(), [[0.0, 1.0, 0.0]])


def test_bad_input_non_convergence_returns_last_iterate():
    rng = np.random.default_rng(11)
    pi, q = random_cases(rng, 4, 6)
    p, info = project(q, pi, max_cycles=1, tol=1e-12, method="dykstra")
    assert np.all(np.isfinite(p)) and not info.converged.all()
    assert np.all(info.cycles == 1) and np.all(np.isfinite(info.max_violation))
    ref, _ = ref_literal_dykstra(q[0], pi[0], 0.0, 1)
    np.testing.assert_allclose(p[0], ref, atol=1e-13)


def test_bad_arguments_raise_early():
    logits, pi = [[0.0, 1.0]], [[1.0, 0.5]]
    for kwargs, match in (
        ({"stopping": "best"}, "`stopping`"),
        ({"support_mode": "clip"}, "`support_mode`"),
        ({"gap_policy": "x"}, "`gap_policy`"),
        ({"tol": 0.0}, "`tol`"),
        ({"max_cycles": 0}, "`max_cycles`"),
        ({"floor": 0.0}, "`floor`"),
        ({"eps_cap": 0.7}, "`eps_cap`"),
    ):
        with pytest.raises(ValueError, match=match):
            possibilistic_projection(logits, pi, **kwargs)
    with pytest.raises(ValueError, match="`possibility` must have the shape"):
        possibilistic_projection(logits, [[1.0, 0.5, 0.2]])
    with pytest.raises(ValueError, match="rank"):
        possibilistic_projection(1.0, 1.0)
    with pytest.raises(TypeError, match="`logits"):
        possibilistic_projection(tf.constant([["a", "b"]]), pi)


# ----------------------------------------------------------------------------------------
# Issue 19: unknown batch size at trace time, invalid logits, antipignistic / option checks
# ----------------------------------------------------------------------------------------


def _graded(rng, batch, k):
    pi = np.round(rng.random((batch, k)), 2)
    pi[np.arange(batch), rng.integers(k, size=batch)] = 1.0
    pi[0] = np.eye(k)[0]  # a two-block row (closed form)
    pi[1] = 1.0  # total ignorance (short-circuit)
    return np.maximum(pi, RHO)


def _none_batch_case(k, batch):
    rng = np.random.default_rng(19)
    return tf.constant(3.0 * rng.normal(size=(batch, k))), tf.constant(_graded(rng, batch, k))


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize(
    "k,batches,kw",
    [
        # Interior point, Dykstra finish. The None-batch program takes the compacted stage at
        # any batch (its size is a tensor, max(B // 4, 1)): 40 rows (10 go on) and 3 rows
        # (1 goes on) through one program; eager compacts neither (below 128 rows).
        (12, (40, 3), {}),
        (12, (40,), {"method": "dykstra", "stopping": "paper"}),  # rolled Dykstra, compacted
        (5, (6,), {"method": "dykstra"}),  # small-K Dykstra
    ],
)
def test_none_batch_dim_matches_static_shapes(k, batches, kw, jit_compile):
    # Issue 19: with the batch unknown at trace time (a Keras dataset with a partial last
    # batch), the cyclic-reduction solve built shapes from static dims and raised TypeError.

    def fn(z, pi):  # one projection per program: the loss's (its gradient is q - p*)
        with tf.GradientTape() as tape:
            tape.watch(z)
            loss, info = possibilistic_projection_loss(pi, z, return_info=True, **kw)
        return info.iterations, loss, tape.gradient(loss, z)

    spec = [tf.TensorSpec([None, k], tf.float64)] * 2
    dynamic = tf.function(fn, input_signature=spec, jit_compile=jit_compile)
    # The reference is the same mode's program at static shapes, then eager. A row whose last
    # residual sits at the stopping tolerance may stop one iteration apart in two programs
    # (they differ in the compacted stage and in rounding: on CI and in a full local run,
    # graph mode's None-batch program stopped one row at 13 iterations, the static one at
    # 14; XLA against eager, 8 of 40 rows): such a row agrees to the certificate's tolerance
    # (1e-8), every other row to 1e-10.
    reference = tf.function(fn, jit_compile=jit_compile)
    for batch in batches:
        z, pi = _none_batch_case(k, batch)
        (it, loss, grad), (it_want, loss_want, grad_want) = dynamic(z, pi), reference(z, pi)
        assert grad.shape.as_list() == [batch, k]
        p_eager, info_eager = possibilistic_projection(z, pi, **kw)
        q = tf.nn.softmax(z).numpy()
        # against the static program, then (p* = q - gradient) against the eager projection
        for want_it, pairs in [
            (it_want, [(loss, loss_want), (grad, grad_want)]),
            (info_eager.iterations, [(q - grad.numpy(), p_eager)]),
        ]:
            apart = np.abs(it.numpy() - np.asarray(want_it))
            assert apart.max() <= 1, (it.numpy(), np.asarray(want_it))
            atol = np.where(apart == 0, 1e-10, 1e-8)
            for a, b in pairs:
                diff = np.abs(np.asarray(a) - np.asarray(b)).reshape(batch, -1).max(-1)
                np.testing.assert_array_less(diff, atol)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_fixed_target_ops_accept_unknown_batch_and_class_dims(jit_compile):
    rng = np.random.default_rng(20)
    pi, _ = random_cases(rng, 5, 4)
    logits = rng.normal(size=(5, 4))
    votes = rng.integers(1, 9, size=(5, 4)).astype(float)
    q = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    pdot = np.stack([ref_antipignistic(r) for r in pi])
    spec = [tf.TensorSpec([None, None], tf.float64)] * 2

    def run(fn, *args):
        return tf.function(fn, input_signature=spec[: len(args)], jit_compile=jit_compile)(*args)

    np.testing.assert_allclose(run(lambda p: antipignistic(p), pi).numpy(), pdot, atol=1e-12)
    np.testing.assert_allclose(
        run(lambda z, p: antipignistic_kl_loss(p, z), logits, pi).numpy(), kl(pdot, q), atol=1e-12
    )
    vbar = votes / votes.sum(1, keepdims=True)
    np.testing.assert_allclose(
        run(lambda z, v: vote_kl_loss(v, z), logits, votes).numpy(), kl(vbar, q), atol=1e-12
    )
    # The projection unrolls over K: an unknown class axis is a clear error.
    with pytest.raises(ValueError, match="class axis .* `logits` must have a static size"):
        run(lambda z, p: possibilistic_projection_loss(p, z), logits, pi)


BAD_LOGIT_ROWS = [
    [np.inf, 0.0, -1.0],  # +inf: q is undefined (softmax gives NaN)
    [-np.inf, -np.inf, -np.inf],  # every class masked
]


def test_invalid_logits_give_nan_loss_not_zero():
    # Issue 19: these rows gave loss 0.0 while the projection was NaN. Both bad rows in one
    # batch beside a good one. Eager here (the solver ops on a padded batch: their kernels are
    # shared with this file's other K = 3 tests); the same two rows under XLA, all four ops,
    # NaN rows and a finite good row: tests/contract/test_possibilistic_contract.py
    # (test_invalid_logit_rows_rejected_or_nan).
    z = np.array([*BAD_LOGIT_ROWS, [2.0, 0.0, -1.0]])
    pi = np.array([[1.0, 0.5, 0.2]] * 3)
    for op, padded in (
        (lambda z, p: possibilistic_projection_loss(p, z), lambda z, p: padded_loss(z, p)[0]),
        (lambda z, p: possibilistic_projection(z, p)[0], lambda z, p: project_logits(z, p)[0]),
        (lambda z, p: antipignistic_kl_loss(p, z), None),
        (lambda z, p: vote_kl_loss(p, z), None),
    ):
        with pytest.raises(ValueError, match="`logits` must not hold NaN or \\+inf"):
            op(z, pi)
        with losszoo.validation(False):
            out = (padded or op)(z, pi).numpy()
        assert np.isnan(out[:2]).all() and np.isfinite(out[2]).all()
    # A -inf logit alone masks its class: still a finite loss.
    loss, _ = padded_loss([[-np.inf, 0.0, -1.0]], [[1.0, 0.5, 0.2]])
    assert np.isfinite(loss.numpy()).all()


def test_restrict_mode_with_every_support_class_masked_is_nan():
    # The support's logits all -inf (the others finite): q is undefined on the support.
    # (Padded batches: the K = 3 kernels of this file's other tests.)
    z, pi = [[-np.inf, -np.inf, 1.0], [0.0, 1.0, 1.0]], [[1.0, 0.5, 0.0]] * 2
    loss, info = padded_loss(z, pi, support_mode="restrict")
    p, _ = project_logits(z, pi, support_mode="restrict")
    assert np.isnan(loss.numpy()[0]) and np.isnan(p.numpy()[0]).all()
    np.testing.assert_array_equal(info.valid.numpy(), [False, True])
    assert np.isfinite(loss.numpy()[1])


def test_antipignistic_invalid_rows_raise_or_nan():
    # Issue 19 (item 11): a NaN row came back as the uniform distribution.
    good = [1.0, 0.5, 0.2]
    xla_antipignistic = tf.function(antipignistic, jit_compile=True)  # one program, 4 inputs
    for bad in ([np.nan, 1.0, 0.5], [np.inf, 1.0, 0.5], [1.0, -0.5, 0.2], [0.0, 0.0, 0.0]):
        pi = np.array([bad, good])
        with pytest.raises(ValueError, match="`possibility` must hold finite, non-negative"):
            antipignistic(pi)
        with losszoo.validation(False):
            eager = antipignistic(pi).numpy()
        xla = xla_antipignistic(tf.constant(pi)).numpy()
        for out in (eager, xla):
            assert np.isnan(out[0]).all()
            np.testing.assert_allclose(out[1], ref_antipignistic(np.array(good)), atol=1e-7)
    # any positive scale stays valid (the op divides by the row maximum)
    np.testing.assert_allclose(
        antipignistic([[3.0, 1.5, 0.6]]).numpy()[0], ref_antipignistic(np.array(good)), atol=1e-7
    )


def test_possibility_constraints_rejects_bad_options():
    # Issue 19 (item 11): floor=-1 and tie_tol=2 were accepted.
    pi = [[1.0, 0.5, 0.2]]
    for kwargs, name in (
        ({"floor": -1.0}, "floor"),
        ({"floor": 1.0}, "floor"),
        ({"tie_tol": 2.0}, "tie_tol"),
        ({"tie_tol": -0.1}, "tie_tol"),
        ({"eps_cap": 0.5}, "eps_cap"),
        ({"eps_cap": float("nan")}, "eps_cap"),
    ):
        with pytest.raises(ValueError, match=f"`{name}`"):
            possibility_constraints(pi, **kwargs)
    # the boundary values that are allowed still work
    c = possibility_constraints(pi, tie_tol=0.0, eps_cap=0.0, floor=0.5)
    np.testing.assert_allclose(c.sorted_possibility.numpy(), [[1.0, 0.5, 0.5]])


def test_projection_config_is_checked_once_and_frozen():
    """Issue 20 item 2: the options are validated where ``ProjectionConfig`` is built (the
    error names the option), numbers are stored as Python int / float, ``solver`` resolves
    ``method=None`` by the stopping rule, and the object cannot change after the check."""
    import dataclasses

    from losszoo.ops.possibilistic import ProjectionConfig

    cfg = ProjectionConfig(tol=np.float32(1e-6), max_cycles=np.int64(50), method="dykstra")
    assert type(cfg.max_cycles) is int and cfg.max_cycles == 50
    assert type(cfg.tol) is float and cfg.tol == float(np.float32(1e-6))
    assert cfg.solver == "dykstra"
    assert ProjectionConfig().solver == "interior_point"
    assert ProjectionConfig(stopping="paper").solver == "dykstra"
    for bad, name in [
        (dict(tol=0.0), "tol"),
        (dict(max_cycles=2.5), "max_cycles"),
        (dict(eps_cap=0.5), "eps_cap"),
        (dict(support_mode="all"), "support_mode"),
        (dict(method="interior_point", stopping="paper"), "method"),
    ]:
        with pytest.raises(ValueError, match=f"`{name}`"):
            ProjectionConfig(**bad)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.tol = 1e-3
