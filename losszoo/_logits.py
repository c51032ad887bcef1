"""Carry a head's logits on its output tensor, so a loss can train on the logits.

Keras does the same: its softmax and sigmoid attach their input to their output as
``_keras_logits``, and Keras' own cross-entropies read it. losszoo's heads (e.g.
:class:`losszoo.heads.Sparsemax`) attach theirs as ``_losszoo_logits``. A model that ends in
such a head or activation (``Dense(K, activation="softmax")``) can then be compiled with
``loss="sparsemax"`` (or any losszoo loss defined on scores): the model outputs probabilities
for prediction, and the loss finds the scores attached to them instead of training on the
probabilities. The logits live only with the tensor object the head returned; any op applied
after the head drops them (the loss then treats its input as logits, or raises if told
``from_logits=False``).

Tensors that refuse attributes (JAX arrays and tracers) get theirs in a table keyed by the
object's ``id``, cleared when the object dies (as Keras keeps masks on JAX). Keras' softmax
attaches nothing on JAX, so there only losszoo's heads carry logits.
"""

import weakref

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
