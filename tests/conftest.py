"""Test session setup; runs before any Keras backend is imported by a test module.

The suite runs on TensorFlow unless ``KERAS_BACKEND`` names another backend (then only
``tests/backends`` applies: the backend-neutral suite).
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# tensorflow-recommenders 0.7 needs tf.keras to be tf_keras (Keras 2). `import keras`
# stays Keras 3, which is what losszoo uses.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import pytest  # noqa: E402

if os.environ["KERAS_BACKEND"] != "tensorflow":
    # JAX and PyTorch runs see no TensorFlow, as on a machine with only their backend (the
    # GPU machine, a JAX user's install): Keras would otherwise import it lazily (e.g. for file
    # I/O when saving), and TensorFlow beside PyTorch in one process can crash.
    import sys

    for _name in ("tensorflow", "tf_keras", "tensorflow_recommenders"):
        sys.modules[_name] = None
if os.environ["KERAS_BACKEND"] == "tensorflow":
    import tensorflow as tf

    # Two logical CPUs, so MirroredStrategy tests run on any machine.
    _cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
    )

import keras  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts with float32 policy and seeded RNGs."""
    keras.mixed_precision.set_global_policy("float32")
    keras.utils.set_random_seed(0)
    yield
    keras.mixed_precision.set_global_policy("float32")


def pytest_terminal_summary(terminalreporter):
    """Print how the fail-loud contract tests' inputs fared (see tests/contract/__init__.py)."""
    if "tests.contract" not in __import__("sys").modules:
        return
    from tests import contract

    table = contract.outcome_table()
    if not table["per_suite"]:
        return
    bad = sum(table["summary"]["bad"].values())
    valid = sum(table["summary"]["valid"].values())
    terminalreporter.write_sep(
        "-", f"fail-loud contract: {bad} bad-input runs, {valid} valid-input runs"
    )
    for kind in ("bad", "valid"):
        counts = ", ".join(f"{k}={v}" for k, v in sorted(table["summary"][kind].items()))
        terminalreporter.write_line(f"{kind}: {counts}")
    path = os.environ.get("LOSSZOO_CONTRACT_REPORT")
    if path:
        import json

        with open(path, "w") as f:
            json.dump(table, f, indent=1, sort_keys=True)
