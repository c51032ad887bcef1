"""Keras 3 losses over losszoo's ops; each is registered by name for ``model.compile``."""

from losszoo.losses._base_loss import per_example_loss
from losszoo.losses.dro import CVaRLoss, KLDROBatchLSE, KLDROSumExp, SafeKLDRORisk
from losszoo.losses.possibilistic import (
    AntipignisticKLLoss,
    PossibilisticProjectionLoss,
    ProjectionDiagnostic,
    VoteKLLoss,
)
from losszoo.losses.rankmax import RankmaxLoss
from losszoo.losses.softmax import SoftmaxCrossEntropyLoss
from losszoo.losses.sparsemax import SparsemaxLoss
