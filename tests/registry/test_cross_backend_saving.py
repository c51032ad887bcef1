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
out = {}
for path in sys.argv[2:]:  # every other backend's file, in one process
    model = keras.models.load_model(path, compile=False)
    out[path] = [np.asarray(p).tolist() for p in model.predict(np.load(sys.argv[1]), verbose=0)]
print(json.dumps(out))
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
    return json.loads(result.stdout.strip().splitlines()[-1])


BACKENDS = ("tensorflow", "jax", "torch")

pytestmark = [
    pytest.mark.slow,
    # The test runs every backend in its own subprocesses, whatever the suite's backend: once
    # per CI (the TensorFlow run), not the same processes again in the JAX and PyTorch runs.
    pytest.mark.skipif(
        os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow",
        reason="cross-backend subprocesses run once, in the TensorFlow run",
    ),
]


def test_saved_model_predicts_the_same_on_every_backend(tmp_path):
    """One process per backend trains and saves its model, then one process per backend
    loads the two other backends' files (6 processes instead of a save and two loads per
    saving backend; one test, so pytest-xdist cannot split the saves between its workers)."""
    data, files = str(tmp_path / "x.npy"), {}
    for backend in BACKENDS:
        path = str(tmp_path / f"{backend}.keras")
        expected = [np.array(p) for p in _run(SAVE, backend, path, data)]
        assert expected[0].shape == (7, 5) and np.allclose(expected[0].sum(-1), 1, atol=1e-6)
        files[backend] = path, expected
    for loaded_on in BACKENDS:
        others = [b for b in BACKENDS if b != loaded_on]
        got = _run(LOAD, loaded_on, data, *(files[b][0] for b in others))
        for saved_on in others:
            path, expected = files[saved_on]
            assert len(got[path]) == len(expected)
            for a, b in zip(got[path], expected):
                np.testing.assert_allclose(
                    np.array(a), b, atol=2e-6, err_msg=f"{saved_on} -> {loaded_on}"
                )
