"""Safe-KL DRO risk: forward+backward against a plain mean of the same losses, and a full
model forward+backward (the training step's compute) with the safe-KL risk against ERM.

Targets (issue 6): report the risk/mean ratios at batch 10, 1024 and 2^20; the model step with
the safe-KL risk <= 1.1x the ERM step on the same model.

The real target is a full Keras ``model.fit`` training step (forward, loss, backward, Adam
update, metrics, and for safe-KL the alpha update and diagnostics). The harness times one
function at a time, so :func:`fit_step_rows` measures that separately: the compiled
``model.train_function`` of an ERM model and of safe-KL models (identical MLP 64-256-10,
batch 256, Adam) are called in interleaved blocks (order alternating each round) and the
per-step medians and the median of the per-round ratios are reported, under
``jit_compile=True`` and ``False`` on TensorFlow (mode ``fit jit`` / ``fit graph``). On JAX
(``jit_compile=True``, mode ``fit jax:jit``) and PyTorch (eager, mode ``fit torch:eager``) the
step is ``model.train_on_batch`` (JAX's ``train_function`` takes the model state explicitly),
which adds the same per-call overhead to ERM and safe-KL. ``cases()`` prints these rows into
run.py's table (they appear first). Standalone: ``python benchmarks/bench_dro.py [--quick]``.
The ``Case`` rows run on every backend in the harness' modes.
"""

import functools
import math
import statistics
import time

import numpy as np
from harness import BACKEND, Case
from keras import ops as kops

from losszoo import ops

LAM, RHO = 1.0, 0.1


def _losses(batch, seed=0):
    def make():
        rng = np.random.default_rng(seed)
        return rng.gamma(2.0, size=batch).astype(np.float32), np.float32(1.5)

    return make


def safe_kl(l, alpha):
    return ops.safe_kl_dro_risk(l, alpha, LAM, RHO)


def plain_mean(l, alpha):
    return kops.mean(l) + 0.0 * alpha


def reduce_logsumexp(l, alpha):
    return LAM * (kops.logsumexp(l / LAM) - math.log(float(l.shape[0]))) + 0.0 * alpha


def batch_lse(l, alpha):
    return ops.kl_dro_batch_lse(l, LAM) + 0.0 * alpha


# ---- model step: 2-layer MLP, per-example cross-entropy, gradient w.r.t. all weights
def _model_inputs(batch, d=64, h=256, k=10, seed=0):
    def make():
        rng = np.random.default_rng(seed)
        return (
            rng.normal(size=(d, h)).astype(np.float32) / 8,
            rng.normal(size=(h, k)).astype(np.float32) / 16,
            rng.normal(size=(batch, d)).astype(np.float32),
            rng.integers(0, k, batch).astype(np.int32),
            np.float32(0.5),
        )

    return make


def _per_example(w1, w2, x, y):
    logits = kops.matmul(kops.relu(kops.matmul(x, w1)), w2)
    return kops.sparse_categorical_crossentropy(y, logits, from_logits=True)


def model_safe_kl(w1, w2, x, y, alpha):
    return ops.safe_kl_dro_risk(_per_example(w1, w2, x, y), alpha, LAM, RHO)


def model_erm(w1, w2, x, y, alpha):
    return kops.mean(_per_example(w1, w2, x, y)) + 0.0 * alpha


# ---- full model.fit training step: safe-KL vs ERM, interleaved
def _fit_models(jit, variants, batch=256, seed=0):
    import keras

    from losszoo.losses import SafeKLDRORisk  # noqa: F401  (registers the loss)

    rng = np.random.default_rng(seed)
    data = [
        (
            kops.convert_to_tensor(rng.normal(size=(batch, 64)).astype(np.float32)),
            kops.convert_to_tensor(rng.integers(0, 10, batch).astype(np.int32)),
        )
        for _ in range(8)
    ]
    fns = {}
    for name, make_loss in variants.items():
        keras.utils.set_random_seed(seed)
        model = keras.Sequential(
            [keras.Input((64,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)]
        )
        model.compile(keras.optimizers.Adam(1e-3), loss=make_loss(), jit_compile=jit)
        x0, y0 = (kops.convert_to_numpy(t) for t in data[0])
        model.fit(x0, y0, batch_size=batch, epochs=1, verbose=0)
        if BACKEND == "tensorflow":
            train = model.train_function  # the compiled step that fit calls

            def step(batch, train=train):
                return train([batch])
        else:  # JAX's train_function takes the state explicitly: the public one-step call
            step = functools.partial(_train_on_batch, model)
        fns[name] = step
    return fns, data


def _train_on_batch(model, batch):
    return model.train_on_batch(*batch, return_dict=True)


def _time_block(fn, data, steps):
    start = time.perf_counter()
    for i in range(steps):
        out = fn(data[i % len(data)])
    float(out["loss"])  # wait for the last step
    return (time.perf_counter() - start) / steps


# jit_compile settings timed per backend (PyTorch's jit_compile=True is torch.compile)
FIT_JIT = {"tensorflow": (True, False), "jax": (True,), "torch": (False,)}


def _fit_mode(jit):
    if BACKEND == "tensorflow":
        return "jit" if jit else "graph"
    return f"{BACKEND}:{'jit' if jit else 'eager'}"


def fit_step_rows(quick=False):
    """Interleaved timing of full training steps; returns run.py-style table rows."""
    import keras

    from losszoo.losses import SafeKLDRORisk

    def ce():
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    variants = {
        "erm": ce,
        "safe_kl (default: newton alpha, first-batch init)": lambda: SafeKLDRORisk(ce()),
        "safe_kl (alpha_optimizer='auto' -> Adam)": lambda: SafeKLDRORisk(
            ce(), alpha_optimizer="auto"
        ),
        "safe_kl (init_alpha_from_batch=False)": lambda: SafeKLDRORisk(
            ce(), init_alpha_from_batch=False
        ),
    }
    rounds, steps = (6, 10) if quick else (15, 20)
    rows = []
    for jit in FIT_JIT[BACKEND]:
        fns, data = _fit_models(jit, variants)
        for fn in fns.values():
            _time_block(fn, data, 5)
        times = {n: [] for n in fns}
        names = list(fns)
        for r in range(rounds):
            for n in names if r % 2 == 0 else names[::-1]:
                times[n].append(_time_block(fns[n], data, steps))
        erm = statistics.median(times["erm"])
        for n in names[1:]:
            med = statistics.median(times[n])
            paired = statistics.median(a / b for a, b in zip(times[n], times["erm"]))
            rows.append(
                f"| model.fit step {n} | MLP 64-256-10, B=256, Adam | "
                f"fit {_fit_mode(jit)} | {med * 1e3:.2f} | "
                f"erm: {med / erm:.2f}x ({erm * 1e3:.2f}); paired median {paired:.2f}x | "
                f"<= 1.1x ERM |"
            )
    return rows


def cases(quick=False):
    try:
        rows = fit_step_rows(quick)
    except Exception as error:  # noqa: BLE001  (report it in the table, time the cases)
        if BACKEND == "tensorflow":
            raise
        message = " ".join(f"{type(error).__name__}: {error}".split())[:200]
        rows = [
            f"| model.fit step safe_kl | MLP 64-256-10, B=256, Adam | fit {BACKEND} | - | "
            f"failed: {message} | <= 1.1x ERM |"
        ]
    for row in rows:
        print(row, flush=True)
    reps = 5 if quick else 20
    out = []
    for batch in (10, 1024, 2**16 if quick else 2**20):
        out.append(
            Case(
                op="safe_kl_dro_risk",
                shape=f"B={batch}",
                fn=safe_kl,
                inputs=_losses(batch),
                anchors={
                    "mean": plain_mean,
                    "reduce_logsumexp": reduce_logsumexp,
                    "kl_dro_batch_lse": batch_lse,
                },
                wrt=(0, 1),
                target="report ratio vs mean",
                repeats=reps,
            )
        )
    out.append(
        Case(
            op="model_step_safe_kl",
            shape="MLP 64-256-10, B=256",
            fn=model_safe_kl,
            inputs=_model_inputs(256),
            anchors={"model_step_erm": model_erm},
            wrt=(0, 1, 4),
            target="<= 1.1x ERM",
            repeats=reps,
        )
    )
    return out


if __name__ == "__main__":
    import os
    import sys

    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    for line in fit_step_rows("--quick" in sys.argv):
        print(line, flush=True)
