"""The losses over ops (losszoo.losses._base_loss.OpLoss): each loss is its op on the scores,
with the same config as before, and labels are read once, by the op."""

import numpy as np
import pytest

import losszoo
from losszoo import ops
from tests.harness import float64, numpy

rng = np.random.default_rng(1)
Z = rng.normal(size=(3, 4)).astype(np.float32)
IDS = np.array([2, 0, 3])

# name -> (op, config of a non-default instance: keys its get_config has always had)
CASES = {
    "softmax_cross_entropy": (ops.softmax_cross_entropy, {"normalize_labels": False}),
    "sparsemax": (ops.sparsemax_loss, {"normalize_labels": False, "from_logits": True}),
    "rankmax": (ops.rankmax_loss, {"k": 2, "margin": 0.5, "max_positives": None}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_loss_is_its_op_per_example_and_config_round_trips(name):
    op, config = CASES[name]
    loss = losszoo.get(name, reduction=None, **config)
    op_args = {k: v for k, v in config.items() if k != "from_logits"}
    for labels in (IDS, np.eye(4, dtype=np.float32)[IDS]):
        np.testing.assert_allclose(
            numpy(loss(labels, Z)), numpy(op(labels, Z, **op_args)), rtol=1e-6
        )
    again = type(loss).from_config(loss.get_config())
    assert again.get_config() == loss.get_config()
    assert all(loss.get_config()[k] == v for k, v in config.items())
    assert all(getattr(loss, k) == v for k, v in config.items())


@pytest.mark.parametrize("op", [ops.sparsemax_loss, ops.softmax_cross_entropy, ops.vote_kl_loss])
def test_ops_read_keras_label_forms_once(op):
    # ids [B], [B, 1] and one-hot give one value; a bad id raises once, naming the argument.
    with float64():  # the possibilistic ops compute in float64
        want = numpy(op(np.eye(4, dtype=np.float32)[IDS], Z))
        np.testing.assert_allclose(numpy(op(IDS, Z)), want, rtol=1e-6)
        np.testing.assert_allclose(numpy(op(IDS[:, None], Z)), want, rtol=1e-6)
        with pytest.raises(ValueError, match="`y_true` holds class ids"):
            op(np.array([2, 0, 4]), Z, labels_name="y_true")
