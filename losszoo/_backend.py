"""Backend guard: losszoo's kernels are TensorFlow ops, so Keras must run on TensorFlow."""

import json
import os
import sys


def _keras_json_backend():
    """``(path, backend)`` of the ``keras.json`` Keras reads (``$KERAS_HOME`` or ``~/.keras``);
    ``backend`` is None when the file is missing, unreadable or has no ``"backend"`` key."""
    home = os.environ.get("KERAS_HOME")  # the lookup of keras/src/backend/config.py
    if home is None:
        base = os.path.expanduser("~")
        home = os.path.join(base if os.access(base, os.W_OK) else "/tmp", ".keras")
    path = os.path.expanduser(os.path.join(home, "keras.json"))
    try:
        with open(path) as f:
            return path, json.load(f).get("backend")
    except (OSError, ValueError, AttributeError):
        return path, None


def require_tensorflow_backend() -> None:
    """Raise ImportError unless Keras 3 runs on the TensorFlow backend.

    When Keras is not imported yet, a set ``KERAS_BACKEND`` is checked first, so that the
    error comes before Keras loads another backend's heavy machinery; otherwise the backend
    Keras runs on is checked. The message says where the setting came from: the environment
    variable ``KERAS_BACKEND`` or the ``"backend"`` key of Keras' ``keras.json`` (its path).
    """
    env = os.environ.get("KERAS_BACKEND") or None  # Keras ignores an empty value too
    if env is not None and "keras" not in sys.modules:
        backend = env
    else:
        import keras

        backend = keras.backend.backend()
    if backend == "tensorflow":
        return
    path, from_json = _keras_json_backend()
    if env == backend:
        source = f"the environment variable KERAS_BACKEND is {backend!r}"
    elif from_json == backend:
        source = f'Keras\' configuration file {path} sets "backend": {backend!r}'
        if env is not None:
            source += f" (KERAS_BACKEND={env!r} was set after keras was imported: too late)"
    else:
        source = f"Keras was started with the {backend!r} backend"
    raise ImportError(
        f"losszoo needs the TensorFlow backend of Keras 3, but {source}. Set "
        "KERAS_BACKEND=tensorflow before importing keras or losszoo (for example "
        '`export KERAS_BACKEND=tensorflow`), or set "backend": "tensorflow" in keras.json.'
    )
