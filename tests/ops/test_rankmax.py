"""Rankmax projection and loss on the running backend, against the spec's numpy oracle
(``rankmax``, ``rankmax_loss_grad``, ``rankmax_projection_vjp``, spec section 6) and finite
differences, for every label path and in every mode of the harness; NaN rows when traced,
errors naming the argument when checked. TensorFlow-only checks (``None``-shaped
signatures, ragged / sparse labels): ``test_rankmax_tensorflow.py``."""

import keras
import numpy as np
import pytest
from keras import ops as kops

import losszoo
from losszoo.ops import rankmax, rankmax_loss
from tests.harness import (
    BACKEND,
    MODES,
    TRACED_MODES,
    compiled,
    finite_difference,
    float64,
    numpy,
    upstream,
    value_and_grad,
)
from tests.references import load_reference

ref = load_reference("rankmax_sparsemax")
TRACED = list(TRACED_MODES)
# JAX runs eager code op by op (one compilation per primitive and shape): the label paths
# below run jitted there; their forward still runs eagerly as the harness' probe.
PATH_MODES = ("jit",) if BACKEND == "jax" else MODES

# A float64 oracle sweep calls the op on many label forms and shapes: on JAX each one compiles
# the rankmax kernel (sorts, conds, custom gradients) anew, about 20 s apiece on the 2-core
# CI machine. JAX runs the jitted every-label-path tests at the end of this module instead.
SWEEP = pytest.mark.skipif(
    BACKEND == "jax", reason="float64 oracle sweep: one kernel compile per call on JAX (CI time)"
)


def tol(atol):
    """``atol`` for a float64 computation; PyTorch: keras.ops demotes float64 inside some ops
    (maximum, cumsum), so the kernel's float64 result is float32-accurate there."""
    return max(atol, 2e-5) if BACKEND == "torch" else atol


def _loss_and_grad(labels, z, mode=None, **kw):
    """``(rankmax_loss, d sum(loss) / d z)`` as numpy (float64 in, float64 out); eager, or
    jitted on JAX (whose eager gradient compiles every primitive anew for each shape)."""
    mode = mode or ("jit" if BACKEND == "jax" else "eager")
    with float64():
        loss, (g,) = value_and_grad(lambda s: rankmax_loss(labels, s, **kw), z, mode=mode)
    return loss, g / upstream(loss.shape)[:, None]


def _ref_rows(z, positives, k, eta=1.0):
    """Reference loss and gradient per row, summed over the row's positives (with weights)."""
    losses, grads = [], []
    for row, pos in zip(np.float64(z), positives):
        losses.append(sum(w * ref.rankmax(row, y, k, eta)[4] for y, w in pos))
        grads.append(
            sum((w * ref.rankmax_loss_grad(row, y, k, eta) for y, w in pos), np.zeros(row.size))
        )
    return np.array(losses), np.array(grads)


def _project(z, labels, **kw):
    with float64():
        return numpy(rankmax(labels, z, **kw))


@SWEEP
@pytest.mark.parametrize("n", [2, 5, 13])
def test_loss_and_grad_match_reference_every_label_format(n):
    rng = np.random.default_rng(n)
    B = 64
    for k in sorted({1, max(1, n // 2), n - 1}):
        z = rng.normal(size=(B, n)) * rng.choice([0.2, 1.0, 4.0], size=(B, 1))
        y = rng.integers(0, n, size=B)
        want_l, want_g = _ref_rows(z, [[(yy, 1.0)] for yy in y], k)
        for labels in (y, np.eye(n)[y]):  # ids, one-hot
            got_l, got_g = _loss_and_grad(labels, z, k=k)
            np.testing.assert_allclose(got_l, want_l, atol=tol(1e-10))
            np.testing.assert_allclose(got_g, want_g, atol=tol(1e-10))
        # several positives: multi-hot (merged-sort path), weighted dense, padded ids
        multi = (rng.random((B, n)) < 0.4).astype(np.float64)
        multi[0] = 0.0  # a row without positives
        weights = multi * rng.uniform(0.5, 2.0, size=(B, n))
        positives = [[(i, row[i]) for i in np.nonzero(row)[0]] for row in weights]
        want_l, want_g = _ref_rows(z, positives, k)
        got_l, got_g = _loss_and_grad(weights, z, k=k)
        np.testing.assert_allclose(got_l, want_l, atol=tol(1e-10))
        np.testing.assert_allclose(got_g, want_g, atol=tol(1e-10))
        ids = np.full((B, n), -1)
        for b, row in enumerate(multi):
            pos = np.nonzero(row)[0]
            ids[b, : pos.size] = pos
        want_l, want_g = _ref_rows(z, [[(i, 1.0) for i in np.nonzero(r)[0]] for r in multi], k)
        # [B, n] integer ids are ambiguous (one-hot rows?): the format must be given.
        got_l, got_g = _loss_and_grad(ids, z, k=k, label_format="ids")
        np.testing.assert_allclose(got_l, want_l, atol=tol(1e-10))
        np.testing.assert_allclose(got_g, want_g, atol=tol(1e-10))
        assert got_l[0] == 0.0 and np.all(got_g[0] == 0.0)


@SWEEP
def test_dense_fast_path_equals_exact_sort_path():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(32, 9))
    y = np.eye(9)[rng.integers(0, 9, 32)] * rng.uniform(0.5, 2, size=(32, 1))
    for k in (1, 4):
        fast = _loss_and_grad(y, z, k=k, max_positives=1)
        exact = _loss_and_grad(y, z, k=k, max_positives=None)
        np.testing.assert_allclose(fast[0], exact[0], atol=tol(1e-12))
        np.testing.assert_allclose(fast[1], exact[1], atol=tol(1e-12))


@pytest.mark.parametrize("mode", MODES)
def test_dense_fast_path_rejects_rows_that_only_look_one_hot(mode):
    """The one-hot reading (index from sum(i w) / sum(w)) must be verified entry by entry:
    a second positive too small to change sum(w) in float32, a positive at index 0 next to an
    empty row, and weights whose index sum overflows still give the exact multi-hot result;
    without them the same program takes the fast path."""
    z = np.array(
        [[10.0, 0.0, 5.0, 1.0], [0.5, 2.0, -1.0, 0.0], [1.0, 3.0, 2.0, 0.0], [0.0, 1.0, 2.0, 3.0]],
        np.float32,
    )
    w = np.zeros((4, 4), np.float32)
    w[0, [0, 2]] = [1.0, 1e-30]  # term 0 for the first positive: the loss is the tiny one's
    w[1, 0] = 2.0
    w[3, 3] = 3e38  # 3 * 3e38 overflows sum(i w): the index is unreadable
    fast = w.copy()
    fast[0, 2], fast[3, 3] = 0.0, 3.0  # the same batch one-hot: the fast path
    for weights, atol in ((w, 1e-36), (fast, 1e-7)):
        positives = [[(i, float(row[i])) for i in np.nonzero(row)[0]] for row in weights]
        want_l, want_g = _ref_rows(z, positives, k=1)
        got_l, (got_g,) = value_and_grad(lambda s, lab: rankmax_loss(lab, s), z, weights, mode=mode)
        np.testing.assert_allclose(got_l, want_l, rtol=1e-6)
        got_g = got_g / upstream(4)[:, None]
        np.testing.assert_allclose(got_g, want_g, rtol=1e-6, atol=atol)
    assert 0 < _ref_rows(z, [[(0, 1.0), (2, 1e-30)]], 1)[0][0] < 1e-29


def test_one_hot_index_is_read_exactly():
    """The fast path's index reading (base-256 digits of sum(i w) / sum(w)) returns the
    positive for any weight and any index below 2^24, so one-hot batches do take it."""
    from losszoo.ops._rankmax import _one_hot_ids

    n = 70_000
    y = np.array([0, 1, 255, 256, 65535, 65536, n - 1])
    w = np.zeros((y.size, n), np.float32)
    w[np.arange(y.size), y] = [1.0, 0.3, 2.5, 1e-3, 7.0, 1e30, 0.1]
    for mode in MODES:
        got = numpy(compiled(_one_hot_ids, mode)(w))
        np.testing.assert_array_equal(got[:, 0], y, err_msg=mode)


def _away_from_kinks(z, y, k):
    p, a, mu, _, _ = ref.rankmax(z, y, k)
    return not ref._near_kink(z, mu, a)


@SWEEP
@pytest.mark.parametrize("k", [1, 3])
def test_gradients_match_finite_differences(k):
    rng = np.random.default_rng(k)
    while True:
        z = rng.normal(size=(3, 7)) * 2
        y = rng.integers(0, 7, size=3)
        if all(_away_from_kinks(z[b], y[b], k) for b in range(3)):
            break
    multi = np.stack([np.eye(7)[y[b]] + np.eye(7)[(y[b] + 2) % 7] for b in range(3)])
    fns = [lambda s: rankmax_loss(y, s, k=k), lambda s: rankmax(y, s, k=k)]
    if all(_away_from_kinks(z[b], (y[b] + 2) % 7, k) for b in range(3)):
        fns.append(lambda s: rankmax_loss(multi, s, k=k))
    with float64():
        for fn in fns:
            _, (g,) = value_and_grad(fn, z)
            np.testing.assert_allclose(g, finite_difference(fn, z), atol=tol(1e-6), rtol=1e-5)


@SWEEP
def test_projection_matches_reference_and_invariants():
    rng = np.random.default_rng(2)
    B, n = 200, 11
    for k in (1, 2, 5, 10):
        z = rng.normal(size=(B, n)) * rng.choice([0.2, 1.0, 4.0], size=(B, 1))
        y = rng.integers(0, n, size=B)
        p = _project(z, y, k=k)
        want = np.stack([ref.rankmax(z[b], y[b], k)[0] for b in range(B)])
        np.testing.assert_allclose(p, want, atol=tol(1e-12))
        # spec oracle 10: the Euclidean (n,k)-simplex projection at alpha_y, computed by bisection
        for b in range(5):
            alpha = ref.rankmax(z[b], y[b], k)[1]
            np.testing.assert_allclose(p[b], ref.euclid_capped(z[b], k, alpha), atol=tol(1e-9))
        np.testing.assert_allclose(p.sum(-1), k, atol=tol(1e-10))
        assert p.min() >= 0.0 and p.max() <= 1.0
        assert np.all(p[np.arange(B), y] > 0), "the positive must stay in the support"
        # order preserving (Prop. 1b): z_i > z_j => p_i >= p_j
        zi, zj = z[:, :, None], z[:, None, :]
        assert np.all((p[:, :, None] >= p[:, None, :] - tol(1e-12)) | ~(zi > zj))
        # loss = -log p_y
        with float64():
            loss = numpy(rankmax_loss(y, z, k=k))
        want = -np.log(np.minimum(1.0, p[np.arange(B), y]))
        np.testing.assert_allclose(loss, want, atol=tol(1e-10))


def test_projection_is_monotone_in_the_positive_score():
    rng = np.random.default_rng(3)
    z = rng.normal(size=(1, 8))
    bumps = np.linspace(0, 3, 13)
    w = np.repeat(z, bumps.size, 0)
    w[:, 2] += bumps
    ps = _project(w, np.full(bumps.size, 2), k=2)[:, 2]
    assert np.all(np.diff(ps) >= -tol(1e-12)) and ps[-1] == pytest.approx(1.0)


def test_multi_positive_projection_and_padding():
    rng = np.random.default_rng(4)
    z = rng.normal(size=(3, 6))
    ids = np.array([[0, 3], [5, -1], [-1, -1]])
    p = _project(z, ids, k=2)
    assert p.shape == (3, 2, 6)
    for b in range(3):
        for m in range(2):
            want = ref.rankmax(z[b], ids[b, m], 2)[0] if ids[b, m] >= 0 else np.zeros(6)
            np.testing.assert_allclose(p[b, m], want, atol=tol(1e-12))


def test_k1_closed_form_and_erratum():
    rng = np.random.default_rng(5)
    z = rng.normal(size=(50, 20)).astype(np.float32)
    y = rng.integers(0, 20, size=50)
    zy = z[np.arange(50), y][:, None]
    closed = np.log(np.maximum(z - zy + 1, 0).sum(-1))
    loss, (grad,) = value_and_grad(lambda s: rankmax_loss(y, s), z)
    grad = grad / upstream(50)[:, None]
    np.testing.assert_allclose(loss, closed, atol=1e-6)
    # erratum E1: d loss / d z_y = -(s - 1) p_y with s counting y itself
    s = (z > zy - 1).sum(-1)
    p_y = 1.0 / np.maximum(z - zy + 1, 0).sum(-1)
    np.testing.assert_allclose(grad[np.arange(50), y], -(s - 1) * p_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad.sum(-1), 0.0, atol=1e-5 * 20)


@SWEEP
@pytest.mark.parametrize("n,k", [(10, 1), (10, 3), (7, 6)])
def test_all_scores_equal(n, k):
    z = np.full((1, n), 2.5)
    loss, grad = _loss_and_grad(np.array([2]), z, k=k)
    p = _project(z, np.array([2]), k=k)
    np.testing.assert_allclose(p, k / n, atol=tol(1e-12))
    np.testing.assert_allclose(loss, np.log(n / k), atol=tol(1e-12))
    np.testing.assert_allclose(grad[0], 1.0 / n - np.eye(n)[2], atol=tol(1e-12))
    if k == 1:  # equals softmax cross-entropy, value and gradient
        softmax = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        np.testing.assert_allclose(loss, -np.log(softmax[:, 2]), atol=tol(1e-12))
        np.testing.assert_allclose(grad, softmax - np.eye(n)[[2]], atol=tol(1e-12))


@SWEEP
def test_margin_locality_scale_and_shift():
    z = np.array([[3.0, 1.9, 0.5, -2.0]])
    loss, grad = _loss_and_grad(np.array([0]), z)
    assert loss[0] == 0.0 and np.all(grad == 0.0)  # margin >= 1 over every other score
    rng = np.random.default_rng(6)
    z = rng.normal(size=(20, 9))
    y = rng.integers(0, 9, size=20)
    for k in (1, 3):
        p = _project(z, y, k=k)
        scaled = _project(3.7 * z, y, k=k, margin=3.7)
        shifted = _project(z + 50.0, y, k=k)
        np.testing.assert_allclose(scaled, p, atol=tol(1e-12))
        np.testing.assert_allclose(shifted, p, atol=tol(1e-10))


@SWEEP
def test_minus_inf_mask_equals_unpadded_row():
    rng = np.random.default_rng(7)
    z = rng.normal(size=(4, 6))
    y = np.array([0, 2, 5, 1])
    padded = np.concatenate([z, np.full((4, 3), -np.inf)], -1)
    for k in (1, 2):
        for small, big in ((y, y), (np.eye(6)[y], np.eye(9)[y])):
            a = _loss_and_grad(small, z, k=k, max_positives=None)
            b = _loss_and_grad(big, padded, k=k, max_positives=None)
            np.testing.assert_allclose(b[0], a[0], atol=tol(1e-12))
            np.testing.assert_allclose(b[1][:, :6], a[1], atol=tol(1e-12))
            assert np.all(b[1][:, 6:] == 0.0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_computed_in_float32(dtype):
    rng = np.random.default_rng(9)
    z = rng.normal(size=(8, 10)).astype(np.float32)
    y = rng.integers(0, 10, size=8)
    zh = kops.cast(z, dtype)
    got = rankmax_loss(y, zh, k=2)
    assert keras.backend.standardize_dtype(got.dtype) == dtype
    exact = numpy(rankmax_loss(y, kops.cast(zh, "float32"), k=2))  # same inputs, float32
    np.testing.assert_allclose(numpy(kops.cast(got, "float32")), exact, rtol=1e-2)
    assert keras.backend.standardize_dtype(rankmax(y, zh, k=2).dtype) == dtype


def test_float32_large_n_matches_float64():
    rng = np.random.default_rng(10)
    n = 200_000
    z = 100.0 + rng.normal(size=(2, n))
    y = np.array([3, 17])
    for k in (1, 10):
        l64 = _ref_rows(z, [[(t, 1.0)] for t in y], k)[0]
        l32 = numpy(rankmax_loss(y, z.astype(np.float32), k=k))
        np.testing.assert_allclose(l32, l64, rtol=1e-5)


def test_bad_inputs_name_the_argument():
    # more messages: test_eager_errors_name_the_argument
    z = np.array([[0.1, 0.2, 0.3]], np.float32)
    with pytest.raises(ValueError, match="`k`"):
        rankmax_loss([0], z, k=0)
    with pytest.raises(ValueError, match="`k`"):
        rankmax([0], z, k=5)
    with pytest.raises(ValueError, match="`margin`"):
        rankmax([0], z, margin=-1.0)
    with pytest.raises(ValueError, match="shape"):
        rankmax_loss(np.array([[1.0, 0.0]], np.float32), z)


def test_rows_without_positives_have_zero_loss_and_grad():
    z = np.array([[0.3, 1.0, -0.5], [2.0, 0.0, 0.1]])
    for labels in (np.array([-1, 1]), np.array([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])):
        loss, grad = _loss_and_grad(labels, z)
        assert loss[0] == 0.0 and np.all(grad[0] == 0.0)
        assert loss[1] > 0.0


# ----------------------------------------------------------------- issue 9 regressions


@SWEEP
def test_scale_1e8_projection_and_loss_match_reference():
    z = np.array([[3e8, 1e8, 0.0, -1e8]])
    for dtype in (np.float32, np.float64):
        p = _project(z.astype(dtype), np.array([0]))
        np.testing.assert_allclose(p, ref.rankmax(z[0], 0, 1)[0][None], atol=1e-6)
    # all ties at 1e8: log 3 (the positive's own margin term must survive the offset)
    with float64():
        got = numpy(rankmax_loss(np.array([0]), np.array([[1e8, 1e8, 1e8]])))
    np.testing.assert_allclose(got, [np.log(3)], rtol=1e-6)
    np.testing.assert_allclose(ref.rankmax(np.array([1e8] * 3), 0, 1)[4], np.log(3))
    if BACKEND == "torch":  # float64 is float32-accurate inside (see tol): no 1e8 offsets
        return
    # offsets of 1e8 leave loss and gradient unchanged (k = 1 and k = 2)
    rng = np.random.default_rng(3)
    base = rng.normal(size=(4, 6)).astype(np.float64) * 3
    y = np.array([0, 2, 5, 1])
    for k in (1, 2):
        want_l, want_g = _ref_rows(base, [[(yy, 1.0)] for yy in y], k)
        got_l, got_g = _loss_and_grad(y, base + 1e8, k=k)
        np.testing.assert_allclose(got_l, want_l, atol=1e-6)
        np.testing.assert_allclose(got_g, want_g, atol=1e-6)


def test_masked_positive_gives_inf_loss_and_zero_gradient():
    z = np.array([[-np.inf, 1.0, 2.0], [0.5, -np.inf, 0.0]], np.float32)
    for labels in (np.array([0, 0]), np.eye(3, dtype=np.float32)[[0, 0]]):
        loss, (grad,) = value_and_grad(lambda s: rankmax_loss(labels, s), z)
        assert loss[0] == np.inf and np.all(grad[0] == 0)
        np.testing.assert_allclose(
            loss[1], ref.rankmax(np.array([0.5, -1e30, 0.0]), 0, 1)[4], rtol=1e-6
        )
    for mode in TRACED:
        loss = numpy(compiled(lambda y, s: rankmax_loss(y, s), mode)(np.array([0, 0]), z))
        assert np.isinf(loss[0]), mode
    assert np.all(np.isnan(numpy(rankmax([0, 0], z))[0]))


def test_integer_one_hot_is_ambiguous_and_dense_format_matches_float():
    z = np.array([[0.3, 1.0, -0.5]], np.float32)
    with pytest.raises(ValueError, match="`labels` is ambiguous.*`label_format`"):
        rankmax_loss(np.eye(3, dtype="int32")[[0]], z)
    dense = numpy(rankmax_loss(np.eye(3, dtype="int32")[[0]], z, label_format="dense"))
    floats = numpy(rankmax_loss(np.eye(3, dtype="float32")[[0]], z))
    ids = numpy(rankmax_loss(np.array([0]), z))
    np.testing.assert_allclose(dense, floats)
    np.testing.assert_allclose(dense, ids)
    np.testing.assert_allclose(dense, [ref.rankmax(z[0].astype(np.float64), 0, 1)[4]], rtol=1e-6)
    padded = numpy(rankmax_loss(np.array([[0, -1, -1]]), z, label_format="ids"))
    np.testing.assert_allclose(padded, ids)
    with pytest.raises(ValueError, match="`label_format`"):
        rankmax_loss([0], z, label_format="onehot")


def test_float_ids_must_be_whole():
    z = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="`labels`"):
        rankmax_loss(np.array([0.0, 1.5], np.float32), z)
    np.testing.assert_allclose(
        numpy(rankmax_loss(np.array([0.0, 2.0], np.float32), z)),
        numpy(rankmax_loss(np.array([0, 2]), z)),
    )


def test_rankmax_rejects_integer_one_hot_like_rankmax_loss():
    # Issue 19 item 11: rankmax read an integer one-hot row as padded ids (a projection per
    # entry, for ids 0, 1, 0) where rankmax_loss rejects it as ambiguous; one rule now, in
    # every mode (a static check: it raises while tracing too).
    z = np.array([[2.0, 1.0, 0.0]], np.float32)
    one_hot = np.array([[0, 1, 0]], np.int32)
    for fn in (lambda: rankmax(one_hot, z), lambda: rankmax_loss(one_hot, z)):
        with pytest.raises(ValueError, match="`labels` is ambiguous"):
            fn()
    for mode in MODES:
        with pytest.raises(ValueError, match="`labels` is ambiguous"):
            compiled(lambda y: rankmax(y, z), mode)(one_hot)
    # forcing the ids reading gives one projection per listed id
    p = numpy(rankmax(one_hot, z, label_format="ids"))
    for j, y in enumerate([0, 1, 0]):
        want = ref.rankmax(z[0].astype(np.float64), y, 1)[0]
        np.testing.assert_allclose(p[0, j], want, atol=1e-6)
    with pytest.raises(TypeError, match="must be integer ids"):
        rankmax(one_hot, z, label_format="dense")


@SWEEP
def test_keras_label_format_reads_shapes_not_dtypes():
    # Issue 20: RankmaxLoss's "auto" rule lives in the op as label_format="keras".
    rng = np.random.default_rng(20)
    z = rng.normal(size=(4, 5))
    y = np.array([0, 4, 2, 1])
    want, _ = _ref_rows(z, [[(t, 1.0)] for t in y], 1)
    with float64():
        for labels in (y, y[:, None], y.astype(np.float32)[:, None], np.eye(5, dtype=np.int32)[y]):
            got = numpy(rankmax_loss(labels, z, label_format="keras"))
            np.testing.assert_allclose(got, want, atol=tol(1e-10))
        # [B, M] with static M != n: padded ids, integer or float (Keras casts y_true to float).
        padded = np.array([[0, 2, -1], [4, -1, -1], [-1, -1, -1], [1, 3, 0]])
        want, _ = _ref_rows(z, [[(i, 1.0) for i in row if i >= 0] for row in padded], 1)
        for labels in (padded, padded.astype(np.float32)):
            got = numpy(rankmax_loss(labels, z, label_format="keras"))
            np.testing.assert_allclose(got, want, atol=tol(1e-10))
    # "auto" still rejects the ambiguous integer one-hot; both rules name the argument given.
    with pytest.raises(ValueError, match="`y_true` is ambiguous"):
        rankmax_loss(np.eye(5, dtype=np.int32)[y], z, labels_name="y_true")
    with pytest.raises(ValueError, match="`y_pred` must have rank >= 1"):
        rankmax_loss(np.int32(1), np.float32(2.0), logits_name="y_pred")


# ------------------------------------------- every label path in every mode (was tests/backends)


def _data(b=6, n=7, seed=0):
    r = np.random.default_rng(seed)
    return (r.normal(size=(b, n)) * 2).astype(np.float32), r.integers(0, n, b)


def _oracle(z, positives, k):
    """Loss per row and d(sum upstream * loss)/dz from the spec oracle, float64.

    ``positives``: per row, a list of ``(id, weight)``."""
    z = z.astype(np.float64)
    up = upstream(z.shape[0])
    loss = np.array([sum(w * ref.rankmax(r, y, k)[4] for y, w in p) for r, p in zip(z, positives)])
    grad = np.stack(
        [
            u * sum((w * ref.rankmax_loss_grad(r, y, k) for y, w in p), np.zeros(r.size))
            for u, r, p in zip(up, z, positives)
        ]
    )
    return loss, grad


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("mode", MODES)
def test_loss_with_ids_matches_reference(mode, k):
    z, y = _data(seed=k)
    loss, (g,) = value_and_grad(lambda s: rankmax_loss(y, s, k=k), z, mode=mode)
    want, want_g = _oracle(z, [[(t, 1.0)] for t in y], k)
    assert loss.dtype == np.float32
    np.testing.assert_allclose(loss, want, atol=2e-5)
    np.testing.assert_allclose(g, want_g, atol=2e-5)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("mode", MODES)
def test_projection_matches_reference_with_vjp(mode, k):
    z, y = _data(seed=10 + k)
    p, (g,) = value_and_grad(lambda s: rankmax(y, s, k=k), z, mode=mode)
    z64 = z.astype(np.float64)
    want = np.stack([ref.rankmax(r, t, k)[0] for r, t in zip(z64, y)])
    up = upstream(p.shape)
    want_g = np.stack([ref.rankmax_projection_vjp(r, t, k, u) for r, t, u in zip(z64, y, up)])
    np.testing.assert_allclose(p, want, atol=1e-6)
    np.testing.assert_allclose(p.sum(-1), k, atol=1e-5)
    np.testing.assert_allclose(g, want_g, atol=2e-5)


def _dense_labels(kind):
    """Weights [5, 6] with their positives: ``one_hot`` (weight 1.5), or ``multi``: up to two
    positives per row, one of them tiny (1e-30: the row only looks one-hot to the fast
    path's index reading), and a row without positives."""
    _, y = _data(b=5, n=6, seed=3)
    w = np.eye(6, dtype=np.float32)[y] * np.float32(1.5)
    if kind == "multi":
        w[0, (y[0] + 2) % 6] = 0.5
        w[1, (y[1] + 1) % 6] = 1e-30
        w[4] = 0.0
    return w, [[(i, float(r[i])) for i in np.nonzero(r)[0]] for r in w]


@pytest.mark.parametrize(
    "max_positives,kind",
    # 1: the one-hot fast path, and its exact fallback; 2: the ids path on the top-2
    # weights; None: the merged sort.
    [(1, "one_hot"), (1, "multi"), (2, "multi"), (None, "multi")],
)
@pytest.mark.parametrize("mode", PATH_MODES)
def test_dense_labels_every_path(mode, max_positives, kind):
    z, _ = _data(b=5, n=6, seed=3)
    w, positives = _dense_labels(kind)
    fn = lambda s: rankmax_loss(w, s, k=2, max_positives=max_positives)  # noqa: E731
    loss, (g,) = value_and_grad(fn, z, mode=mode)
    want, want_g = _oracle(z, positives, 2)
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(g, want_g, atol=2e-5)
    if kind == "multi":
        assert loss[4] == 0.0 and np.all(g[4] == 0.0)


@pytest.mark.parametrize("mode", PATH_MODES)
def test_padded_ids_and_masked_positive(mode):
    z, _ = _data(b=3, n=6, seed=4)
    ids = np.array([[0, 3], [5, -1], [-1, -1]])
    loss, (g,) = value_and_grad(lambda s: rankmax_loss(ids, s, k=2), z, mode=mode)
    want, want_g = _oracle(z, [[(i, 1.0) for i in r if i >= 0] for r in ids], 2)
    np.testing.assert_allclose(loss, want, atol=2e-5)
    np.testing.assert_allclose(g, want_g, atol=2e-5)
    p = numpy(compiled(lambda s: rankmax(ids, s, k=2), mode)(z))
    assert p.shape == (3, 2, 6) and np.all(p[1, 1] == 0) and np.all(p[2] == 0)
    np.testing.assert_allclose(p[0, 1], ref.rankmax(z[0].astype(np.float64), 3, 2)[0], atol=1e-6)
    masked = z.copy()
    masked[0, 0] = -np.inf
    loss, (g,) = value_and_grad(lambda s: rankmax_loss(np.array([0, 1, 2]), s), masked, mode=mode)
    assert loss[0] == np.inf and np.all(g[0] == 0) and np.all(np.isfinite(loss[1:]))


def test_float64_kept():
    z, y = _data(seed=5)
    # PyTorch: keras.ops demotes float64 (maximum, cumsum, ...), so the op computes in float32
    offset, atol = (0.0, 2e-5) if BACKEND == "torch" else (1e8, 1e-7)
    with float64():
        z64 = z.astype(np.float64) + offset  # offsets of 1e8 keep the margin term exact
        # JAX: jitted (eager float64 recompiles every primitive)
        mode = "jit" if BACKEND == "jax" else "eager"
        loss, (g,) = value_and_grad(lambda s: rankmax_loss(y, s, k=3), z64, mode=mode)
        want, want_g = _oracle(z, [[(t, 1.0)] for t in y], 3)
        assert loss.dtype == np.float64
        np.testing.assert_allclose(loss, want, atol=atol)
        np.testing.assert_allclose(g, want_g, atol=atol)


@pytest.mark.parametrize("mode", TRACED)
def test_traced_bad_rows_are_nan_and_others_untouched(mode):
    """Under XLA / jax.jit the checks cannot raise: the broken rows come back NaN (labels and
    logits are traced arguments; a constant known while tracing raises instead)."""
    z, y = _data(b=4, n=5, seed=6)
    bad_ids = y.copy()
    bad_ids[1], bad_ids[3] = 5, -2
    loss = compiled(lambda lab, s: rankmax_loss(lab, s, k=2), mode)
    proj = compiled(lambda lab, logits: rankmax(lab, logits, k=2), mode)
    for fn in (loss, proj):
        out = numpy(fn(bad_ids, z))
        assert np.all(np.isnan(out[[1, 3]])) and np.all(np.isfinite(out[[0, 2]]))
    nan_z = z.copy()
    nan_z[2, 4] = np.nan
    for fn in (loss, proj):
        out = numpy(fn(y, nan_z))
        assert np.all(np.isnan(out[2])) and np.all(np.isfinite(out[[0, 1, 3]]))
    with losszoo.validation(False):  # the harness' probe runs eagerly
        _, (g,) = value_and_grad(lambda s: rankmax_loss(y, s), nan_z, mode=mode)
    assert np.isnan(g[2, :4]).all() and np.isfinite(g[[0, 1, 3]]).all()
    w = np.eye(5, dtype=np.float32)[y]
    w[0, 1] = -1.0
    w[3, 0] = np.nan
    for max_positives in (1, None):
        out = numpy(
            compiled(lambda lab, s: rankmax_loss(lab, s, max_positives=max_positives), mode)(w, z)
        )
        assert np.isnan(out[[0, 3]]).all() and np.isfinite(out[[1, 2]]).all()


@pytest.mark.parametrize("mode", MODES)
def test_bad_rows_are_nan_without_validation(mode):
    z, y = _data(b=3, n=5, seed=7)
    y[1] = 9
    with losszoo.validation(False):
        out = numpy(compiled(lambda s: rankmax_loss(y, s), mode)(z))
    assert np.isnan(out[1]) and np.isfinite(out[[0, 2]]).all()


def test_eager_errors_name_the_argument():
    z, y = _data(b=3, n=4, seed=8)
    with pytest.raises(ValueError, match=r"`labels` holds class ids.*\[0, K\).*rows \[1\]"):
        rankmax_loss(np.array([0, 4, 1]), z)
    with pytest.raises(ValueError, match=r"`labels` holds class ids.*rows \[2\]"):
        rankmax(np.array([0.0, 1.0, 1.5], np.float32), z)
    nan_z = z.copy()
    nan_z[0, 1] = np.nan
    with pytest.raises(ValueError, match="`logits` must not hold NaN"):
        rankmax_loss(y, nan_z)
    with pytest.raises(ValueError, match="`y_pred` must not hold NaN"):
        rankmax_loss(y, nan_z, logits_name="y_pred")
    with pytest.raises(ValueError, match="`logits` must not hold NaN"):
        rankmax(y, nan_z)
    with pytest.raises(ValueError, match="`labels` must be finite and >= 0"):
        rankmax_loss(-np.eye(4, dtype=np.float32)[y], z)
    with pytest.raises(ValueError, match="`labels` is ambiguous"):
        rankmax_loss(np.eye(4, dtype=np.int32)[y], z)
    with pytest.raises(ValueError, match="`k` must be smaller"):
        rankmax_loss(y, z, k=4)
    with pytest.raises(TypeError, match="`k`"):
        rankmax(y, z, k=2.0)
    with pytest.raises(ValueError, match="`margin`"):
        rankmax_loss(y, z, margin=0.0)
    with pytest.raises(TypeError, match="must be integer ids"):
        rankmax(np.eye(4, dtype=np.float32)[y], z)
