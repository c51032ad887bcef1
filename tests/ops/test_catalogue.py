"""losszoo.ops.catalogue_loss (issue 34): the streamed full-catalogue losses equal the
materialised ones (a float64 NumPy reference of the [B, N] scores), loss and gradients of the
queries and of the table, on every backend and mode; fail loud on bad input.

Backend-neutral: runs under KERAS_BACKEND=tensorflow, jax and torch.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import losszoo
from tests.harness import BACKEND, MODES, compiled, numpy, value_and_grad

catalogue_loss = losszoo.ops.catalogue_loss
COMPILED = MODES[-1]  # xla on TensorFlow, jit on JAX and PyTorch (eager)


def reference(kind, q, t, pos, exclude=None, temperature=1.0, margin=1.0):
    """``(loss [B], dloss/dz [B, N])`` from the materialised scores, float64."""
    z = (q.astype(np.float64) @ t.astype(np.float64).T) / temperature
    rows = np.arange(len(q))
    if exclude is not None:
        for i, ids in enumerate(exclude):
            z[i, ids[ids >= 0]] = -np.inf
    zy = z[rows, pos]
    onehot = np.zeros_like(z)
    onehot[rows, pos] = 1.0
    if kind == "softmax":
        m = z.max(1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(z - m).sum(1))
        return lse - zy, np.exp(z - lse[:, None]) - onehot
    if kind == "rankmax":
        mu = zy - margin
        d = np.maximum(z - mu[:, None], 0).sum(1)
        inside = (z > mu[:, None]).astype(np.float64)
        s = inside.sum(1)
        return np.log(d) - np.log(margin), (inside - s[:, None] * onehot) / d[:, None]
    # sparsemax, sort-based (spec A1)
    zs = -np.sort(-z, axis=1)
    cs = np.cumsum(np.where(np.isfinite(zs), zs, 0.0), axis=1)
    r = np.arange(1, z.shape[1] + 1)
    k = np.sum(1 + r * zs > cs, axis=1)
    tau = (cs[rows, k - 1] - 1) / k
    p = np.maximum(z - tau[:, None], 0)
    loss = 0.5 * (p * p).sum(1) + 0.5 - (zy - tau)
    return np.maximum(loss, 0), p - onehot


def reference_grads(kind, q, t, pos, upstream, **kw):
    loss, g = reference(kind, q, t, pos, **kw)
    g = g * upstream[:, None] / kw.get("temperature", 1.0)
    return loss, g @ t.astype(np.float64), g.T @ q.astype(np.float64)


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def problem(b, n, d=8, scale=1.0, seed=0, num_excluded=6):
    rng = np.random.default_rng(seed)
    q = (rng.normal(size=(b, d)) * scale).astype("float32")
    t = rng.normal(size=(n, d)).astype("float32")
    pos = rng.integers(0, n, b)
    exclude = rng.integers(-1, n, (b, num_excluded))
    exclude[exclude == pos[:, None]] = -1
    # the row's best other items too, so that exclusion changes the support
    top = np.argsort(-(q @ t.T), axis=1)[:, :2]
    top[top == pos[:, None]] = -1
    exclude[:, :2] = top
    return q, t, pos, exclude


def check_exact(kind, q, t, pos, mode, tol=1e-5, **kw):
    def fn(q, t):
        return catalogue_loss(q, t, pos, loss=kind, **kw)

    loss, (gq, gt) = value_and_grad(fn, q, t, mode=mode, argnums=(0, 1))
    upstream = np.random.default_rng(7).uniform(0.5, 1.5, size=loss.shape)
    ref = {k: v for k, v in kw.items() if k in ("exclude", "temperature", "margin")}
    rloss, rq, rt = reference_grads(kind, q, t, pos, upstream, **ref)
    assert loss.shape == (len(q),) and loss.dtype == np.float32
    assert rel(loss, rloss) <= tol, (rel(loss, rloss), loss, rloss)
    assert rel(gq, rq) <= tol, rel(gq, rq)
    assert rel(gt, rt) <= tol, rel(gt, rt)


@pytest.mark.parametrize("kind", ["softmax", "rankmax", "sparsemax"])
@pytest.mark.parametrize("excluded", [False, True])
def test_exact_at_20000_items(kind, excluded):
    """N = 2x10^4, a partial last chunk (20000 = 4 x 4096 + 3616), an odd batch of 7."""
    q, t, pos, exclude = problem(7, 20_000, scale=1.5)
    kw = {"exclude": exclude} if excluded else {}
    check_exact(kind, q, t, pos, COMPILED, chunk_size=4096, temperature=0.7, **kw)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["softmax", "rankmax", "sparsemax"])
def test_exact_every_mode(kind, mode):
    q, t, pos, exclude = problem(5, 3000, seed=1)
    check_exact(kind, q, t, pos, mode, chunk_size=512, exclude=exclude, margin=0.5)


@pytest.mark.parametrize("scale", [0.01, 0.05])
def test_sparsemax_support_beyond_candidates(scale):
    """Near-zero scores (the whole catalogue in the support, as at initialisation) and a wide
    support: the candidates do not cover it and the full Newton passes run."""
    q, t, pos, exclude = problem(6, 5000, scale=scale, seed=2)
    _, g = reference("sparsemax", q, t, pos)
    # some row has a chunk of 1024 with support entries in more than 8 groups of 32
    spans = [np.max(np.bincount(np.unique(np.flatnonzero(r > 0) // 32) // 32)) for r in g]
    assert max(spans) > 8
    check_exact("sparsemax", q, t, pos, COMPILED, chunk_size=1024)
    check_exact("sparsemax", q, t, pos, COMPILED, chunk_size=1024, exclude=exclude)


def test_single_chunk_and_example():
    q = np.array([[1.0, 0.0]], "float32")
    items = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], "float32")
    out = numpy(catalogue_loss(q, items, [1], loss="rankmax"))
    np.testing.assert_allclose(out, [np.log(4.0)], rtol=1e-6)  # the docstring's example
    for kind in ("softmax", "sparsemax"):
        np.testing.assert_allclose(
            numpy(catalogue_loss(q, items, [1], loss=kind)),
            reference(kind, q, items, np.array([1]))[0],
            rtol=1e-6,
        )


@pytest.mark.skipif(BACKEND != "tensorflow", reason="unknown batch size: a TensorFlow graph")
@pytest.mark.parametrize("jit", [False, True])
def test_unknown_batch_tensorflow(jit):
    tf = pytest.importorskip("tensorflow")
    q, t, pos, exclude = problem(4, 2000, seed=3)
    for kind in ("softmax", "rankmax", "sparsemax"):
        fn = tf.function(
            lambda q, p, e, kind=kind: catalogue_loss(
                q, t, p, loss=kind, exclude=e, chunk_size=512
            ),
            input_signature=[
                tf.TensorSpec([None, 8], tf.float32),
                tf.TensorSpec([None], tf.int64),
                tf.TensorSpec([None, None], tf.int64),
            ],
            jit_compile=jit,
        )
        out = fn(q, pos, exclude).numpy()
        np.testing.assert_allclose(
            out, reference(kind, q, t, pos, exclude=exclude)[0], rtol=1e-5, atol=1e-6
        )


# ----------------------------------------------------------------------------- fail loud


@pytest.mark.parametrize("kind", ["softmax", "rankmax", "sparsemax"])
def test_bad_values_raise_eagerly(kind):
    q, t, pos, exclude = problem(3, 600)

    def call(q=q, t=t, pos=pos, exclude=exclude):
        return catalogue_loss(q, t, pos, loss=kind, exclude=exclude, chunk_size=256)

    bad_q, bad_t = q.copy(), t.copy()
    bad_q[1, 2] = np.nan
    bad_t[5, 0] = np.inf
    with pytest.raises(ValueError, match="`queries` contains NaN or Inf"):
        call(q=bad_q)
    with pytest.raises(ValueError, match="`table` contains NaN or Inf"):
        call(t=bad_t)
    with pytest.raises(ValueError, match="`positive_ids` holds class ids"):
        call(pos=np.array([0, 600, 1]))
    with pytest.raises(ValueError, match="`exclude` holds class ids"):
        call(exclude=np.where(exclude == exclude[0, 0], -2, exclude))
    own = exclude.copy()
    own[2, 3] = pos[2]
    with pytest.raises(ValueError, match=r"`exclude` must not list the row's own positive.*\[2\]"):
        call(exclude=own)
    with losszoo.validation(False):  # the NaN rows instead
        assert np.isnan(numpy(call(exclude=own))[2])


@pytest.mark.parametrize("kind", ["softmax", "rankmax", "sparsemax"])
def test_bad_rows_are_nan_when_compiled(kind):
    """As traced for XLA (and with validation off anywhere): bad rows come out NaN, loss and
    gradient, and the other rows keep their values."""
    q, t, pos, exclude = problem(4, 1000, seed=4)
    q[1, 0] = np.nan
    pos[2] = 1000  # out of range
    exclude[3, 1] = pos[3]  # removes the positive

    def fn(q, t):
        return catalogue_loss(q, t, pos, loss=kind, exclude=exclude, chunk_size=256)

    with losszoo.validation(False):  # the harness calls fn eagerly once; traced: no checks
        loss, (gq, gt) = value_and_grad(fn, q, t, mode=COMPILED, argnums=(0, 1))
    assert np.isnan(loss[1:]).all() and np.isfinite(loss[0])
    assert np.isnan(gq[1:]).all(axis=1).all() and np.isfinite(gq[0]).all()
    assert np.isnan(gt).any()  # NaN in never becomes finite out
    ok = [0]
    np.testing.assert_allclose(
        loss[ok], reference(kind, q[ok], t, pos[ok], exclude=exclude[ok])[0], rtol=1e-5
    )


def test_nan_table_is_nan_everywhere_when_compiled():
    q, t, pos, _ = problem(3, 1000, seed=5)
    t[17, 3] = np.nan
    fn = compiled(lambda q, t: catalogue_loss(q, t, pos, chunk_size=256), COMPILED)
    with losszoo.validation(False):
        assert np.isnan(numpy(fn(q, t))).all()


def test_bad_arguments():
    q, t, pos, _ = problem(2, 600)
    with pytest.raises(ValueError, match="`loss` must be one of"):
        catalogue_loss(q, t, pos, loss="hinge")
    with pytest.raises(ValueError, match="`chunk_size` must be a multiple of 256"):
        catalogue_loss(q, t, pos, chunk_size=300)
    with pytest.raises(ValueError, match="`temperature` must be > 0"):
        catalogue_loss(q, t, pos, temperature=0.0)
    with pytest.raises(ValueError, match="differ in d"):
        catalogue_loss(q, t[:, :4], pos)
    with pytest.raises(ValueError, match="`positive_ids` must be \\[B\\]"):
        catalogue_loss(q, t, pos[:, None])
    assert keras.backend.backend() == BACKEND


@pytest.mark.parametrize("gpu, chunk", [(False, 8192), (True, 32768)])
def test_default_chunk_size_follows_the_platform(monkeypatch, gpu, chunk):
    """``chunk_size=None``: chunks of 8192 items, of 32768 where programs run on a GPU; the
    loss is the materialised one either way (eager, so no compiled program is reused)."""
    from losszoo.ops import _catalogue

    seen = []
    sweep = _catalogue._sweep

    def spy(qs, table3, *args, **kwargs):
        seen.append(table3.shape[1])
        return sweep(qs, table3, *args, **kwargs)

    monkeypatch.setattr(_catalogue._backend, "compiles_for_gpu", lambda: gpu)
    monkeypatch.setattr(_catalogue, "_sweep", spy)
    rng = np.random.default_rng(5)
    q, t = rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(40_000, 4))
    pos = np.array([0, 17, 39_999])
    got = numpy(catalogue_loss(q, t.astype(np.float32), pos))
    np.testing.assert_allclose(got, reference("softmax", q, t, pos)[0], rtol=1e-5)
    assert seen and set(seen) == {chunk}
