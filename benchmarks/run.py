"""Run the benchmarks: ``python benchmarks/run.py [--only NAME] [--quick]``.

Discovers ``benchmarks/bench_<name>.py`` modules, each exposing ``cases(quick) -> list[Case]``,
and prints one Markdown table: op, shape, mode (graph = tf.function, xla = jit_compile),
forward+backward median time, and the ratio to each anchor measured in the same run
(ratio < 1: faster than the anchor).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from harness import machine_line, measure  # noqa: E402


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
    args = parser.parse_args(argv)

    print(f"machine: {machine_line()}\n")
    print("| op | shape | mode | fwd+bwd ms | ratio to anchors (anchor ms) | target |")
    print("|---|---|---|---|---|---|")
    for name in discover(args.only):
        module = importlib.import_module(f"bench_{name}")
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
