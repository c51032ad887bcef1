"""Carry a head's logits on its output tensor, so a loss can train on the logits.

Keras does the same: its softmax and sigmoid attach their input to their output as
``_keras_logits``, and Keras' own cross-entropies read it. losszoo's heads (e.g.
:class:`losszoo.heads.Sparsemax`) attach theirs as ``_losszoo_logits``. A model that ends in
such a head or activation (``Dense(K, activation="softmax")``) can then be compiled with
``loss="sparsemax"`` (or any losszoo loss defined on scores): the model outputs probabilities
for prediction, and the loss finds the scores attached to them instead of training on the
probabilities. The attribute lives only on the tensor object the head returned; any op
applied after the head drops it (the loss then treats its input as logits, or raises if told
``from_logits=False``).
"""

_ATTRIBUTE = "_losszoo_logits"
_KERAS_ATTRIBUTE = "_keras_logits"


def attach_logits(output, logits):
    """Record ``logits`` on ``output`` (a no-op for tensors that refuse attributes)."""
    try:
        setattr(output, _ATTRIBUTE, logits)
    except AttributeError:
        pass
    return output


def attached_logits(y_pred):
    """The logits attached to ``y_pred``: a losszoo head's, else Keras' softmax/sigmoid's.

    Returns None when ``y_pred`` carries neither attribute.
    """
    logits = getattr(y_pred, _ATTRIBUTE, None)
    return logits if logits is not None else getattr(y_pred, _KERAS_ATTRIBUTE, None)
