"""Keras layer: the sparsemax head."""

from __future__ import annotations

from losszoo import ops
from losszoo._logits import attach_logits
from losszoo.contract import check_number
from losszoo.heads._base import ScoresLayer
from losszoo.registry import register


@register(
    "sparsemax",
    kind="head",
    description="Sparsemax: Euclidean projection of scores onto the simplex (sparse outputs)",
)
class Sparsemax(ScoresLayer):
    """Sparsemax head: ``sparsemax(z) = argmin_{p in simplex} ||p - z||^2 = (z - tau)_+``.

    A drop-in replacement for a softmax output layer whose probabilities can be exactly
    zero. ``tau`` is the unique threshold making the output sum to 1; the Jacobian is
    ``diag(s) - s s^T / |S|`` on the support ``S`` (``s`` its indicator). Computed in float32
    (or float64) whatever the layer's compute dtype; by default the layer's dtype is
    float32, which keeps probabilities in float32 under a mixed-precision policy, as Keras
    recommends for output layers. Train it with :class:`losszoo.losses.SparsemaxLoss`: the
    output carries the head's logits, so ``model.compile(loss="sparsemax")`` on a model ending
    in this head trains on the logits (cross-entropy on its output would take the log of
    exact zeros).

    Rows holding a NaN or ``+inf`` score (or only ``-inf``) come out entirely NaN in every
    mode (eager, graph, XLA), the other rows unaffected; ``-inf`` masks a class.

    Args:
      axis: the class axis (an integer).
      **kwargs: ``keras.layers.Layer`` arguments (``name``, ``dtype``...).

    Example:
      >>> head = losszoo.heads.Sparsemax()
      >>> keras.ops.convert_to_numpy(head(np.array([[0.0, 0.5, 1.0]])))
      array([[0.  , 0.25, 0.75]], dtype=float32)
    """

    _config_keys = ("axis",)

    def __init__(self, axis: int = -1, **kwargs):
        axis = check_number(axis, "axis", integer=True)
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.axis = axis
        self.supports_masking = True

    def call(self, inputs):
        return attach_logits(ops.sparsemax(inputs, axis=self.axis), inputs)
