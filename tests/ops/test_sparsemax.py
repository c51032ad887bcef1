"""Sparsemax and the sparsemax loss against the spec's numpy reference, scipy and FD."""

import numpy as np
import pytest
import tensorflow as tf
from scipy.optimize import minimize

from losszoo import ops
from tests.helpers import (
    assert_grad_matches_fd,
    assert_grad_matches_reference,
    assert_xla_matches_eager,
    load_reference,
)

pytestmark = pytest.mark.tensorflow_only(
    reason="tf.GradientTape / tf.function / XLA checks (tests/helpers.py)"
)

ref = load_reference("rankmax_sparsemax")


def ref_sparsemax(z):
    return np.stack([ref.sparsemax(row)[0] for row in np.asarray(z, np.float64)])


def away_from_kinks(z, gap=1e-3):
    """True when no score sits within `gap` of the threshold or of another score."""
    _, tau = ref.sparsemax(z)
    s = np.sort(z)
    return np.min(np.abs(z - tau)) > gap and np.min(np.diff(s)) > gap


def test_known_values_with_several_nonzeros():
    # keras.ops.sparsemax (Keras 3.15) returns [0, 0, 0.25] here; the right answer:
    np.testing.assert_allclose(ops.sparsemax([0.0, 0.5, 1.0]).numpy(), [0, 0.25, 0.75], atol=1e-7)
    np.testing.assert_allclose(
        ops.sparsemax([[1.0, 1.2, 0.9, -3.0]]).numpy(), [[0.3, 0.5, 0.2, 0.0]], atol=1e-6
    )


@pytest.mark.parametrize("t", [-3.0, -1.0, -0.4, 0.0, 0.3, 0.99, 1.0, 5.0])
def test_two_classes_is_hard_sigmoid(t):
    p = ops.sparsemax(tf.constant([t, 0.0], tf.float64)).numpy()
    np.testing.assert_allclose(p[0], np.clip((t + 1) / 2, 0, 1), atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_reference_on_random_rows(dtype):
    rng = np.random.default_rng(1)
    for n, scale in [(1, 1.0), (2, 1.0), (7, 0.3), (30, 1.0), (300, 3.0), (5000, 0.1)]:
        z = (scale * rng.normal(size=(16, n))).astype(dtype)
        got = ops.sparsemax(z).numpy()
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
        np.testing.assert_allclose(ops.sparsemax(z).numpy(), qp.x, atol=1e-6)


def test_edge_inputs():
    inf = np.inf
    # ties, constant rows, K = 1, -inf masks, huge logits
    np.testing.assert_allclose(ops.sparsemax([2.0, 2.0, 2.0, 2.0]).numpy(), [0.25] * 4)
    np.testing.assert_allclose(ops.sparsemax([[1.0, 1.0, -5.0]]).numpy(), [[0.5, 0.5, 0.0]])
    np.testing.assert_allclose(ops.sparsemax([[-7.0]]).numpy(), [[1.0]])
    np.testing.assert_allclose(ops.sparsemax([0.0, -inf, 0.5, -inf]).numpy(), [0.25, 0, 0.75, 0])
    np.testing.assert_allclose(ops.sparsemax([1e30, -1e30, 1e30]).numpy(), [0.5, 0, 0.5])
    np.testing.assert_allclose(ops.sparsemax([3e38, 0.0]).numpy(), [1.0, 0.0])
    # margin >= 1 gives a one-hot output
    np.testing.assert_allclose(ops.sparsemax([5.0, 4.0, 1.0]).numpy(), [1.0, 0.0, 0.0])
    # a row that is all -inf has no distribution: NaN, as softmax gives
    assert np.all(np.isnan(ops.sparsemax([-inf, -inf]).numpy()))


def test_shift_invariance_and_axis():
    rng = np.random.default_rng(3)
    z = rng.normal(size=(4, 9)).astype(np.float32)
    base = ops.sparsemax(z).numpy()
    for c in (-100.0, -3.5, 42.0, 100.0):
        np.testing.assert_allclose(ops.sparsemax(z + c).numpy(), base, atol=1e-5)
    z3 = rng.normal(size=(3, 5, 4))
    np.testing.assert_allclose(
        ops.sparsemax(z3, axis=1).numpy(),
        np.moveaxis(ref_sparsemax(np.moveaxis(z3, 1, -1).reshape(-1, 5)).reshape(3, 4, 5), -1, 1),
        atol=1e-12,
    )


def test_large_k_when_support_entries_share_chunks():
    # uniform scores: the support (~sqrt(2K) entries) fills many of the 1250 chunks of 32
    # twice, so the chunk maxima's threshold is a strict lower bound and Newton has work left
    z = np.random.default_rng(11).uniform(size=(3, 40_000))
    p = ops.sparsemax(z).numpy()
    assert np.sum(p[0] > 0) > 128
    np.testing.assert_allclose(p, ref_sparsemax(z), atol=1e-12)


@pytest.mark.parametrize("shape", [(1024,), (3, 1024), (2, 3, 512), (5, 96), (4, 1000)])
def test_chunked_start_with_ties_and_masked_chunks(shape):
    """The chunk-maxima start (K divisible by 2, >= 16 chunks) on ranks 1-3, with tied top
    scores, whole chunks of -inf and a tie inside the support, in eager, graph (unknown
    batch) and XLA: the same as the sort-based reference."""
    rng = np.random.default_rng(5)
    z = rng.normal(size=shape).astype(np.float32)
    flat = z.reshape(-1, shape[-1])
    flat[:, 32:64] = -np.inf  # a masked chunk
    flat[:, 3] = flat[:, 7] = flat.max(-1) + 0.25  # tied maxima in one chunk
    flat[:, 80] = flat[:, 3] - 0.5  # a third support entry in another chunk
    want = ref_sparsemax(flat).reshape(shape)
    graph = tf.function(ops.sparsemax, input_signature=[tf.TensorSpec([None, *shape[1:]])])
    for mode, fn in {**_MODES, "graph (None batch)": graph}.items():
        np.testing.assert_allclose(fn(tf.constant(z)).numpy(), want, atol=1e-6, err_msg=mode)


def test_large_k_float32_regression():
    # spec oracle 6: without the max shift float32 loses the support entirely here
    rng = np.random.default_rng(4)
    z = 100 + 0.01 * rng.normal(size=(2, 200_000))
    p = ops.sparsemax(z.astype(np.float32)).numpy()
    p64 = ref_sparsemax(z)
    assert np.array_equal(p > 0, p64 > 0)
    assert np.max(np.abs(p - p64)) <= 1e-4
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_computed_in_float32(dtype):
    z = np.array([[0.0, 0.5, 1.0, 0.9]])
    p = ops.sparsemax(tf.constant(z, dtype))
    assert p.dtype.name == dtype
    np.testing.assert_allclose(p.numpy().astype(np.float64), ref_sparsemax(z), atol=1e-2)


def test_gradient_matches_finite_differences_and_jacobian_properties():
    rng = np.random.default_rng(5)
    tested = 0
    while tested < 6:
        z = rng.normal(size=(1, int(rng.integers(2, 12))))
        if not away_from_kinks(z[0]):
            continue
        tested += 1
        assert_grad_matches_fd(ops.sparsemax, [z], atol=1e-6)
        with tf.GradientTape() as tape:
            x = tf.constant(z)
            tape.watch(x)
            p = ops.sparsemax(x)
        J = tape.jacobian(p, x).numpy()[0, :, 0, :]
        np.testing.assert_allclose(J, J.T, atol=1e-12)
        np.testing.assert_allclose(J.sum(1), 0, atol=1e-12)


def plain_tf_sparsemax(z):
    """Spec A1 in differentiable plain TF (sort, cumsum, gather): the autodiff reference."""
    z = z - tf.reduce_max(z, -1, keepdims=True)
    zs = tf.sort(z, direction="DESCENDING")
    cs = tf.cumsum(zs, axis=-1)
    r = tf.range(1, z.shape[-1] + 1, dtype=z.dtype)
    k = tf.reduce_sum(tf.cast(1 + r * zs > cs, tf.int32), -1, keepdims=True)
    tau = (tf.gather(cs, k - 1, batch_dims=1) - 1) / tf.cast(k, z.dtype)
    return tf.nn.relu(z - tau)


def test_gradient_matches_autodiff_of_sort_based_reference():
    z = np.random.default_rng(6).normal(size=(8, 20))
    assert_grad_matches_reference(ops.sparsemax, plain_tf_sparsemax, [z], atol=1e-10)


def test_xla_matches_eager():
    rng = np.random.default_rng(7)
    z = rng.normal(size=(32, 100)).astype(np.float32)
    z[0, 3] = -np.inf
    assert_xla_matches_eager(ops.sparsemax, tf.constant(z), atol=1e-6)
    q = tf.one_hot(rng.integers(0, 100, 32), 100)
    assert_xla_matches_eager(
        lambda z: ops.sparsemax_loss(q, z), tf.constant(rng.normal(size=(32, 100)), tf.float32)
    )


# ------------------------------------------------------------------------ sparsemax loss
def test_loss_three_forms_agree():
    rng = np.random.default_rng(8)
    for _ in range(50):
        n = int(rng.integers(1, 15))
        z = rng.normal(size=n) * rng.uniform(0.1, 3)
        q = rng.dirichlet(np.ones(n)) if rng.uniform() < 0.5 else np.eye(n)[rng.integers(n)]
        p, tau = ref.sparsemax(z)
        fenchel_young = 0.5 * np.sum((z - q) ** 2) - 0.5 * np.sum((z - p) ** 2)
        support = p > 0
        martins = -q @ z + 0.5 * np.sum(z[support] ** 2 - tau**2) + 0.5 * q @ q
        got = ops.sparsemax_loss(q[None], z[None]).numpy()[0]
        np.testing.assert_allclose(got, ref.sparsemax_loss(z, q), atol=1e-10)
        np.testing.assert_allclose(got, fenchel_young, atol=1e-10)
        np.testing.assert_allclose(got, martins, atol=1e-10)


def test_loss_exact_values():
    for n in (1, 2, 5, 100):
        q = np.eye(n)[:1]
        np.testing.assert_allclose(
            ops.sparsemax_loss(q, np.zeros((1, n))).numpy(), [0.5 - 0.5 / n], atol=1e-12
        )
    # margin of 1 -> zero loss; -inf logits on classes without target mass are fine
    np.testing.assert_allclose(
        ops.sparsemax_loss([[0, 1.0, 0]], [[0.0, 1.0, -np.inf]]).numpy(), [0.0]
    )
    # p == q -> zero loss
    z = np.array([[0.1, 0.6, -2.0]])
    np.testing.assert_allclose(ops.sparsemax_loss(ref_sparsemax(z), z).numpy(), [0.0], atol=1e-12)


def test_loss_gradient_is_p_minus_q_and_matches_fd():
    rng = np.random.default_rng(9)
    z = rng.normal(size=(3, 6))
    q = rng.dirichlet(np.ones(6), size=3)
    assert_grad_matches_fd(lambda x: ops.sparsemax_loss(q, x), [z], atol=1e-6)
    x = tf.constant(z)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(ops.sparsemax_loss(q, x))
    np.testing.assert_allclose(tape.gradient(loss, x).numpy(), ref_sparsemax(z) - q, atol=1e-12)


def test_loss_is_nonnegative_and_convex_on_chords():
    rng = np.random.default_rng(10)
    a, b = rng.normal(size=(2, 200, 8)) * 2
    q = rng.dirichlet(np.ones(8), size=200)
    la, lb = ops.sparsemax_loss(q, a).numpy(), ops.sparsemax_loss(q, b).numpy()
    assert la.min() >= 0 and lb.min() >= 0
    for t in (0.25, 0.5, 0.75):
        mid = ops.sparsemax_loss(q, t * a + (1 - t) * b).numpy()
        assert np.all(mid <= t * la + (1 - t) * lb + 1e-10)


def test_loss_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="labels"):
        ops.sparsemax_loss(tf.ones((2, 3)), tf.ones((2, 4)))


def test_rank_zero_logits_rejected():
    with pytest.raises(ValueError, match="logits.*rank"):
        ops.sparsemax(tf.constant(1.0))


# ----------------------------------------------------------------- issue 9 regressions

_MODES = {
    "eager": ops.sparsemax,
    "graph": tf.function(ops.sparsemax, autograph=False),
    "xla": tf.function(ops.sparsemax, jit_compile=True, autograph=False),
}


@pytest.mark.parametrize("num_classes", [6, 32768])
def test_bad_rows_are_entirely_nan_in_every_mode(num_classes):
    """All -inf, NaN or +inf rows: that row NaN, the others right (also at 32768 classes,
    where the search starts from the chunk maxima's threshold)."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(4, num_classes)).astype(np.float32)
    z[0] = -np.inf
    z[1, 2] = np.nan
    z[2, 1] = np.inf
    want = ref_sparsemax(z[3:].astype(np.float64))
    for mode, fn in _MODES.items():
        p = fn(tf.constant(z)).numpy()
        assert np.all(np.isnan(p[:3])), mode
        np.testing.assert_allclose(p[3:], want, atol=1e-6, err_msg=mode)


@pytest.mark.parametrize("num_classes", [32768, 1_000_000])
def test_candidate_chunks_and_full_search_fallback(num_classes):
    """From 256 chunks on, the threshold is searched on the 64 chunks with the largest maxima,
    and on the whole row where the support spans more of them. One batch holds both kinds,
    maxima tied across the 64th place, and a NaN row; at 10^6 classes the chunk maxima are
    searched the same way. Eager, graph (unknown batch) and XLA against the sort-based
    reference: values, the loss and its gradient ``p - q``."""
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

    def both(z, q):
        with tf.GradientTape() as tape:
            tape.watch(z)
            loss = ops.sparsemax_loss(q, z)
        return ops.sparsemax(z), loss, tape.gradient(loss, z)

    spec = [tf.TensorSpec([None, num_classes])] * 2
    modes = {
        "eager": both,
        "graph": tf.function(both, input_signature=spec),
        "xla": tf.function(both, jit_compile=True),
    }
    for mode, fn in modes.items():
        p, loss, grad = (t.numpy() for t in fn(tf.constant(z), tf.constant(q)))
        np.testing.assert_allclose(p[:3], p_want, atol=1e-6, err_msg=mode)
        np.testing.assert_allclose(loss[:3], loss_want, rtol=1e-5, atol=1e-6, err_msg=mode)
        np.testing.assert_allclose(grad[:3], p_want - q[:3], atol=1e-6, err_msg=mode)
        assert np.all(np.isnan(p[3])) and np.isnan(loss[3]) and np.all(np.isnan(grad[3])), mode


def test_nan_row_gradient_is_nan_and_others_match():
    z = np.array([[0.1, np.nan, 0.3], [1.0, 0.5, -2.0]], np.float32)
    for mode in ("eager", "xla"):
        x = tf.constant(z)

        def run(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                total = tf.reduce_sum(ops.sparsemax(x) * tf.constant([[1.0, 2.0, 3.0]]))
            return tape.gradient(total, x)

        g = (run if mode == "eager" else tf.function(run, jit_compile=True))(x).numpy()
        assert np.all(np.isnan(g[0])), mode
        # support {0, 1}: the gradient is v - mean_S(v) on the support
        np.testing.assert_allclose(g[1], [-0.5, 0.5, 0.0], atol=1e-6, err_msg=mode)


def test_offsets_of_1e8_match_unshifted():
    rng = np.random.default_rng(1)
    z = (rng.normal(size=(8, 50)) * 4).astype(np.float64)
    q = np.eye(50)[rng.integers(0, 50, 8)]
    np.testing.assert_allclose(ops.sparsemax(z + 1e8).numpy(), ref_sparsemax(z), atol=1e-7)
    np.testing.assert_allclose(
        ops.sparsemax_loss(q, z + 1e8).numpy(), ops.sparsemax_loss(q, z).numpy(), atol=1e-7
    )
    np.testing.assert_allclose(
        ops.sparsemax((z * 1e8).astype(np.float32)).numpy(), ref_sparsemax(z * 1e8), atol=1e-6
    )


def test_loss_labels_are_checked_and_poison_under_xla():
    z = tf.constant([[0.5, 1.0, 0.0], [1.0, 0.0, 0.0]])
    for bad in ([[np.nan, 1.0, 0.0], [1.0, 0.0, 0.0]], [[-1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]):
        with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="`labels`"):
            ops.sparsemax_loss(np.array(bad, np.float32), z)
        out = tf.function(ops.sparsemax_loss, jit_compile=True)(tf.constant(bad), z).numpy()
        assert np.isnan(out[0]) and np.isfinite(out[1])
    for bad_axis in (1.5, "1", None):
        with pytest.raises(
            TypeError if not isinstance(bad_axis, float) else ValueError, match="`axis`"
        ):
            ops.sparsemax(z, axis=bad_axis)


_UNNORMALISED = np.array([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.4, 0.4, 0.4]], np.float32)


@pytest.mark.parametrize("row", range(3))
def test_label_rows_must_sum_to_one(row):
    # Issue 19 item 6: such rows gave a plausible 0.5. Eager and graph name `labels`; XLA
    # makes that row's loss and gradient NaN and leaves the others alone.
    z = np.array([[1.0, 0.0, -1.0], [0.5, 0.2, 0.1]], np.float32)
    q = np.array([_UNNORMALISED[row], [0.0, 1.0, 0.0]], np.float32)
    with pytest.raises(ValueError, match="`labels` rows must sum to 1"):
        ops.sparsemax_loss(q, z)
    graph = tf.function(ops.sparsemax_loss)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`labels` rows must sum to 1"):
        graph(tf.constant(q), tf.constant(z))

    @tf.function(jit_compile=True)
    def xla(q, z):
        with tf.GradientTape() as tape:
            tape.watch(z)
            loss = ops.sparsemax_loss(q, z)
        return loss, tape.gradient(loss, z)

    loss, grad = (t.numpy() for t in xla(tf.constant(q), tf.constant(z)))
    assert np.isnan(loss[0]) and np.all(np.isnan(grad[0]))
    want = ref.sparsemax_loss(z[1].astype(np.float64), q[1].astype(np.float64))
    np.testing.assert_allclose(loss[1], want, atol=1e-6)
    np.testing.assert_allclose(grad[1], ref.sparsemax(z[1].astype(np.float64))[0] - q[1], atol=1e-6)


def test_label_sums_within_float_tolerance_are_accepted():
    z = np.array([[1.0, 0.3, -1.0, 0.2]], np.float32)
    q = np.array([[0.25, 0.25, 0.25, 0.25 + 1e-4]], np.float32)  # off by 1e-4 < 3.5e-4
    want = ref.sparsemax_loss(z[0].astype(np.float64), q[0].astype(np.float64))
    np.testing.assert_allclose(ops.sparsemax_loss(q, z).numpy(), [want], atol=1e-6)
    with pytest.raises(ValueError, match="`labels` rows must sum to 1"):
        ops.sparsemax_loss(q + np.float32(1e-3), z)


def test_sparse_labels_are_densified_and_ragged_labels_rejected():
    # Issue 19 item 10: both failed with TF-internal messages naming no argument.
    z = np.array([[1.0, 0.0, -1.0], [0.5, 0.2, 0.1]], np.float32)
    q = np.array([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]], np.float32)
    want = ops.sparsemax_loss(q, z).numpy()
    np.testing.assert_allclose(want, [ref.sparsemax_loss(a, b) for a, b in zip(z, q)], atol=1e-6)
    sparse = tf.sparse.from_dense(q)
    np.testing.assert_allclose(ops.sparsemax_loss(sparse, z).numpy(), want, atol=1e-7)
    with pytest.raises(TypeError, match="`labels` must be a dense tensor or a tf.SparseTensor"):
        ops.sparsemax_loss(tf.ragged.constant([[1, 2], [0]]), z)
