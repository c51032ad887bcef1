"""Backend-neutral checks of Keras objects: config round trips, short fits, mixed precision.

The TensorFlow-only checks (``MirroredStrategy``) stay in ``tests/helpers.py``.
"""

from __future__ import annotations

import json

import keras
import numpy as np

import losszoo


def _registered_entry(obj):
    for entry in losszoo.entries():
        if entry.cls is type(obj):
            return entry
    return None


def assert_config_roundtrip(obj):
    """``get_config``/``from_config``, Keras (de)serialization via JSON, and the registry name."""
    config = obj.get_config()
    clone = type(obj).from_config(config)
    assert clone.get_config() == config, "from_config(get_config()) changed the config"
    serialized = json.loads(json.dumps(keras.saving.serialize_keras_object(obj)))
    restored = keras.saving.deserialize_keras_object(serialized)
    assert type(restored) is type(obj), f"deserialized as {type(restored)}"
    assert restored.get_config() == config, "Keras serialization changed the config"
    entry = _registered_entry(obj)
    assert entry is not None, f"{type(obj).__name__} is not registered in losszoo"
    by_name = losszoo.get_class(entry.name, entry.kind).from_config(config)
    assert by_name.get_config() == config
    return restored


def assert_fit_smoke(model, x, y, epochs=3, **fit_kwargs):
    """``model.fit`` runs with finite losses that go down; returns the History."""
    fit_kwargs.setdefault("verbose", 0)
    history = model.fit(x, y, epochs=epochs, **fit_kwargs)
    losses = np.asarray(history.history["loss"])
    assert np.all(np.isfinite(losses)), f"non-finite training loss: {losses}"
    assert losses[-1] < losses[0], f"training loss did not decrease: {losses}"
    return history


def _dtype(t):
    return keras.backend.standardize_dtype(t.dtype)


def assert_mixed_precision(build_model, x, y, loss, epochs=2, batch_size=32):
    """Under ``mixed_float16`` the model trains with finite losses; the loss value is float32,
    and so are the outputs of a losszoo head ending the model. Returns ``(model, history)``."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = build_model()
        if isinstance(loss, keras.losses.Loss):
            loss = type(loss).from_config(loss.get_config())
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
        history = model.fit(x, y, epochs=epochs, batch_size=batch_size, verbose=0)
        assert np.all(np.isfinite(history.history["loss"])), history.history
        loss_obj = keras.losses.get(loss) if isinstance(loss, str) else loss
        preds = model(x[:8])
        if isinstance(loss_obj, keras.losses.Loss):
            value = loss_obj(y[:8], preds)
            assert _dtype(value) == "float32", f"loss computed in {_dtype(value)}"
        if type(model.layers[-1]).__module__.startswith("losszoo."):
            assert _dtype(preds) == "float32", f"head output in {_dtype(preds)}"
        return model, history
    finally:
        keras.mixed_precision.set_global_policy(previous)
