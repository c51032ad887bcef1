"""The package's layering (issue 20 item 5), declared as import-linter contracts in
``pyproject.toml`` (``[tool.importlinter]``): ops use keras.ops and the backend module (no
tf_keras, no other subpackage), imports run one way (calibration, retrieval > metrics >
losses, heads > registry > ops), and no subpackage imports another's private modules except
the shared ``losszoo._logits`` and ``losszoo._backend`` (and the public ``losszoo.contract``).
No contract has exceptions (``ignore_imports``) any more. Which modules may name a private
module of Keras or TensorFlow is checked here too.
"""

import ast
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


def test_no_contract_has_exceptions():
    """The burn-down is over (issue 35 item 2: the last entry, ``losszoo.metrics.dro ->
    losszoo.losses._base_loss``, went with the public ``losszoo.losses.per_example_loss``): no
    contract lists ``ignore_imports``, and every contract holds."""
    text = (ROOT / "pyproject.toml").read_text()
    config = text[text.index("\n[tool.importlinter]\n") :]
    assert config.count("\n[[tool.importlinter.contracts]]\n") >= 3
    assert not re.search(r"^\s*ignore_imports\s*=", config, re.M)
    code, out = _lint_imports()
    assert code == 0, out


# Where the package may name a private module of Keras, tf_keras or TensorFlow (import it, or
# name it to import or look it up), and why (issue 35: Keras' private hooks in one place).
# import-linter cannot check this (it sees an external package as one module).
PRIVATE = re.compile(r"^(keras\.src|tf_keras\.src|tensorflow\.(python|compiler|core))(\.|$)")
ALLOWED_PRIVATE = {
    # the one module that knows the backend: every private name of Keras, tf_keras or
    # TensorFlow is reached through it (losszoo._keras_hooks and the registry glue say why)
    "losszoo/_backend.py": ("keras.src", "tf_keras.src", "tensorflow.python"),
}


def _private_names(path):
    """``(line, module)`` for each import of, or string naming, a private module."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]
        else:
            continue
        yield from ((node.lineno, n) for n in names if PRIVATE.match(n))


def test_private_keras_and_tensorflow_modules_only_where_allowed():
    """No import of ``keras.src`` or of a private TensorFlow module outside the modules of
    ``ALLOWED_PRIVATE`` (TensorFlow's only in ``losszoo/_backend.py``), and each of those still
    needs its entry (the list shrinks when one goes)."""
    found = {}
    for path in sorted((ROOT / "losszoo").rglob("*.py")):
        for line, name in _private_names(path):
            found.setdefault(str(path.relative_to(ROOT)), []).append((line, name))
    wrong = [
        f"{path}:{line} {name}"
        for path, names in found.items()
        for line, name in names
        if not name.startswith(ALLOWED_PRIVATE.get(path, ()))
    ]
    assert not wrong, wrong
    assert sorted(found) == sorted(ALLOWED_PRIVATE), found


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
