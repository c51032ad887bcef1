"""Run the benchmarks: ``python benchmarks/run.py [--backend B] [--only NAME] [--quick]``.

Discovers ``benchmarks/bench_<name>.py`` modules, each exposing ``cases(quick) -> list[Case]``,
and prints one Markdown table: op, shape, mode (``backend:mode``; TensorFlow graph =
tf.function, xla = jit_compile; JAX jit; PyTorch eager), forward+backward median time, and the
ratio to each anchor measured in the same run (ratio < 1: faster than the anchor).
``--backend`` (tensorflow, jax or torch; default: ``KERAS_BACKEND``, else tensorflow) picks
the Keras backend before anything imports Keras.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def discover(only: list[str] | None) -> list[str]:
    names = sorted(p.stem[len("bench_") :] for p in HERE.glob("bench_*.py"))
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise SystemExit(f"unknown benchmark(s) {unknown}; available: {names}")
        names = [n for n in names if n in only]
    return names


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--only", action="append", help="benchmark name (repeatable), e.g. sparsemax"
    )
    parser.add_argument("--quick", action="store_true", help="smaller shapes and fewer repeats")
    parser.add_argument(
        "--backend",
        choices=("tensorflow", "jax", "torch"),
        default=os.environ.get("KERAS_BACKEND") or "tensorflow",
        help="Keras backend to measure on",
    )
    args = parser.parse_args(argv)
    if "keras" in sys.modules and os.environ.get("KERAS_BACKEND") != args.backend:
        raise SystemExit("--backend must be chosen before Keras is imported")
    os.environ["KERAS_BACKEND"] = args.backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from harness import machine_line, measure

    print(f"machine: {machine_line()}\n")
    print("| op | shape | mode | fwd+bwd ms | ratio to anchors (anchor ms) | target |")
    print("|---|---|---|---|---|---|")
    for name in discover(args.only):
        module = importlib.import_module(f"bench_{name}")
        if not hasattr(module, "cases"):  # e.g. bench_retrieval: a script with its own table
            print(f"| {name} | - | - | - | run `python benchmarks/bench_{name}.py` | - |")
            continue
        for case in module.cases(args.quick):
            for row in measure(case):
                ratios = "; ".join(
                    f"{a}: {r:.2f}x ({row['anchor_ms'][a]:.2f})" for a, r in row["ratios"].items()
                )
                print(
                    f"| {row['op']} | {row['shape']} | {row['mode']} | {row['ms']:.2f} | "
                    f"{ratios or '-'} | {row['target']} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
