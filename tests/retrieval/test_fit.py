"""The task trains in `fit` with every registered retrieval loss, XLA on and off, with a
partial last batch (50 pairs, batch 16: the last batch has 2)."""

import keras
import numpy as np
import pytest

import losszoo
import losszoo.retrieval as R

# These need a static class axis; the task's class axis is the batch (dynamic).
STATIC_CLASS_AXIS = {"possibilistic_projection", "antipignistic_kl", "vote_kl"}
RETRIEVAL_LOSSES = [n for n in losszoo.names("loss") if n not in STATIC_CLASS_AXIS]
USERS, ITEMS, PAIRS = 12, 20, 50
# PyTorch's jit_compile=True is torch.compile, outside losszoo's contract (tests/harness.py)
JIT = [False] if keras.backend.backend() == "torch" else [False, True]


def pairs():
    rng = np.random.default_rng(0)
    users = rng.integers(0, USERS, PAIRS).astype(np.int32)
    items = ((users * 3 + rng.integers(0, 2, PAIRS)) % ITEMS).astype(np.int32)  # learnable
    counts = np.bincount(items, minlength=ITEMS) + 1.0
    return {"user": users, "item": items, "q": (counts / counts.sum())[items].astype("float32")}


class TwoTower(keras.Model):
    def __init__(self, task):
        super().__init__()
        self.users = keras.layers.Embedding(USERS, 8)
        self.items = keras.layers.Embedding(ITEMS, 8)
        self.users.build()  # both towers exist before fit, as docs/api/retrieval.md does: the
        self.items.build()  # item tower is used in compute_loss only (PyTorch, cvar: unbuilt)
        self.task = task

    def call(self, x):
        return self.users(x["user"])

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return self.task(
            self.users(x["user"]),
            self.items(x["item"]),
            candidate_ids=x["item"],
            candidate_sampling_probability=x["q"],
            candidate_model=self.items,
            compute_metrics=not training,
        )


def train(task, jit, lr=0.1, epochs=4):
    keras.utils.set_random_seed(0)
    model = TwoTower(task)
    for metric in task.task_metrics:  # the catalogue: the item tower's current table
        metric.candidates = lambda: model.items.embeddings
    model.compile(optimizer=keras.optimizers.Adagrad(lr), jit_compile=jit)
    history = model.fit(pairs(), batch_size=16, epochs=epochs, verbose=0, shuffle=False)
    return model, history.history["loss"]


@pytest.mark.parametrize("jit", JIT, ids=["graph", "xla"][: len(JIT)])
@pytest.mark.parametrize("name", RETRIEVAL_LOSSES)
def test_each_retrieval_loss_trains_in_fit(name, jit):
    is_risk = callable(getattr(losszoo.get_class(name), "per_example_losses", None))
    task = R.Retrieval(loss=name, remove_accidental_hits=True)
    # The risks are on the scale of a mean (16x smaller gradients than the summed losses);
    # kl_dro_sumexp is exponential in the losses, so it keeps the small rate.
    lr = 1.0 if is_risk and name != "kl_dro_sumexp" else 0.1
    _, losses = train(task, jit, lr=lr)
    assert np.all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("jit", JIT, ids=["graph", "xla"][: len(JIT)])
def test_every_option_at_once_trains_and_reports_catalogue_top_k(jit):
    task = R.Retrieval(
        temperature=0.5,
        remove_accidental_hits=True,
        num_hard_negatives=4,
        sampler=R.UnigramSampler(np.bincount(pairs()["item"], minlength=ITEMS) + 1.0),
        num_sampled_negatives=8,
        metrics=R.CatalogueTopK(ks=(1, 5)),
        seed=0,
    )
    model, losses = train(task, jit)
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    logs = model.evaluate(pairs(), batch_size=16, verbose=0, return_dict=True)
    ranks = R.candidate_ranks(model.users(pairs()["user"]), pairs()["item"], model.items.embeddings)
    assert logs["top_5"] == pytest.approx(float(np.mean(np.asarray(ranks) < 5)), abs=1e-6)
