"""Test session setup; runs before any Keras backend is imported by a test module.

The whole suite runs on the Keras backend ``KERAS_BACKEND`` names (TensorFlow if unset), one
pytest process per backend: ``KERAS_BACKEND=jax python -m pytest tests``.

What only TensorFlow has (tf_keras, TensorFlow Recommenders, ``tf.distribute``, the
``tf.function`` / XLA harness of ``tests/helpers.py``) is marked
``tensorflow_only``:

- a whole module: ``pytestmark = pytest.mark.tensorflow_only(reason="...")`` after its imports.
  On JAX and PyTorch the module is skipped *without being imported* (the mark is read from its
  source), so it may import TensorFlow at module level; ``-ra`` lists it with the reason.
- one test or class: ``@pytest.mark.tensorflow_only(reason="...")``.

A module that is not marked must import on every backend: on JAX and PyTorch, TensorFlow,
tf_keras and TFRS are not importable (below), so a stray module-level ``import tensorflow`` is a
collection error, not a silent skip.
"""

import ast
import gc
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# tensorflow-recommenders 0.7 needs tf.keras to be tf_keras (Keras 2). `import keras`
# stays Keras 3, which is what losszoo uses.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# XLA's LLVM backend without its optimisation passes: the suite's time is mostly XLA compiles
# of small programs (JAX's possibilistic loss step: 10.3 s -> 5.5 s), which then run a little
# slower. The HLO, hence every fusion and loop, is the one users get; results differ from an
# optimised build in the last bits (1e-15 relative on the possibilistic loss). An XLA_FLAGS
# that already sets the level wins; subprocesses of the suite inherit it.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
    ).strip()

import pytest  # noqa: E402

BACKEND = os.environ["KERAS_BACKEND"]
TENSORFLOW_ONLY = "tensorflow_only"

if BACKEND != "tensorflow":
    # JAX and PyTorch runs see no TensorFlow, as on a machine with only their backend (the
    # GPU machine, a JAX user's install): Keras would otherwise import it lazily (e.g. for file
    # I/O when saving), and TensorFlow beside PyTorch in one process can crash.
    import sys

    for _name in ("tensorflow", "tf_keras", "tensorflow_recommenders"):
        sys.modules[_name] = None
if BACKEND == "tensorflow":
    import tensorflow as tf

    # Two logical CPUs, so MirroredStrategy tests run on any machine.
    _cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
    )

import keras  # noqa: E402

if BACKEND == "torch" and os.environ.get("PYTEST_XDIST_WORKER"):
    # Two pytest-xdist workers share the cores: PyTorch's OpenMP pool of one thread per core
    # in each worker oversubscribes them, and its spinning threads then wait on each other
    # (seen in session 13: 1,549 s for what took 16 s alone). The tests' tensors are small.
    import torch

    torch.set_num_threads(1)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        f"{TENSORFLOW_ONLY}(reason): needs TensorFlow itself (tf_keras, TFRS, tf.distribute, "
        "tf.function/XLA); skipped on JAX and PyTorch. As a module's `pytestmark` the module is "
        "not even imported there.",
    )


def _tensorflow_only_mark(path):
    """``(line, reason)`` of ``path``'s module-level ``pytestmark = ...tensorflow_only(...)``,
    read from its source; ``None`` if it has no such mark."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None  # let the import report it
    for node in tree.body:
        if not (
            isinstance(node, (ast.Assign, ast.AnnAssign))
            and any(
                isinstance(t, ast.Name) and t.id == "pytestmark"
                for t in getattr(node, "targets", [getattr(node, "target", None)])
            )
            and node.value is not None
        ):
            continue
        for sub in ast.walk(node.value):
            mark = sub.func if isinstance(sub, ast.Call) else sub
            if isinstance(mark, ast.Attribute) and mark.attr == TENSORFLOW_ONLY:
                words = [k.value for k in getattr(sub, "keywords", []) if k.arg == "reason"]
                words += getattr(sub, "args", [])[:1]
                if words and isinstance(words[0], ast.Constant):
                    return node.lineno, str(words[0].value)
                return node.lineno, "needs TensorFlow"
    return None


class _TensorFlowOnlyModule(pytest.File):
    """A ``tensorflow_only`` module on another backend: skipped, never imported."""

    mark = (0, "")

    def collect(self):
        return []


def pytest_pycollect_makemodule(module_path, parent):
    if BACKEND == "tensorflow" or module_path.name == "__init__.py":
        return None
    mark = _tensorflow_only_mark(module_path)
    if mark is None:
        return None
    module = _TensorFlowOnlyModule.from_parent(parent, path=module_path)
    module.mark = mark
    return module


@pytest.hookimpl(tryfirst=True)
def pytest_make_collect_report(collector):
    """A ``tensorflow_only`` module is reported skipped at its ``pytestmark`` line."""
    if isinstance(collector, _TensorFlowOnlyModule):
        line, reason = collector.mark
        where = (str(collector.path), line, f"TensorFlow-only module: {reason}")
        return pytest.CollectReport(collector.nodeid, "skipped", where, [])
    return None


def pytest_collection_modifyitems(config, items):
    if BACKEND == "tensorflow":
        return
    for item in items:
        mark = item.get_closest_marker(TENSORFLOW_ONLY)
        if mark is not None:
            reason = mark.kwargs.get("reason", mark.args[0] if mark.args else "needs TensorFlow")
            item.add_marker(pytest.mark.skip(reason=f"TensorFlow-only: {reason}"))


#: Resident size (MiB) above which a JAX worker drops its compiled programs after a test,
#: not only after a module: some modules compile more than a gigabyte of executables. After a
#: release the bar is at least ``JAX_RELEASE_STEP_MIB`` above what is left, so that memory
#: the release cannot free never makes every test recompile.
JAX_RELEASE_MIB = 1200
JAX_RELEASE_STEP_MIB = 500
_release_above = JAX_RELEASE_MIB


def _resident_mib() -> float:
    """This process' resident memory in MiB (Linux ``/proc``; 0 where there is none)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return 0.0


def _release_memory():
    """Collect garbage, drop JAX's compiled programs (``jax.clear_caches()``) and hand the
    freed heap back to the system (glibc's ``malloc_trim``; elsewhere nothing). TensorFlow
    keeps every XLA program it compiled: its device compilation cache has no eviction."""
    global _release_above
    if BACKEND == "jax":
        import jax

        jax.clear_caches()
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    _release_above = max(JAX_RELEASE_MIB, _resident_mib() + JAX_RELEASE_STEP_MIB)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """After each module, :func:`_release_memory`, so the process does not keep every
    module's XLA executables and freed heap. Per test, clearing JAX's caches would recompile
    every eager op (about 4 s a test on the 2-core machine): a JAX worker does that only once
    it holds more than ``JAX_RELEASE_MIB`` (see there)."""
    yield
    _release_memory()


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts from a clean Keras: ``keras.backend.clear_session()`` (as Keras' own
    ``TestCase.setUp`` does: names, global settings, TensorFlow's default graph and kernel
    cache, torch.compile's caches), float32 policy and seeded RNGs."""
    keras.backend.clear_session(free_memory=False)
    keras.mixed_precision.set_global_policy("float32")
    keras.utils.set_random_seed(0)
    yield
    keras.mixed_precision.set_global_policy("float32")
    if BACKEND == "jax" and _resident_mib() > _release_above:
        _release_memory()


#: Contract outcomes the pytest-xdist workers sent back (on the controlling process).
_WORKER_OUTCOMES: list = []


def _contract_outcomes() -> list:
    """This process' contract outcomes as ``[[suite, kind, mode, outcome, count], ...]``."""
    if "tests.contract" not in __import__("sys").modules:
        return []
    from tests import contract

    return [[*key, n] for key, n in contract.OUTCOMES.items()]


def pytest_sessionfinish(session):
    """On a pytest-xdist worker: hand the contract outcomes to the controlling process."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["losszoo_contract_outcomes"] = _contract_outcomes()


def pytest_testnodedown(node, error):
    """On the controlling process: collect a finished worker's contract outcomes."""
    _WORKER_OUTCOMES.extend(getattr(node, "workeroutput", {}).get("losszoo_contract_outcomes", []))


def pytest_terminal_summary(terminalreporter):
    """Print how the fail-loud contract tests' inputs fared (see tests/contract/__init__.py),
    summed over the pytest-xdist workers when the run has them."""
    import collections

    outcomes = collections.Counter()
    for *key, n in _contract_outcomes() + _WORKER_OUTCOMES:
        outcomes[tuple(key)] += n
    if not outcomes:
        return
    from tests import contract

    table = contract.outcome_table(outcomes)
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
