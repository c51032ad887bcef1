"""The scores a loss trains on, when the model ends in a softmax or a losszoo head.

Every losszoo loss is defined on scores (logits). A model may still end in a layer that turns
them into probabilities: ``Dense(K, activation="softmax")``, ``keras.layers.Softmax()``,
``Activation("softmax")`` or a losszoo head such as :class:`losszoo.heads.Sparsemax`. The
losses then train on the logits, by one rule (:func:`scores`), the same on every backend:

1. Logits attached to ``y_pred``: a losszoo head's (``_losszoo_logits``, or a table keyed by
   the object's ``id`` for JAX arrays, which refuse attributes) or those Keras' softmax and
   sigmoid attach on TensorFlow and PyTorch (``_keras_logits``, as Keras' cross-entropies
   read them).
2. Else, inside Keras' ``fit`` / ``evaluate`` (the model computing the loss is known through
   :func:`losszoo._keras_hooks.current_trainer`), when the output of a Functional or
   Sequential model that the loss is given (in a multi-output model: found by identity
   among the step's outputs) is made by a Keras softmax over the last axis (a
   ``Softmax`` layer or a layer whose ``activation`` is ``keras.activations.softmax``), the
   scores are ``log(y_pred)``. That is ``z - logsumexp(z)``: the logits up to a per-row shift
   and rounding, so every loss invariant to such a shift (softmax cross-entropy, sparsemax,
   Rankmax, the possibilistic losses; Keras' categorical cross-entropies as DRO base
   losses) gets the value and gradient it gets from the logits. This is the rule on JAX,
   where Keras' softmax cannot attach its logits. A probability that underflowed to 0 gives
   a ``-inf`` score (``+inf`` loss where that class is a target, as from a ``-inf`` logit).
   A loss that is not shift-invariant raises ``ValueError`` instead.
3. Else, when that output is made by a Keras sigmoid or by a losszoo head (whose logits
   were lost, or which outputs probabilities: BCSoftmax and the calibration heads),
   ``ValueError``: the logits cannot be recovered, so the model should output its scores.
4. Else ``y_pred`` is the scores (also outside a Keras trainer: custom loops, direct calls,
   and subclassed models, where the output layer is not known). A multi-output model whose
   output the loss cannot match (it was given a converted copy) raises ``ValueError`` if any
   of its outputs is made by a softmax, a sigmoid or a losszoo head.
"""

import weakref

import keras
from keras import ops

from losszoo import _backend

_ATTRIBUTE = "_losszoo_logits"
_KERAS_ATTRIBUTE = "_keras_logits"
_TABLE = {}  # id(output) -> logits, for objects without a __dict__


def attach_logits(output, logits):
    """Record ``logits`` with ``output``; returns ``output``."""
    try:
        setattr(output, _ATTRIBUTE, logits)
    except AttributeError:
        try:
            weakref.finalize(output, _TABLE.pop, id(output), None)
        except TypeError:  # neither attributes nor weak references: nothing to attach to
            return output
        _TABLE[id(output)] = logits
    return output


def attached_logits(y_pred):
    """The logits attached to ``y_pred``: a losszoo head's, else Keras' softmax/sigmoid's.

    Returns None when ``y_pred`` carries neither.
    """
    logits = getattr(y_pred, _ATTRIBUTE, None)
    if logits is None:
        logits = _TABLE.get(id(y_pred))
    return logits if logits is not None else getattr(y_pred, _KERAS_ATTRIBUTE, None)


def track_models():
    """Make the model computing a loss known to :func:`scores` (Keras' trainer hook, once).

    Losses call it when they are built, before the first step is traced."""
    from losszoo._keras_hooks import install_trainer_hook

    install_trainer_hook()


def scores(y_pred, shift_invariant: bool = True, loss_name: str = "the loss"):
    """The scores a loss on ``y_pred`` trains on, by the module's rule (attached logits,
    ``log(y_pred)`` after a Keras softmax, an error after a sigmoid or a losszoo head).

    Args:
      y_pred: the model's output as the loss receives it.
      shift_invariant: the loss gives the same value for scores shifted by a constant per
        row; if not, a model ending in a softmax without attached logits raises.
      loss_name: named in the error messages.
    """
    logits = attached_logits(y_pred)
    if logits is not None:
        return logits
    layer, rank = _output_layer(y_pred)
    if layer is None or _backend.in_shape_inference():  # Keras' build: placeholders
        return y_pred
    what = f"The model ends in {type(layer).__name__} {layer.name!r}"
    fix = "; have the model output its logits (drop the final activation) for this loss."
    if _is_softmax(layer, rank):
        if not shift_invariant:
            raise ValueError(
                f"{what}, a softmax whose logits this backend ({_backend.NAME}) does not "
                f"carry, and {loss_name} is not invariant to a shift of the scores, so "
                f"log(y_pred) cannot stand in for them{fix}"
            )
        if ops.dtype(y_pred) in ("float16", "bfloat16"):
            y_pred = ops.cast(y_pred, "float32")
        return _log(y_pred)
    if isinstance(layer, keras.layers.Softmax) or (
        getattr(layer, "activation", None) is keras.activations.sigmoid
    ):  # a sigmoid, or a softmax over another axis
        raise ValueError(f"{what}, whose logits are not attached to `y_pred`{fix}")
    if type(layer).__module__.startswith("losszoo.heads."):
        raise ValueError(
            f"{what}, a losszoo head whose output is not scores and carries no logits "
            f"(the input of the head), so {loss_name} cannot train on them{fix}"
        )
    return y_pred


def _output_layer(y_pred):
    """``(layer, rank)``: the layer making ``y_pred``, an output of the Functional or
    Sequential model computing the loss, and its rank; ``(None, None)`` where no such model
    is known (custom loops, subclassed models).

    In a multi-output model the output is found by identity among the model's outputs in
    this step (Keras passes each loss its own output object); where it cannot be found and
    some output would need its logits, ``ValueError``: the loss cannot tell which it has."""
    from losszoo._keras_hooks import current_predictions, current_trainer

    model, _ = current_trainer()
    try:
        outputs = keras.tree.flatten(model.outputs) if model is not None else []
    except (AttributeError, ValueError):  # subclassed, or not built
        outputs = []
    if len(outputs) > 1:
        predictions = keras.tree.flatten(current_predictions())
        index = [i for i, p in enumerate(predictions) if p is y_pred]
        if len(index) == 1 and len(predictions) == len(outputs):
            outputs = [outputs[index[0]]]
        elif any(_needs_logits(*making_layer(o)) for o in outputs):
            raise ValueError(
                f"The model {model.name!r} has {len(outputs)} outputs, one of them made by "
                "a softmax, a sigmoid or a losszoo head, and the loss was given an output "
                "it cannot match to one of them (a converted copy), so it cannot tell "
                "whether `y_pred` is scores; have those outputs be the logits."
            )
        else:
            return None, None
    return making_layer(outputs[0]) if outputs else (None, None)


def making_layer(output):
    """``(layer, rank)``: the layer that makes the symbolic ``output``, through nested
    models."""
    while True:
        history = getattr(output, "_keras_history", None)
        layer = getattr(history, "operation", None)
        if not isinstance(layer, keras.Model):
            return layer, len(output.shape) if layer is not None else None
        try:  # a nested model: the output of its own that became this one
            output = keras.tree.flatten(layer.outputs)[history.tensor_index]
        except (AttributeError, ValueError, IndexError):
            return None, None


def _needs_logits(layer, rank) -> bool:
    """Whether an output made by ``layer`` is not the scores (a softmax, a sigmoid, a losszoo
    head)."""
    return layer is not None and (
        isinstance(layer, keras.layers.Softmax)
        or getattr(layer, "activation", None)
        in (keras.activations.softmax, keras.activations.sigmoid)
        or type(layer).__module__.startswith("losszoo.heads.")
    )


def _is_softmax(layer, rank) -> bool:
    if isinstance(layer, keras.layers.Softmax):
        axis = layer.axis if isinstance(layer.axis, int) else tuple(layer.axis)
        return axis in (-1, (-1,), rank - 1, (rank - 1,))
    return getattr(layer, "activation", None) is keras.activations.softmax


@_backend.custom_gradient
def _log(p):
    """``log(p)`` whose gradient is 0 where the upstream gradient is 0 (a class whose
    probability underflowed to 0 and which the loss ignores), not NaN = 0 * inf."""

    def grad(upstream):
        return ops.where(ops.equal(upstream, 0), ops.zeros_like(upstream), upstream / p)

    return ops.log(p), grad
