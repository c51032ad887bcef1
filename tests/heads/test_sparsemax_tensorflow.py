"""Sparsemax head under MirroredStrategy (TensorFlow only); the rest: ``test_sparsemax.py``."""

import numpy as np
import pytest

from tests.heads.test_sparsemax import build_head_model
from tests.helpers import assert_mirrored_matches_single

pytestmark = pytest.mark.tensorflow_only(reason="tf.distribute.MirroredStrategy")


def test_mirrored_strategy_with_head():
    x = np.random.default_rng(3).normal(size=(32, 5)).astype(np.float32)
    y = np.eye(4)[np.argmax(x[:, :4], 1)]
    assert_mirrored_matches_single(build_head_model, x, y, "mse", learning_rate=0.5)
