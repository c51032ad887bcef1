"""Backend guard: losszoo's kernels are TensorFlow ops, so Keras must run on TensorFlow."""

import os


def require_tensorflow_backend() -> None:
    """Raise ImportError unless Keras 3 runs on the TensorFlow backend.

    The environment variable is checked first so that the error is raised before
    Keras loads another backend's heavy machinery.
    """
    requested = os.environ.get("KERAS_BACKEND")
    if requested is None:
        import keras

        requested = keras.backend.backend()
    if requested != "tensorflow":
        raise ImportError(
            f"losszoo needs the TensorFlow backend of Keras 3, but KERAS_BACKEND is "
            f"{requested!r}. Set KERAS_BACKEND=tensorflow before importing keras or "
            "losszoo (for example `export KERAS_BACKEND=tensorflow`)."
        )
