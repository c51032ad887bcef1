"""Keras 3's and TensorFlow's private hooks, in one place (checked against Keras 3.15.1,
TensorFlow 2.21). The private classes themselves are reached through
:func:`losszoo._backend.keras_trainer_classes`, as every private name is.

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
* ``Model._compile_loss._flat_losses`` (Keras 3.15.1): the loss objects a model was compiled
  with, a loss given by name included (made in the model's first train / evaluate call);
  Keras keeps no public list (:func:`compiled_losses`).
* ``Model._metrics`` (Keras 3.15.1): the safe-KL loss adds its diagnostics metrics to the
  model that computes it (:func:`add_metrics`), so that they reach the logs and
  ``model.metrics_names`` also for ``compile(loss="safe_kl_dro")``, where no instance exists
  to pass as ``compile(metrics=loss.metrics)``, and on JAX, whose trainer threads only the
  model's own metrics' variables (the loss's alpha state among them) through its pure step.
* ``Model._compile_config.config["metrics"]`` (Keras 3.15.1): the metric objects given to
  ``compile``, which the TensorFlow and PyTorch trainers put into ``model.metrics`` only in the
  first step's ``compute_metrics``, after the loss has run: the possibilistic projection loss
  finds its diagnostics there (:func:`model_metrics`).
* ``Model._compile_config.config["loss"]`` (Keras 3.15.1): ``model.save`` stores the
  ``compile(loss=...)`` argument as given, a name for a loss compiled by name; the safe-KL
  loss puts itself there (:func:`store_loss_in_compile_config`) so that a saved model keeps
  its trained alpha.

The one private TensorFlow module used, ``tensorflow.python.eager.record`` (whether a tape
records, :func:`recording_gradients`; pausing the tapes), is reached through
:func:`losszoo._backend.tape_recording` and :func:`losszoo._backend.stop_recording`.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings

import keras

from losszoo import _backend

_state = threading.local()
_HOOK = {"warned": False}


def thread_stack(name):
    """This thread's list ``name`` (empty at first): the hooks' stacks, and the override stack
    of :func:`losszoo.losses.dro.alpha_updates`."""
    if not hasattr(_state, name):
        setattr(_state, name, [])
    return getattr(_state, name)


@contextlib.contextmanager
def pushed(name, value):
    """``value`` on top of :func:`thread_stack` ``name`` inside the block."""
    stack = thread_stack(name)
    stack.append(value)
    try:
        yield
    finally:
        stack.pop()


def _publish_during_call(cls, name, stack, entry):
    """Wrap the method ``cls.<name>`` (once) so that ``entry(self, *args, **kwargs)`` of each
    call is on the thread-local ``stack`` while the call runs."""
    original = getattr(cls, name)
    if getattr(original, "_losszoo_dro_hook", False):
        return

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        with pushed(stack, entry(self, *args, **kwargs)):
            return original(self, *args, **kwargs)

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
    Trainer, JAXTrainer = _backend.keras_trainer_classes()
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
    if JAXTrainer is not None:
        _publish_during_call(
            JAXTrainer, "compute_loss_and_updates", "optimizer", _optimizer_and_variables
        )


def current_trainer():
    """``(model, training)`` of the innermost Keras 3 loss computation, or ``(None, None)``."""
    st = thread_stack("trainer")
    return st[-1][:2] if st else (None, None)


def current_predictions():
    """The model's whole output (``y_pred``, every output of a multi-output model) in the
    innermost Keras 3 loss or metrics computation, or None: the losses find which output
    they were given by identity in it."""
    st = thread_stack("trainer")
    return st[-1][2] if st else None


def optimizer_scope(optimizer):
    """A ``keras.StatelessScope`` holding ``optimizer``'s variables as the JAX train step
    passed them (reading ``optimizer.learning_rate`` then works, schedules included); a
    no-op elsewhere."""
    published = thread_stack("optimizer")
    if published and published[-1][0] is optimizer and published[-1][1] is not None:
        mapping = list(zip(optimizer.variables, published[-1][1]))
        return keras.StatelessScope(state_mapping=mapping)
    return contextlib.nullcontext()


def recording_gradients(losses) -> bool:
    """Whether gradients of ``losses`` are being recorded: a TensorFlow ``GradientTape`` is
    recording; PyTorch autograd is on and ``losses`` requires a gradient. Always False on
    JAX, where differentiation is a transformation that the loss cannot see."""
    if _backend.NAME == "torch":
        import torch

        return bool(torch.is_grad_enabled() and getattr(losses, "requires_grad", False))
    return _backend.tape_recording()  # False on JAX


def compiled_losses(model) -> list:
    """The loss objects of a Keras 3 model's ``compile(loss=...)``, flattened (``[]`` before
    the first train / evaluate call of a model compiled by name, or without a model)."""
    entries = getattr(getattr(model, "_compile_loss", None), "_flat_losses", None) or []
    return [entry.loss for entry in entries]


def model_metrics(model) -> list:
    """Every metric object of a Keras 3 model: ``model.metrics`` with the ``compile_metrics``
    entry opened, and the objects given as ``compile(metrics=..., weighted_metrics=...)``,
    which Keras' TensorFlow and PyTorch trainers collect only in the first step's
    ``compute_metrics``, after the loss ran (``Model._compile_config``)."""
    found = []
    for metric in getattr(model, "metrics", None) or []:
        inner = getattr(metric, "metrics", None)
        found.extend(inner if isinstance(inner, list) else [metric])
    compiled = getattr(getattr(model, "_compile_config", None), "config", None) or {}
    for key in ("metrics", "weighted_metrics"):
        for metric in keras.tree.flatten(compiled.get(key)):
            if isinstance(metric, keras.metrics.Metric) and not any(x is metric for x in found):
                found.append(metric)
    return found


def add_metrics(model, metrics) -> bool:
    """Append those of ``metrics`` that a Keras 3 model does not hold yet to its own metrics,
    so that they reach its logs (nothing for ``model=None``). Whether any was appended."""
    own = getattr(model, "_metrics", None)
    new = [] if own is None else [m for m in metrics if not any(x is m for x in own)]
    if new:
        own.extend(new)
    return bool(new)


def store_loss_in_compile_config(model, loss):
    """Make ``model.save`` store ``loss`` (with its state) instead of the name the model was
    compiled with. Only a single loss given by name is replaced."""
    compiled = getattr(getattr(model, "_compile_config", None), "config", None)
    if isinstance(compiled, dict) and isinstance(compiled.get("loss"), str):
        if any(x is loss for x in compiled_losses(model)):
            compiled["loss"] = loss
