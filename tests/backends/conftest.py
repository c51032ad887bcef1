"""The backend-neutral suite: runs on whichever Keras backend ``KERAS_BACKEND`` names.

CI runs the whole of ``tests`` (this folder included) once per backend (TensorFlow, JAX,
PyTorch), each in its own process; ``tests/conftest.py`` sets the session up.
"""
