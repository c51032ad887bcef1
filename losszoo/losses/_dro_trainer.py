"""How the safe-KL loss tells a training step from evaluation.

The first :class:`~losszoo.losses.SafeKLDRORisk` built installs
:func:`losszoo._keras_hooks.install_trainer_hook` (Keras' private ``Trainer._compute_loss``
publishes ``(model, training)`` while it runs); :func:`training_flag` reads it at trace time,
with :func:`alpha_updates` as an override and "gradients are being recorded"
(:func:`losszoo._keras_hooks.recording_gradients`) as the rule outside a Keras 3 trainer
(see ``docs/design/dro.md``). Its other Keras-private glue (its metrics in the model's logs,
itself in the saved compile config) is in :mod:`losszoo._keras_hooks`.
"""

from __future__ import annotations

import contextlib
import threading

from losszoo._keras_hooks import current_trainer, recording_gradients

_state = threading.local()


def _overrides():
    if not hasattr(_state, "override"):
        _state.override = []
    return _state.override


@contextlib.contextmanager
def alpha_updates(enabled: bool):
    """Force (``True``) or forbid (``False``) alpha updates of safe-KL losses in this block.

    The decision is taken when a step is traced, so use it around the first call of a
    ``tf.function`` (or around eager code).
    """
    _overrides().append(bool(enabled))
    try:
        yield
    finally:
        _overrides().pop()


def training_flag(update_alpha, losses=None):
    """``(training, trainer)``: whether alpha moves in the step being traced, and the Keras 3
    model computing the loss (``None`` outside one, or under :func:`alpha_updates`).

    ``update_alpha`` is ``"auto"`` (a Keras 3 train step; outside a trainer,
    :func:`recording_gradients` of ``losses``), ``True`` or ``False``; :func:`alpha_updates`
    overrides all three.
    """
    override = _overrides()
    if override:
        return override[-1], None
    trainer, training = current_trainer()
    if update_alpha is not True and update_alpha is not False:
        if trainer is not None:
            return training, trainer
        return recording_gradients(losses), None
    return bool(update_alpha), trainer
