"""Count host reads and bytes copied to the host per call of each op on PyTorch.

On a GPU every read of a tensor's value by Python (``.item()``, ``bool(t)``, ``.cpu()``,
``.numpy()``, ``.tolist()``, ``int(t)`` / ``float(t)``) waits for the device and copies to
the host. This CPU run counts them by patching those ``torch.Tensor`` methods (a copy that
costs nothing on the CPU is counted as the GPU would pay it): one forward and backward pass
per op at ``--shape`` (default 128x32768), validation on (``--no-validation`` for off).
Issue 33 item 3's targets: at most 4 reads and 1 MiB per call.

  KERAS_BACKEND=torch python benchmarks/torch_host_syncs.py [--shape 128x32768] [--time]

``--time`` also times fwd+bwd of ``sparsemax_loss`` against ``torch.nn.functional.
cross_entropy`` (the median of interleaved rounds, ratio to cross-entropy).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

os.environ.setdefault("KERAS_BACKEND", "torch")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import losszoo  # noqa: E402

_COUNTS = {"reads": 0, "bytes": 0, "where": {}}


def _nbytes(t):
    return t.numel() * t.element_size()


@contextlib.contextmanager
def counting():
    """Count host reads of torch tensors inside the block (see the module docstring)."""
    originals = {}

    def patch(name, copies):
        original = getattr(torch.Tensor, name)
        originals[name] = original

        def wrapper(self, *args, **kwargs):
            if not _COUNTS.get("inside"):
                _COUNTS["inside"] = True
                try:
                    _COUNTS["reads"] += 1
                    _COUNTS["bytes"] += _nbytes(self) if copies else self.element_size()
                    _COUNTS["where"][name] = _COUNTS["where"].get(name, 0) + 1
                    return original(self, *args, **kwargs)
                finally:
                    _COUNTS["inside"] = False
            return original(self, *args, **kwargs)

        setattr(torch.Tensor, name, wrapper)

    for name in ("item", "__bool__", "__int__", "__float__", "__index__"):
        patch(name, copies=False)
    for name in ("cpu", "numpy", "tolist"):
        patch(name, copies=True)
    try:
        yield _COUNTS
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def _problems(n, k, seed=0):
    r = np.random.default_rng(seed)
    z = torch.tensor(r.normal(size=(n, k)).astype(np.float32))
    ids = torch.tensor(r.integers(0, k, n))
    onehot = torch.nn.functional.one_hot(ids, k).float()
    return z, ids, onehot


def cases(n, k):
    """``name -> fn(z)`` for the ops measured (z requires grad; fn returns a tensor)."""
    _, ids, onehot = _problems(n, k)
    return {
        "sparsemax": lambda z: losszoo.ops.sparsemax(z),
        "sparsemax_loss": lambda z: losszoo.ops.sparsemax_loss(onehot, z),
        "sparsemax_loss (Keras loss, ids)": lambda z: losszoo.get("sparsemax")(ids, z),
        "bcsoftmax": lambda z: losszoo.ops.bcsoftmax(z, lower=0.2 / k, upper=0.1),
        "bcsoftmax (T = 0.1)": lambda z: losszoo.ops.bcsoftmax(
            z, lower=0.2 / k, upper=0.1, temperature=0.1
        ),
        "rankmax_loss (ids, k = 1)": lambda z: losszoo.ops.rankmax_loss(ids, z),
        "rankmax_loss (ids, k = 5)": lambda z: losszoo.ops.rankmax_loss(ids, z, k=5),
        "rankmax_loss (one-hot)": lambda z: losszoo.ops.rankmax_loss(onehot, z, k=5),
        "rankmax (ids, k = 5)": lambda z: losszoo.ops.rankmax(ids, z, k=5),
        "softmax_cross_entropy (Keras loss, ids)": lambda z: losszoo.get("softmax_cross_entropy")(
            ids, z
        ),
    }


def count(fn, z):
    """``(reads, bytes, by method)`` of one fwd+bwd of ``fn`` (after one warm-up call)."""
    z = z.clone().requires_grad_(True)
    fn(z).sum().backward()  # warm-up: caches, lazy imports
    _COUNTS.update(reads=0, bytes=0, where={})
    with counting():
        fn(z).sum().backward()
    return _COUNTS["reads"], _COUNTS["bytes"], dict(_COUNTS["where"])


def time_ratio(n, k, rounds=7):
    """Median fwd+bwd ms of sparsemax_loss and of torch cross-entropy, interleaved."""
    z, ids, onehot = _problems(n, k)
    z = z.requires_grad_(True)

    def ours():
        losszoo.ops.sparsemax_loss(onehot, z).sum().backward()

    def ce():
        torch.nn.functional.cross_entropy(z, ids, reduction="sum").backward()

    for f in (ours, ce):
        f()
    times = {"sparsemax_loss": [], "cross_entropy": []}
    for _ in range(rounds):
        for name, f in (("sparsemax_loss", ours), ("cross_entropy", ce)):
            start = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - start)
    med = {name: 1e3 * float(np.median(t)) for name, t in times.items()}
    return med["sparsemax_loss"], med["cross_entropy"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="128x32768")
    parser.add_argument("--no-validation", action="store_true")
    parser.add_argument("--time", action="store_true")
    parser.add_argument("--only", default=None, help="substring of the op names to run")
    args = parser.parse_args()
    n, k = map(int, args.shape.split("x"))
    z, _, _ = _problems(n, k)
    print(
        f"shape {n}x{k}, validation {'off' if args.no_validation else 'on'}, torch "
        f"{torch.__version__}"
    )
    print("| op | host reads | bytes to host | by method |\n|---|---|---|---|")
    with losszoo.validation(not args.no_validation):
        for name, fn in cases(n, k).items():
            if args.only and args.only not in name:
                continue
            reads, nbytes, where = count(fn, z)
            shown = ", ".join(f"{m} {c}" for m, c in sorted(where.items()))
            print(f"| {name} | {reads} | {nbytes / 2**20:.3g} MiB | {shown} |", flush=True)
        if args.time:
            ours, ce = time_ratio(n, k)
            print(
                f"time fwd+bwd {n}x{k}: sparsemax_loss {ours:.1f} ms, torch cross_entropy "
                f"{ce:.1f} ms, ratio {ours / ce:.2f}"
            )


if __name__ == "__main__":
    main()
