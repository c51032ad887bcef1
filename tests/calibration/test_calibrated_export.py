"""A calibrated model takes its base model's inputs as the base takes them: one tensor for a
one-input base (not a list of one), so its exported ``serve`` signature is the same as every
other model's (issue 31 item 12). On every backend; the export on TensorFlow and JAX."""

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

from losszoo.calibration import fit_calibrator

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(0)
X = RNG.normal(size=(32, 4)).astype("float32")
Y = np.arange(32) % 3


def _base():
    inputs = keras.Input((4,), name="features")
    return keras.Model(inputs, keras.layers.Dense(3)(inputs))


@pytest.mark.parametrize("method", ["ts", "pb-c", "lb-l"])
def test_one_input_base_gives_a_one_tensor_calibrated_model(method):
    calibrated = fit_calibrator(_base(), X, Y, method, epochs=1)
    assert isinstance(calibrated.inputs, list) and len(calibrated.inputs) == 1
    assert not isinstance(calibrated.input, (list, tuple, dict))  # a tensor, not [tensor]
    probs = keras.ops.convert_to_numpy(calibrated(keras.ops.convert_to_tensor(X[:5])))
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(calibrated.predict(X[:5], verbose=0), probs, atol=1e-6)


def test_two_input_base_keeps_its_list():
    a, b = keras.Input((4,), name="a"), keras.Input((2,), name="b")
    base = keras.Model([a, b], keras.layers.Dense(3)(keras.layers.Concatenate()([a, b])))
    x = [X, RNG.normal(size=(32, 2)).astype("float32")]
    calibrated = fit_calibrator(base, x, Y, "ts", epochs=1)
    assert isinstance(calibrated.input, list) and len(calibrated.input) == 2
    assert calibrated.predict(x, verbose=0).shape == (32, 3)


EXPORT = """
import json, sys
import keras, numpy as np, tensorflow as tf
from losszoo.calibration import fit_calibrator
from losszoo.heads import Sparsemax
rng = np.random.default_rng(0)
x = rng.normal(size=(32, 4)).astype("float32")
inputs = keras.Input((4,), name="features")
calibrated = fit_calibrator(keras.Model(inputs, keras.layers.Dense(3)(inputs)), x,
                            np.arange(32) % 3, "pb-c", epochs=1)
head = keras.Model(inputs, Sparsemax()(keras.layers.Dense(3)(inputs)))
out, loaded = {}, {}
for name, model in (("calibrated", calibrated), ("head", head)):
    model.export(sys.argv[1] + "/" + name, format="tf_saved_model", verbose=0)
    loaded[name] = tf.saved_model.load(sys.argv[1] + "/" + name)  # kept: it owns the variables
    args, kwargs = loaded[name].serve.concrete_functions[0].structured_input_signature
    out[name] = {"args": [type(a).__name__ for a in args], "kwargs": sorted(kwargs),
                 "shape": [list(a.shape) for a in args if hasattr(a, "shape")]}
    served = np.asarray(loaded[name].serve(x[:5]))
    out[name + "_error"] = float(np.abs(served - model.predict(x[:5], verbose=0)).max())
print("RESULT", json.dumps(out))
"""


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_exported_serve_signature_takes_a_tensor_like_any_head(tmp_path, backend):
    if keras.backend.backend() != backend:
        pytest.skip(f"runs in the {backend} backend's test run (tf_saved_model export)")
    for module in ("tensorflow", backend):
        if importlib.machinery.PathFinder.find_spec(module) is None:  # sys.modules may hide it
            pytest.skip(f"{module} is not installed")
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(  # a fresh process: the JAX test run hides TensorFlow
        [sys.executable, "-c", EXPORT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT", 1)[1])
    errors = out.pop("calibrated_error"), out.pop("head_error")
    assert (
        out["calibrated"]
        == out["head"]
        == {
            "args": ["TensorSpec"],  # one tensor, not a list of one
            "kwargs": [],
            "shape": [[None, 4]],
        }
    )
    assert max(errors) < 1e-5
