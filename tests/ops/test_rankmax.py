"""Rankmax projection and loss ops against the spec's numpy reference (spec section 6)."""

import numpy as np
import pytest
import tensorflow as tf

from losszoo.ops import rankmax, rankmax_loss
from tests.helpers import assert_grad_matches_fd, assert_xla_matches_eager, load_reference

pytestmark = pytest.mark.tensorflow_only(
    reason="tf.GradientTape / tf.function / XLA checks (tests/helpers.py); ragged inputs"
)

ref = load_reference("rankmax_sparsemax")


def _loss_and_grad(labels, z, **kw):
    z = tf.constant(z)
    with tf.GradientTape() as tape:
        tape.watch(z)
        loss = rankmax_loss(labels, z, **kw)
    return loss.numpy(), tape.gradient(loss, z).numpy()


def _ref_rows(z, positives, k, eta=1.0):
    """Reference loss and gradient per row, summed over the row's positives (with weights)."""
    losses, grads = [], []
    for row, pos in zip(z, positives):
        losses.append(sum(w * ref.rankmax(row, y, k, eta)[4] for y, w in pos))
        grads.append(
            sum((w * ref.rankmax_loss_grad(row, y, k, eta) for y, w in pos), np.zeros(row.size))
        )
    return np.array(losses), np.array(grads)


@pytest.mark.parametrize("n", [2, 5, 13])
def test_loss_and_grad_match_reference_every_label_format(n):
    rng = np.random.default_rng(n)
    B = 64
    for k in sorted({1, max(1, n // 2), n - 1}):
        z = rng.normal(size=(B, n)) * rng.choice([0.2, 1.0, 4.0], size=(B, 1))
        y = rng.integers(0, n, size=B)
        want_l, want_g = _ref_rows(z, [[(yy, 1.0)] for yy in y], k)
        for labels in (tf.constant(y), tf.constant(np.eye(n)[y])):  # ids, one-hot
            got_l, got_g = _loss_and_grad(labels, z, k=k)
            np.testing.assert_allclose(got_l, want_l, atol=1e-10)
            np.testing.assert_allclose(got_g, want_g, atol=1e-10)
        # several positives: multi-hot (merged-sort path), weighted dense, padded ids
        multi = (rng.random((B, n)) < 0.4).astype(np.float64)
        multi[0] = 0.0  # a row without positives
        weights = multi * rng.uniform(0.5, 2.0, size=(B, n))
        positives = [[(i, row[i]) for i in np.nonzero(row)[0]] for row in weights]
        want_l, want_g = _ref_rows(z, positives, k)
        got_l, got_g = _loss_and_grad(tf.constant(weights), z, k=k)
        np.testing.assert_allclose(got_l, want_l, atol=1e-10)
        np.testing.assert_allclose(got_g, want_g, atol=1e-10)
        ids = np.full((B, n), -1)
        for b, row in enumerate(multi):
            pos = np.nonzero(row)[0]
            ids[b, : pos.size] = pos
        want_l, want_g = _ref_rows(z, [[(i, 1.0) for i in np.nonzero(r)[0]] for r in multi], k)
        # [B, n] integer ids are ambiguous (one-hot rows?): the format must be given.
        got_l, got_g = _loss_and_grad(tf.constant(ids), z, k=k, label_format="ids")
        np.testing.assert_allclose(got_l, want_l, atol=1e-10)
        np.testing.assert_allclose(got_g, want_g, atol=1e-10)
        assert got_l[0] == 0.0 and np.all(got_g[0] == 0.0)


def test_dense_fast_path_equals_exact_sort_path():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(32, 9))
    y = np.eye(9)[rng.integers(0, 9, 32)] * rng.uniform(0.5, 2, size=(32, 1))
    for k in (1, 4):
        fast = _loss_and_grad(tf.constant(y), z, k=k, max_positives=1)
        exact = _loss_and_grad(tf.constant(y), z, k=k, max_positives=None)
        np.testing.assert_allclose(fast[0], exact[0], atol=1e-12)
        np.testing.assert_allclose(fast[1], exact[1], atol=1e-12)


def test_dense_fast_path_rejects_rows_that_only_look_one_hot():
    """The one-hot reading (index from sum(i w) / sum(w)) must be verified entry by entry:
    a second positive too small to change sum(w) in float32, a positive at index 0 next to an
    empty row, and weights whose index sum overflows still give the exact multi-hot result,
    eagerly and under XLA."""
    z = np.array(
        [[10.0, 0.0, 5.0, 1.0], [0.5, 2.0, -1.0, 0.0], [1.0, 3.0, 2.0, 0.0], [0.0, 1.0, 2.0, 3.0]],
        np.float32,
    )
    w = np.zeros((4, 4), np.float32)
    w[0, [0, 2]] = [1.0, 1e-30]  # term 0 for the first positive: the loss is the tiny one's
    w[1, 0] = 2.0
    w[3, 3] = 3e38  # 3 * 3e38 overflows sum(i w): the index is unreadable
    positives = [[(i, float(row[i])) for i in np.nonzero(row)[0]] for row in w]
    want_l, want_g = _ref_rows(z.astype(np.float64), positives, k=1)
    assert 0 < want_l[0] < 1e-29
    got_l, got_g = _loss_and_grad(tf.constant(w), z)
    np.testing.assert_allclose(got_l, want_l, rtol=1e-6)
    np.testing.assert_allclose(got_g, want_g, rtol=1e-6, atol=1e-36)
    xla = tf.function(_loss_and_grad_graph, jit_compile=True, autograph=False)
    xla_l, xla_g = (t.numpy() for t in xla(tf.constant(w), tf.constant(z)))
    np.testing.assert_allclose(xla_l, want_l, rtol=1e-6)
    np.testing.assert_allclose(xla_g, want_g, rtol=1e-6, atol=1e-36)
    # The same batch without the overflowing and the tiny positive: one-hot, fast path.
    w[0, 2], w[3, 3] = 0.0, 3.0
    positives = [[(i, float(row[i])) for i in np.nonzero(row)[0]] for row in w]
    want_l, want_g = _ref_rows(z.astype(np.float64), positives, k=1)
    xla_l, xla_g = (t.numpy() for t in xla(tf.constant(w), tf.constant(z)))
    np.testing.assert_allclose(xla_l, want_l, rtol=1e-6)
    np.testing.assert_allclose(xla_g, want_g, rtol=1e-6, atol=1e-7)


def test_one_hot_index_is_read_exactly():
    """The fast path's index reading (base-256 digits of sum(i w) / sum(w)) returns the
    positive for any weight and any index below 2^24, so one-hot batches do take it."""
    from losszoo.ops._rankmax import _one_hot_ids

    n = 70_000
    y = np.array([0, 1, 255, 256, 65535, 65536, n - 1])
    w = np.zeros((y.size, n), np.float32)
    w[np.arange(y.size), y] = [1.0, 0.3, 2.5, 1e-3, 7.0, 1e30, 0.1]
    eager = _one_hot_ids(tf.constant(w))
    xla = tf.function(_one_hot_ids, jit_compile=True)(tf.constant(w))
    np.testing.assert_array_equal(eager.numpy()[:, 0], y)
    np.testing.assert_array_equal(xla.numpy()[:, 0], y)


def _loss_and_grad_graph(labels, z):
    with tf.GradientTape() as tape:
        tape.watch(z)
        loss = rankmax_loss(labels, z)
    return loss, tape.gradient(loss, z)


def _away_from_kinks(z, y, k):
    p, a, mu, _, _ = ref.rankmax(z, y, k)
    return not ref._near_kink(z, mu, a)


@pytest.mark.parametrize("k", [1, 3])
def test_gradients_match_finite_differences(k):
    rng = np.random.default_rng(k)
    while True:
        z = rng.normal(size=(3, 7)) * 2
        y = rng.integers(0, 7, size=3)
        if all(_away_from_kinks(z[b], y[b], k) for b in range(3)):
            break
    assert_grad_matches_fd(lambda s: rankmax_loss(tf.constant(y), s, k=k), [z])
    assert_grad_matches_fd(lambda s: rankmax(s, tf.constant(y), k=k), [z])
    multi = np.stack([np.eye(7)[y[b]] + np.eye(7)[(y[b] + 2) % 7] for b in range(3)])
    if all(_away_from_kinks(z[b], (y[b] + 2) % 7, k) for b in range(3)):
        assert_grad_matches_fd(lambda s: rankmax_loss(tf.constant(multi), s, k=k), [z])


def test_projection_matches_reference_and_invariants():
    rng = np.random.default_rng(2)
    B, n = 200, 11
    for k in (1, 2, 5, 10):
        z = rng.normal(size=(B, n)) * rng.choice([0.2, 1.0, 4.0], size=(B, 1))
        y = rng.integers(0, n, size=B)
        p = rankmax(tf.constant(z), tf.constant(y), k=k).numpy()
        want = np.stack([ref.rankmax(z[b], y[b], k)[0] for b in range(B)])
        np.testing.assert_allclose(p, want, atol=1e-12)
        # spec oracle 10: the Euclidean (n,k)-simplex projection at alpha_y, computed by bisection
        for b in range(5):
            alpha = ref.rankmax(z[b], y[b], k)[1]
            np.testing.assert_allclose(p[b], ref.euclid_capped(z[b], k, alpha), atol=1e-9)
        np.testing.assert_allclose(p.sum(-1), k, atol=1e-10)
        assert p.min() >= 0.0 and p.max() <= 1.0
        assert np.all(p[np.arange(B), y] > 0), "the positive must stay in the support"
        # order preserving (Prop. 1b): z_i > z_j => p_i >= p_j
        zi, zj = z[:, :, None], z[:, None, :]
        assert np.all((p[:, :, None] >= p[:, None, :] - 1e-12) | ~(zi > zj))
        # loss = -log p_y
        np.testing.assert_allclose(
            rankmax_loss(tf.constant(y), tf.constant(z), k=k).numpy(),
            -np.log(np.minimum(1.0, p[np.arange(B), y])),
            atol=1e-10,
        )


def test_projection_is_monotone_in_the_positive_score():
    rng = np.random.default_rng(3)
    z = rng.normal(size=(1, 8))
    ps = []
    for bump in np.linspace(0, 3, 13):
        w = z.copy()
        w[0, 2] += bump
        ps.append(rankmax(tf.constant(w), tf.constant([2]), k=2).numpy()[0, 2])
    assert np.all(np.diff(ps) >= -1e-12) and ps[-1] == pytest.approx(1.0)


def test_multi_positive_projection_and_padding():
    rng = np.random.default_rng(4)
    z = rng.normal(size=(3, 6))
    ids = np.array([[0, 3], [5, -1], [-1, -1]])
    p = rankmax(tf.constant(z), tf.constant(ids), k=2).numpy()
    assert p.shape == (3, 2, 6)
    for b in range(3):
        for m in range(2):
            want = ref.rankmax(z[b], ids[b, m], 2)[0] if ids[b, m] >= 0 else np.zeros(6)
            np.testing.assert_allclose(p[b, m], want, atol=1e-12)


def test_k1_closed_form_and_erratum():
    rng = np.random.default_rng(5)
    z = rng.normal(size=(50, 20)).astype(np.float32)
    y = rng.integers(0, 20, size=50)
    zy = z[np.arange(50), y][:, None]
    closed = np.log(np.maximum(z - zy + 1, 0).sum(-1))
    loss, grad = _loss_and_grad(tf.constant(y), z)
    np.testing.assert_allclose(loss, closed, atol=1e-6)
    # erratum E1: d loss / d z_y = -(s - 1) p_y with s counting y itself
    s = (z > zy - 1).sum(-1)
    p_y = 1.0 / np.maximum(z - zy + 1, 0).sum(-1)
    np.testing.assert_allclose(grad[np.arange(50), y], -(s - 1) * p_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad.sum(-1), 0.0, atol=1e-5 * 20)


@pytest.mark.parametrize("n,k", [(10, 1), (10, 3), (7, 6)])
def test_all_scores_equal(n, k):
    z = np.full((1, n), 2.5)
    loss, grad = _loss_and_grad(tf.constant([2]), z, k=k)
    p = rankmax(tf.constant(z), tf.constant([2]), k=k).numpy()
    np.testing.assert_allclose(p, k / n, atol=1e-12)
    np.testing.assert_allclose(loss, np.log(n / k), atol=1e-12)
    np.testing.assert_allclose(grad[0], 1.0 / n - np.eye(n)[2], atol=1e-12)
    if k == 1:  # equals softmax cross-entropy, value and gradient
        zt = tf.constant(z)
        with tf.GradientTape() as tape:
            tape.watch(zt)
            ce = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.constant([2]), zt)
        np.testing.assert_allclose(loss, ce.numpy(), atol=1e-12)
        np.testing.assert_allclose(grad, tape.gradient(ce, zt).numpy(), atol=1e-12)


def test_margin_locality_scale_and_shift():
    z = np.array([[3.0, 1.9, 0.5, -2.0]])
    loss, grad = _loss_and_grad(tf.constant([0]), z)
    assert loss[0] == 0.0 and np.all(grad == 0.0)  # margin >= 1 over every other score
    rng = np.random.default_rng(6)
    z = rng.normal(size=(20, 9))
    y = rng.integers(0, 9, size=20)
    for k in (1, 3):
        p = rankmax(tf.constant(z), tf.constant(y), k=k).numpy()
        scaled = rankmax(tf.constant(3.7 * z), tf.constant(y), k=k, margin=3.7).numpy()
        shifted = rankmax(tf.constant(z + 50.0), tf.constant(y), k=k).numpy()
        np.testing.assert_allclose(scaled, p, atol=1e-12)
        np.testing.assert_allclose(shifted, p, atol=1e-10)


def test_minus_inf_mask_equals_unpadded_row():
    rng = np.random.default_rng(7)
    z = rng.normal(size=(4, 6))
    y = np.array([0, 2, 5, 1])
    padded = np.concatenate([z, np.full((4, 3), -np.inf)], -1)
    for k in (1, 2):
        for labels in (tf.constant(y), None):
            lab_small = labels if labels is not None else tf.constant(np.eye(6)[y])
            lab_big = labels if labels is not None else tf.constant(np.eye(9)[y])
            a = _loss_and_grad(lab_small, z, k=k, max_positives=None)
            b = _loss_and_grad(lab_big, padded, k=k, max_positives=None)
            np.testing.assert_allclose(b[0], a[0], atol=1e-12)
            np.testing.assert_allclose(b[1][:, :6], a[1], atol=1e-12)
            assert np.all(b[1][:, 6:] == 0.0)


def test_xla_matches_eager():
    rng = np.random.default_rng(8)
    z = tf.constant(rng.normal(size=(16, 12)), tf.float32)
    y = tf.constant(rng.integers(0, 12, size=16), tf.int32)
    multi = tf.constant((rng.random((16, 12)) < 0.3).astype(np.float32))
    for k in (1, 4):
        assert_xla_matches_eager(lambda s: rankmax_loss(y, s, k=k), z, atol=1e-5, rtol=1e-5)
        assert_xla_matches_eager(lambda s: rankmax(s, y, k=k), z, atol=1e-5, rtol=1e-5)
    assert_xla_matches_eager(lambda s: rankmax_loss(multi, s, k=4), z, atol=1e-5, rtol=1e-5)
    # one positive per row: the tf.cond fast path (both branches' gradients compile)
    onehot = tf.one_hot(y, 12)
    assert_xla_matches_eager(lambda s: rankmax_loss(onehot, s, k=1), z, atol=1e-5, rtol=1e-5)


def test_dtypes_half_in_float32_float64_kept():
    rng = np.random.default_rng(9)
    z = rng.normal(size=(8, 10)).astype(np.float32)
    y = tf.constant(rng.integers(0, 10, size=8))
    want = rankmax_loss(y, tf.constant(z), k=2).numpy()
    for dtype in (tf.float16, tf.bfloat16):
        zh = tf.cast(z, dtype)
        got = rankmax_loss(y, zh, k=2)
        assert got.dtype == dtype
        exact = rankmax_loss(y, tf.cast(zh, tf.float32), k=2).numpy()  # same inputs, float32
        np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), exact, rtol=1e-2)
        assert rankmax(zh, y, k=2).dtype == dtype
    assert rankmax_loss(y, tf.constant(z, tf.float64)).dtype == tf.float64
    np.testing.assert_allclose(want, rankmax_loss(y, tf.constant(z, tf.float64), k=2), rtol=1e-5)


def test_float32_large_n_matches_float64():
    rng = np.random.default_rng(10)
    n = 200_000
    z = 100.0 + rng.normal(size=(2, n))
    y = tf.constant([3, 17])
    for k in (1, 10):
        l64 = rankmax_loss(y, tf.constant(z), k=k).numpy()
        l32 = rankmax_loss(y, tf.constant(z, tf.float32), k=k).numpy()
        np.testing.assert_allclose(l32, l64, rtol=1e-5)


def test_bad_inputs():
    z = tf.constant([[0.1, 0.2, 0.3]])
    with pytest.raises(ValueError, match="k"):
        rankmax_loss([0], z, k=0)
    with pytest.raises(ValueError, match="k"):
        rankmax_loss([0], z, k=3)
    with pytest.raises(ValueError, match="k"):
        rankmax(z, [0], k=5)
    with pytest.raises(TypeError, match="k"):
        rankmax_loss([0], z, k=1.5)
    with pytest.raises(ValueError, match="margin"):
        rankmax_loss([0], z, margin=0.0)
    with pytest.raises(ValueError, match="margin"):
        rankmax(z, [0], margin=-1.0)
    with pytest.raises(ValueError, match="NaN"):
        rankmax_loss([0], tf.constant([[0.1, np.nan, 0.3]]))
    with pytest.raises(ValueError, match=r"`labels` holds class ids.*\[0, K\).*rows \[0\]"):
        rankmax_loss([3], z)
    with pytest.raises(ValueError, match=">= 0"):
        rankmax_loss(tf.constant([[1.0, -1.0, 0.0]]), z)
    with pytest.raises(TypeError, match="integer ids"):
        rankmax(z, tf.constant([[1.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="shape"):
        rankmax_loss(tf.constant([[1.0, 0.0]]), z)

    @tf.function
    def graph(s, y):
        return rankmax_loss(y, s)

    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN"):
        graph(tf.constant([[np.nan, 0.0, 1.0]]), tf.constant([0]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="labels"):
        graph(z, tf.constant([7]))

    # in-batch scores have a dynamic n: k < n is checked when the graph runs
    dynamic = tf.function(
        lambda s, y: rankmax_loss(y, s, k=3),
        input_signature=[tf.TensorSpec([None, None]), tf.TensorSpec([None], tf.int32)],
    )
    np.testing.assert_allclose(
        dynamic(tf.zeros([2, 4]), tf.constant([0, 1])), [np.log(4 / 3)] * 2, rtol=1e-6
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="k"):
        dynamic(tf.zeros([2, 3]), tf.constant([0, 1]))


def test_rows_without_positives_have_zero_loss_and_grad():
    z = np.array([[0.3, 1.0, -0.5], [2.0, 0.0, 0.1]])
    for labels in (tf.constant([-1, 1]), tf.constant([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])):
        loss, grad = _loss_and_grad(labels, z)
        assert loss[0] == 0.0 and np.all(grad[0] == 0.0)
        assert loss[1] > 0.0


# ----------------------------------------------------------------- issue 9 regressions

_XLA_LOSS = tf.function(lambda y, s: rankmax_loss(y, s), jit_compile=True, autograph=False)


def test_scale_1e8_projection_and_loss_match_reference():
    z = np.array([[3e8, 1e8, 0.0, -1e8]])
    for dtype in (np.float32, np.float64):
        p = rankmax(z.astype(dtype), [0]).numpy()
        np.testing.assert_allclose(p, ref.rankmax(z[0], 0, 1)[0][None], atol=1e-6)
    # all ties at 1e8: log 3 (the positive's own margin term must survive the offset)
    np.testing.assert_allclose(rankmax_loss([0], [[1e8, 1e8, 1e8]]).numpy(), [np.log(3)], rtol=1e-6)
    np.testing.assert_allclose(ref.rankmax(np.array([1e8] * 3), 0, 1)[4], np.log(3))
    # offsets of 1e8 leave loss and gradient unchanged (k = 1 and k = 2, eager and XLA)
    rng = np.random.default_rng(3)
    base = rng.normal(size=(4, 6)).astype(np.float64) * 3
    y = np.array([0, 2, 5, 1])
    for k in (1, 2):
        want_l, want_g = _ref_rows(base, [[(yy, 1.0)] for yy in y], k)
        got_l, got_g = _loss_and_grad(tf.constant(y), base + 1e8, k=k)
        np.testing.assert_allclose(got_l, want_l, atol=1e-6)
        np.testing.assert_allclose(got_g, want_g, atol=1e-6)


def test_masked_positive_gives_inf_loss_and_zero_gradient():
    z = np.array([[-np.inf, 1.0, 2.0], [0.5, -np.inf, 0.0]], np.float32)
    for labels in (tf.constant([0, 0]), tf.constant(np.eye(3, dtype=np.float32)[[0, 0]])):
        loss, grad = _loss_and_grad(labels, z)
        assert loss[0] == np.inf and np.all(grad[0] == 0)
        np.testing.assert_allclose(
            loss[1], ref.rankmax(np.array([0.5, -1e30, 0.0]), 0, 1)[4], rtol=1e-6
        )
    assert np.isinf(_XLA_LOSS(tf.constant([0, 0]), tf.constant(z)).numpy()[0])
    assert np.all(np.isnan(rankmax(z, [0, 0]).numpy()[0]))


def test_integer_one_hot_is_ambiguous_and_dense_format_matches_float():
    z = np.array([[0.3, 1.0, -0.5]], np.float32)
    with pytest.raises(ValueError, match="`labels` is ambiguous.*`label_format`"):
        rankmax_loss(np.eye(3, dtype="int32")[[0]], z)
    dense = rankmax_loss(np.eye(3, dtype="int32")[[0]], z, label_format="dense").numpy()
    floats = rankmax_loss(np.eye(3, dtype="float32")[[0]], z).numpy()
    ids = rankmax_loss(np.array([0]), z).numpy()
    np.testing.assert_allclose(dense, floats)
    np.testing.assert_allclose(dense, ids)
    np.testing.assert_allclose(dense, [ref.rankmax(z[0].astype(np.float64), 0, 1)[4]], rtol=1e-6)
    padded = rankmax_loss(np.array([[0, -1, -1]]), z, label_format="ids").numpy()
    np.testing.assert_allclose(padded, ids)
    with pytest.raises(ValueError, match="`label_format`"):
        rankmax_loss([0], z, label_format="onehot")


@pytest.mark.parametrize("labels", [[0, 7], [0, -2]])
def test_xla_out_of_range_ids_give_nan_rows(labels):
    z = tf.constant(np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32))
    out = _XLA_LOSS(tf.constant(labels), z).numpy()
    assert np.isfinite(out[0]) and np.isnan(out[1])
    proj = tf.function(lambda s, y: rankmax(s, y), jit_compile=True)(z, tf.constant(labels))
    assert np.all(np.isfinite(proj[0])) and np.all(np.isnan(proj[1]))
    with pytest.raises(ValueError, match="`labels`"):
        rankmax_loss(labels, z)


def test_xla_nan_scores_and_bad_dense_labels_give_nan_rows():
    z = np.array([[np.nan, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]], np.float32)
    out = _XLA_LOSS(tf.constant([1, 1]), tf.constant(z)).numpy()
    assert np.isnan(out[0]) and np.isfinite(out[1])
    ok = np.ones((2, 4), np.float32)
    for bad in ([[np.nan, 0, 0, 0], [1, 0, 0, 0]], [[-1, 0, 1, 0], [1, 0, 0, 0]]):
        out = _XLA_LOSS(tf.constant(np.array(bad, np.float32)), tf.constant(ok)).numpy()
        assert np.isnan(out[0]) and np.isfinite(out[1])
        with pytest.raises(ValueError, match="`labels`"):
            rankmax_loss(np.array(bad, np.float32), ok)


def test_float_ids_must_be_whole():
    z = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="`labels`"):
        rankmax_loss(np.array([0.0, 1.5], np.float32), z)
    np.testing.assert_allclose(
        rankmax_loss(np.array([0.0, 2.0], np.float32), z), rankmax_loss(np.array([0, 2]), z)
    )


def test_rankmax_rejects_integer_one_hot_like_rankmax_loss():
    # Issue 19 item 11: rankmax read an integer one-hot row as padded ids (a projection per
    # entry, for ids 0, 1, 0) where rankmax_loss rejects it as ambiguous; one rule now.
    z = tf.constant([[2.0, 1.0, 0.0]])
    one_hot = np.array([[0, 1, 0]], np.int32)
    for fn in (lambda: rankmax(z, one_hot), lambda: rankmax_loss(one_hot, z)):
        with pytest.raises(ValueError, match="`labels` is ambiguous"):
            fn()
    graph = tf.function(lambda y: rankmax(z, y))
    with pytest.raises(ValueError, match="`labels` is ambiguous"):
        graph(tf.constant(one_hot))
    # forcing the ids reading gives one projection per listed id
    p = rankmax(z, one_hot, label_format="ids").numpy()
    for j, y in enumerate([0, 1, 0]):
        np.testing.assert_allclose(p[0, j], ref.rankmax(z.numpy()[0].astype(np.float64), y, 1)[0])
    with pytest.raises(TypeError, match="must be integer ids"):
        rankmax(z, one_hot, label_format="dense")


def test_ragged_and_sparse_labels():
    # Issue 19 item 10: ragged positive lists (natural for retrieval) and sparse labels failed
    # with TF-internal messages. Ragged ids pad with -1; sparse ids' absent entries are -1.
    z = np.random.default_rng(3).normal(size=(3, 5)).astype(np.float32)
    lists = [[0, 3], [4], []]
    want = ref_rows(z, lists)
    ragged = tf.ragged.constant(lists, dtype=tf.int64)
    np.testing.assert_allclose(rankmax_loss(ragged, z).numpy(), want, rtol=1e-6, atol=1e-6)
    dense = np.zeros((3, 5), np.float32)
    for i, ids in enumerate(lists):
        dense[i, ids] = 1.0
    sparse_dense = tf.sparse.from_dense(dense)
    np.testing.assert_allclose(rankmax_loss(sparse_dense, z).numpy(), want, rtol=1e-6, atol=1e-6)
    sparse_ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], [0, 3, 4], [3, 2])
    np.testing.assert_allclose(rankmax_loss(sparse_ids, z).numpy(), want, rtol=1e-6, atol=1e-6)
    p = rankmax(z, ragged).numpy()  # [3, 2, 5]: one projection per listed id, padding zero
    np.testing.assert_allclose(p[0, 1], ref.rankmax(z[0].astype(np.float64), 3, 1)[0], atol=1e-6)
    np.testing.assert_array_equal(p[1, 1], 0.0)
    empty = tf.ragged.constant([[], []], dtype=tf.int32)
    np.testing.assert_array_equal(rankmax_loss(empty, z[:2]).numpy(), [0.0, 0.0])
    with pytest.raises(TypeError, match="`labels` is a tf.RaggedTensor"):
        rankmax_loss(ragged, z, label_format="dense")


def ref_rows(z, lists, k=1):
    return np.array(
        [
            sum(ref.rankmax(row.astype(np.float64), y, k)[4] for y in ids)
            for row, ids in zip(z, lists)
        ]
    )


@pytest.mark.parametrize(
    "labels",
    [tf.ragged.constant([[0, 3], [4]], dtype=tf.int64), tf.sparse.from_dense(np.eye(5)[:2])],
    ids=["ragged", "sparse"],
)
def test_ragged_and_sparse_labels_under_xla_name_the_argument(labels):
    # XLA cannot compile the ops that densify: a TypeError naming `labels`, not TF's own.
    z = np.random.default_rng(4).normal(size=(2, 5)).astype(np.float32)
    with pytest.raises(TypeError, match="`labels` is a .*jit_compile=True"):
        tf.function(lambda y: rankmax_loss(y, z), jit_compile=True)(labels)
    got = tf.function(lambda y: rankmax_loss(y, z))(labels)  # graph without XLA still works
    np.testing.assert_allclose(got.numpy(), rankmax_loss(labels, z).numpy(), rtol=1e-6)


def test_keras_label_format_reads_shapes_not_dtypes():
    # Issue 20: RankmaxLoss's "auto" rule lives in the op as label_format="keras".
    rng = np.random.default_rng(20)
    z = rng.normal(size=(4, 5))
    y = np.array([0, 4, 2, 1])
    one = [[(t, 1.0)] for t in y]
    want, _ = _ref_rows(z, one, 1)
    for labels in (y, y[:, None], y.astype(np.float32)[:, None], np.eye(5, dtype=np.int32)[y]):
        got = rankmax_loss(labels, z, label_format="keras").numpy()
        np.testing.assert_allclose(got, want, atol=1e-10)
    # [B, M] with static M != n: padded ids, integer or float (Keras casts y_true to float).
    padded = np.array([[0, 2, -1], [4, -1, -1], [-1, -1, -1], [1, 3, 0]])
    want, _ = _ref_rows(z, [[(i, 1.0) for i in row if i >= 0] for row in padded], 1)
    for labels in (padded, padded.astype(np.float32)):
        got = rankmax_loss(labels, z, label_format="keras").numpy()
        np.testing.assert_allclose(got, want, atol=1e-10)
    # An unknown last axis of the labels reads as dense weights (TFRS's tf.eye(B)).
    fn = tf.function(
        lambda lab, s: rankmax_loss(lab, s, label_format="keras"),
        input_signature=[tf.TensorSpec([None, None], tf.float32), tf.TensorSpec([None, None])],
    )
    zz = rng.normal(size=(3, 3)).astype(np.float32)
    want, _ = _ref_rows(zz.astype(np.float64), [[(i, 1.0)] for i in range(3)], 1)
    np.testing.assert_allclose(fn(np.eye(3, dtype=np.float32), zz), want, rtol=1e-5)
    # "auto" still rejects the ambiguous integer one-hot; both rules name the argument given.
    with pytest.raises(ValueError, match="`y_true` is ambiguous"):
        rankmax_loss(np.eye(5, dtype=np.int32)[y], z, labels_name="y_true")
    with pytest.raises(ValueError, match="`y_pred` must have rank >= 1"):
        rankmax_loss(np.int32(1), np.float32(2.0), logits_name="y_pred")
