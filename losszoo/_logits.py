"""Carry a head's logits on its output tensor, so a loss can train on the logits.

Keras's own softmax does the same with ``_keras_logits``. A model that ends in a
:class:`losszoo.heads.Sparsemax` head can then be compiled with ``loss="sparsemax"``: the
head outputs probabilities for prediction, and the loss, which is defined on scores, finds
the scores attached to those probabilities. The attribute lives only on the tensor object
the head returned; any op applied after the head drops it (the loss then treats its input
as logits, or raises if told ``from_logits=False``).
"""

_ATTRIBUTE = "_losszoo_logits"


def attach_logits(output, logits):
    """Record ``logits`` on ``output`` (a no-op for tensors that refuse attributes)."""
    try:
        setattr(output, _ATTRIBUTE, logits)
    except AttributeError:
        pass
    return output


def attached_logits(y_pred):
    """The logits a losszoo head attached to ``y_pred``, or None."""
    return getattr(y_pred, _ATTRIBUTE, None)
