"""The backend-neutral suite: runs on whichever Keras backend ``KERAS_BACKEND`` names.

CI runs this folder once per backend (TensorFlow, JAX, PyTorch), each in its own process.
"""
