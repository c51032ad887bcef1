"""Keras 3's private trainer hooks, in one place (being moved here from the DRO trainer glue).

:func:`install_trainer_hook` wraps ``Trainer._compute_loss`` so that the model computing a loss
is known while it runs; :func:`current_trainer` returns ``(model, training)`` of the innermost
such computation, or ``(None, None)``.
"""

from losszoo.losses._dro_trainer import current_trainer, install_trainer_hook

__all__ = ["current_trainer", "install_trainer_hook"]
