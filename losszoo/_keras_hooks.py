"""Keras 3's and TensorFlow's private hooks, in one place (checked against Keras 3.15.1,
TensorFlow 2.21).

Nothing here runs at import: Keras stays untouched until :func:`install_trainer_hook` is called
(by the first :class:`~losszoo.losses.SafeKLDRORisk` built, or by :mod:`losszoo._logits`).

The hooks and why each is needed (Keras offers no public way for any of them):

* ``keras.src.trainers.trainer.Trainer._compute_loss`` (Keras 3.15.1): the one method through
  which Keras' TensorFlow, JAX and PyTorch trainers compute the loss, in ``train_step``
  (``training=True``), ``test_step`` (``False``) and the symbolic build. A loss is called with
  ``(y_true, y_pred, sample_weight)`` only, so this is the one place where the model computing
  it and whether it trains are known: :func:`install_trainer_hook` wraps it so that
  ``(model, training, y_pred)`` is on a thread-local stack while it runs
  (:func:`current_trainer`, :func:`current_predictions`).
* ``keras.src.backend.jax.trainer.JAXTrainer.compute_loss_and_updates`` (Keras 3.15.1, JAX
  only): the optimiser variables' values of the step exist only as its argument
  (``optimizer_variables``) while ``fit`` runs; :func:`optimizer_scope` reads them, so a loss
  can read the optimiser's current learning rate inside the pure JAX step.
* ``tensorflow.python.eager.record.could_possibly_record`` (TensorFlow 2.21):
  whether a ``GradientTape`` is recording (:func:`recording_gradients`); ``tf.GradientTape``
  has no public query.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings

import keras

from losszoo import _backend

__all__ = [
    "current_predictions",
    "current_trainer",
    "install_trainer_hook",
    "optimizer_scope",
    "recording_gradients",
]

_state = threading.local()
_HOOK = {"warned": False}


def _stack(name):
    if not hasattr(_state, name):
        setattr(_state, name, [])
    return getattr(_state, name)


def _publish_during_call(cls, name, stack, entry):
    """Wrap the method ``cls.<name>`` (once) so that ``entry(self, *args, **kwargs)`` of each
    call is on the thread-local ``stack`` while the call runs."""
    original = getattr(cls, name)
    if getattr(original, "_losszoo_dro_hook", False):
        return

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        _stack(stack).append(entry(self, *args, **kwargs))
        try:
            return original(self, *args, **kwargs)
        finally:
            _stack(stack).pop()

    wrapper._losszoo_dro_hook = True
    setattr(cls, name, wrapper)


def _model_and_training(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
    return self, bool(training), y_pred


def _model_evaluating(self, x=None, y=None, y_pred=None, *args, **kwargs):
    return self, False, y_pred


def _optimizer_and_variables(self, *args, optimizer_variables=None, **kwargs):
    return self.optimizer, optimizer_variables


def install_trainer_hook():
    """Wrap ``Trainer._compute_loss`` (and ``compute_metrics``) to publish ``(model, training)``.

    Idempotent; never called at import. The wrapper only pushes ``(model, training)`` to a
    thread-local stack around the original call. If this Keras has no such method, callers
    fall back to :func:`recording_gradients` and a RuntimeWarning is given once. On JAX the
    trainer's ``compute_loss_and_updates`` also publishes the optimiser variables' values of
    the step (see :func:`optimizer_scope`).
    """
    try:
        from keras.src.trainers.trainer import Trainer  # no public equivalent (3.15.1)
    except ImportError:  # pragma: no cover - Keras layout changed
        Trainer = None
    if not hasattr(Trainer, "_compute_loss"):  # pragma: no cover - Keras layout changed
        if not _HOOK["warned"]:
            _HOOK["warned"] = True
            warnings.warn(
                "losszoo could not find Keras' Trainer._compute_loss in this Keras "
                f"({keras.__version__}); the safe-KL loss tells training from evaluation by "
                "the GradientTape rule instead and cannot add its diagnostics to the logs.",
                RuntimeWarning,
                stacklevel=3,
            )
        return
    _publish_during_call(Trainer, "_compute_loss", "trainer", _model_and_training)
    # The compiled metrics see the same y_pred outside _compute_loss: publish the model there
    # too (never training), so a metric on logits reads a softmax model's scores the same way.
    _publish_during_call(Trainer, "compute_metrics", "trainer", _model_evaluating)
    if _backend.NAME == "jax":
        from keras.src.backend.jax.trainer import JAXTrainer  # no public equivalent (3.15.1)

        _publish_during_call(
            JAXTrainer, "compute_loss_and_updates", "optimizer", _optimizer_and_variables
        )


def current_trainer():
    """``(model, training)`` of the innermost Keras 3 loss computation, or ``(None, None)``."""
    st = _stack("trainer")
    return st[-1][:2] if st else (None, None)


def current_predictions():
    """The model's whole output (``y_pred``, every output of a multi-output model) in the
    innermost Keras 3 loss or metrics computation, or None: the losses find which output
    they were given by identity in it."""
    st = _stack("trainer")
    return st[-1][2] if st else None


def optimizer_scope(optimizer):
    """A ``keras.StatelessScope`` holding ``optimizer``'s variables as the JAX train step
    passed them (reading ``optimizer.learning_rate`` then works, schedules included); a
    no-op elsewhere."""
    published = _stack("optimizer")
    if published and published[-1][0] is optimizer and published[-1][1] is not None:
        mapping = list(zip(optimizer.variables, published[-1][1]))
        return keras.StatelessScope(state_mapping=mapping)
    return contextlib.nullcontext()


def recording_gradients(losses) -> bool:
    """Whether gradients of ``losses`` are being recorded: a TensorFlow ``GradientTape`` is
    recording; PyTorch autograd is on and ``losses`` requires a gradient. Always False on
    JAX, where differentiation is a transformation that the loss cannot see."""
    if _backend.TENSORFLOW:
        from tensorflow.python.eager import record  # no public equivalent (TF 2.21)

        return bool(record.could_possibly_record())
    if _backend.NAME == "torch":
        import torch

        return bool(torch.is_grad_enabled() and getattr(losses, "requires_grad", False))
    return False
