"""Issue 21 item 3: a ``.keras`` file saved under one Keras backend loads and predicts the same
under the others (each backend in a fresh process: Keras picks its backend once).

Loaded with ``compile=False``: Keras saves the optimizer of the training backend (e.g. its
PyTorch Adam subclass), whose deserialization imports that backend's framework; the layers,
heads and weights are what travel between backends."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]

SAVE = """
import json, sys
import keras, numpy as np
import losszoo
keras.utils.set_random_seed(0)
inputs = keras.Input((6,))
logits = keras.layers.Dense(5)(inputs)
sparse = losszoo.heads.Sparsemax()(logits)
bounded = losszoo.heads.BCSoftmax(lower=0.02, upper=0.8)(logits)
model = keras.Model(inputs, [sparse, bounded])
x = np.random.default_rng(1).normal(size=(7, 6)).astype("float32") * 3
y = np.random.default_rng(2).integers(0, 5, 7)
# BCSoftmax outputs probabilities: a cross-entropy on them (rankmax would read them as scores,
# which losszoo refuses since the multi-output models are checked too)
model.compile(optimizer="adam", loss=["sparsemax", "sparse_categorical_crossentropy"])
model.fit(x, [y, y], epochs=2, batch_size=4, verbose=0)
model.save(sys.argv[1])
np.save(sys.argv[2], x)
print(json.dumps([p.tolist() for p in model.predict(x, verbose=0)]))
"""

LOAD = """
import json, sys
import keras, numpy as np
import losszoo
model = keras.models.load_model(sys.argv[1], compile=False)
x = np.load(sys.argv[2])
print(json.dumps([np.asarray(p).tolist() for p in model.predict(x, verbose=0)]))
"""


# JAX and PyTorch processes run without TensorFlow (as on a machine with only their backend;
# TensorFlow beside PyTorch in one process can crash).
NO_TENSORFLOW = "import sys\nsys.modules['tensorflow'] = sys.modules['tf_keras'] = None\n"


def _run(code, backend, *args):
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(ROOT)}
    if backend != "tensorflow":
        code = NO_TENSORFLOW + code
    result = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return [np.array(p) for p in json.loads(result.stdout.strip().splitlines()[-1])]


@pytest.mark.slow
@pytest.mark.parametrize("saved_on", ["tensorflow", "jax", "torch"])
def test_saved_model_predicts_the_same_on_every_backend(saved_on, tmp_path):
    path, data = str(tmp_path / "model.keras"), str(tmp_path / "x.npy")
    expected = _run(SAVE, saved_on, path, data)
    assert expected[0].shape == (7, 5) and np.allclose(expected[0].sum(-1), 1, atol=1e-6)
    for backend in {"tensorflow", "jax", "torch"} - {saved_on}:
        got = _run(LOAD, backend, path, data)
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, atol=2e-6, err_msg=f"{saved_on} -> {backend}")
