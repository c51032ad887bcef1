"""Full-catalogue softmax against sampled softmax with logQ at equal compute time (issue 34).

A synthetic catalogue with a known popularity skew: ``--items`` items with Zipf popularity
(``p_j ~ 1 / rank_j ** --zipf``, ranks shuffled), users and items with ``--latent``-dimensional
Gaussian preferences, and each user's ``--per-user`` interactions drawn without replacement
from ``softmax(log p_j + --affinity * u . v_j)`` (Gumbel top-k). The last interaction of every
user is held out. Two-tower embeddings (``--dim``) are trained with Adagrad(``--lr``), batch
``--batch``, SUM reduction, XLA (TensorFlow, ``jit_compile=True``), each method for the same
budget of ``--budget`` seconds of this process's CPU time (``time.process_time``: on a shared
machine wall time measures the other processes; the wall seconds are reported too):

* ``full``: ``losszoo.retrieval.FullCatalogueRetrieval`` (exact softmax over every item,
  streamed by ``losszoo.ops.catalogue_loss``);
* ``sampled S``: ``losszoo.retrieval.Retrieval`` with ``S`` negatives drawn from the true
  popularity (``UnigramSampler`` of the training counts), logQ-corrected, accidental hits
  removed, no in-batch negatives (plain sampled softmax).

Metric: recall@k (``--k``) of the held-out item among all items, the user's training items
excluded. Run::

    python benchmarks/bench_catalogue_quality.py            # ~4 CPU-minutes
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def make_data(args):
    rng = np.random.default_rng(args.seed)
    n, users, k = args.items, args.users, args.latent
    rank = rng.permutation(n) + 1
    log_pop = -args.zipf * np.log(rank)
    u = rng.normal(size=(users, k)) / np.sqrt(k)
    v = rng.normal(size=(n, k))
    picks = np.empty((users, args.per_user), np.int64)
    for start in range(0, users, 1000):
        logits = log_pop + args.affinity * (u[start : start + 1000] @ v.T)
        logits += rng.gumbel(size=logits.shape)
        top = np.argpartition(-logits, args.per_user, axis=1)[:, : args.per_user]
        order = np.argsort(-np.take_along_axis(logits, top, axis=1), axis=1)
        picks[start : start + 1000] = rng.permuted(np.take_along_axis(top, order, 1), axis=1)
    train_u = np.repeat(np.arange(users), args.per_user - 1)
    train_i = picks[:, :-1].reshape(-1)
    return train_u, train_i, picks[:, -1], picks[:, :-1]


def recall(user_table, item_table, test_i, seen, k):
    hits = 0
    for start in range(0, len(test_i), 2000):
        s = user_table[start : start + 2000] @ item_table.T
        np.put_along_axis(s, seen[start : start + 2000], -np.inf, axis=1)
        target = np.take_along_axis(s, test_i[start : start + 2000, None], axis=1)
        hits += int(np.sum(np.sum(s > target, axis=1) < k))  # ties count against
    return hits / len(test_i)


def run(method, data, args):
    import keras
    import tensorflow as tf

    import losszoo.retrieval as R

    train_u, train_i, test_i, seen = data
    keras.utils.set_random_seed(args.seed)
    users = keras.layers.Embedding(args.users, args.dim)
    items = keras.layers.Embedding(args.items, args.dim)
    users.build(None)
    items.build(None)
    variables = [users.embeddings, items.embeddings]
    optimizer = keras.optimizers.Adagrad(args.lr)
    if method == "full":
        task = R.FullCatalogueRetrieval(loss="softmax_cross_entropy")
    else:
        counts = np.bincount(train_i, minlength=args.items) + 1
        task = R.Retrieval(
            sampler=R.UnigramSampler(counts),
            num_sampled_negatives=int(method.split()[1]),
            in_batch_negatives=False,
            remove_accidental_hits=True,
            seed=args.seed,
        )

    def step(u, i):
        with tf.GradientTape() as tape:
            q = users(u)
            if method == "full":
                value = task(q, items.embeddings, i)
            else:
                value = task(q, items(i), candidate_ids=i, candidate_model=items)
        optimizer.apply(tape.gradient(value, variables), variables)
        return value

    step = tf.function(step, jit_compile=True)
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(train_i))
    first = (train_u[order[: args.batch]], train_i[order[: args.batch]])
    float(step(tf.constant(first[0], tf.int32), tf.constant(first[1], tf.int32)))  # compile
    cpu0, wall0, steps, pos = time.process_time(), time.perf_counter(), 0, 0
    while time.process_time() - cpu0 < args.budget:
        if pos + args.batch > len(order):
            order, pos = rng.permutation(len(train_i)), 0
        b = order[pos : pos + args.batch]
        pos += args.batch
        float(step(tf.constant(train_u[b], tf.int32), tf.constant(train_i[b], tf.int32)))
        steps += 1
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    value = recall(
        keras.ops.convert_to_numpy(users.embeddings),
        keras.ops.convert_to_numpy(items.embeddings),
        test_i,
        seen,
        args.k,
    )
    return {
        "method": method,
        "recall": value,
        "steps": steps,
        "epochs": steps * args.batch / len(train_i),
        "cpu_s": cpu,
        "wall_s": wall,
    }


def main(argv=None):
    p = argparse.ArgumentParser(prog="python benchmarks/bench_catalogue_quality.py")
    p.add_argument("--items", type=int, default=20_000)
    p.add_argument("--users", type=int, default=20_000)
    p.add_argument("--per-user", type=int, default=12, help="interactions per user (1 held out)")
    p.add_argument("--latent", type=int, default=16)
    p.add_argument("--zipf", type=float, default=1.0, help="popularity exponent")
    p.add_argument("--affinity", type=float, default=2.0, help="weight of the preferences")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--budget", type=float, default=60.0, help="CPU seconds per method")
    p.add_argument("--sampled", type=int, nargs="+", default=[256, 2048])
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    data = make_data(args)
    pop = np.bincount(data[1], minlength=args.items)
    top_pop = np.argsort(-pop)[: args.k]
    baseline = float(np.mean(np.isin(data[2], top_pop)))
    print(json.dumps({"popularity_top_k_recall": baseline, "train_pairs": len(data[1])}))
    for method in ["full"] + [f"sampled {s}" for s in args.sampled]:
        result = run(method, data, args)
        result["load"] = os.getloadavg()[0]
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
