"""The package's layering (issue 20 item 5), declared as import-linter contracts in
``pyproject.toml`` (``[tool.importlinter]``): ops use keras.ops and the backend module (no
tf_keras, no other subpackage), imports run one way (calibration, retrieval > metrics >
losses, heads > registry > ops), and no subpackage imports another's private modules except
the shared ``losszoo._logits`` and ``losszoo._backend`` (and the public ``losszoo.contract``).
The contracts' ``ignore_imports`` lists what still breaks them (the burn-down); import-linter
fails on an entry that no longer matches.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

import losszoo

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports(*config):
    pytest.importorskip("importlinter")
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    result = subprocess.run(
        [exe, "--no-cache", "--no-logo", *config],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return result.returncode, result.stdout + result.stderr


def test_layering_contracts_hold():
    code, out = _lint_imports()
    assert code == 0, out
    assert re.search(r"Contracts: [1-9]\d* kept, 0 broken", out), out


def test_contracts_see_every_ignored_import(tmp_path):
    """Without its burn-down entries (every ``ignore_imports`` entry) exactly those imports
    break the contracts: the contracts read the real import graph, and the list names what
    remains to fix."""
    text = (ROOT / "pyproject.toml").read_text()
    config = text[text.index("\n[tool.importlinter]\n") :]
    entry = r'^\s*"(losszoo[\w.]* -> losszoo[\w.]*)",\n'
    burn_down = re.findall(entry, config, re.M)
    assert burn_down
    bare = re.sub(entry, lambda m: "" if m[1] in burn_down else m[0], config, flags=re.M)
    (tmp_path / "pyproject.toml").write_text(bare)
    code, out = _lint_imports(str(tmp_path / "pyproject.toml"))
    assert code != 0, out
    broken = re.findall(r"^-\s+(losszoo\S* -> losszoo\S*) \(l\.\d+\)", out, re.M)
    assert sorted(broken) == sorted(burn_down), out


METRICS = (
    "Accuracy",
    "AdaptiveECE",
    "BrierScore",
    "ClasswiseECE",
    "ExpectedCalibrationError",
    "NegativeLogLikelihood",
)


def test_calibration_metrics_in_losszoo_metrics_and_saved_models_load(tmp_path):
    """The streaming calibration metrics moved to losszoo.metrics; their old import path and
    their registered names stay, so .keras files saved before the move still load."""
    from losszoo.calibration import streaming

    for name in METRICS:
        cls = getattr(losszoo.metrics, name)
        assert getattr(losszoo.calibration, name) is cls is getattr(streaming, name)
        assert keras.saving.get_registered_name(cls) == f"losszoo>{name}"
        # A config written by the old module path deserializes to the same class.
        old = keras.saving.serialize_keras_object(cls())
        old["module"] = "losszoo.calibration.streaming"
        assert type(keras.saving.deserialize_keras_object(old)) is cls
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 4)).astype(np.float32)
    y = rng.integers(0, 3, 40)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(
        "sgd",
        "sparse_categorical_crossentropy",
        metrics=[losszoo.metrics.ExpectedCalibrationError(n_bins=5), "brier_score"],
    )
    want = model.evaluate(x, y, batch_size=8, return_dict=True, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    got = loaded.evaluate(x, y, batch_size=8, return_dict=True, verbose=0)
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6)
    probs = model.predict(x, verbose=0)
    np.testing.assert_allclose(want["ece"], losszoo.calibration.ece(probs, y, 5), atol=1e-5)
