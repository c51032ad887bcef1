"""Issue 19 item 15: several ``MirroredStrategy`` instances in one process (a notebook re-run,
a sweep) with the DRO losses.

Every ``MirroredStrategy`` starts its collective group and instance keys at the same numbers
(TF's ``_collective_key_base`` is never advanced), so a strategy built after another one
reuses the keys. The DRO losses' all-reduce / all-gather in the forward pass then met the
previous strategy's gradient all-reduce at the same key with another shape: ``fit`` failed
in ``CollectiveGatherV2`` / ``CollectiveReduceV2`` and the aborted collective executor broke
every later ``fit`` in the process. They now combine the replicas' values by plain copies
(``merge_call``) under a single-process ``MirroredStrategy``.

Run in a fresh process (the failure poisons the process; the suite's other tests reuse one
cached strategy), with the strategies' default cross-device ops (collectives).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.tensorflow_only(
    reason="tf.distribute.MirroredStrategy: a TensorFlow subprocess whatever the suite's backend"
)

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import json
import tensorflow as tf
cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
import numpy as np
import losszoo
from tests import distributed as dist

devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
plain = "sparse_categorical_crossentropy"
report = []
for name in (plain, "kl_dro_batch_lse", "safe_kl_dro", "cvar", "kl_dro_sumexp", plain):
    x, y = dist.data("cvar")
    def fit(strategy):
        def make():
            if name == plain:
                loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
            else:
                loss = dist.make_loss(name)
            model = dist.build_model()
            model.compile(
                optimizer=keras.optimizers.SGD(0.1),
                loss=loss,
                metrics=[losszoo.metrics.ExactKLDRORisk(lam=0.5)],
            )
            return model
        if strategy is None:
            model = make()
        else:
            with strategy.scope():
                model = make()
        h = model.fit(x, y, batch_size=len(x), epochs=2, shuffle=False, verbose=0)
        return model.get_weights(), h.history
    w1, h1 = fit(None)
    try:
        w2, h2 = fit(tf.distribute.MirroredStrategy(devices))  # a new strategy each time
    except Exception as e:  # report, keep going: later fits show whether the process broke
        report.append({"name": name, "error": type(e).__name__ + ": " + str(e)[-300:]})
        continue
    report.append({
        "name": name,
        "weights": max(float(np.max(np.abs(a - b))) for a, b in zip(w1, w2)),
        "loss": [h1["loss"], h2["loss"]],
        "metric": [h1["exact_kl_dro_risk"], h2["exact_kl_dro_risk"]],
    })
print("REPORT " + json.dumps(report))
"""


def _run_reports(script):
    """Run ``script`` in a fresh process (TensorFlow, 2 logical CPUs); its JSON reports."""
    env = {
        **os.environ,
        "KERAS_BACKEND": "tensorflow",
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [x for x in out.stdout.splitlines() if x.startswith("REPORT ")]
    return [json.loads(line[len("REPORT ") :]) for line in lines]


def test_dro_losses_under_successive_mirrored_strategies():
    """Both scripts in one fresh process (TensorFlow imported once): the successive-strategies
    script, then the by-name script, whose strategies come after the first's (more successive
    strategies in one process, as in a notebook)."""
    first, by_name = _run_reports(_SCRIPT + f"NAMES = {_DRO_NAMES!r}\n" + _BY_NAME_SCRIPT)
    _check_successive_strategies(first)
    _check_by_name_inside_mirrored_scope(by_name)


def _check_successive_strategies(report):
    assert [r["name"] for r in report][1:5] == [
        "kl_dro_batch_lse",
        "safe_kl_dro",
        "cvar",
        "kl_dro_sumexp",
    ]
    for r in report:
        assert "error" not in r, r
        # each strategy trains exactly like one device: weights, losses and the exact metric
        assert r["weights"] < 1e-5, r
        for single, mirrored in (r["loss"], r["metric"]):
            assert all(abs(a - b) <= 1e-5 * max(1.0, abs(a)) for a, b in zip(single, mirrored)), r


_DRO_NAMES = ("safe_kl_dro", "kl_dro_batch_lse", "cvar", "kl_dro_sumexp")
# Runs after _SCRIPT in its process (its imports, devices and strategies before these).
_BY_NAME_SCRIPT = r"""
from losszoo.losses.dro import find_dro_losses

report = []
for name in NAMES:
    x, y = dist.data("cvar")
    runs = []
    for strategy in (None, tf.distribute.MirroredStrategy(devices)):
        scope = strategy.scope() if strategy is not None else tf.name_scope("one_device")
        with scope:
            model = dist.build_model()
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss=name)  # by name
        try:
            h = model.fit(x, y, batch_size=len(x), epochs=2, shuffle=False, verbose=0)
        except Exception as e:
            runs.append({"error": type(e).__name__ + ": " + str(e)[-300:]})
            continue
        run = {"weights": [w.tolist() for w in model.get_weights()], "loss": h.history["loss"]}
        for loss in find_dro_losses(model):
            value = loss._state.value
            run["mirrored"] = isinstance(value, tf.distribute.DistributedValues)
            copies = value.values if run["mirrored"] else [value]
            run["alpha"] = [float(v.numpy()[0]) for v in copies]
        runs.append(run)
    report.append({"name": name, "runs": runs})
print("REPORT " + json.dumps(report))
"""


def _check_by_name_inside_mirrored_scope(report):
    """Issue 31 item 2: ``compile(loss="safe_kl_dro")`` inside ``strategy.scope()`` raised
    "created outside the active tf.distribute strategy's scope" (Keras builds a loss given by
    name in its symbolic build, where the alpha variable is still deferred). All four DRO names
    by name under 2-replica Mirrored train as one device; safe-KL's alpha is mirrored and equal
    on both replicas."""
    assert [r["name"] for r in report] == list(_DRO_NAMES)
    for r in report:
        single, mirrored = r["runs"]
        assert "error" not in single and "error" not in mirrored, r
        for a, b in zip(single["weights"], mirrored["weights"]):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(mirrored["loss"], single["loss"], rtol=1e-5)
        if r["name"] == "safe_kl_dro":
            assert mirrored["mirrored"] and len(mirrored["alpha"]) == 2
            assert mirrored["alpha"][0] == mirrored["alpha"][1] != 0.0
            np.testing.assert_allclose(mirrored["alpha"][0], single["alpha"][0], rtol=1e-5)
