"""Seam tests: every registered loss and head in an ordinary Keras run, on every backend
(issue 19, issue 32 item 3).

The partial-batch regression of issue 19 (item 1) passed every method's own tests: they ran
the ops and ``fit`` at static batch sizes only. Here:

* each registered loss (by name, defaults) and head trains with ``fit`` on data whose last
  batch is partial (TensorFlow: a ``tf.data`` pipeline, so the step is traced with a ``None``
  batch; JAX and PyTorch: arrays with a ``batch_size``), with ``jit_compile`` True, False and
  ``"auto"`` (PyTorch: False; its ``"auto"`` is False and its True is ``torch.compile``); the
  loss must be finite and go down, the weights must move and the model must learn the labels
  (a name whose defaults train nothing is the worst bug). ``evaluate`` (NumPy arrays with a
  ``batch_size``, again a partial last batch) must equal an independent computation over the
  whole data: NumPy references where the maths is short, the loss called once on the whole
  data otherwise, and for the batch risks (DRO) the size-weighted mean of each batch's risk;
* each loss takes per-token scores ``[B, T, K]`` the way Keras' ``CategoricalCrossentropy``
  does (the same value as the flattened ``[B * T, K]`` batch) or raises a clear error naming
  the argument.

Every public op under ``tf.function`` with ``None`` dimensions: ``test_seams_tensorflow.py``.
"""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest

import losszoo
from tests.harness import BACKEND, classification_data, float64
from tests.references import load_reference

N, D, K, BATCH = 40, 4, 3, 16  # batches of 16, 16 and 8: the last one is partial
EPOCHS = 15
MIN_ACCURACY = 0.75  # training accuracy after fit; the majority class is 15 of 40 (0.375)
JIT_MODES = [True, False, "auto"]
# Keras resolves "auto" to True on JAX (and TensorFlow on the CPU) and to False on PyTorch;
# PyTorch's True is torch.compile (minutes per loss on a 2-core CPU), not losszoo's contract.
TORCH_COMPILE = "torch.compile: outside losszoo's contract (tests/harness.py MODES)"

RANKMAX = load_reference("rankmax_sparsemax")
DRO = load_reference("safe_kl_dro")

POSSIBILITY_LABELS = (
    losszoo.losses.PossibilisticProjectionLoss,
    losszoo.losses.AntipignisticKLLoss,
)
BATCH_RISKS = (
    losszoo.losses.CVaRLoss,
    losszoo.losses.KLDROBatchLSE,
    losszoo.losses.KLDROSumExp,
    losszoo.losses.SafeKLDRORisk,
)


@pytest.fixture(autouse=True)
def _float64():
    """The possibilistic losses compute in float64 (on JAX: x64 mode, on for each test)."""
    with float64():
        yield


def _numpy(t, dtype=None):
    """A tensor of the running backend (a torch tensor may carry its autograd graph) as numpy."""
    return np.asarray(keras.ops.convert_to_numpy(keras.ops.stop_gradient(t)), dtype)


def _data():
    x, y = classification_data(n=N, k=K, d=D, seed=4)  # classes of 14, 11 and 15
    return x, y


def labels_for(cls, ids, k, seed=0):
    """The labels a loss class takes (read from its docstring), for class ids ``ids``.

    Possibility rows (1 for the true class, graded below) for the possibilistic losses, vote
    counts (a majority for the true class) for ``vote_kl``, class ids otherwise.
    """
    rng = np.random.default_rng(seed)
    if issubclass(cls, POSSIBILITY_LABELS):
        rows = rng.uniform(0.05, 0.6, ids.shape + (k,))
        np.put_along_axis(rows, ids[..., None], 1.0, -1)
        return rows.astype(np.float32)
    if issubclass(cls, losszoo.losses.VoteKLLoss):
        votes = rng.integers(0, 2, ids.shape + (k,)).astype(np.float64)
        np.put_along_axis(votes, ids[..., None], 3.0, -1)
        return votes.astype(np.float32)
    return ids.astype(np.float32)


# ----------------------------------------------------------------------------- references
def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _kl_to_softmax(target, z):
    """``KL(target || softmax(z))`` per row (``0 log 0 = 0``)."""
    t = np.asarray(target, np.float64)
    log_t = np.log(np.where(t > 0, t, 1.0))
    return np.sum(np.where(t > 0, t * (log_t - _log_softmax(z)), 0.0), -1)


def _antipignistic(pi):
    """``pdot_sigma(r) = sum_{j >= r} (pt_j - pt_{j+1}) / j`` of the max-normalised ``pi``."""
    pi = pi / pi.max(-1, keepdims=True)
    order = np.argsort(-pi, -1, kind="stable")
    pt = np.take_along_axis(pi, order, -1)
    steps = (pt - np.concatenate([pt[:, 1:], np.zeros_like(pt[:, :1])], -1)) / np.arange(
        1, pi.shape[-1] + 1
    )
    pdot_sorted = np.cumsum(steps[:, ::-1], -1)[:, ::-1]
    pdot = np.empty_like(pdot_sorted)
    np.put_along_axis(pdot, order, pdot_sorted, -1)
    return pdot


def _per_example_reference(cls, labels, z):
    """Float64 NumPy per-example loss of ``cls`` (defaults), or None where there is none."""
    ids = labels.astype(int)
    onehot = np.eye(z.shape[-1])[ids] if labels.ndim == 1 else None
    if issubclass(cls, losszoo.losses.SparsemaxLoss):
        return np.array([RANKMAX.sparsemax_loss(zi, qi) for zi, qi in zip(z, onehot)])
    if issubclass(cls, losszoo.losses.RankmaxLoss):
        return np.array([RANKMAX.rankmax(zi, yi, 1, 1.0)[4] for zi, yi in zip(z, ids)])
    if issubclass(cls, losszoo.losses.VoteKLLoss):
        return _kl_to_softmax(labels / labels.sum(-1, keepdims=True), z)
    if issubclass(cls, losszoo.losses.AntipignisticKLLoss):
        return _kl_to_softmax(_antipignistic(labels.astype(np.float64)), z)
    if cls.__name__ == "SoftmaxCrossEntropyLoss":
        return -np.take_along_axis(_log_softmax(z), ids[:, None], -1)[:, 0]
    return None


def _batch_risk_reference(loss, per_example, logs):
    """The risk of ``loss`` (a batch risk) of one batch of per-example base losses."""
    if isinstance(loss, losszoo.losses.CVaRLoss):
        return DRO.cvar(per_example, loss.rho)
    if isinstance(loss, losszoo.losses.KLDROBatchLSE):
        return DRO.batch_lse_risk(per_example, loss.lam)
    if isinstance(loss, losszoo.losses.KLDROSumExp):
        return np.mean(np.exp(per_example / loss.lam))
    alpha = logs[f"{loss.name}_alpha"]  # evaluate never moves alpha: one value throughout
    value = DRO.safe_risk(per_example, alpha, loss.lam, loss.rho)[0]
    return value if loss.calibrate else value + loss.lam


def expected_evaluate(kind, name, model, x, labels, logs):
    """What ``evaluate`` must report, computed independently over the whole data."""
    if kind == "head":
        logits = _numpy(model.layers[0](x), np.float64)
        if name == "sparsemax":  # compiled with loss="sparsemax": trains on the head's logits
            return _per_example_reference(losszoo.losses.SparsemaxLoss, labels, logits).mean()
        probs = _numpy(model(x), np.float64)  # Keras' sparse CE on probabilities
        probs = np.clip(probs / probs.sum(-1, keepdims=True), 1e-7, 1 - 1e-7)
        return -np.log(probs[np.arange(len(labels)), labels.astype(int)]).mean()
    loss = losszoo.get(name)
    z = _numpy(model(x), np.float64)
    if isinstance(loss, BATCH_RISKS):
        per_example = _numpy(loss.per_example_losses(labels, model(x)), np.float64)
        starts = range(0, len(x), BATCH)
        risks = [_batch_risk_reference(loss, per_example[i : i + BATCH], logs) for i in starts]
        sizes = [len(per_example[i : i + BATCH]) for i in starts]
        return np.dot(risks, sizes) / len(x)  # Keras weights each batch's loss by its size
    reference = _per_example_reference(type(loss), labels, z)
    if reference is not None:
        return reference.mean()
    return float(_numpy(loss(labels, model(x))))  # one call on the whole data: no batch seams


# ----------------------------------------------------------------------------- fit / evaluate
def _cases():
    return [("loss", name) for name in losszoo.names("loss")] + [
        ("head", name) for name in losszoo.names("head")
    ]


def build(kind, name, labels_ids):
    """``(model, compile loss, labels)`` for a registered name, with its defaults."""
    dense = keras.layers.Dense(K)
    if kind == "loss":
        model = keras.Sequential([keras.Input((D,)), dense])
        return model, name, labels_for(losszoo.get_class(name, "loss"), labels_ids, K)
    model = keras.Sequential([keras.Input((D,)), dense, losszoo.get(name, kind="head")])
    loss = "sparsemax" if name == "sparsemax" else "sparse_categorical_crossentropy"
    return model, loss, labels_ids.astype(np.float32)


@pytest.mark.parametrize("jit", JIT_MODES, ids=lambda j: f"jit={j}")
@pytest.mark.parametrize(("kind", "name"), _cases(), ids=lambda v: str(v))
def test_fit_and_evaluate_with_a_partial_last_batch(kind, name, jit):
    if BACKEND == "torch" and jit is True:
        pytest.skip(TORCH_COMPILE)
    x, y = _data()
    model, loss, labels = build(kind, name, y)
    if jit != "auto":
        # Keras' compile() resolves "auto" to a bool for this model before any step is built
        # (TensorFlow on CPU: False; JAX: True; PyTorch: False): that case is [jit=auto]'s run
        model.compile(loss=loss, jit_compile="auto")
        auto = model.jit_compile
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=loss, jit_compile=jit)
    if jit != "auto" and model.jit_compile == auto:
        pytest.skip(f'jit_compile={jit!r} is what "auto" resolves to here: [jit=auto] runs it')
    initial = model.get_weights()
    if BACKEND == "tensorflow":
        import tensorflow as tf

        data = {"x": tf.data.Dataset.from_tensor_slices((x, labels)).batch(BATCH)}
        assert data["x"].element_spec[0].shape[0] is None  # the step is traced with a None batch
    else:
        data = {"x": x, "y": labels, "batch_size": BATCH}

    history = model.fit(**data, epochs=EPOCHS, shuffle=False, verbose=0).history["loss"]
    assert np.all(np.isfinite(history)), f"{name}: non-finite training loss {history}"
    assert history[-1] < history[0], f"{name}: training loss did not decrease: {history}"
    moved = max(np.max(np.abs(a - b)) for a, b in zip(model.get_weights(), initial))
    assert moved > 1e-3, f"{name}: training did not change the weights"
    accuracy = np.mean(np.argmax(_numpy(model(x)), -1) == y)
    assert accuracy >= MIN_ACCURACY, (
        f"{name} with its defaults trains on a logits model but does not learn the labels: "
        f"training accuracy {accuracy:.2f}"
    )

    logs = model.evaluate(x, labels, batch_size=BATCH, verbose=0, return_dict=True)
    assert np.isfinite(logs["loss"]), logs
    want = expected_evaluate(kind, name, model, x, labels, logs)
    np.testing.assert_allclose(logs["loss"], want, rtol=2e-5, err_msg=f"{name}: evaluate")


# ----------------------------------------------------------------------------- per-token [B, T, K]
@pytest.mark.parametrize("name", losszoo.names("loss"))
def test_per_token_scores_work_like_categorical_crossentropy(name):
    rng = np.random.default_rng(1)
    b, t, k = 2, 3, 4
    ids = rng.integers(0, k, (b, t))
    labels = labels_for(losszoo.get_class(name, "loss"), ids, k)
    scores = rng.normal(size=(b, t, k)).astype(np.float32)
    try:
        value = losszoo.get(name)(labels, scores)
    except (ValueError, TypeError) as err:  # allowed: a clear error naming the argument
        assert re.search(r"`(y_true|y_pred|labels|logits)`", str(err)), f"{name}: unclear: {err}"
        return
    flat = losszoo.get(name)(labels.reshape((b * t,) + labels.shape[2:]), scores.reshape(-1, k))
    assert value.shape == flat.shape == ()
    np.testing.assert_allclose(value, flat, rtol=1e-6, err_msg=f"{name}: [B, T, K] != flattened")


@pytest.mark.parametrize("name", losszoo.names("loss"))
def test_sample_weight_of_the_wrong_length_names_the_argument(name):
    rng = np.random.default_rng(2)
    ids = rng.integers(0, K, 5)
    labels = labels_for(losszoo.get_class(name, "loss"), ids, K)
    scores = rng.normal(size=(5, K)).astype(np.float32)
    loss = losszoo.get(name)
    # Weights of ones are the unweighted loss; one weight too many is an error naming them.
    np.testing.assert_allclose(
        loss(labels, scores, sample_weight=np.ones(5)), loss(labels, scores), rtol=1e-6
    )
    with pytest.raises(ValueError, match="`sample_weight`"):
        loss(labels, scores, sample_weight=np.ones(6))
