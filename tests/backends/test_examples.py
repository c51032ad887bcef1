"""Issue 21 item 5: the Keras 3 retrieval example and the calibration example run on JAX
(smallest settings, as ``tests/test_examples.py`` and ``tests/retrieval/test_example.py`` run
them on TensorFlow)."""

import importlib.util
from pathlib import Path

import pytest

from tests.harness import BACKEND

pytest.importorskip("matplotlib")
pytest.importorskip("sklearn")
pytestmark = pytest.mark.skipif(
    BACKEND != "jax", reason="TensorFlow: tests/test_examples.py; the issue names JAX"
)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}_{BACKEND}", EXAMPLES / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def test_calibrate_classifier_example_on_this_backend(tmp_path, capsys):
    argv = ["--seeds", "1", "--steps", "20", "--calib-epochs", "2", "--methods", "ts,pb-c"]
    argv += ["--diagram", "uncal,ts", "--depth", "1", "--hidden", "16"]
    _load("calibrate_classifier.py").main([*argv, "--out", str(tmp_path)])
    table = (tmp_path / "calibrate_classifier.md").read_text()
    assert "| TS |" in table and "| PB-C |" in table
