"""Old and new kernels side by side in one process: ``python benchmarks/compare.py REV``.

Extracts the package ``losszoo`` and the ``benchmarks`` of git revision ``REV`` into a
temporary folder as ``losszoo_old`` and ``bench_<name>_old`` / ``harness_old`` (imports
renamed), then times every case of the chosen benchmark modules, old and new cases
alternating, in one TensorFlow process (graph and XLA), and prints ``new / old`` per row (the
median of ``--rounds`` alternations). Used to show that a refactor keeps every ratio within 5%.
Cases are paired by (op, shape); a case on one side only is skipped.

``--programs`` compares what each side compiles instead of timing it: per case, the number of
nodes of the TensorFlow graph (``graph``, function library included) and of instructions in
XLA's optimized HLO module (``xla``), with the opcodes that differ. Equal optimized HLO means
a timing difference in that row is noise.

Example:
  python benchmarks/compare.py 205c631 --only sparsemax --only rankmax
"""

from __future__ import annotations

import argparse
import collections
import importlib
import os
import pathlib
import re
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def extract(rev: str) -> pathlib.Path:
    """``REV``'s package and benchmarks, renamed ``*_old``, in a temporary folder on sys.path."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="losszoo_old_"))
    archive = subprocess.run(
        ["git", "-C", str(HERE.parent), "archive", rev, "losszoo", "benchmarks"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    (root / "losszoo").rename(root / "losszoo_old")
    for path in [*(root / "losszoo_old").rglob("*.py"), *(root / "benchmarks").glob("*.py")]:
        text = re.sub(r"\b(from|import) losszoo\b", r"\1 losszoo_old", path.read_text())
        text = re.sub(r"\blosszoo\.", "losszoo_old.", text)
        text = re.sub(r"\bfrom (harness|bench_\w+)\b", r"from \1_old", text)
        text = re.sub(r"^import (harness|bench_\w+)$", r"import \1_old as \1", text, flags=re.M)
        if path.parent.name == "benchmarks":
            path.unlink()
            path = root / f"{path.stem}_old.py"
        path.write_text(text)
    sys.path.insert(0, str(root))
    return root


def paired_cases(name: str, quick: bool) -> list:
    """``(new, old)`` cases of benchmark ``name`` with the same op and shape."""
    old_cases = importlib.import_module(f"bench_{name}_old").cases(quick)
    old = {(case.op, case.shape): case for case in old_cases}
    new_cases = importlib.import_module(f"bench_{name}").cases(quick)
    return [(case, old[case.op, case.shape]) for case in new_cases if (case.op, case.shape) in old]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="git revision of the old kernels")
    parser.add_argument("--only", action="append", required=True, help="benchmark module name")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3, help="alternations (median of each)")
    parser.add_argument("--programs", action="store_true", help="compare compiled programs")
    parser.add_argument("--match", default="", help="only cases whose 'op shape' contains this")
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    extract(args.rev)
    import statistics

    import harness_old
    from harness import machine_line, measure

    print(f"machine: {machine_line()}  | old = {args.rev}\n")
    if args.programs:
        return compare_programs(args)
    print("| op | shape | mode | new ms | old ms | new / old |")
    print("|---|---|---|---|---|---|")
    for name in args.only:
        for new, old in paired_cases(name, args.quick):
            if args.match not in f"{new.op} {new.shape}":
                continue
            new.anchors, old.anchors = {}, {}
            times = {"new": {}, "old": {}}
            for _ in range(args.rounds):
                for label, case, timer in (
                    ("new", new, measure),
                    ("old", old, harness_old.measure),
                ):
                    for row in timer(case):
                        mode = row["mode"].split(":")[-1]
                        times[label].setdefault(mode, []).append(row["ms"])
            for mode in times["new"]:
                n = statistics.median(times["new"][mode])
                o = statistics.median(times["old"][mode])
                print(
                    f"| {new.op} | {new.shape} | {mode} | {n:.2f} | {o:.2f} | {n / o:.3f} |",
                    flush=True,
                )
    return 0


def program_size(case, mode: str) -> collections.Counter:
    """Opcode counts of ``case``'s forward+backward step compiled for ``mode`` (the same
    harness wraps old and new): graph nodes (the function library's included) or
    optimized-HLO instructions."""
    import tensorflow as tf
    from harness import compile_step, forward_backward

    inputs = [tf.convert_to_tensor(x) for x in case.inputs()]
    step = compile_step(forward_backward(case.fn, case.wrt), mode)
    if mode == "xla":
        hlo = step.experimental_get_compiler_ir(*inputs)(stage="optimized_hlo")
        return collections.Counter(re.findall(r"= \S+ (\w[\w-]*)\(", hlo))
    graph = step.get_concrete_function(*inputs).graph.as_graph_def()
    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
    return collections.Counter(n.op for n in nodes)


def compare_programs(args) -> int:
    """Print, per case and mode, the old and new program sizes and the opcodes that differ."""
    import harness

    print("| op | shape | mode | new size | old size | opcodes new - old |")
    print("|---|---|---|---|---|---|")
    for name in args.only:
        for new, old in paired_cases(name, args.quick):
            for mode in new.modes or harness.MODES:
                if mode not in ("graph", "xla"):
                    continue
                n, o = program_size(new, mode), program_size(old, mode)
                diff = {k: n[k] - o[k] for k in n.keys() | o.keys() if n[k] != o[k]}
                shown = ", ".join(f"{k} {v:+d}" for k, v in sorted(diff.items())) or "same"
                print(
                    f"| {new.op} | {new.shape} | {mode} | {n.total()} | {o.total()} | {shown} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
