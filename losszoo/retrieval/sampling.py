"""Candidate samplers with exact sampling probabilities, for sampled / mixed negatives.

Every sampler draws item ids from ``[0, num_items)`` independently, with replacement, from a
fixed distribution held as integer weights ``w_j`` that sum to ``2**30``:

    P(draw = j) = w_j / 2**30.

A draw is ``r ~ uniform{0, ..., 2**30 - 1}`` (unbiased: a power-of-two range) followed by a
binary search of ``r`` in the cumulative weights, so :meth:`CandidateSampler.probability`
returns the probability the sampler *actually* uses, exactly (up to float32 rounding of
``w_j / 2**30``), not an approximation of it. The weights are the target distribution
``p_j`` rounded to multiples of ``2**-30`` (largest remainders; every item with ``p_j > 0``
keeps ``w_j >= 1``): e.g. uniform over 10**6 items gives ``w_j`` in {1073, 1074}, within
0.1% of ``1/N``, and the logQ correction uses the exact value. Catalogues up to ``2**20``
items keep every weight within 0.1% of its target.

Samplers are plain configuration objects (no state): randomness comes from the ``seed``
passed to :meth:`CandidateSampler.sample`, e.g. a ``keras.random.SeedGenerator`` that the
:class:`~losszoo.retrieval.Retrieval` task owns. Written with ``keras.ops``.
"""

from __future__ import annotations

import functools

import keras
import numpy as np
from keras import ops

from losszoo.contract import check_number

#: Sum of the integer weights: draws are uniform integers below it.
TOTAL = 2**30


def quantize(p) -> np.ndarray:
    """Integer weights summing to :data:`TOTAL` that round ``p`` (normalised) as closely as
    largest-remainder rounding allows, with every positive entry kept at weight >= 1."""
    p = np.asarray(p, np.float64)
    p = p / p.sum()
    exact = p * TOTAL
    w = np.floor(exact).astype(np.int64)
    w[(p > 0) & (w == 0)] = 1
    short = TOTAL - int(w.sum())
    if short > 0:  # the largest remainders get one more
        w[np.argsort(w - exact, kind="stable")[:short]] += 1
    elif short < 0:  # only when tiny entries were raised to 1: take from the largest
        w[np.argsort(-w, kind="stable")[:-short]] -= 1
    return w


def count_at_most(cumulative: np.ndarray, r):
    """``#{j : cumulative[j] <= r}`` per entry of ``r`` (``searchsorted(..., side="right")``).

    A binary search of ``ceil(log2 N)`` gathers: O(S log N) work and memory under XLA,
    where ``searchsorted`` is lowered to an ``[S, N]`` comparison (32 GB for 8192 draws
    over 10**6 items).
    """
    n = int(cumulative.shape[0])
    table = ops.convert_to_tensor(cumulative)
    position = ops.zeros_like(r)
    step = 1 << (n.bit_length() - 1)
    while step:
        candidate = position + step
        inside = ops.less_equal(candidate, n)
        value = ops.take(table, ops.minimum(candidate, n) - 1)
        position = ops.where(ops.logical_and(inside, value <= r), candidate, position)
        step >>= 1
    return ops.cast(position, "int32")


class CandidateSampler:
    """Base class: draws from integer weights ``w`` (sum :data:`TOTAL`); see the module doc.

    Subclasses only say which distribution to round (:meth:`target`) and their config.

    Args:
      num_items: catalogue size ``N``; ids are ``0 .. N - 1``.

    Example:
      >>> import losszoo.retrieval
      >>> class FirstHalf(losszoo.retrieval.CandidateSampler):
      ...     def target(self):  # any non-negative weights; normalised, then rounded
      ...         return np.array([1.0, 1.0, 0.0, 0.0])
      >>> sampler = FirstHalf(4)
      >>> sampler.weights().tolist()  # w_j, summing to 2**30
      [536870912, 536870912, 0, 0]
      >>> keras.ops.convert_to_numpy(sampler.probability([0, 3])).tolist()
      [0.5, 0.0]
    """

    def __init__(self, num_items: int):
        self.num_items = check_number(num_items, "num_items", low=1, high=TOTAL, integer=True)

    def target(self) -> np.ndarray:
        """The distribution the weights round (float64, shape ``[num_items]``)."""
        raise NotImplementedError

    def weights(self) -> np.ndarray:
        """The integer weights ``w_j`` (int64, sum :data:`TOTAL`)."""
        return self._tables[0]

    @functools.cached_property
    def _tables(self):
        """``(weights, cumulative weights as int32)``, computed on first use."""
        w = quantize(self.target())
        return w, np.cumsum(w).astype(np.int32)

    def sample(self, num_samples: int, seed=None):
        """Draw ``num_samples`` ids (int32, shape ``[num_samples]``), with replacement.

        Args:
          num_samples: how many ids to draw (a Python int).
          seed: a ``keras.random.SeedGenerator``, an int or None (Keras' global generator).
        """
        num_samples = check_number(num_samples, "num_samples", low=1, integer=True)
        r = keras.random.randint((num_samples,), 0, TOTAL, dtype="int32", seed=seed)
        return count_at_most(self._tables[1], r)

    def probability(self, ids):
        """Exact probability of one draw being each id (float32, ``ids``' shape).

        Ids outside ``[0, num_items)`` give NaN (callers validate ids before this).
        """
        ids = ops.convert_to_tensor(ids)
        bad = ops.logical_or(ops.less(ids, 0), ops.greater_equal(ids, self.num_items))
        table = ops.convert_to_tensor(self.weights().astype(np.float32))
        w = ops.take(table, ops.where(bad, 0, ids))
        return ops.where(bad, ops.cast(np.nan, "float32"), w / np.float32(TOTAL))

    def get_config(self) -> dict:
        return {"num_items": self.num_items}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self) -> str:
        config = {"num_items": self.num_items, **self.get_config()}
        args = ", ".join(f"{k}={v!r}" for k, v in config.items() if k != "counts")
        return f"{type(self).__name__}({args})"


@keras.saving.register_keras_serializable(package="losszoo")
class UniformSampler(CandidateSampler):
    """Every item equally likely: ``p_j = 1/N`` (rounded to ``w_j / 2**30``; exact when ``N``
    is a power of two).

    Args:
      num_items: catalogue size ``N``, an integer in ``[1, 2**30]``; ids are ``0 .. N - 1``.

    Example:
      >>> import losszoo.retrieval
      >>> sampler = losszoo.retrieval.UniformSampler(1024)
      >>> ids = sampler.sample(8, seed=keras.random.SeedGenerator(0))
      >>> tuple(ids.shape)
      (8,)
      >>> float(sampler.probability([3])[0]) == 1 / 1024    # 1024 divides 2**30: exact
      True
    """

    def target(self):
        return np.full(self.num_items, 1.0 / self.num_items)


@keras.saving.register_keras_serializable(package="losszoo")
class LogUniformSampler(CandidateSampler):
    """Log-uniform (Zipfian) over ids sorted by decreasing popularity, as TensorFlow's
    ``log_uniform_candidate_sampler``:

        p_j = (log(j + 2) - log(j + 1)) / log(N + 1).

    Args:
      num_items: catalogue size ``N``, an integer in ``[1, 2**30]``; id ``j`` is the
        ``j``-th most popular item (``0 .. N - 1``).

    Example:
      >>> import losszoo.retrieval
      >>> sampler = losszoo.retrieval.LogUniformSampler(1000)
      >>> round(float(sampler.probability([0])[0]), 4)      # log(2) / log(1001)
      0.1003
    """

    def target(self):
        j = np.arange(self.num_items, dtype=np.float64)
        return (np.log(j + 2) - np.log(j + 1)) / np.log(self.num_items + 1)


@keras.saving.register_keras_serializable(package="losszoo")
class UnigramSampler(CandidateSampler):
    """Popularity ("unigram") sampling: ``p_j`` proportional to ``counts_j ** power``.

    ``power = 1`` samples as often as items occur in the data; word2vec's ``0.75`` flattens
    the distribution. Items with count 0 are never drawn (probability 0).

    Args:
      counts: non-negative finite counts (or any weights), one per item; not all zero.
      power: exponent applied to the counts (``> 0``).

    Example:
      >>> import losszoo.retrieval
      >>> sampler = losszoo.retrieval.UnigramSampler([3, 0, 1])   # e.g. np.bincount(items)
      >>> tuple(round(float(p), 4) for p in sampler.probability([0, 1, 2]))
      (0.75, 0.0, 0.25)
    """

    def __init__(self, counts, power: float = 1.0):
        counts = np.asarray(counts, np.float64)
        if counts.ndim != 1 or counts.size == 0:
            raise ValueError(f"`counts` must be a non-empty vector, got shape {counts.shape}.")
        if not np.all(np.isfinite(counts)) or counts.min() < 0 or counts.max() <= 0:
            raise ValueError("`counts` must be finite, non-negative and not all zero.")
        super().__init__(counts.size)
        self.counts = counts
        self.power = check_number(power, "power", low=0, low_open=True)

    def target(self):
        return self.counts**self.power

    def get_config(self):
        return {"counts": self.counts.tolist(), "power": self.power}
