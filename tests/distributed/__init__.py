"""Distribution tests: every registered loss on N replicas vs one device (same global batch).

Shared here: the per-loss targets and the tiny model, so the MirroredStrategy tests, the
MultiWorkerMirroredStrategy workers (``_mwms_worker.py``, run as subprocesses) and the
single-device references build exactly the same problem.
"""

from __future__ import annotations

import numpy as np

K = 3  # classes
D = 4  # features
BATCH = 16  # global batch (8 per replica on 2 replicas)


def targets(name: str, x: np.ndarray) -> np.ndarray:
    """What loss ``name`` takes as ``y_true`` for features ``x``: ids, possibilities or votes."""
    r = np.random.default_rng(1)
    ids = np.argmax(x[:, :K] + 0.5 * r.normal(size=(len(x), K)), 1)
    if name in ("antipignistic_kl", "possibilistic_projection"):
        pi = r.uniform(0.0, 0.7, size=(len(x), K)).astype(np.float32)
        pi[np.arange(len(x)), ids] = 1.0
        return pi
    if name == "vote_kl":
        votes = r.integers(0, 3, size=(len(x), K)).astype(np.float32)
        votes[np.arange(len(x)), ids] += 2.0
        return votes
    return ids.astype(np.int32)


def data(name: str, n: int = BATCH, seed: int = 0):
    x = np.random.default_rng(seed).normal(size=(n, D)).astype(np.float32)
    return x, targets(name, x)


def build_model():
    """Keras 3 MLP ``D -> 8 -> K`` with fixed initial weights (seeded initialisers)."""
    import keras

    init = keras.initializers.GlorotUniform
    return keras.Sequential(
        [
            keras.Input((D,)),
            keras.layers.Dense(8, activation="tanh", kernel_initializer=init(seed=1)),
            keras.layers.Dense(K, kernel_initializer=init(seed=2)),
        ]
    )


def make_loss(name: str):
    """The registered loss ``name``; DRO risks over cross-entropy *on logits* (the model's
    output), so their losses stay in a sane range and training moves every weight."""
    import keras

    import losszoo

    entry_cls = losszoo.get_class(name, "loss")
    if callable(getattr(entry_cls, "per_example_losses", None)):
        base = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        return losszoo.get(name, base_loss=base)
    return losszoo.get(name)


def dro_state(loss) -> dict:
    """Observable DRO state of a loss (alpha of safe_kl_dro), empty for stateless losses."""
    alpha = getattr(loss, "alpha", None)
    return {} if alpha is None else {"alpha": float(np.asarray(alpha))}
