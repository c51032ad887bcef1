"""Text and TensorFlow-only tensors given as scores: one clear error on every backend.

On JAX and PyTorch Keras converts a layer's (and a loss's) inputs before losszoo sees them,
so text failed with Keras' "could not convert string to float" (JAX) or "Invalid dtype:
str32" (PyTorch) instead of naming the argument (issue 31 item 14).
"""

import keras
import numpy as np
import pytest

import losszoo

TEXT = np.array([["a", "b", "c"]])
HEADS = {
    "BCSoftmax": lambda: losszoo.heads.BCSoftmax(upper=0.9),
    "LogitBounding": losszoo.heads.LogitBounding,
    "ProbabilityBounding": losszoo.heads.ProbabilityBounding,
    "TemperatureScaling": losszoo.heads.TemperatureScaling,
    "Sparsemax": losszoo.heads.Sparsemax,
}


@pytest.mark.parametrize("name", sorted(HEADS))
def test_a_head_given_text_names_logits(name):
    with pytest.raises(TypeError, match="`logits` must hold real numbers"):
        HEADS[name]()(TEXT)


@pytest.mark.parametrize("name", ["sparsemax", "rankmax", "softmax_cross_entropy", "vote_kl"])
def test_a_loss_given_text_scores_names_y_pred(name):
    with pytest.raises(TypeError, match="`y_pred` must hold real numbers"):
        keras.losses.get(name)(np.array([0]), TEXT)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_a_head_still_reads_numbers(name):
    out = keras.ops.convert_to_numpy(HEADS[name]()(np.array([[0.5, -1.0, 2.0]], "float32")))
    assert out.shape == (1, 3) and np.isfinite(out).all()


def test_features_given_as_text_are_named():
    head = losszoo.heads.ProbabilityBounding(bound_fn="linear")
    logits = np.zeros((1, 3), "float32")
    with pytest.raises(TypeError, match="`features` must hold real numbers"):
        head([logits, TEXT])


@pytest.mark.parametrize("name", ["cvar", "safe_kl_dro", "kl_dro_batch_lse", "kl_dro_sumexp"])
def test_a_dro_risk_given_text_names_the_argument(name):
    # The DRO risks override Keras' Loss.__call__; text reached the base loss (a raw JAX
    # "Error interpreting argument to stage", PyTorch "Invalid dtype: str32").
    risk = keras.losses.get(name)
    with pytest.raises(TypeError, match="`y_pred` must hold real numbers"):
        risk(np.array([0]), TEXT)
    with pytest.raises(TypeError, match="`y_true` must hold real numbers"):
        risk(np.array(["a"]), np.zeros((1, 3), "float32"))
