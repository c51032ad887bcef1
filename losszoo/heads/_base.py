"""What every losszoo head shares: it reads scores, and says so before Keras converts them."""

from __future__ import annotations

import keras

from losszoo.contract import check_array_form


class ScoresLayer(keras.layers.Layer):
    """A Keras layer whose first input is scores (logits).

    Keras converts a layer's inputs to tensors before ``call``; on JAX and PyTorch text then
    fails inside Keras ("could not convert string to float", "Invalid dtype: str32"), so the
    form of the scores is checked first (:func:`losszoo.contract.check_array_form`): text,
    ragged lists or a TensorFlow-only sparse tensor raise ``TypeError`` naming ``logits``,
    the same on every backend.

    Its output has the shape of the scores unless a subclass says otherwise, and
    ``get_config`` adds the attributes named in ``_config_keys`` (the constructor arguments,
    as checked and stored).
    """

    _config_keys = ()

    def __call__(self, inputs, *args, **kwargs):
        if isinstance(inputs, (list, tuple)) and any(hasattr(x, "shape") for x in inputs):
            for x, name in zip(inputs, ("logits", "features")):  # [logits, features]
                check_array_form(x, name)
        else:
            check_array_form(inputs, "logits")
        return super().__call__(inputs, *args, **kwargs)

    def constant_weight(self, name, value, shape=(), **kwargs):
        """A float32 weight ``name`` of ``shape`` initialised to ``value`` (broadcast)."""
        init = keras.initializers.Constant(value)
        return self.add_weight(name=name, shape=shape, initializer=init, dtype="float32", **kwargs)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), **{k: getattr(self, k) for k in self._config_keys}}
