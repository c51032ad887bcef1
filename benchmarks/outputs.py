"""Each op's outputs and gradients on fixed inputs, saved or compared: where a device changes
the numbers (a GPU against this machine's CPU).

``python benchmarks/outputs.py --save cpu.npz`` here, then on the other machine
``python benchmarks/outputs.py --compare cpu.npz``: prints, per op, the largest absolute and
relative difference of its value and gradient (``jax.jit`` on JAX, the backend's default
elsewhere). The inputs are made from fixed seeds, so both sides see the same numbers.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def cases():
    """``name -> (fn, inputs)``: ``fn(*inputs)`` is differentiated w.r.t. ``inputs[0]``."""
    from keras import ops as kops

    from losszoo import ops

    r = np.random.default_rng(0)
    z = (2 * r.normal(size=(64, 1000))).astype(np.float32)
    ids = r.integers(0, 1000, 64)
    onehot = np.zeros_like(z)
    onehot[np.arange(64), ids] = 1.0
    pi = r.uniform(0.01, 0.5, size=(16, 12))
    pi[np.arange(16), r.integers(0, 12, 16)] = 1.0
    losses = r.exponential(size=512).astype(np.float32)
    weight = np.sin(np.arange(1000, dtype=np.float32))
    return {
        "sparsemax": (lambda z: ops.sparsemax(z) * weight, (z,)),
        "sparsemax_loss": (lambda z: ops.sparsemax_loss(onehot, z), (z,)),
        "rankmax_loss_k1": (lambda z: ops.rankmax_loss(ids, z, k=1), (z,)),
        "rankmax_loss_k5": (lambda z: ops.rankmax_loss(ids, z, k=5), (z,)),
        "bcsoftmax": (lambda z: ops.bcsoftmax(z, lower=1e-4, upper=0.5) * weight, (z,)),
        "softmax_ce": (
            lambda z: kops.categorical_crossentropy(onehot, z, from_logits=True),
            (z,),
        ),
        "cvar_risk": (lambda l: ops.cvar_risk(l, rho=0.1), (losses,)),
        "kl_dro_batch_lse": (lambda l: ops.kl_dro_batch_lse(l, lam=1.0), (losses,)),
        "safe_kl_dro_risk": (lambda l: ops.safe_kl_dro_risk(l, 0.0, lam=1.0, rho=0.1), (losses,)),
        "possibilistic_projection_loss": (
            lambda z: ops.possibilistic_projection_loss(pi, z),
            (z[:16, :12].astype(np.float64),),
        ),
    }


def run_all():
    import keras
    from keras import ops as kops

    backend = keras.backend.backend()
    results, errors = {}, {}
    for name, (fn, inputs) in cases().items():
        try:
            if backend == "jax":
                import jax

                def total(*xs, fn=fn):
                    return kops.sum(fn(*xs))

                value = jax.jit(fn)(*inputs)
                grad = jax.jit(jax.grad(total))(*inputs)
            elif backend == "torch":
                import torch

                device = "cuda" if torch.cuda.is_available() else "cpu"
                xs = [torch.tensor(x, device=device) for x in inputs]
                xs[0].requires_grad_(True)
                out = fn(*xs)
                (grad,) = torch.autograd.grad(out.sum(), [xs[0]])
                value = out.detach()
            else:
                import tensorflow as tf

                xs = [tf.constant(x) for x in inputs]
                with tf.GradientTape() as tape:
                    tape.watch(xs[0])
                    value = fn(*xs)
                    out = tf.reduce_sum(value)
                grad = tape.gradient(out, xs[0])
            results[f"{name}/value"] = np.asarray(kops.convert_to_numpy(value))
            results[f"{name}/grad"] = np.asarray(kops.convert_to_numpy(grad))
        except Exception as e:  # report and go on: one op's failure must not hide the rest
            errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return results, errors


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--save")
    group.add_argument("--compare")
    args = parser.parse_args(argv)
    results, errors = run_all()
    for name, error in errors.items():
        print(f"{name}: FAILED {error}")
    if args.save:
        np.savez(args.save, **results)
        print(f"saved {len(results)} arrays to {args.save}")
        return 0
    reference = np.load(args.compare)
    print("| op | output | max abs diff | max rel diff |")
    print("|---|---|---|---|")
    for key in sorted(results):
        if key not in reference:
            continue
        a, b = results[key].astype(np.float64), reference[key].astype(np.float64)
        diff = np.abs(a - b)
        rel = diff / np.maximum(np.abs(b), 1e-12)
        op, what = key.split("/")
        print(f"| {op} | {what} | {np.nanmax(diff):.2e} | {np.nanmax(rel):.2e} |")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
