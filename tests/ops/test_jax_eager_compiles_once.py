"""On JAX an eager call of a kernel with loops compiles once per shape (``jit_on_jax``).

Outside any ``jit`` JAX ran such kernels op by op and compiled each ``while_loop`` / ``cond``
anew at every call (their bodies are new closures): 4-5 s per BCSoftmax call and 0.9 s per
sparsemax call at 64x512 on a loaded 2-core machine, against 0.01 and 0.001 s now.
"""

import numpy as np
import pytest

import losszoo
from losszoo.ops import _bcsoftmax, _sparsemax
from tests.harness import BACKEND, float64
from tests.ops.test_possibilistic import _slsqp, _softmax
from tests.references import load_reference

pytestmark = pytest.mark.skipif(BACKEND != "jax", reason="JAX-only: the eager jit cache")
DRO = load_reference("safe_kl_dro")


def test_repeated_eager_calls_reuse_one_program():
    rng = np.random.default_rng(0)
    kernels = (
        _bcsoftmax._kernel,
        _sparsemax._sparsemax_last_axis,
        _sparsemax._sparsemax_loss_default,
    )
    before = [k._cache_size() for k in kernels]
    q = np.zeros((8, 37), "float32")
    q[np.arange(8), rng.integers(0, 37, 8)] = 1.0
    for _ in range(3):  # new values, same shapes
        x = rng.normal(size=(8, 37)).astype("float32")
        y = np.asarray(losszoo.ops.bcsoftmax(x, 0.001, 0.2, 0.3))
        p = np.asarray(losszoo.ops.sparsemax(x))
        l = np.asarray(losszoo.ops.sparsemax_loss(q, x))
        np.testing.assert_allclose(y.sum(-1), 1.0, atol=1e-5)
        np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
        assert np.all(l >= 0)
    assert [k._cache_size() - b for k, b in zip(kernels, before)] == [1, 1, 1]


def test_possibilistic_loss_compiles_nothing_after_its_first_call(caplog):
    # The interior point's finish is a ``cond`` outside its loop: run op by op it was compiled
    # anew at every eager call (49 compiles, 64 s, in one 15-epoch `jit_compile=False` fit).
    import jax

    rng = np.random.default_rng(1)
    calls = []
    with float64():
        for _ in range(3):  # new values, same shapes
            z = rng.normal(size=(6, 5))
            pi = rng.uniform(size=(6, 5))
            pi[np.arange(6), rng.integers(0, 5, 6)] = 1.0
            caplog.clear()
            with jax.log_compiles(True), caplog.at_level("WARNING"):
                value, grad = jax.value_and_grad(
                    lambda z: losszoo.ops.possibilistic_projection_loss(pi, z).sum()
                )(z)
            calls.append([r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()])
            # the gradient is softmax(z) - p*, p* the KL projection (scipy's SLSQP)
            q = _softmax(z)
            p = q - np.asarray(grad)
            for i in range(len(z)):
                np.testing.assert_allclose(p[i], _slsqp(q[i], pi[i]), atol=2e-6)
            want = np.sum(p * np.log(np.maximum(p, 1e-300) / q))  # sum of KL(p* || q)
            np.testing.assert_allclose(float(value), want, rtol=1e-9)
    assert calls[0], "the first call compiles"
    assert calls[1:] == [[], []], calls[1:]


def test_safe_kl_dro_compiles_nothing_after_its_first_call(caplog):
    # The loss solves alpha in a ``cond`` on its first step (and the op in a ``while_loop``):
    # run op by op, both were compiled anew at every call.
    import jax

    rng = np.random.default_rng(2)
    loss = losszoo.get("safe_kl_dro", kind="loss")
    calls = []
    for _ in range(3):  # new values, same shapes
        y = rng.integers(0, 3, 8).astype("float32")
        z = rng.normal(size=(8, 3)).astype("float32")
        l = rng.uniform(0.0, 3.0, 8).astype("float32")
        caplog.clear()
        with jax.log_compiles(True), caplog.at_level("WARNING"):
            value, grad = jax.value_and_grad(lambda z: loss(y, z))(z)
            alpha = losszoo.ops.safe_kl_dro_solve_alpha(l, lam=1.0, rho=0.1)
        calls.append([r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()])
        assert np.isfinite(float(value)) and np.all(np.isfinite(np.asarray(grad)))
        np.testing.assert_allclose(float(alpha), DRO.solve_alpha(l, 1.0, 0.1), atol=1e-5)
    assert calls[0], "the first call compiles"
    assert calls[1:] == [[], []], calls[1:]
