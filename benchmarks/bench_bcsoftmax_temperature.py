"""BCSoftmax at every temperature (issue 33 item 1): old kernel, new kernel and softmax,
interleaved in one process.

Rows: fwd+bwd of ``sum(bcsoftmax(x, lower=0.2/K, upper=0.1, temperature=T) * sin(0..K-1))``
with respect to ``x``, for T in {10, 1, 0.1, 0.05} at 128x1024, 1024x4096 and 128x32768, with
``x ~ N(0, 3)`` (``--scale``; the paper's runtime-study scale, as in ``bench_bcsoftmax.py``).
Anchor: ``softmax(x / T)`` weighted the same way. The old kernel is
``losszoo/ops/_bcsoftmax`` of git revision ``--old`` (default ``HEAD``), loaded as a module
of its own beside the working tree's kernel; both are timed in the same process and compiled
the same way (TensorFlow ``jit_compile=True``, or ``jax.jit`` with ``KERAS_BACKEND=jax``).
Each round times old, new and softmax one after another (the order rotates between rounds)
and the table gives the medians over the rounds: ms, and the per-round ratios to softmax, so
a loaded machine slows all three alike.

Also checks that the two kernels agree (the gradient of the weighted sum, max abs difference)
and counts the coordinates of each problem at a bound (per row).

Example:
  python benchmarks/bench_bcsoftmax_temperature.py --rounds 7
  python benchmarks/bench_bcsoftmax_temperature.py --shapes 128x1024 --temperatures 0.05
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from harness import BACKEND, _wait, compile_step, forward_backward, machine_line  # noqa: E402
from keras import ops as kops  # noqa: E402

from losszoo.ops import _bcsoftmax as new_kernel  # noqa: E402

MODE = {"tensorflow": "xla", "jax": "jit", "torch": "eager"}[BACKEND]
SHAPES = ("128x1024", "1024x4096", "128x32768")
TEMPERATURES = (10.0, 1.0, 0.1, 0.05)


def load_old(rev: str):
    """The BCSoftmax kernel of ``rev`` as the module ``losszoo.ops._bcsoftmax_old``: the file
    ``losszoo/ops/_bcsoftmax.py`` (before the split) or the package ``losszoo/ops/_bcsoftmax/``
    (its modules import each other relatively, so the old copy keeps to itself)."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="bcsoftmax_old_"))
    listing = subprocess.run(
        ["git", "-C", str(HERE.parent), "ls-tree", "--name-only", rev, "losszoo/ops/_bcsoftmax/"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    files = listing or ["losszoo/ops/_bcsoftmax.py"]
    for name in files:
        text = subprocess.run(
            ["git", "-C", str(HERE.parent), "show", f"{rev}:{name}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        (root / pathlib.Path(name).name).write_text(text)
    if listing:
        init, search = root / "__init__.py", [str(root)]
    else:
        init, search = root / "_bcsoftmax.py", None
    name = "losszoo.ops._bcsoftmax_old"
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=search)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def problem(n: int, k: int, scale: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(0.0, scale, (n, k)).astype(np.float32)


def functions(old, k: int, t: float):
    lower, upper = 0.2 / k, 0.1

    def weights(x):
        return kops.sin(kops.arange(x.shape[-1], dtype=x.dtype))

    def run_old(x):
        return old.bcsoftmax(x, lower=lower, upper=upper, temperature=t) * weights(x)

    def run_new(x):
        return new_kernel.bcsoftmax(x, lower=lower, upper=upper, temperature=t) * weights(x)

    def run_softmax(x):
        return kops.softmax(x / t) * weights(x)

    return {"old": run_old, "new": run_new, "softmax": run_softmax}


def _numpy(t):
    return np.asarray(kops.convert_to_numpy(t))


def agreement(steps, x):
    """Max abs difference of the summed value's gradient and of the outputs, old vs new."""
    (_, g_old), (_, g_new) = steps["old"](x), steps["new"](x)
    g_old, g_new = (_numpy(g[0] if isinstance(g, (list, tuple)) else g) for g in (g_old, g_new))
    return float(np.max(np.abs(g_old - g_new)))


def time_once(step, x, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        _wait(step(x))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default="HEAD", help="git revision of the old kernel")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=5, help="calls per measurement")
    parser.add_argument("--shapes", nargs="+", default=SHAPES)
    parser.add_argument("--temperatures", nargs="+", type=float, default=TEMPERATURES)
    parser.add_argument("--scale", type=float, default=3.0, help="std of the logits")
    args = parser.parse_args(argv)

    old = load_old(args.old)
    print(f"# {machine_line()}")
    print(f"# mode {BACKEND}:{MODE}; old = {args.old}; x ~ N(0, {args.scale}); bounds [0.2/K, 0.1]")
    print(
        "| shape | T | old ms | new ms | softmax ms | old / softmax | new / softmax | "
        "new / old | max abs grad diff | rows clamped (L, U) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        n, k = (int(v) for v in shape.split("x"))
        x_np = problem(n, k, args.scale)
        x = kops.convert_to_tensor(x_np)
        for t in args.temperatures:
            fns = functions(old, k, t)
            steps = {
                name: compile_step(forward_backward(fn, (0,)), MODE) for name, fn in fns.items()
            }
            for step in steps.values():  # compile and warm up
                _wait(step(x))
                _wait(step(x))
            diff = agreement(steps, x)
            y = _numpy(new_kernel.bcsoftmax(x_np, lower=0.2 / k, upper=0.1, temperature=t))
            n_low = int(np.sum(np.isclose(y, 0.2 / k, rtol=1e-6, atol=0)))
            n_up = int(np.sum(np.isclose(y, 0.1, rtol=1e-6, atol=0)))
            ms = {name: [] for name in steps}
            ratios = {"old": [], "new": [], "new_old": []}
            names = list(steps)
            for r in range(args.rounds):
                order = names[r % 3 :] + names[: r % 3]
                got = {name: time_once(steps[name], x, args.repeats) for name in order}
                for name in names:
                    ms[name].append(got[name] * 1e3)
                ratios["old"].append(got["old"] / got["softmax"])
                ratios["new"].append(got["new"] / got["softmax"])
                ratios["new_old"].append(got["new"] / got["old"])
            print(
                f"| {shape} | {t:g} | {statistics.median(ms['old']):.2f} | "
                f"{statistics.median(ms['new']):.2f} | {statistics.median(ms['softmax']):.2f} | "
                f"{statistics.median(ratios['old']):.2f}x | "
                f"{statistics.median(ratios['new']):.2f}x | "
                f"{statistics.median(ratios['new_old']):.2f} | {diff:.1e} | "
                f"{n_low / n:.0f}, {n_up / n:.1f} per row |",
                flush=True,
            )


if __name__ == "__main__":
    main()
