"""The TF -> XLA -> jaxlib pipeline (issue 13): export every op's program, run it with jaxlib.

``benchmarks/xla_export.py --small --reference graph`` runs here in-process (TensorFlow is
loaded anyway; graph-mode references spare TF's XLA compiles, the bulk of the export time);
``benchmarks/run_xla.py`` runs in a subprocess, as on a machine without TensorFlow, and its
outputs must match TensorFlow's for every module. A corrupted reference must be caught, and the
``--large`` way of referencing (TF on the first rows only) is exercised on a tiny batch.
"""

import gzip
import importlib.util
import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
RUNNER = BENCH / "run_xla.py"

pytestmark = [
    pytest.mark.tensorflow_only(reason="exports TensorFlow's XLA programs"),
    pytest.mark.skipif(
        importlib.util.find_spec("jax") is None,
        reason="needs jax (pip install losszoo[xla-export])",
    ),
]

# Every op of losszoo.ops that issue 13 names, as case ops or anchors of the small preset.
REQUIRED_CASES = [
    "sparsemax_loss",
    "sparsemax",
    "rankmax_loss k=1",
    "rankmax_loss k=10",
    "rankmax_loss k=1 dense labels",
    "rankmax_loss k=10 dense labels",
    "rankmax k=1",
    "rankmax k=10",
    "bcsoftmax (bounds + temperature)",
    "safe_kl_dro_risk",
]
REQUIRED_PREFIXES = ["possibilistic_projection_loss", "possibilistic_projection fwd"]
REQUIRED_ANCHORS = [
    "softmax_ce",
    "softmax",
    "alg_A_sort",
    "kl_dro_batch_lse",
    "kl_dro_sumexp",
    "cvar_risk",
]
CAP = 4096  # bytes: bigger outputs are referenced by their first rows (the --cap path)


def _import(name):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


def _run(folder, *args, timeout=300):
    proc = subprocess.run(
        [sys.executable, str(RUNNER), str(folder), "--json", str(folder / "result.json"), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    rows = (
        json.loads((folder / "result.json").read_text())["rows"]
        if (folder / "result.json").exists()
        else None
    )
    return proc, rows


def test_export_run_with_jaxlib_and_catch_a_wrong_reference(tmp_path):
    """One test for the four checks of one export and one jaxlib run (module fixtures were
    computed again on each pytest-xdist worker that ran one of them: ~60 s twice)."""
    folder = tmp_path / "small"
    manifest = _import("xla_export").export(
        "small", folder, cap=CAP, log=lambda *_: None, reference="graph"
    )
    _check_every_op_is_exported(folder, manifest)
    ran = _run(folder, "--repeats", "2")
    _check_no_tensorflow_only_custom_calls(manifest, ran)
    _check_jaxlib_outputs_match_tensorflow(manifest, ran)
    _check_a_wrong_reference_is_caught(folder, manifest, tmp_path)


def _check_every_op_is_exported(folder, manifest):
    ops = [c["op"] for c in manifest["cases"]]
    for name in REQUIRED_CASES:
        assert name in ops, name
    for prefix in REQUIRED_PREFIXES:
        assert sum(op.startswith(prefix) for op in ops) == 2, prefix  # K = 3 and K = 20
    anchors = {a for c in manifest["cases"] for a in c["anchors"]}
    assert set(REQUIRED_ANCHORS) <= anchors
    for case in manifest["cases"]:
        for meta in case["modules"].values():
            proto = gzip.decompress((folder / meta["file"]).read_bytes())
            assert len(proto) == meta["bytes"] > 0
    # the small shapes still take the code paths of the big ones
    by_op = {c["op"]: c for c in manifest["cases"]}
    # the chunk maxima's thresholds (three levels at K = 32768), the search on the candidate
    # chunks and, in the branch for wide supports, the full Newton loop
    assert by_op["sparsemax_loss"]["modules"]["sparsemax_loss"]["hlo_ops"].get("while") == 5
    assert by_op["rankmax_loss k=1 dense labels"]["modules"]["rankmax_loss k=1 dense labels"][
        "hlo_ops"
    ].get("conditional")


def _check_no_tensorflow_only_custom_calls(manifest, ran):
    _, rows = ran
    for case in manifest["cases"]:
        for name, meta in case["modules"].items():
            assert meta["custom_calls"] == [], (case["op"], name)
    for row in rows:
        for name, mod in row["modules"].items():
            assert mod["custom_calls"] == [], (row["op"], name)


def _check_jaxlib_outputs_match_tensorflow(manifest, ran):
    proc, rows = ran
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(rows) == len(manifest["cases"])
    refs = {"full": 0, "rows": 0}
    for row, case in zip(rows, manifest["cases"]):
        assert row["error"] is None, row
        assert set(row["modules"]) == {case["op"], *case["anchors"]}
        for name, mod in row["modules"].items():
            assert mod["match"] == "yes", (row["op"], name, mod)
            assert mod["worst"] <= 1.0
            assert mod["ms"] > 0
        for meta in case["modules"].values():
            for out in meta["outputs"]:
                refs[out["reference"]] += 1
    assert refs["full"] > 0 and refs["rows"] > 0  # both kinds of reference were checked
    table = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(rows)  # header + one row per case, run.py's columns + 1
    assert all(line.count("|") == 8 for line in table)


def _check_a_wrong_reference_is_caught(folder, manifest, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad, ignore=shutil.ignore_patterns("result.json"))
    case = next(c for c in manifest["cases"] if c["op"] == "sparsemax_loss")
    key = case["modules"][case["op"]]["key"]
    ref = dict(np.load(bad / "reference.npz"))
    grad = ref[f"{key}/1"]  # d loss / d logits, 4 x 32768, referenced by its leading block
    assert grad.shape == (1, CAP // 4)
    grad[0, 5] += 1e-3 * max(1.0, np.abs(grad).max())  # ~100x the tolerance, one entry
    np.savez(bad / "reference.npz", **ref)
    proc, rows = _run(bad, "--only", "sparsemax_loss", "--check-only")
    assert proc.returncode == 1
    (row,) = rows
    assert row["modules"][case["op"]]["match"] == "NO"
    assert 10 < row["modules"][case["op"]]["worst"] < 1000
    assert all(m["match"] == "yes" for n, m in row["modules"].items() if n != case["op"])


def test_large_mode_references_the_first_rows(tmp_path):
    """--large traces from shapes and checks rows computed by TF on a smaller batch."""
    xe, bs = _import("xla_export"), _import("bench_sparsemax")
    batch = 40  # > BLOCK rows: the TF run sees only the first block
    spec = xe.Spec(
        "sparsemax_loss",
        f"{batch}x64",
        bs.sparsemax_loss,
        {"generator": "logits_onehot", "batch": batch, "k": 64},
        {"softmax_ce": bs.softmax_ce},
        repeats=2,
    )
    manifest = xe.export("large", tmp_path / "large", cases=[spec], log=lambda *_: None)
    outputs = manifest["cases"][0]["modules"]["sparsemax_loss"]["outputs"]
    assert [o["reference"] for o in outputs] == ["none", "rows"]  # summed value, gradient
    assert outputs[1]["shape"] == [batch, 64]
    ref = np.load(tmp_path / "large" / "reference.npz")
    key = manifest["cases"][0]["modules"]["sparsemax_loss"]["key"]
    assert ref[f"{key}/1"].shape == (_import("run_xla").BLOCK, 64)
    proc, rows = _run(tmp_path / "large")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [m["match"] for m in rows[0]["modules"].values()] == ["yes", "yes"]


# ---- numpy-only helpers of run_xla ---------------------------------------------------


def test_inputs_first_rows_do_not_depend_on_the_batch():
    make_inputs, block = _import("run_xla").make_inputs, _import("run_xla").BLOCK
    for recipe in (
        {"generator": "logits_onehot", "batch": 50, "k": 7},
        {"generator": "scores_ids", "batch": 50, "n": 9, "dense": True},
        {"generator": "bcsoftmax", "batch": 50, "k": 6},
        {"generator": "possibility", "batch": 50, "k": 5},
    ):
        full, head = make_inputs(recipe), make_inputs(recipe, rows=block)
        for f, h in zip(full, head):
            np.testing.assert_array_equal(f[:block] if f.ndim else f, h)
        assert full[0].shape[0] == 50
    _x, a, b, t = make_inputs({"generator": "bcsoftmax", "batch": 50, "k": 6})
    assert np.all(a <= b) and np.all(a.sum(1) <= 1) and np.all(b.sum(1) >= 1) and t > 0
    _s, ids = make_inputs({"generator": "scores_ids", "batch": 50, "n": 9})
    assert ids.dtype == np.int32 and ids.min() >= 0 and ids.max() < 9


def test_compare_tolerance_and_non_finite_values():
    compare = _import("run_xla").compare
    ref = np.array([1.0, -200.0, np.nan, np.inf, 0.0])
    assert compare(ref.copy(), ref, 1e-4, 1e-5) == (True, 0.0)
    out = ref.copy()
    out[0] += 1e-3  # bound: atol * max|ref| + rtol * |ref| = 2e-3 + 1e-4
    ok, worst = compare(out, ref, 1e-4, 1e-5)
    assert ok and worst == pytest.approx(1e-3 / 2.1e-3)
    out[0] += 2e-3
    assert compare(out, ref, 1e-4, 1e-5)[0] is False
    for i, value in ((2, 0.0), (3, -np.inf), (4, np.nan)):
        out = ref.copy()
        out[i] = value
        assert compare(out, ref, 1e-4, 1e-5)[0] is False, i
    assert compare(ref[:2], ref, 1e-4, 1e-5) == (False, float("inf"))
