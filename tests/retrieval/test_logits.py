"""The retrieval task's steps as functions (losszoo.retrieval.logits), each alone against numpy,
eager and compiled, on every backend; and the task is exactly their composition."""

import keras
import numpy as np
import pytest

import losszoo.retrieval as R
from tests.harness import MODES, compiled, numpy
from tests.retrieval._common import towers

IDS = np.array([3, 1, 3, 2, 5, 1], np.int32)  # rows 0/2 and 1/5 share an item


@pytest.mark.parametrize("mode", MODES)
def test_in_batch_logits_are_scores_over_temperature(mode):
    q, v = towers(b=4, c=6)
    got = numpy(compiled(lambda q, v: R.in_batch_logits(q, v, temperature=0.25), mode)(q, v))
    np.testing.assert_allclose(got, q @ v.T / 0.25, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(numpy(R.in_batch_logits(q, v)), q @ v.T, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_logq_correction_subtracts_log_q(mode):
    z = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    p = np.array([0.5, 0.1, 1.0, 0.02], np.float32)
    got = numpy(compiled(R.logq_correction, mode)(z, p))
    np.testing.assert_allclose(got, z - np.log(p)[None], rtol=1e-6, atol=1e-6)


def test_logq_correction_fails_loud():
    z = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"candidate_sampling_probability.*\(0, 1\]"):
        R.logq_correction(z, np.array([0.5, 0.0, 0.5], np.float32))
    with pytest.raises(ValueError, match="candidate_sampling_probability"):
        R.logq_correction(z, np.array([0.5, 0.5], np.float32))  # one per column
    if keras.backend.backend() == "jax":  # traced: the bad column is NaN
        got = numpy(compiled(R.logq_correction, "jit")(z, np.array([0.5, np.nan, 2.0], "f4")))
        assert np.isnan(got).tolist() == [[False, True, True]] * 2


@pytest.mark.parametrize("mode", MODES)
def test_remove_accidental_hits_masks_the_rows_own_item_except_its_positive(mode):
    z = np.random.default_rng(1).normal(size=(4, 6)).astype(np.float32)
    rows = np.arange(4, dtype=np.int32)
    got = numpy(compiled(R.remove_accidental_hits, mode)(z, IDS[:4], IDS, rows))
    want = z.copy()
    for i in range(4):
        for j in range(6):
            if IDS[i] == IDS[j] and i != j:
                want[i, j] = -np.inf
    assert np.isneginf(want).sum() == 3  # (0, 2), (2, 0), (1, 5)
    np.testing.assert_array_equal(got, want)
    # no positive among the columns (sampled ones): every match goes
    sampled = np.array([1, 3, 4], np.int32)
    got = numpy(R.remove_accidental_hits(z[:, :3], IDS[:4], sampled))
    np.testing.assert_array_equal(np.isneginf(got), IDS[:4, None] == sampled[None])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [1, 3, 7])
def test_hard_negative_mining_keeps_positive_and_top_n(mode, n):
    z = np.random.default_rng(2).normal(size=(4, 6)).astype(np.float32)
    z[1, 3] = z[1, 4] = 9.0  # a tie
    labels = np.array([0, 2, 5, 1], np.int32)
    got, new_labels = compiled(lambda z, y: R.hard_negative_mining(z, y, n), mode)(z, labels)
    want = []
    for i, y in enumerate(labels):
        others = np.sort(np.delete(z[i], y))[::-1][:n]
        want.append(np.concatenate([[z[i, y]], others, np.full(n - others.size, -np.inf)]))
    np.testing.assert_array_equal(numpy(got), np.array(want, np.float32))
    np.testing.assert_array_equal(numpy(new_labels), 0)


def test_hard_negative_mining_keeps_nan_rows_nan():
    z = np.array([[1.0, np.nan, 0.0], [1.0, 2.0, 3.0]], np.float32)
    got = numpy(R.hard_negative_mining(z, np.array([0, 0], np.int32), 1)[0])
    assert np.isnan(got[0, 0]) and np.isfinite(got[1]).all()
    with pytest.raises(ValueError, match="num_hard_negatives"):
        R.hard_negative_mining(z, np.array([0, 0]), 0)


class Table:
    """A candidate model: rows of a table, recording the ids it was asked for."""

    def __init__(self, table):
        self.table, self.ids = table, []

    def __call__(self, ids):
        self.ids.append(numpy(ids))
        return keras.ops.take(self.table, ids, axis=0)


@pytest.mark.parametrize("num_in_batch", [None, 6])
def test_sampled_logits_score_drawn_ids_with_their_exact_logq(num_in_batch):
    q, _ = towers(b=4, c=6)
    table = np.random.default_rng(3).normal(size=(8, 3)).astype(np.float32)
    sampler = R.UnigramSampler([5, 1, 0, 2, 9, 3, 1, 1])
    model = Table(table)
    logits, ids = R.sampled_logits(
        q, sampler, 10, model, temperature=0.5, num_in_batch=num_in_batch, seed=4
    )
    ids = numpy(ids)
    np.testing.assert_array_equal(ids, model.ids[0])
    assert ids.shape == (10,) and 2 not in ids  # count 0: never drawn
    p = sampler.weights()[ids] / 2**30
    expected = p if num_in_batch is None else 10 * p / num_in_batch
    want = q @ table[ids].T / 0.5 - np.log(expected)[None]
    np.testing.assert_allclose(numpy(logits), want, rtol=1e-5, atol=1e-5)
    plain, _ = R.sampled_logits(q, sampler, 10, model, logq=False, seed=4)
    np.testing.assert_allclose(numpy(plain), q @ table[ids].T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="candidate_model"):
        R.sampled_logits(q, sampler, 2, None)
    with pytest.raises(ValueError, match=r"candidate_model\(ids\)"):
        R.sampled_logits(q, sampler, 2, lambda i: table[:2, :2])


def test_the_task_is_the_composition_of_the_functions():
    q, v = towers(b=4, c=6)
    p = np.linspace(0.05, 0.6, 6).astype(np.float32)
    task = R.Retrieval(temperature=0.5, remove_accidental_hits=True, num_hard_negatives=3)
    logits, labels = task.logits_and_labels(
        q, v, candidate_ids=IDS, candidate_sampling_probability=p
    )
    rows = np.arange(4, dtype=np.int32)
    z = R.logq_correction(R.in_batch_logits(q, v, 0.5), p)
    z = R.remove_accidental_hits(z, IDS[:4], IDS, rows)
    z, y = R.hard_negative_mining(z, rows, 3)
    np.testing.assert_array_equal(numpy(logits), numpy(z))
    np.testing.assert_array_equal(numpy(labels), numpy(y))


def test_score_mask_on_every_backend():
    # PyTorch's bool dtype read as "not boolean" before the mask's dtype was standardized.
    q, v = towers(b=3, c=4)
    mask = np.array([[1, 0, 1, 1], [1, 1, 1, 0], [0, 1, 1, 1]], bool)
    logits, _ = R.Retrieval().logits_and_labels(q, v, score_mask=mask)
    np.testing.assert_allclose(numpy(logits), np.where(mask, q @ v.T, -np.inf), rtol=1e-6)
    with pytest.raises(TypeError, match="score_mask"):
        R.Retrieval()(q, v, score_mask=mask.astype(np.float32))
