"""losszoo: output heads and training losses beyond the softmax, for Keras 3 on TensorFlow, JAX
and PyTorch.

Importing losszoo registers every loss, head and metric by name, so that
``model.compile(loss="sparsemax")`` works in Keras 3 (and in tf_keras when installed), and
loads the installed plugins (entry-point group ``losszoo.plugins``), whose names then work in
``compile`` and ``keras.models.load_model`` too. A plugin that fails to load is skipped with a
``RuntimeWarning`` naming it; the import of losszoo goes on.

Subpackages:
  ops: kernels written once in ``keras.ops``, with hand-derived gradients (no layers).
  contract: the fail-loud input rules and the validation switch.
  heads: Keras layers over the ops.
  losses: Keras losses over the ops.
  calibration: post-hoc calibrators (fit_calibrator), calibration metrics, reliability plots.
  metrics: Keras metrics (e.g. the exact full-data KL-DRO risk).
  registry: names -> classes, Keras string lookup, entry-point plugins.
  retrieval: the Keras 3 retrieval task, candidate samplers, catalogue top-k.
  datasets: data loaders of the examples (MovieLens 100K); imported on first access.

If the backend Keras picks is not installed (say ``pip install "losszoo[jax]"`` without
``KERAS_BACKEND=jax``, so that Keras picks its default, TensorFlow), the import raises one
ImportError that says which backend Keras picked, from where (the environment variable
``KERAS_BACKEND``, Keras' ``keras.json`` or Keras' default) and how to choose another.

The command line (``losszoo``) lives in :mod:`losszoo_cli`, outside this package, so that it
answers without importing it.
"""

import importlib

__version__ = "0.1.0"

__all__ = [
    "calibration",
    "contract",
    "datasets",
    "entries",
    "get",
    "get_class",
    "heads",
    "losses",
    "metrics",
    "names",
    "ops",
    "register",
    "retrieval",
    "set_validation",
    "tf_keras_loss",
    "validation",
    "validation_enabled",
]


_BACKEND_MODULES = {"tensorflow": "tensorflow", "jax": "jax", "jaxlib": "jax", "torch": "torch"}


def _keras_json() -> tuple[str, object]:
    """``(path, backend)`` of the ``keras.json`` Keras reads, found as Keras finds it (Keras
    cannot be imported here); ``backend`` is None when the file or its key is missing."""
    import json
    import os

    home = os.environ.get("KERAS_HOME")
    if not home:
        base = os.path.expanduser("~")
        home = os.path.join(base if os.access(base, os.W_OK) else "/tmp", ".keras")
    path = os.path.expanduser(os.path.join(home, "keras.json"))
    try:
        with open(path) as f:
            return path, json.load(f).get("backend")
    except (OSError, ValueError, AttributeError):
        return path, None


def _missing_backend_message(error: ModuleNotFoundError) -> str:
    """The one message for a Keras whose chosen backend module is not installed."""
    import importlib.util
    import os

    env = os.environ.get("KERAS_BACKEND") or None  # Keras ignores an empty value too
    path, from_json = _keras_json()
    picked = env or from_json or _BACKEND_MODULES[error.name.split(".")[0]]
    if env:
        source = f"the environment variable KERAS_BACKEND={env!r} chose it"
    elif from_json:
        source = (
            f'Keras\' configuration file {path} sets "backend": {from_json!r} (Keras writes its '
            "default there on its first import)"
        )
    else:
        source = f"it is Keras' default (KERAS_BACKEND is unset and {path} sets no backend)"

    def installed(module):
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False

    others = [b for b in ("tensorflow", "jax", "torch") if b != picked and installed(b)]
    choose = f"export KERAS_BACKEND={others[0] if others else 'jax'}"
    found = ", ".join(others) or "none of tensorflow, jax, torch"
    return (
        f"losszoo cannot start Keras: Keras picked the {picked!r} backend ({source}), but it "
        f"is not installed ({error}). Choose an installed backend before importing keras or "
        f'losszoo, e.g. `{choose}` (installed here: {found}), or set "backend" in {path}; '
        f'or install it: pip install "losszoo[{picked}]".'
    )


def _import_keras() -> None:
    """Import Keras; a missing backend module becomes one ImportError (see the docstring)."""
    try:
        import keras  # noqa: F401
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] not in _BACKEND_MODULES:
            raise
        raise ImportError(_missing_backend_message(error)) from None


def __getattr__(name: str):
    if name == "datasets":  # light, but not needed by most programs: imported on first use
        return importlib.import_module("losszoo.datasets")
    raise AttributeError(f"module 'losszoo' has no attribute {name!r}")


_import_keras()

from losszoo._backend import require_supported_backend  # noqa: E402

require_supported_backend()
from losszoo import calibration, contract, heads, losses, metrics, ops, retrieval  # noqa: E402
from losszoo.contract import set_validation, validation, validation_enabled  # noqa: E402
from losszoo.registry import (  # noqa: E402
    entries,
    get,
    get_class,
    load_plugins,
    names,
    register,
    tf_keras_loss,
)

load_plugins()
