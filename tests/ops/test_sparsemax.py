"""Sparsemax and the sparsemax loss on the running backend, against the spec's numpy
reference, scipy's QP solver and finite differences, in every mode of the harness (eager;
TensorFlow graph and XLA; ``jax.jit``). TensorFlow-only checks (``None``-batch signatures,
persistent tapes, sparse / ragged labels) are in ``test_sparsemax_tensorflow.py``."""

import keras
import numpy as np
import pytest
from keras import ops as kops
from scipy.optimize import minimize

import losszoo
from losszoo import ops
from tests.harness import (
    BACKEND,
    MODES,
    TRACED_MODES,
    compiled,
    errors,
    finite_difference,
    float64,
    jacobian,
    numpy,
    upstream,
    value_and_grad,
)
from tests.references import load_reference

ref = load_reference("rankmax_sparsemax")


def ref_sparsemax(z):
    return np.stack([ref.sparsemax(row)[0] for row in np.asarray(z, np.float64)])


def ref_losses(z, q):
    return np.array([ref.sparsemax_loss(a, b) for a, b in zip(np.float64(z), np.float64(q))])


def sparsemax_vjp(p, u):
    """The closed-form VJP of sparsemax: ``s * (u - mean over the support of u)``."""
    s = (np.asarray(p) > 0).astype(np.float64)
    return s * (u - (s * u).sum(-1, keepdims=True) / s.sum(-1, keepdims=True))


def away_from_kinks(z, gap=1e-3):
    """True when no score sits within `gap` of the threshold or of another score."""
    _, tau = ref.sparsemax(z)
    s = np.sort(z)
    return np.min(np.abs(z - tau)) > gap and np.min(np.diff(s)) > gap


def test_known_values_with_several_nonzeros():
    # keras.ops.sparsemax (Keras 3.15) returns [0, 0, 0.25] here; the right answer:
    np.testing.assert_allclose(numpy(ops.sparsemax([0.0, 0.5, 1.0])), [0, 0.25, 0.75], atol=1e-7)
    np.testing.assert_allclose(
        numpy(ops.sparsemax([[1.0, 1.2, 0.9, -3.0]])), [[0.3, 0.5, 0.2, 0.0]], atol=1e-6
    )


def test_two_classes_is_hard_sigmoid():
    t = np.array([-3.0, -1.0, -0.4, 0.0, 0.3, 0.99, 1.0, 5.0])
    with float64():
        p = numpy(ops.sparsemax(np.stack([t, np.zeros_like(t)], -1)))
    np.testing.assert_allclose(p[:, 0], np.clip((t + 1) / 2, 0, 1), atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_reference_on_random_rows(dtype):
    rng = np.random.default_rng(1)
    with float64():
        for n, scale in [(1, 1.0), (2, 1.0), (7, 0.3), (30, 1.0), (300, 3.0), (5000, 0.1)]:
            z = (scale * rng.normal(size=(16, n))).astype(dtype)
            got = numpy(ops.sparsemax(z))
            assert got.dtype == dtype
            np.testing.assert_allclose(
                got, ref_sparsemax(z), atol=1e-6 if dtype == np.float32 else 1e-12
            )


def test_matches_generic_qp_solver():
    rng = np.random.default_rng(2)
    for _ in range(20):
        z = rng.normal(size=int(rng.integers(2, 12)))
        qp = minimize(
            lambda p: 0.5 * np.sum((p - z) ** 2),
            np.full(z.size, 1 / z.size),
            jac=lambda p: p - z,
            method="SLSQP",
            bounds=[(0, None)] * z.size,
            constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1}],
            options={"ftol": 1e-14, "maxiter": 500},
        )
        np.testing.assert_allclose(numpy(ops.sparsemax(z.astype(np.float32))), qp.x, atol=1e-6)


def test_edge_inputs():
    inf = np.inf

    def p(z):
        return numpy(ops.sparsemax(np.array(z, np.float32)))

    # ties, constant rows, K = 1, -inf masks, huge logits
    np.testing.assert_allclose(p([2.0, 2.0, 2.0, 2.0]), [0.25] * 4)
    np.testing.assert_allclose(p([[1.0, 1.0, -5.0]]), [[0.5, 0.5, 0.0]])
    np.testing.assert_allclose(p([[-7.0]]), [[1.0]])
    np.testing.assert_allclose(p([0.0, -inf, 0.5, -inf]), [0.25, 0, 0.75, 0])
    np.testing.assert_allclose(p([1e30, -1e30, 1e30]), [0.5, 0, 0.5])
    np.testing.assert_allclose(p([3e38, 0.0]), [1.0, 0.0])
    # margin >= 1 gives a one-hot output
    np.testing.assert_allclose(p([5.0, 4.0, 1.0]), [1.0, 0.0, 0.0])
    # a row that is all -inf has no distribution: NaN, as softmax gives
    assert np.all(np.isnan(p([-inf, -inf])))


def test_shift_invariance_and_axis():
    rng = np.random.default_rng(3)
    z = rng.normal(size=(4, 9)).astype(np.float32)
    base = numpy(ops.sparsemax(z))
    for c in (-100.0, -3.5, 42.0, 100.0):
        np.testing.assert_allclose(numpy(ops.sparsemax(z + np.float32(c))), base, atol=1e-5)
    z3 = rng.normal(size=(3, 5, 4))
    with float64():
        got = numpy(ops.sparsemax(z3, axis=1))
    want = np.moveaxis(ref_sparsemax(np.moveaxis(z3, 1, -1).reshape(-1, 5)).reshape(3, 4, 5), -1, 1)
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_large_k_when_support_entries_share_chunks():
    # uniform scores: the support (~sqrt(2K) entries) fills many of the 1250 chunks of 32
    # twice, so the chunk maxima's threshold is a strict lower bound and Newton has work left
    z = np.random.default_rng(11).uniform(size=(3, 40_000))
    with float64():
        p = numpy(ops.sparsemax(z))
    assert np.sum(p[0] > 0) > 128
    np.testing.assert_allclose(p, ref_sparsemax(z), atol=1e-12)


def _chunk_data(shape):
    rng = np.random.default_rng(5)
    z = rng.normal(size=shape).astype(np.float32)
    flat = z.reshape(-1, shape[-1])
    flat[:, 32:64] = -np.inf  # a masked chunk
    flat[:, 3] = flat[:, 7] = flat.max(-1) + 0.25  # tied maxima in one chunk
    flat[:, 80] = flat[:, 3] - 0.5  # a third support entry in another chunk
    return z, ref_sparsemax(flat).reshape(shape)


# TensorFlow's graph mode of the two tests below runs in test_sparsemax_tensorflow.py, traced
# with a None batch (which also covers the known-shape graph): one graph trace less per case.
UNSHAPED_MODES = tuple(m for m in MODES if m != "graph")
CHUNK_SHAPES = [(1024,), (3, 1024), (2, 3, 512), (5, 96), (4, 1000)]


@pytest.mark.parametrize("shape", CHUNK_SHAPES)
def test_chunked_start_with_ties_and_masked_chunks(shape):
    """The chunk-maxima start (K divisible by 2, >= 16 chunks) on ranks 1-3, with tied top
    scores, whole chunks of -inf and a tie inside the support, in every mode: the same as the
    sort-based reference."""
    z, want = _chunk_data(shape)
    for mode in UNSHAPED_MODES:
        got = numpy(compiled(ops.sparsemax, mode)(z))
        np.testing.assert_allclose(got, want, atol=1e-6, err_msg=mode)


def test_large_k_float32_regression():
    # spec oracle 6: without the max shift float32 loses the support entirely here
    rng = np.random.default_rng(4)
    z = 100 + 0.01 * rng.normal(size=(2, 200_000))
    p = numpy(ops.sparsemax(z.astype(np.float32)))
    p64 = ref_sparsemax(z)
    assert np.array_equal(p > 0, p64 > 0)
    assert np.max(np.abs(p - p64)) <= 1e-4
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_computed_in_float32(dtype):
    z = np.array([[0.0, 0.5, 1.0, 0.9]])
    p = ops.sparsemax(kops.cast(z, dtype))
    assert keras.backend.standardize_dtype(p.dtype) == dtype
    np.testing.assert_allclose(numpy(kops.cast(p, "float32")), ref_sparsemax(z), atol=1e-2)
    wide = (np.random.default_rng(0).normal(size=(5, 9)) * 2).astype(np.float32)
    p = numpy(kops.cast(ops.sparsemax(kops.cast(wide, dtype)), "float32"))
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=2e-3 if dtype == "float16" else 1e-2)


def test_gradient_matches_finite_differences_and_jacobian_properties():
    rng = np.random.default_rng(5)
    tested = 0
    with float64():
        while tested < 6:
            z = rng.normal(size=(1, int(rng.integers(2, 12))))
            if not away_from_kinks(z[0]):
                continue
            tested += 1
            _, (g,) = value_and_grad(ops.sparsemax, z)
            np.testing.assert_allclose(g, finite_difference(ops.sparsemax, z), atol=1e-6)
            J = jacobian(ops.sparsemax, z[0])
            np.testing.assert_allclose(J, J.T, atol=1e-12)
            np.testing.assert_allclose(J.sum(1), 0, atol=1e-12)


def plain_sparsemax(z):
    """Spec A1 in differentiable keras.ops (sort, cumsum, gather): the autodiff reference."""
    z = kops.convert_to_tensor(z)
    z = z - kops.max(z, -1, keepdims=True)
    zs = -kops.sort(-z, axis=-1)
    cs = kops.cumsum(zs, axis=-1)
    r = kops.arange(1, z.shape[-1] + 1, dtype=keras.backend.standardize_dtype(z.dtype))
    k = kops.sum(kops.cast(1 + r * zs > cs, "int32"), -1, keepdims=True)
    tau = (kops.take_along_axis(cs, k - 1, axis=-1) - 1) / kops.cast(k, z.dtype)
    return kops.relu(z - tau)


def test_gradient_matches_autodiff_of_sort_based_reference():
    z = np.random.default_rng(6).normal(size=(8, 20))
    with float64():
        p, (g,) = value_and_grad(ops.sparsemax, z)
        want_p, (want_g,) = value_and_grad(plain_sparsemax, z)
    # PyTorch: keras.ops demotes float64 in the reference (cumsum), not in losszoo's kernel
    atol = 1e-6 if BACKEND == "torch" else 1e-10
    np.testing.assert_allclose(p, want_p, atol=atol)
    np.testing.assert_allclose(g, want_g, atol=atol)


@pytest.mark.parametrize("mode", MODES)
def test_values_and_gradients_in_every_mode(mode):
    """Sparsemax (a masked entry included) and the loss of the same logits in one program:
    values against the oracle, the gradient against ``J^T u1 + u2 (p - q)``."""
    rng = np.random.default_rng(7)
    z = rng.normal(size=(8, 100)).astype(np.float32)
    z[0, 3] = -np.inf
    q = np.zeros((8, 100), np.float32)
    q[np.arange(8), rng.integers(4, 100, 8)] = 1.0

    def both(z):
        return kops.concatenate([ops.sparsemax(z), ops.sparsemax_loss(q, z)[:, None]], -1)

    out, (g,) = value_and_grad(both, z, mode=mode)
    p = ref_sparsemax(z)
    np.testing.assert_allclose(out[:, :-1], p, atol=1e-6)
    finite = np.where(np.isinf(z), -1e30, z)  # the numpy loss reads 0 * -inf as NaN
    np.testing.assert_allclose(out[:, -1], ref_losses(finite, q), atol=1e-5)
    u = upstream(out.shape)
    np.testing.assert_allclose(g, sparsemax_vjp(p, u[:, :-1]) + u[:, -1:] * (p - q), atol=1e-5)


# ------------------------------------------------------------------------ sparsemax loss
def test_loss_three_forms_agree():
    rng = np.random.default_rng(8)
    with float64():
        for _ in range(50):
            n = int(rng.integers(1, 15))
            z = rng.normal(size=n) * rng.uniform(0.1, 3)
            q = rng.dirichlet(np.ones(n)) if rng.uniform() < 0.5 else np.eye(n)[rng.integers(n)]
            p, tau = ref.sparsemax(z)
            fenchel_young = 0.5 * np.sum((z - q) ** 2) - 0.5 * np.sum((z - p) ** 2)
            support = p > 0
            martins = -q @ z + 0.5 * np.sum(z[support] ** 2 - tau**2) + 0.5 * q @ q
            got = numpy(ops.sparsemax_loss(q[None], z[None]))[0]
            np.testing.assert_allclose(got, ref.sparsemax_loss(z, q), atol=1e-10)
            np.testing.assert_allclose(got, fenchel_young, atol=1e-10)
            np.testing.assert_allclose(got, martins, atol=1e-10)


def test_loss_exact_values():
    with float64():
        for n in (1, 2, 5, 100):
            q = np.eye(n)[:1]
            got = numpy(ops.sparsemax_loss(q, np.zeros((1, n))))
            np.testing.assert_allclose(got, [0.5 - 0.5 / n], atol=1e-12)
        # margin of 1 -> zero loss; -inf logits on classes without target mass are fine
        got = numpy(ops.sparsemax_loss(np.array([[0, 1.0, 0]]), np.array([[0.0, 1.0, -np.inf]])))
        np.testing.assert_allclose(got, [0.0])
        # p == q -> zero loss
        z = np.array([[0.1, 0.6, -2.0]])
        np.testing.assert_allclose(
            numpy(ops.sparsemax_loss(ref_sparsemax(z), z)), [0.0], atol=1e-12
        )


def test_loss_gradient_is_p_minus_q_and_matches_fd():
    rng = np.random.default_rng(9)
    z = rng.normal(size=(3, 6))
    q = rng.dirichlet(np.ones(6), size=3)
    with float64():
        loss, (g,) = value_and_grad(lambda x: ops.sparsemax_loss(q, x), z)
        fd = finite_difference(lambda x: ops.sparsemax_loss(q, x), z)
    np.testing.assert_allclose(g, fd, atol=1e-6)
    np.testing.assert_allclose(
        g, upstream(loss.shape)[:, None] * (ref_sparsemax(z) - q), atol=1e-12
    )


def test_loss_is_nonnegative_and_convex_on_chords():
    rng = np.random.default_rng(10)
    a, b = rng.normal(size=(2, 200, 8)) * 2
    q = rng.dirichlet(np.ones(8), size=200)
    with float64():
        la, lb = numpy(ops.sparsemax_loss(q, a)), numpy(ops.sparsemax_loss(q, b))
        assert la.min() >= 0 and lb.min() >= 0
        for t in (0.25, 0.5, 0.75):
            mid = numpy(ops.sparsemax_loss(q, t * a + (1 - t) * b))
            assert np.all(mid <= t * la + (1 - t) * lb + 1e-10)


def test_shape_rank_and_axis_errors_name_the_argument():
    with pytest.raises(ValueError, match="labels"):
        ops.sparsemax_loss(np.ones((2, 3), np.float32), np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match="logits.*rank"):
        ops.sparsemax(np.float32(1.0))
    z = np.zeros((2, 3), np.float32)
    for bad_axis in (1.5, "1", None):
        kind = ValueError if isinstance(bad_axis, float) else TypeError
        with pytest.raises(kind, match="`axis`"):
            ops.sparsemax(z, axis=bad_axis)


# ----------------------------------------------------------------- issue 9 regressions


@pytest.mark.parametrize("num_classes", [6, 32768])
def test_bad_rows_are_entirely_nan_in_every_mode(num_classes):
    """All -inf, NaN or +inf rows: that row NaN, the others right (also at 32768 classes,
    where the search starts from the chunk maxima's threshold)."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(4, num_classes)).astype(np.float32)
    z[0] = -np.inf
    z[1, 2] = np.nan
    z[2, 1] = np.inf
    want = ref_sparsemax(z[3:])
    for mode in MODES:
        p = numpy(compiled(ops.sparsemax, mode)(z))
        assert np.all(np.isnan(p[:3])), mode
        np.testing.assert_allclose(p[3:], want, atol=1e-6, err_msg=mode)


def candidate_chunk_data(num_classes):
    """4 rows: the candidate search, the full search, 100 maxima tied across the 64th place,
    a NaN row; one-hot targets."""
    rng = np.random.default_rng(3)
    z = rng.normal(size=(4, num_classes)).astype(np.float32)
    z[1] *= 0.01  # support across hundreds of chunks: the full search
    z[2] *= 0.1
    z[2, :3] = [5.0, 4.6, 4.3]  # in the first chunk
    z[2, 64 * np.arange(1, 101)] = 1.0  # 100 tied chunk maxima below the threshold
    z[3, 7] = np.nan
    q = np.zeros_like(z)
    q[np.arange(4), [2, 5, 64, 0]] = 1.0
    want = [ref.sparsemax(row) for row in z[:3].astype(np.float64)]
    p_want = np.stack([p for p, _ in want])
    loss_want = [
        0.5 * p @ p + 0.5 - (row[i] - tau)
        for (p, tau), row, i in zip(want, z.astype(np.float64), [2, 5, 64])
    ]
    chunks_in_support = np.sum(p_want.reshape(3, -1, 32).max(-1) > 0, -1)
    assert chunks_in_support[1] > 64 and max(chunks_in_support[[0, 2]]) <= 64
    return z, q, p_want, np.array(loss_want)


@pytest.mark.parametrize("num_classes", [32768, 1_000_000])
def test_candidate_chunks_and_full_search_fallback(num_classes):
    """From 256 chunks on, the threshold is searched on the 64 chunks with the largest maxima,
    and on the whole row where the support spans more of them. One batch holds both kinds,
    maxima tied across the 64th place, and a NaN row; at 10^6 classes the chunk maxima are
    searched the same way. Every mode against the sort-based reference, in one program:
    values, the loss and the gradient ``J^T u1 + u2 (p - q)``."""
    z, q, p_want, loss_want = candidate_chunk_data(num_classes)

    def both(z, q):
        return kops.concatenate([ops.sparsemax(z), ops.sparsemax_loss(q, z)[:, None]], -1)

    u = upstream((4, num_classes + 1))
    want_g = sparsemax_vjp(p_want, u[:3, :-1]) + u[:3, -1:] * (p_want - q[:3])
    for mode in UNSHAPED_MODES:
        out, (g,) = value_and_grad(both, z, q, mode=mode)
        np.testing.assert_allclose(out[:3, :-1], p_want, atol=1e-6, err_msg=mode)
        np.testing.assert_allclose(out[:3, -1], loss_want, rtol=1e-5, atol=1e-6, err_msg=mode)
        np.testing.assert_allclose(g[:3], want_g, atol=1e-5, err_msg=mode)
        assert np.all(np.isnan(out[3])) and np.all(np.isnan(g[3])), mode


@pytest.mark.parametrize("mode", MODES)
def test_nan_row_gradient_is_nan_and_others_match(mode):
    z = np.array([[0.1, np.nan, 0.3], [1.0, 0.5, -2.0]], np.float32)
    weights = np.array([[1.0, 2.0, 3.0]], np.float32)
    _, (g,) = value_and_grad(
        lambda x: ops.sparsemax(x) * kops.convert_to_tensor(weights), z, mode=mode
    )
    assert np.all(np.isnan(g[0])), mode
    # support {0, 1}: the gradient is v - mean_S(v) on the support
    v = upstream((2, 3))[1] * weights[0]
    np.testing.assert_allclose(g[1], [(v[0] - v[1]) / 2, (v[1] - v[0]) / 2, 0.0], atol=1e-6)


def test_offsets_of_1e8_match_unshifted():
    rng = np.random.default_rng(1)
    z = (rng.normal(size=(8, 50)) * 4).astype(np.float64)
    q = np.eye(50)[rng.integers(0, 50, 8)]
    with float64():
        np.testing.assert_allclose(numpy(ops.sparsemax(z + 1e8)), ref_sparsemax(z), atol=1e-7)
        np.testing.assert_allclose(
            numpy(ops.sparsemax_loss(q, z + 1e8)), numpy(ops.sparsemax_loss(q, z)), atol=1e-7
        )
    np.testing.assert_allclose(
        numpy(ops.sparsemax((z * 1e8).astype(np.float32))), ref_sparsemax(z * 1e8), atol=1e-6
    )


_UNNORMALISED = np.array([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.4, 0.4, 0.4]], np.float32)


def test_label_rows_must_sum_to_one():
    # Issue 19 item 6: such rows gave a plausible 0.5. The checked modes (eager, TensorFlow
    # graphs) name `labels`; XLA / jax.jit make those rows' loss and gradient NaN and leave the
    # other row alone. (Errors and NaN rows of random batches: tests/contract.)
    z = np.array([[1.0, 0.0, -1.0]] * 3 + [[0.5, 0.2, 0.1]], np.float32)
    q = np.concatenate([_UNNORMALISED, [[0.0, 1.0, 0.0]]]).astype(np.float32)
    for mode in MODES:
        if mode in TRACED_MODES:
            continue
        with pytest.raises(errors(), match="`labels` rows must sum to 1"):
            compiled(lambda q, z: ops.sparsemax_loss(q, z), mode)(q, z)
    for mode in TRACED_MODES:
        with losszoo.validation(False):  # the harness' probe runs eagerly
            loss, (grad,) = value_and_grad(lambda z, q: ops.sparsemax_loss(q, z), z, q, mode=mode)
        assert np.isnan(loss[:3]).all() and np.isnan(grad[:3]).all(), mode
        np.testing.assert_allclose(loss[3], ref_losses(z[3:], q[3:])[0], atol=1e-6)
        want_g = upstream(4)[3] * (ref_sparsemax(z[3:])[0] - q[3])
        np.testing.assert_allclose(grad[3], want_g, atol=1e-6)


def test_label_sums_within_float_tolerance_are_accepted():
    z = np.array([[1.0, 0.3, -1.0, 0.2]], np.float32)
    q = np.array([[0.25, 0.25, 0.25, 0.25 + 1e-4]], np.float32)  # off by 1e-4 < 3.5e-4
    np.testing.assert_allclose(numpy(ops.sparsemax_loss(q, z)), ref_losses(z, q), atol=1e-6)
    with pytest.raises(ValueError, match="`labels` rows must sum to 1"):
        ops.sparsemax_loss(q + np.float32(1e-3), z)
