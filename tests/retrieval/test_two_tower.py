"""The retrieval task in Keras ``fit`` on the running backend: a two-tower model by loss name
(mixed negatives, accidental hits removed), its loss and logits against numpy, catalogue top-k
against numpy ranks (pessimistic ties)."""

import keras
import numpy as np
import pytest

import losszoo.retrieval as R
from tests.harness import BACKEND
from tests.retrieval._common import softmax_ce, towers

LOSSES = ("sparsemax", "softmax_cross_entropy")


class TwoTower(keras.Model):
    """Users and items embedded; the retrieval task computes the loss (mixed negatives) and,
    in ``evaluate``, top-k over the whole catalogue."""

    def __init__(self, loss, users=12, items=20, dim=4):
        super().__init__()
        self.users = keras.layers.Embedding(users, dim)
        self.items = keras.layers.Embedding(items, dim)
        self.users.build(None)
        self.items.build(None)
        self.task = R.Retrieval(
            loss=loss,
            remove_accidental_hits=True,
            sampler=R.UniformSampler(items),
            num_sampled_negatives=5,
            metrics=R.CatalogueTopK(ks=(1, 5)),
            seed=0,
        )
        self.task.task_metrics[0].candidates = lambda: self.items.embeddings

    def call(self, x):
        return self.users(x["user"])

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return self.task(
            self.users(x["user"]),
            self.items(x["item"]),
            candidate_ids=x["item"],
            candidate_model=self.items,
            compute_metrics=not training,
        )


def test_retrieval_task_matches_numpy():
    q, v = towers(b=4, c=6)
    assert float(R.Retrieval()(q, v)) == pytest.approx(softmax_ce(q @ v.T, np.arange(4)), rel=1e-5)
    ids = np.array([7, 8, 7, 1, 2, 3])  # rows 0 and 2 share an item: masked in each other's row
    logits, labels = R.Retrieval(remove_accidental_hits=True).logits_and_labels(
        q, v, candidate_ids=ids
    )
    want = q @ v.T
    want[0, 2] = want[2, 0] = -np.inf
    np.testing.assert_allclose(keras.ops.convert_to_numpy(logits), want, rtol=1e-6)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(labels), np.arange(4))


@pytest.mark.parametrize("name", LOSSES)
def test_retrieval_two_tower_fit(name):
    users = np.random.default_rng(4).integers(0, 12, 70)
    data = {"user": users.astype(np.int32), "item": (3 * users % 20).astype(np.int32)}
    keras.utils.set_random_seed(5)
    model = TwoTower(name)
    # compiled where that is the usual way (JAX); TensorFlow's XLA path: tests/retrieval
    model.compile(optimizer=keras.optimizers.Adagrad(0.5), jit_compile=BACKEND == "jax")
    losses = model.fit(data, batch_size=64, epochs=5, verbose=0, shuffle=False).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    result = model.evaluate(data, batch_size=64, verbose=0, return_dict=True)
    u = keras.ops.convert_to_numpy(model.users.embeddings)[users]
    scores = u @ keras.ops.convert_to_numpy(model.items.embeddings).T
    true = scores[np.arange(70), data["item"]]
    rank = (scores >= true[:, None]).sum(1) - 1  # pessimistic: ties rank ahead
    for k in (1, 5):
        np.testing.assert_allclose(result[f"top_{k}"], np.mean(rank < k), atol=1e-6)


def test_catalogue_ranks_ties_and_bad_ids():
    table = np.eye(4, dtype=np.float32)
    queries = np.array([[1, 0, 0, 0], [0, 1, 1, 0]], np.float32)  # query 1: items 1, 2 tie
    ranks = keras.ops.convert_to_numpy(R.candidate_ranks(queries, [0, 2], table, chunk_size=3))
    np.testing.assert_array_equal(ranks, [0.0, 1.0])
    with pytest.raises(ValueError, match="`true_ids`"):
        R.candidate_ranks(queries, [0, 4], table)
    sampler = R.UnigramSampler([3, 0, 1])
    probability = keras.ops.convert_to_numpy(sampler.probability([0, 1, 2]))
    np.testing.assert_allclose(probability, [0.75, 0.0, 0.25])
    draws = keras.ops.convert_to_numpy(sampler.sample(400, seed=keras.random.SeedGenerator(0)))
    assert set(np.unique(draws)) <= {0, 2} and 0.65 < np.mean(draws == 0) < 0.85
