"""The spec's numpy oracles (``../shared/specs/*_reference.py``), importable without any
Keras backend loaded."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SPECS_DIR = Path(os.environ.get("LOSSZOO_SHARED", REPO_ROOT.parent / "shared")) / "specs"


@functools.cache
def load_reference(name: str):
    """Import ``../shared/specs/<name>_reference.py`` (a float64 numpy oracle) as a module."""
    path = SPECS_DIR / f"{name}_reference.py"
    if not path.exists():
        raise FileNotFoundError(
            f"Reference {path} not found; the tests need ../shared beside the repository "
            "(or LOSSZOO_SHARED pointing at it)."
        )
    spec = importlib.util.spec_from_file_location(f"_losszoo_reference_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
