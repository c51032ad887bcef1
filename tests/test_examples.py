"""Each example script, run in-process with its smallest settings into a temporary folder.

Checks that the run finishes, that the files it says it wrote exist and parse (Markdown table
rows with numbers, PNG images of a readable shape, JSON), and that nothing is written to
examples/results. MovieLens runs on a small synthetic data set through the loader's data_dir.
"""

import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.harness import BACKEND

# Every example at its smallest settings runs once, on TensorFlow; on JAX the two Keras 3
# examples of issue 21 item 5 run too (the last two tests).
tensorflow_only = pytest.mark.tensorflow_only(reason="each example runs once, on TensorFlow")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")


def load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


def table_rows(path):
    """Data rows of the Markdown tables in ``path`` (header and rule lines dropped)."""
    lines = [line for line in path.read_text().splitlines() if line.startswith("|")]
    return [line for line in lines if not set(line) <= set("|- ") and "---" not in line][1:]


def numbers(row):
    return [float(x) for x in re.findall(r"(?<![\w.])-?\d+\.\d+", row)]


def check_png(path):
    import matplotlib.image

    image = matplotlib.image.imread(path)
    height, width = image.shape[:2]
    assert 300 <= width <= 2000 and 250 <= height <= 1600, (width, height)
    assert width / height < 3.5, "a thin strip is hard to read"
    assert image[..., :3].std() > 0.05, "blank image"


def written(capsys):
    out = capsys.readouterr().out
    return [Path(line.split(" ", 1)[1]) for line in out.splitlines() if line.startswith("wrote ")]


@pytest.fixture(autouse=True)
def _no_committed_results_touched(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # default out/ goes here
    before = {p: p.stat().st_mtime_ns for p in (EXAMPLES / "results").iterdir()}
    yield
    after = {p: p.stat().st_mtime_ns for p in (EXAMPLES / "results").iterdir()}
    assert after == before, "an example wrote into examples/results without --out"


@tensorflow_only
def test_tour(capsys):
    """The README's first command, whole: every method of the tour at its smallest settings."""
    tour = load("tour")
    assert tour.main(["--smoke"]) == 0
    (md,) = written(capsys)
    assert md.parent.parent == Path("out") and md.name == "tour_smoke.md"  # fresh default folder
    assert "`python examples/tour.py --smoke`" in md.read_text()
    rows = [[cell.strip() for cell in row.split("|")[1:-1]] for row in table_rows(md)]
    assert [row[0] for row in rows] == [entry.name for entry in tour.TOUR]
    for method, accuracy, nll, ece, zeros, seconds in rows:
        assert 0.2 < float(accuracy) <= 1.0, (method, accuracy)  # chance is 0.1 (10 digits)
        assert nll.startswith("n/a") or float(nll) > 0.0, (method, nll)
        assert 0.0 <= float(ece) <= 1.0, (method, ece)
        assert zeros.endswith("%") and 0.0 <= float(zeros[:-1]) <= 100.0, (method, zeros)
        assert float(seconds) > 0.0, (method, seconds)


@tensorflow_only
def test_calibrate_classifier(tmp_path, capsys):
    load("calibrate_classifier").main(
        [
            "--seeds",
            "1",
            "--steps",
            "20",
            "--calib-epochs",
            "2",
            "--methods",
            "ts",
            "--diagram",
            "uncal,ts",
            "--depth",
            "1",
            "--hidden",
            "16",
            "--out",
            str(tmp_path / "c"),
        ]
    )
    out = capsys.readouterr().out
    assert "no worse than TS" not in out and "WORSE" not in out  # one seed: no verdict
    md = tmp_path / "c" / "calibrate_classifier.md"
    png = md.with_suffix(".png")
    assert f"wrote {md}" in out and f"wrote {png}" in out
    rows = table_rows(md)
    assert [r.split("|")[1].strip() for r in rows] == ["Uncal", "TS"]
    assert all("±" not in r for r in rows)  # one seed: no spread
    assert all(len(numbers(r)) == 4 for r in rows)
    check_png(png)


@tensorflow_only
def test_dro_noisy_labels(tmp_path, capsys):
    load("dro_noisy_labels").main(["--epochs", "1", "--seeds", "1", "--out", str(tmp_path)])
    files = written(capsys)
    assert {f.name for f in files} == {"dro_noisy_labels.md", "dro_noisy_labels.png"}
    rows = table_rows(tmp_path / "dro_noisy_labels.md")
    assert [r.split("|")[1].strip() for r in rows] == ["erm", "safe_kl", "sumexp"]
    assert all("±" not in r for r in rows)
    check_png(tmp_path / "dro_noisy_labels.png")


@tensorflow_only
def test_dro_regression(tmp_path, capsys):
    load("dro_regression").main(
        [
            "--datasets",
            "diabetes",
            "--batches",
            "50",
            "--seeds",
            "2",
            "--grid",
            "1e-4",
            "--epochs",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    assert {f.name for f in written(capsys)} == {"dro_regression.md", "dro_regression.png"}
    rows = table_rows(tmp_path / "dro_regression.md")
    assert len(rows) == 3 and all("±" in r for r in rows[1:])  # two seeds: mean ± std
    check_png(tmp_path / "dro_regression.png")


@tensorflow_only
def test_possibilistic_synthetic(tmp_path, capsys):
    load("possibilistic_synthetic").main(["--smoke", "--out", str(tmp_path)])
    names = {f.name for f in written(capsys)}
    assert names == {"possibilistic_synthetic_smoke.md", "possibilistic_synthetic_smoke.png"}
    (row,) = table_rows(tmp_path / "possibilistic_synthetic_smoke.md")
    assert row.startswith("| 30 | 0.40 | 200 |")
    check_png(tmp_path / "possibilistic_synthetic_smoke.png")


def _synthetic_movielens(folder, users=40, items=150, per_user=12, seed=0):
    """GroupLens layout: u.data (user item rating timestamp) and u.item (19 genre flags)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    lines = []
    for u in range(1, users + 1):
        for i in rng.choice(items, per_user, replace=False) + 1:
            lines.append(f"{u}\t{i}\t{rng.integers(1, 6)}\t{880000000 + len(lines)}\n")
    (folder / "u.data").write_text("".join(lines))
    flags = "|".join(["0"] * 19)
    (folder / "u.item").write_bytes(
        "".join(
            f"{i}|Movie {i} (1995)|01-Jan-1995||http://x|{flags}\n" for i in range(1, items + 1)
        ).encode("latin-1")
    )


@tensorflow_only
def test_movielens_retrieval(tmp_path, capsys, monkeypatch):
    pytest.importorskip("tensorflow_recommenders")
    monkeypatch.setenv("LOSSZOO_CACHE_DIR", str(tmp_path / "cache"))  # never the real cache
    data = tmp_path / "ml"
    _synthetic_movielens(data)
    module = load("movielens_retrieval")
    common = [
        "--data-dir",
        str(data),
        "--dim",
        "4",
        "--batch-size",
        "128",
        "--epochs",
        "1",
        "--out",
        str(tmp_path / "r"),
    ]
    module.main([*common, "--tune", "--loss", "sparsemax", "--grid-lr", "0.01", "0.03"])
    tuning = json.loads((tmp_path / "r" / "movielens_retrieval_tuning.json").read_text())
    assert [row["lr"] for row in tuning["grid"]["sparsemax"]] == [0.01, 0.03]
    best = max(tuning["grid"]["sparsemax"], key=lambda row: row["AP@10"])["lr"]
    assert tuning["best"]["sparsemax"]["lr"] == best
    tuned = tmp_path / "tuned.json"
    tuned.write_text(
        json.dumps(
            {"best": {"softmax": {"lr": 0.02}, "sparsemax": {"lr": best}, "rankmax": {"lr": 0.005}}}
        )
    )
    results = module.main([*common, "--seeds", "1", "--tuned-from", str(tuned)])
    assert {name: runs[0]["lr"] for name, runs in results.items()} == {
        "softmax": 0.02,
        "sparsemax": best,
        "rankmax": 0.005,
    }
    out = capsys.readouterr().out
    for suffix in (".md", ".png", ".json"):
        assert f"wrote {tmp_path / 'r' / ('movielens_retrieval' + suffix)}" in out
    rows = table_rows(tmp_path / "r" / "movielens_retrieval.md")
    assert [r.split("|")[1].strip() for r in rows] == [
        "softmax",
        "softmax",
        "sparsemax",
        "sparsemax",
        "rankmax",
        "rankmax",
    ]
    assert all("±" not in r for r in rows)
    saved = json.loads((tmp_path / "r" / "movielens_retrieval.json").read_text())
    assert 0.0 <= saved["rankmax"][0]["test"]["AP@10"] <= 1.0
    check_png(tmp_path / "r" / "movielens_retrieval.png")  # one epoch: markers


@tensorflow_only
def test_every_option_has_help_with_default(capsys):
    for name in (
        "tour",
        "calibrate_classifier",
        "dro_noisy_labels",
        "dro_regression",
        "possibilistic_synthetic",
        "movielens_retrieval",
        "keras3_retrieval",
    ):
        with pytest.raises(SystemExit):
            sys_argv, sys.argv = sys.argv, [name, "--help"]
            try:
                load(name).main(["--help"])
            finally:
                sys.argv = sys_argv
        text = capsys.readouterr().out
        assert text.startswith(f"usage: python examples/{name}.py"), name
        options = re.findall(r"^  (--[\w-]+)", text, re.M)
        assert len(options) >= 3, name
        blocks = re.split(r"\n  (?=-)", text.split("options:", 1)[1])
        for block in blocks[1:]:
            if block.startswith("-h"):
                continue
            assert "(default:" in " ".join(block.split()), (name, block.split()[0])


# ------------------------------------------------ issue 21 item 5: the Keras 3 examples on JAX
on_jax = pytest.mark.skipif(
    BACKEND != "jax", reason="TensorFlow: the tests above; the issue names JAX"
)


def _load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}_{BACKEND}", EXAMPLES / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@on_jax
def test_keras3_retrieval_example_on_this_backend(tmp_path, monkeypatch):
    from tests.retrieval.test_example import synthetic_movielens

    monkeypatch.setenv("LOSSZOO_CACHE_DIR", str(tmp_path / "cache"))
    synthetic_movielens(tmp_path / "ml")
    argv = ["--data-dir", str(tmp_path / "ml"), "--dim", "4", "--batch-size", "64"]
    argv += ["--epochs", "2", "--loss", "rankmax", "--negatives", "mixed", "--sampled", "8"]
    results = _load("keras3_retrieval.py").main([*argv, "--out", str(tmp_path / "r")])
    (run,) = results[("mixed", "rankmax")]
    assert 0.0 <= run["test"]["top1"] <= run["test"]["top100"] <= 1.0
    assert (tmp_path / "r" / "keras3_retrieval.md").read_text().startswith("# MovieLens")


@on_jax
def test_calibrate_classifier_example_on_this_backend(tmp_path, capsys):
    argv = ["--seeds", "1", "--steps", "20", "--calib-epochs", "2", "--methods", "ts,pb-c"]
    argv += ["--diagram", "uncal,ts", "--depth", "1", "--hidden", "16"]
    _load("calibrate_classifier.py").main([*argv, "--out", str(tmp_path)])
    table = (tmp_path / "calibrate_classifier.md").read_text()
    assert "| TS |" in table and "| PB-C |" in table
