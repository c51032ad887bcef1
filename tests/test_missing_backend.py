"""``import losszoo`` where the backend Keras picks is not installed: one ImportError saying
which backend, from where and how to choose another (issue 31 item 9). The missing module is
simulated in a fresh process by a meta-path finder that refuses to import it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == {module!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Block())
import losszoo
"""


def _import_without(module, tmp_path, backend_env=None, keras_json=None):
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "KERAS_HOME")}
    home = tmp_path / "keras_home"
    home.mkdir()
    if keras_json is not None:
        (home / "keras.json").write_text(json.dumps(keras_json))
    env["KERAS_HOME"] = str(home)
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if backend_env is not None:
        env["KERAS_BACKEND"] = backend_env
    result = subprocess.run(
        [sys.executable, "-c", BLOCK.format(module=module)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert result.returncode != 0
    return result.stderr.strip(), home / "keras.json"


def _check_one_message(stderr):
    last = stderr.splitlines()[-1]
    assert last.startswith("ImportError: losszoo cannot start Keras: Keras picked the ")
    assert len(stderr.splitlines()) <= 8, stderr  # one short traceback, not Keras' 40 lines
    return last


def test_keras_default_backend_missing(tmp_path):
    # No KERAS_BACKEND, no keras.json: Keras picks TensorFlow (and writes it to keras.json).
    stderr, path = _import_without("tensorflow", tmp_path)
    message = _check_one_message(stderr)
    assert "'tensorflow' backend" in message and "No module named 'tensorflow'" in message
    assert str(path) in message  # where the choice comes from / can be changed
    assert "export KERAS_BACKEND=jax" in message or "export KERAS_BACKEND=torch" in message
    assert 'pip install "losszoo[tensorflow]"' in message


def test_backend_chosen_by_the_environment_variable(tmp_path):
    pytest.importorskip("tensorflow")
    stderr, _ = _import_without("jax", tmp_path, backend_env="jax")
    message = _check_one_message(stderr)
    assert "'jax' backend (the environment variable KERAS_BACKEND='jax' chose it)" in message
    assert "export KERAS_BACKEND=tensorflow" in message
    assert 'pip install "losszoo[jax]"' in message


def test_backend_chosen_by_keras_json(tmp_path):
    stderr, path = _import_without("torch", tmp_path, keras_json={"backend": "torch"})
    message = _check_one_message(stderr)
    assert f"{path} sets \"backend\": 'torch'" in message
    assert "No module named 'torch'" in message
    assert 'pip install "losszoo[torch]"' in message
