"""Rankmax projection and loss on the running backend: values and gradients against the spec's
numpy oracle (``rankmax``, ``rankmax_loss_grad``, ``rankmax_projection_vjp``) for every label
path, NaN rows when traced, errors naming the argument when eager."""

import numpy as np
import pytest

import losszoo
from losszoo.ops import rankmax, rankmax_loss
from tests.harness import BACKEND, MODES, compiled, float64, numpy, value_and_grad
from tests.references import load_reference

ref = load_reference("rankmax_sparsemax")
TRACED = [m for m in MODES if m == "xla" or (m == "jit" and BACKEND == "jax")]
# JAX runs eager code op by op (one compilation per primitive and shape): the label paths
# below run jitted there; their forward still runs eagerly as the harness' probe.
PATH_MODES = ("jit",) if BACKEND == "jax" else MODES


def _upstream(shape):
    """The harness' weighting of the outputs (see ``value_and_grad``)."""
    return np.random.default_rng(7).uniform(0.5, 1.5, size=shape)


def _data(b=6, n=7, seed=0):
    r = np.random.default_rng(seed)
    return (r.normal(size=(b, n)) * 2).astype(np.float32), r.integers(0, n, b)


def _oracle(z, positives, k):
    """Loss per row and d(sum upstream * loss)/dz from the spec oracle, float64.

    ``positives``: per row, a list of ``(id, weight)``."""
    z = z.astype(np.float64)
    up = _upstream(z.shape[0])
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
    p, (g,) = value_and_grad(lambda s: rankmax(s, y, k=k), z, mode=mode)
    z64 = z.astype(np.float64)
    want = np.stack([ref.rankmax(r, t, k)[0] for r, t in zip(z64, y)])
    up = _upstream(p.shape)
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
    p = numpy(compiled(lambda s: rankmax(s, ids, k=2), mode)(z))
    assert p.shape == (3, 2, 6) and np.all(p[1, 1] == 0) and np.all(p[2] == 0)
    np.testing.assert_allclose(p[0, 1], ref.rankmax(z[0].astype(np.float64), 3, 2)[0], atol=1e-6)
    masked = z.copy()
    masked[0, 0] = -np.inf
    loss, (g,) = value_and_grad(lambda s: rankmax_loss(np.array([0, 1, 2]), s), masked, mode=mode)
    assert loss[0] == np.inf and np.all(g[0] == 0) and np.all(np.isfinite(loss[1:]))


def test_float64_kept_and_half_precision_in_float32():
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
    half = numpy(rankmax_loss(y, z.astype(np.float16), k=3))
    assert half.dtype == np.float16
    exact = numpy(rankmax_loss(y, z.astype(np.float16).astype(np.float32), k=3))
    np.testing.assert_allclose(half.astype(np.float32), exact, rtol=1e-2)


@pytest.mark.parametrize("mode", TRACED)
def test_traced_bad_rows_are_nan_and_others_untouched(mode):
    """Under XLA / jax.jit the checks cannot raise: the broken rows come back NaN (labels and
    logits are traced arguments; a constant known while tracing raises instead)."""
    z, y = _data(b=4, n=5, seed=6)
    bad_ids = y.copy()
    bad_ids[1], bad_ids[3] = 5, -2
    loss = compiled(lambda lab, s: rankmax_loss(lab, s, k=2), mode)
    proj = compiled(lambda lab, logits: rankmax(logits, lab, k=2), mode)
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
        rankmax(z, np.array([0.0, 1.0, 1.5], np.float32))
    nan_z = z.copy()
    nan_z[0, 1] = np.nan
    with pytest.raises(ValueError, match="`logits` must not hold NaN"):
        rankmax_loss(y, nan_z)
    with pytest.raises(ValueError, match="`y_pred` must not hold NaN"):
        rankmax_loss(y, nan_z, logits_name="y_pred")
    with pytest.raises(ValueError, match="`logits` must not hold NaN"):
        rankmax(nan_z, y)
    with pytest.raises(ValueError, match="`labels` must be finite and >= 0"):
        rankmax_loss(-np.eye(4, dtype=np.float32)[y], z)
    with pytest.raises(ValueError, match="`labels` is ambiguous"):
        rankmax_loss(np.eye(4, dtype=np.int32)[y], z)
    with pytest.raises(ValueError, match="`k` must be smaller"):
        rankmax_loss(y, z, k=4)
    with pytest.raises(TypeError, match="`k`"):
        rankmax(z, y, k=2.0)
    with pytest.raises(ValueError, match="`margin`"):
        rankmax_loss(y, z, margin=0.0)
    with pytest.raises(TypeError, match="must be integer ids"):
        rankmax(z, np.eye(4, dtype=np.float32)[y])


def test_keras_loss_on_this_backend():
    z, y = _data(seed=9)
    loss = losszoo.losses.RankmaxLoss(k=2, reduction=None)
    want, _ = _oracle(z, [[(t, 1.0)] for t in y], 2)
    for labels in (y, y.astype(np.float32)[:, None], np.eye(7, dtype=np.float32)[y]):
        np.testing.assert_allclose(numpy(loss(labels, z)), want, atol=2e-5)
    with pytest.raises(ValueError, match="`y_true` holds class ids"):
        loss(np.full(6, 7.0, np.float32), z)
