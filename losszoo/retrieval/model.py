"""A Keras 3 base model whose loss the user writes, TFRS-style (``tfrs.Model``'s contract)."""

from __future__ import annotations

import inspect

import keras
from keras import ops


def _batch_loss_adapter(batch_loss):
    """Keras' ``compute_loss(x, y, y_pred, sample_weight, training)`` around a TFRS-style
    ``compute_loss(inputs, training)``: the batch as the data gave it, plus ``self.losses``."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        inputs = keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
        loss = batch_loss(self, inputs, training=training)
        for extra in self.losses:  # regularization, as tfrs.Model and Keras add them
            loss = loss + ops.cast(ops.sum(extra), loss.dtype)
        return loss

    compute_loss.__doc__ = batch_loss.__doc__
    compute_loss.batch_loss = batch_loss
    return compute_loss


class Model(keras.Model):
    """Base class of models whose loss is written by hand: Keras 3's ``tfrs.Model``.

    A subclass builds its towers and task in ``__init__`` and writes
    ``compute_loss(self, inputs, training=False)`` returning the batch loss (TFRS'
    signature; ``inputs`` is the batch as the dataset yields it, e.g. a dict of features).
    ``fit`` and ``evaluate`` then train on that loss plus the layers' regularization losses
    (``self.losses``) on TensorFlow, JAX and PyTorch; the task's metrics show in the logs.
    Keras' own signature ``compute_loss(self, x, y, y_pred, sample_weight, training)`` is
    used as it is.

    ``call`` (optional, as in TFRS) defaults to building the model: the first call runs
    ``compute_loss`` once without updating any state (Keras' symbolic build before ``fit``),
    so that every tower exists before training starts (JAX needs that); it returns
    ``None``. A subclass that defines ``call`` builds its towers itself.

    Args:
      *args, **kwargs: those of a subclassed ``keras.Model`` (e.g. ``name``); a subclass
        passes them on with ``super().__init__(...)``.

    Example:
      >>> import losszoo.retrieval as R
      >>> class TwoTower(R.Model):
      ...     def __init__(self):
      ...         super().__init__()
      ...         self.users = keras.layers.Embedding(5, 4)
      ...         self.items = keras.layers.Embedding(7, 4)
      ...         self.task = R.Retrieval()
      ...     def compute_loss(self, inputs, training=False):
      ...         return self.task(self.users(inputs["user"]), self.items(inputs["item"]))
      >>> model = TwoTower()
      >>> model.compile(optimizer="adagrad")
      >>> data = {"user": np.arange(4), "item": np.arange(4)}
      >>> logs = model.fit(data, batch_size=4, epochs=2, verbose=0)
      >>> len(logs.history["loss"])
      2
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("compute_loss")
        if own is not None and "y_pred" not in inspect.signature(own).parameters:
            cls.compute_loss = _batch_loss_adapter(own)

    def call(self, inputs, training=False):
        if not self.__dict__.get("_built_by_loss", False):
            self.__dict__["_built_by_loss"] = True
            if getattr(type(self).compute_loss, "batch_loss", None) is not None:
                with keras.StatelessScope():  # build the towers; keep no state update
                    self.compute_loss(inputs, training=False)
        return None
