"""JAX training steps with ``jit_compile=False``: seconds of the first epoch, ms per later step.

Run op by op, a ``cond`` / ``while_loop`` whose branches are new closures is compiled anew at
every call; this measures what a user of ``model.compile(jit_compile=False)`` on JAX waits per
step. The model is the seam test's: ``Dense(3)`` on 40 x 4 inputs, batch 16 (the last batch is
partial), each loss by registry name with its defaults; one epoch to warm up, five timed.

Run ``python benchmarks/bench_jax_eager_step.py [names...]`` (default: every registered loss),
``--root <checkout>`` to time another checkout's losszoo.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "jax"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--root", help="checkout whose losszoo to import")
    args = parser.parse_args()
    if args.root:
        sys.path.insert(0, os.path.abspath(args.root))
    import jax
    import keras
    import numpy as np

    import losszoo
    from losszoo import losses as L

    jax.config.update("jax_enable_x64", True)  # the possibilistic losses compute in float64
    print(f"losszoo from {os.path.dirname(losszoo.__file__)}")
    rng = np.random.default_rng(4)
    x = rng.normal(size=(40, 4)).astype("float32")
    ids = rng.integers(0, 3, 40)
    for name in args.names or losszoo.names("loss"):
        cls = losszoo.get_class(name, "loss")
        if issubclass(cls, (L.PossibilisticProjectionLoss, L.AntipignisticKLLoss)):
            labels = rng.uniform(0.05, 0.6, (40, 3))  # possibility rows, 1 at the true class
            labels[np.arange(40), ids] = 1.0
        elif issubclass(cls, L.VoteKLLoss):
            labels = rng.integers(0, 2, (40, 3)).astype("float64")  # votes, a majority
            labels[np.arange(40), ids] = 3.0
        else:
            labels = ids
        labels = np.asarray(labels, "float32")
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss=name, jit_compile=False)
        start = time.perf_counter()
        model.fit(x, labels, batch_size=16, epochs=1, verbose=0, shuffle=False)
        first = time.perf_counter() - start
        start = time.perf_counter()
        model.fit(x, labels, batch_size=16, epochs=5, verbose=0, shuffle=False)
        later = (time.perf_counter() - start) / 15
        print(f"{name}: first epoch {first:.1f} s, later steps {1000 * later:.0f} ms/step")


if __name__ == "__main__":
    main()
