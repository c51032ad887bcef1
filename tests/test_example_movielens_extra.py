"""examples/movielens_retrieval.py checks the ``retrieval`` extra first and answers ``--help``
without starting TensorFlow (issue 31 item 14, issue 35 item 5)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "movielens_retrieval.py"


def _load():
    spec = importlib.util.spec_from_file_location("example_movielens_extra", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("missing", ["tf_keras", "tensorflow_recommenders"])
def test_a_missing_extra_is_named_before_any_work(tmp_path, monkeypatch, missing):
    module = _load()
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == missing else find_spec(name)
    )
    # A data folder that does not exist: the check must come before the data is read.
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--data-dir", str(tmp_path / "absent"), "--out", str(tmp_path / "r")])
    message = str(exit_info.value.code)
    assert "`retrieval` extra" in message and missing in message
    assert 'pip install "losszoo[retrieval]"' in message


def test_help_does_not_import_tensorflow_or_losszoo():
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    result = subprocess.run(
        [sys.executable, "-X", "importtime", str(SCRIPT), "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage: python examples/movielens_retrieval.py")
    modules = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "argparse" in modules  # importtime did record the imports
    heavy = {"tensorflow", "keras", "tf_keras", "tensorflow_recommenders", "losszoo"}
    assert not {m for m in modules if m.split(".")[0] in heavy}


def test_readme_example_table_names_the_extra():
    row = next(
        line
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith("| `examples/movielens_retrieval.py`")
    )
    assert '.[retrieval]"' in row
