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
  datasets: data loaders of the examples (MovieLens 100K); imported on first access.

The command line (``losszoo``, ``python -m losszoo``) imports this package only to reach
:mod:`losszoo.__main__`: there the loading above is deferred to the first attribute access,
so ``losszoo --help`` answers without starting a Keras backend.
"""

import importlib
import sys

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


def _launched_by_cli() -> bool:
    """True while ``python -m losszoo`` or the ``losszoo`` script imports this package."""
    argv = getattr(sys, "orig_argv", [])
    if sys.argv[:1] == ["-m"]:  # runpy sets argv[0] to "-m" while it locates the module
        return any(
            a == "-mlosszoo" or argv[i : i + 2] == ["-m", "losszoo"] for i, a in enumerate(argv)
        )
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None) or ""
    return bool(sys.argv) and script == sys.argv[0] and script.rsplit("/", 1)[-1] == "losszoo"


def __getattr__(name: str):
    if name == "datasets":  # light, but not needed by most programs: imported on first use
        return importlib.import_module("losszoo.datasets")
    if name in __all__ and _DEFERRED:  # the command line deferred the loading: load now
        globals()["_LOAD_NOW"] = True  # kept by the reload, which runs the imports below
        importlib.reload(sys.modules[__name__])
        return globals()[name]
    raise AttributeError(f"module 'losszoo' has no attribute {name!r}")


_DEFERRED = _launched_by_cli() and not globals().get("_LOAD_NOW", False)
if not _DEFERRED:
    from losszoo._backend import require_supported_backend

    require_supported_backend()
    from losszoo import calibration, contract, heads, losses, metrics, ops, retrieval
    from losszoo.contract import set_validation, validation, validation_enabled
    from losszoo.registry import (
        entries,
        get,
        get_class,
        load_plugins,
        names,
        register,
        tf_keras_loss,
    )

    load_plugins()
