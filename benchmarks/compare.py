"""Old and new kernels side by side in one process: ``python benchmarks/compare.py REV``.

Extracts the package ``losszoo`` and the ``benchmarks`` of git revision ``REV`` into a
temporary folder as ``losszoo_old`` and ``bench_<name>_old`` / ``harness_old`` (imports
renamed), then times every case of the chosen benchmark modules, old and new cases
alternating, in one TensorFlow process (graph and XLA), and prints ``new / old`` per row (the
median of ``--rounds`` alternations). Used to show that a refactor keeps every ratio within 5%.
Cases are paired in order, so the old and new module must list the same cases.

Example:
  python benchmarks/compare.py 205c631 --only sparsemax --only rankmax
"""

from __future__ import annotations

import argparse
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
        text = re.sub(r"\b(from|import) (harness|bench_\w+)\b", r"\1 \2_old", text)
        if path.parent.name == "benchmarks":
            path.unlink()
            path = root / f"{path.stem}_old.py"
        path.write_text(text)
    sys.path.insert(0, str(root))
    return root


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="git revision of the old kernels")
    parser.add_argument("--only", action="append", required=True, help="benchmark module name")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3, help="alternations (median of each)")
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    extract(args.rev)
    import statistics

    import harness_old
    from harness import machine_line, measure

    print(f"machine: {machine_line()}  | old = {args.rev}\n")
    print("| op | shape | mode | new ms | old ms | new / old |")
    print("|---|---|---|---|---|---|")
    for name in args.only:
        new_cases = importlib.import_module(f"bench_{name}").cases(args.quick)
        old_cases = importlib.import_module(f"bench_{name}_old").cases(args.quick)
        for new, old in zip(new_cases, old_cases, strict=True):
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


if __name__ == "__main__":
    sys.exit(main())
