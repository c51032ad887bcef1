"""Keras 3 losses over losszoo's ops; each is registered by name for ``model.compile``."""

from losszoo.losses.sparsemax import SparsemaxLoss
from losszoo.losses.dro import SafeKLDRORisk, KLDROBatchLSE, KLDROSumExp, CVaRLoss
from losszoo.losses.rankmax import RankmaxLoss
from losszoo.losses.possibilistic import PossibilisticProjectionLoss, AntipignisticKLLoss, VoteKLLoss, ProjectionDiagnostic
