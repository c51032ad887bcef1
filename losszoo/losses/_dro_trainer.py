"""How the safe-KL loss tells a training step from evaluation, and its Keras 3 trainer glue.

The first :class:`~losszoo.losses.SafeKLDRORisk` built wraps Keras 3's private
``Trainer._compute_loss`` (:func:`install_trainer_hook`) so that it publishes
``(model, training)`` to a thread-local stack during the call; :func:`training_flag` reads it
at trace time, with :func:`alpha_updates` as an override and "gradients are being recorded"
as the rule outside a Keras 3 trainer (see :mod:`losszoo.losses.dro`). The hook is the same
on every backend: Keras' TensorFlow, JAX and PyTorch trainers all compute the loss through
``Trainer._compute_loss`` (JAX inside ``stateless_compute_loss``).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings

import keras

from losszoo import _backend

_state = threading.local()


def _stack(name):
    if not hasattr(_state, name):
        setattr(_state, name, [])
    return getattr(_state, name)


@contextlib.contextmanager
def alpha_updates(enabled: bool):
    """Force (``True``) or forbid (``False``) alpha updates of safe-KL losses in this block.

    The decision is taken when a step is traced, so use it around the first call of a
    ``tf.function`` (or around eager code).
    """
    _stack("override").append(bool(enabled))
    try:
        yield
    finally:
        _stack("override").pop()


def install_trainer_hook():
    """Wrap ``keras.src.trainers.trainer.Trainer._compute_loss`` to publish the training flag.

    Called by :class:`~losszoo.losses.SafeKLDRORisk` when one is built, never at import: Keras stays
    untouched for users who do not use a DRO loss. Idempotent. The wrapper only pushes
    ``(model, training)`` to a thread-local stack around the original call. If this Keras
    has no such method, the loss falls back to the tape rule (alpha moves when a
    ``GradientTape`` records) and warns once. On JAX the trainer's
    ``compute_loss_and_updates`` also publishes the optimiser variables' values of the step
    (the only place they exist while ``fit`` runs, see :func:`optimizer_scope`).
    """
    try:
        from keras.src.trainers.trainer import Trainer
    except ImportError:  # pragma: no cover - Keras layout changed
        Trainer = None
    if not hasattr(Trainer, "_compute_loss"):  # pragma: no cover - Keras layout changed
        if not _HOOK["warned"]:
            _HOOK["warned"] = True
            warnings.warn(
                "losszoo.SafeKLDRORisk could not find Keras' Trainer._compute_loss in this "
                f"Keras ({keras.__version__}); it tells training from evaluation by the "
                "GradientTape rule instead and cannot add its diagnostics to the logs.",
                RuntimeWarning,
                stacklevel=3,
            )
        return
    _publish_during_call(Trainer, "_compute_loss", "trainer", _model_and_training)
    if _backend.NAME == "jax":
        from keras.src.backend.jax.trainer import JAXTrainer

        _publish_during_call(
            JAXTrainer, "compute_loss_and_updates", "optimizer", _optimizer_and_variables
        )


def _model_and_training(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
    return self, bool(training)


def _optimizer_and_variables(self, *args, optimizer_variables=None, **kwargs):
    return self.optimizer, optimizer_variables


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


def optimizer_scope(optimizer):
    """A ``keras.StatelessScope`` holding ``optimizer``'s variables as the JAX train step
    passed them (reading ``optimizer.learning_rate`` then works, schedules included); a
    no-op elsewhere."""
    published = _stack("optimizer")
    if published and published[-1][0] is optimizer and published[-1][1] is not None:
        mapping = list(zip(optimizer.variables, published[-1][1]))
        return keras.StatelessScope(state_mapping=mapping)
    return contextlib.nullcontext()


_HOOK = {"warned": False}


def current_trainer():
    """``(model, training)`` of the innermost Keras 3 loss computation, or ``(None, None)``."""
    st = _stack("trainer")
    return st[-1] if st else (None, None)


def recording_gradients(losses) -> bool:
    """Whether gradients of ``losses`` are being recorded: a TensorFlow ``GradientTape`` is
    recording; PyTorch autograd is on and ``losses`` requires a gradient. Always False on
    JAX, where differentiation is a transformation that the loss cannot see."""
    if _backend.TENSORFLOW:
        from tensorflow.python.eager import record  # no public equivalent

        return bool(record.could_possibly_record())
    if _backend.NAME == "torch":
        import torch

        return bool(torch.is_grad_enabled() and getattr(losses, "requires_grad", False))
    return False


def training_flag(update_alpha, losses=None):
    """``(training, trainer)``: whether alpha moves in the step being traced, and the Keras 3
    model computing the loss (``None`` outside one, or under :func:`alpha_updates`).

    ``update_alpha`` is ``"auto"`` (a Keras 3 train step; outside a trainer,
    :func:`recording_gradients` of ``losses``), ``True`` or ``False``; :func:`alpha_updates`
    overrides all three.
    """
    override = _stack("override")
    if override:
        return override[-1], None
    trainer, training = current_trainer()
    if update_alpha is not True and update_alpha is not False:
        if trainer is not None:
            return training, trainer
        return recording_gradients(losses), None
    return bool(update_alpha), trainer


def attach_metrics(trainer, metrics):
    """Append ``metrics`` to a Keras 3 model's own metrics (once), so they reach the logs
    (nothing outside a trainer: ``trainer`` is ``None``). Whether any was appended now."""
    own = getattr(trainer, "_metrics", None)
    new = [m for m in metrics if not any(x is m for x in own or ())]
    if own is not None and new:
        own.extend(new)
        return True
    return False


def store_instance_in_compile_config(trainer, loss):
    """Make ``model.save`` store ``loss`` (with its state), not the name the model was
    compiled with: Keras serialises ``compile(loss=...)`` as given. Only a single loss given
    by name is replaced."""
    compiled = getattr(getattr(trainer, "_compile_config", None), "config", None)
    if not isinstance(compiled, dict) or not isinstance(compiled.get("loss"), str):
        return
    entries = getattr(getattr(trainer, "_compile_loss", None), "_flat_losses", None) or []
    if any(entry.loss is loss for entry in entries):
        compiled["loss"] = loss
