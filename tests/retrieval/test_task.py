"""Each option of the retrieval task pinned against a numpy computation of its logits."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import losszoo
import losszoo.retrieval as R
from tests.retrieval._common import softmax_ce, towers

pytestmark = pytest.mark.tensorflow_only(
    reason="tf.function / tf.errors checks of losszoo.retrieval"
)

IDS = np.array([3, 1, 3, 2, 5, 1])  # rows 0/2 and 1/5 share an item


def logits_of(task, *args, **kwargs):
    logits, labels = task.logits_and_labels(*args, **kwargs)
    return np.asarray(logits), np.asarray(labels)


def test_in_batch_logits_loss_and_extra_candidates():
    q, v = towers(b=4, c=6)
    logits, labels = logits_of(R.Retrieval(), q, v)
    np.testing.assert_allclose(logits, q @ v.T, rtol=1e-6)
    np.testing.assert_array_equal(labels, np.arange(4))
    loss = float(R.Retrieval()(q, v))
    assert loss == pytest.approx(softmax_ce(q @ v.T, np.arange(4)), rel=1e-5)
    w = np.array([1.0, 0.0, 2.0, 0.5], np.float32)
    weighted = float(R.Retrieval()(q, v, sample_weight=w))
    assert weighted == pytest.approx(softmax_ce(q @ v.T, np.arange(4), w), rel=1e-5)


def test_temperature_divides_scores_before_logq():
    q, v = towers(b=4, c=6)
    p = np.linspace(0.05, 0.6, 6).astype(np.float32)
    logits, _ = logits_of(R.Retrieval(temperature=0.2), q, v, candidate_sampling_probability=p)
    np.testing.assert_allclose(logits, q @ v.T / 0.2 - np.log(p)[None], rtol=1e-5, atol=1e-5)


def test_logq_is_scores_minus_log_q():
    q, v = towers(b=6, c=6)
    p = np.array([0.5, 0.1, 0.02, 1.0, 0.3, 0.25], np.float32)
    task = R.Retrieval()
    logits, _ = logits_of(task, q, v, candidate_sampling_probability=p)
    np.testing.assert_allclose(logits, q @ v.T - np.log(p)[None], rtol=1e-6, atol=1e-6)
    loss = float(task(q, v, candidate_sampling_probability=p))
    assert loss == pytest.approx(softmax_ce(q @ v.T - np.log(p)[None], np.arange(6)), rel=1e-5)


def test_accidental_hits_are_minus_inf_exactly_there():
    q, v = towers(b=4, c=6)
    logits, _ = logits_of(R.Retrieval(remove_accidental_hits=True), q, v, candidate_ids=IDS)
    want = q @ v.T
    for i in range(4):
        for j in range(6):
            if IDS[i] == IDS[j] and i != j:
                want[i, j] = -np.inf
    assert np.isneginf(want).sum() == 3  # (0, 2), (2, 0), (1, 5): the premise holds
    np.testing.assert_allclose(logits, want, rtol=1e-6)
    loss = float(R.Retrieval(remove_accidental_hits=True)(q, v, candidate_ids=IDS))
    assert loss == pytest.approx(softmax_ce(want, np.arange(4)), rel=1e-5)


def test_score_mask_sets_minus_inf():
    q, v = towers(b=3, c=4)
    mask = np.array([[1, 0, 1, 1], [1, 1, 1, 0], [0, 1, 1, 1]], bool)
    logits, _ = logits_of(R.Retrieval(), q, v, score_mask=mask)
    np.testing.assert_allclose(logits, np.where(mask, q @ v.T, -np.inf), rtol=1e-6)


@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_hard_negatives_keep_positive_and_top_n(n):
    q, v = towers(b=4, c=6)
    scores = q @ v.T
    scores[1, 3] = scores[1, 4] = 7.0  # a tie
    task = R.Retrieval(num_hard_negatives=n)
    # feed the tied scores through an identity tower: queries = rows of `scores`
    logits, labels = logits_of(task, scores, np.eye(6, dtype=np.float32))
    want = []
    for i in range(4):
        others = np.sort(np.delete(scores[i], i))[::-1][:n]
        others = np.concatenate([others, np.full(n - others.size, -np.inf)])
        want.append(np.concatenate([[scores[i, i]], others]))
    np.testing.assert_allclose(logits, np.array(want), rtol=1e-6)
    np.testing.assert_array_equal(labels, 0)
    assert float(task(scores, np.eye(6, dtype=np.float32))) == pytest.approx(
        softmax_ce(np.array(want), np.zeros(4, int)), rel=1e-5
    )


class Recorder:
    """A candidate model that records the ids the task sampled."""

    def __init__(self, table):
        self.table, self.ids = table, []

    def __call__(self, ids):
        self.ids.append(np.asarray(ids))
        return keras.ops.take(self.table, ids, axis=0)


@pytest.mark.parametrize("hits", [False, True])
def test_mixed_negatives_sampled_columns_and_their_logq(hits):
    q, v = towers(b=4, c=6)
    table = np.random.default_rng(1).normal(size=(8, 3)).astype(np.float32)
    sampler = R.UnigramSampler([5, 1, 0, 2, 9, 3, 1, 1])
    task = R.Retrieval(
        sampler=sampler, num_sampled_negatives=10, remove_accidental_hits=hits, seed=3
    )
    p = np.full(6, 0.25, np.float32)
    model = Recorder(table)
    logits, labels = logits_of(
        task, q, v, candidate_sampling_probability=p, candidate_ids=IDS, candidate_model=model
    )
    (drawn,) = model.ids
    exact = sampler.weights()[drawn] / 2**30
    in_batch = q @ v.T - np.log(p)[None]
    sampled = q @ table[drawn].T - np.log(10 * exact / 6)[None]
    if hits:
        in_batch[(IDS[:4, None] == IDS[None]) & ~np.eye(4, 6, dtype=bool)] = -np.inf
        sampled[IDS[:4, None] == drawn[None]] = -np.inf
        assert np.isneginf(sampled).any()
    np.testing.assert_allclose(logits, np.concatenate([in_batch, sampled], 1), rtol=1e-5)
    np.testing.assert_array_equal(labels, np.arange(4))
    assert set(drawn) <= {0, 1, 3, 4, 5, 6, 7}  # count 0: never drawn


def test_sampled_softmax_without_in_batch_negatives():
    q, v = towers(b=4, c=4)
    table = np.random.default_rng(2).normal(size=(6, 3)).astype(np.float32)
    sampler = R.LogUniformSampler(6)
    task = R.Retrieval(sampler=sampler, num_sampled_negatives=5, in_batch_negatives=False)
    model = Recorder(table)
    ids = np.array([0, 4, 2, 5])
    logits, labels = logits_of(task, q, v, candidate_ids=ids, candidate_model=model)
    (drawn,) = model.ids
    prob = sampler.weights() / 2**30
    positive = np.sum(q * v, 1) - np.log(prob[ids])
    sampled = q @ table[drawn].T - np.log(prob[drawn])[None]
    np.testing.assert_allclose(logits, np.concatenate([positive[:, None], sampled], 1), rtol=1e-5)
    np.testing.assert_array_equal(labels, 0)


@pytest.mark.parametrize(
    "name", ["softmax_cross_entropy", "rankmax", "sparsemax", "cvar", "kl_dro_batch_lse"]
)
def test_loss_by_name_is_that_loss_on_the_logits(name):
    q, v = towers(b=5, c=5)
    task = R.Retrieval(loss=name, remove_accidental_hits=True)
    ids = np.array([0, 1, 0, 2, 3])
    logits, labels = task.logits_and_labels(q, v, candidate_ids=ids)
    cls = losszoo.get_class(name)
    if callable(getattr(cls, "per_example_losses", None)):
        loss = cls(base_loss="softmax_cross_entropy")
    else:
        loss = cls(reduction="sum")
    assert float(task(q, v, candidate_ids=ids)) == pytest.approx(
        float(loss(labels, logits)), rel=1e-6
    )


def test_rankmax_temperature_is_a_scaled_margin():
    q, v = towers(b=5, c=5)
    cold = R.Retrieval(loss="rankmax", temperature=0.25)(q, v)
    margin = R.Retrieval(loss="rankmax", loss_config={"margin": 0.25})(q, v)
    assert float(cold) == pytest.approx(float(margin), rel=1e-5)


# ----------------------------------------------------------------------------- fail loud


@pytest.mark.parametrize("bad", [0.0, 1.5, -0.1, np.nan])
def test_probability_outside_0_1_raises_and_is_nan_under_xla(bad):
    q, v = towers(b=3, c=3)
    p = np.array([0.5, bad, 0.5], np.float32)
    task = R.Retrieval()
    with pytest.raises(ValueError, match="candidate_sampling_probability.*\\(0, 1\\]"):
        task(q, v, candidate_sampling_probability=p)
    graph = tf.function(lambda p: task(q, v, candidate_sampling_probability=p))
    with pytest.raises(tf.errors.InvalidArgumentError, match="candidate_sampling_probability"):
        graph(tf.constant(p))
    xla = tf.function(lambda p: task(q, v, candidate_sampling_probability=p), jit_compile=True)
    assert np.isnan(float(xla(tf.constant(p))))


def test_bad_ids_raise_and_are_nan_under_xla():
    q, v = towers(b=3, c=3)
    task = R.Retrieval(remove_accidental_hits=True)
    with pytest.raises(ValueError, match="candidate_ids"):
        task(q, v, candidate_ids=np.array([0, -1, 2]))
    sampled = R.Retrieval(sampler=R.UniformSampler(4), num_sampled_negatives=2)
    with pytest.raises(ValueError, match=r"candidate_ids.*\[0, 4\)"):
        sampled(q, v, candidate_ids=np.array([0, 4, 2]), candidate_model=lambda i: v[:2])
    with pytest.raises(TypeError, match="candidate_ids"):
        task(q, v, candidate_ids=np.array([0.0, 1.0, 2.0]))
    xla = tf.function(lambda ids: task(q, v, candidate_ids=ids), jit_compile=True)
    assert np.isnan(float(xla(tf.constant([0, -1, 2]))))


def test_wrong_shapes_and_missing_arguments_raise_naming_them():
    q, v = towers(b=3, c=4)
    task = R.Retrieval()
    with pytest.raises(ValueError, match="score_mask"):
        task(q, v, score_mask=np.ones((3, 3), bool))
    with pytest.raises(TypeError, match="score_mask"):
        task(q, v, score_mask=np.ones((3, 4)))
    with pytest.raises(ValueError, match="candidate_sampling_probability"):
        task(q, v, candidate_sampling_probability=np.full(3, 0.5, np.float32))
    with pytest.raises(ValueError, match="candidate_embeddings"):
        task(q, v[:, :2])
    with pytest.raises(ValueError, match="candidate_embeddings"):
        task(q, v[:2])
    with pytest.raises(ValueError, match="candidate_ids"):
        R.Retrieval(remove_accidental_hits=True)(q, v)
    graph = tf.function(
        lambda m: task(q, v, score_mask=m),
        input_signature=[tf.TensorSpec([None, None], tf.bool)],
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="score_mask"):
        graph(tf.ones((3, 3), tf.bool))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"temperature": 0.0}, "temperature"),
        ({"num_hard_negatives": 0}, "num_hard_negatives"),
        ({"num_sampled_negatives": 3}, "num_sampled_negatives"),
        ({"in_batch_negatives": False}, "in_batch_negatives"),
        ({"loss": "no_such_loss"}, "no_such_loss"),
    ],
)
def test_bad_hyper_parameters_raise_naming_them(kwargs, name):
    with pytest.raises((ValueError, TypeError, KeyError), match=name):
        R.Retrieval(**kwargs)


def test_config_roundtrips():
    task = R.Retrieval(
        loss="rankmax",
        loss_config={"margin": 0.5},
        temperature=0.1,
        remove_accidental_hits=True,
        num_hard_negatives=3,
        sampler=R.UnigramSampler([1, 2, 3], power=0.75),
        num_sampled_negatives=4,
        seed=7,
    )
    config = task.get_config()
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(task))
    assert type(again) is R.Retrieval and again.get_config() == config
    assert again.loss.margin == 0.5 and again.sampler.power == 0.75
    custom = R.Retrieval(loss=losszoo.get("sparsemax", reduction="sum"))
    again = R.Retrieval.from_config(custom.get_config())
    assert again.get_config() == custom.get_config()
    assert type(again.loss).__name__ == "SparsemaxLoss" and again.loss.reduction == "sum"
