"""Retrieval benchmarks for ``losszoo.retrieval`` (issue 22); committed results, not CI.

(a) ``movielens``: TFRS' basic-retrieval recipe on MovieLens 100K (every rating a positive,
    ratings shuffled with seed 42, first 80% train, last 20% test; user/movie id embeddings
    of size 32; Adagrad 0.1; batch 8192; 3 epochs; in-batch negatives, SUM reduction).
    TFRS' own ``tfrs.tasks.Retrieval`` (tf_keras) and the Keras 3 task with
    ``"softmax_cross_entropy"`` train on the same batches in the same process; beside them
    rankmax and sparsemax, logQ on/off (q = the movie's share of the training ratings) and
    in-batch vs mixed negatives (512 extra negatives per batch from the unigram sampler over
    the training counts, exact logQ). Test top-k: share of test ratings whose movie is in
    the user's top k over all 1682 movies (``losszoo.retrieval.candidate_ranks``,
    pessimistic ties, nothing removed), the same function for every model; TFRS' own
    ``FactorizedTopK`` top-100 for its model as a cross-check. A learning-rate sweep per
    loss (test top-100, so a sensitivity table, not a tuned selection).
(b) ``catalogue``: a synthetic 1,000,000-item catalogue (embedding 32, batch 256 queries):
    sampled softmax (the task, 8192 log-uniform negatives, exact logQ) vs full softmax
    (``softmax_cross_entropy`` over the whole catalogue): step time (forward, backward and
    Adagrad update of both tables, XLA) and peak resident memory, each case in a fresh
    process.
(c) ``stream`` (issue 34): ``losszoo.ops.catalogue_loss``, the exact full-catalogue loss
    streamed over candidate chunks, against the materialised ``[batch, N]`` scores with the
    registered loss (``softmax_cross_entropy``, ``sparsemax``, ``rankmax``) at ``--stream-small``
    items, and against sampled softmax (8192 log-uniform negatives) at ``--items``: one Adagrad
    step on both tables, batch ``--stream-batch``, XLA; step time and peak resident memory,
    each case in a fresh process.

Usage:
  python benchmarks/bench_retrieval.py                      # both parts, a few minutes
  python benchmarks/bench_retrieval.py --part catalogue --full-batch 256 1024
  python benchmarks/bench_retrieval.py --part stream --steps 2   # issue 34's rows
  python benchmarks/bench_retrieval.py --out examples/results   # rewrite the committed file
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.keras = tf_keras for TFRS
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
NAME = "keras3_retrieval_bench"
KS = (1, 10, 50, 100)


# --------------------------------------------------------------------------- (a) MovieLens


def movielens_data():
    from losszoo.datasets import movielens

    data = movielens.load_100k()
    users, items, num_users, num_items = data.indexed()
    order = np.random.default_rng(42).permutation(data.num_ratings)
    users, items = users[order].astype(np.int32), items[order].astype(np.int32)
    cut = int(0.8 * data.num_ratings)
    return (users[:cut], items[:cut]), (users[cut:], items[cut:]), num_users, num_items


def batches(train, batch_size):
    users, items = train
    return [
        (users[i : i + batch_size], items[i : i + batch_size])
        for i in range(0, len(users), batch_size)
    ]


def top_k(user_table, item_table, test):
    from losszoo.retrieval import candidate_ranks

    ranks = np.asarray(candidate_ranks(user_table[test[0]], test[1], item_table))
    return {f"top{k}": float(np.mean(ranks < k)) for k in KS}


def run_keras3(setting, data, args, seed):
    import keras

    import losszoo.retrieval as R

    train, test, num_users, num_items = data
    keras.utils.set_random_seed(seed)
    counts = np.bincount(train[1], minlength=num_items).astype(np.float64)
    q_item = (counts / counts.sum()).astype(np.float32)
    sampler = None
    if setting["negatives"] == "mixed":
        sampler = R.UnigramSampler(counts + 1.0)  # +1: every movie can be drawn
    task = R.Retrieval(
        loss=setting["loss"],
        sampler=sampler,
        num_sampled_negatives=args.sampled if sampler else 0,
        remove_accidental_hits=sampler is not None,
        seed=seed,
    )
    users = keras.layers.Embedding(num_users, args.dim)
    items = keras.layers.Embedding(num_items, args.dim)
    users.build(None)
    items.build(None)
    optimizer = keras.optimizers.Adagrad(setting["lr"])
    variables = [users.embeddings, items.embeddings]
    import tensorflow as tf

    def step(u, i):
        with tf.GradientTape() as tape:
            prob = tf.gather(q_item, i) if setting["logq"] else None
            loss = task(
                users(u),
                items(i),
                candidate_ids=i,
                candidate_sampling_probability=prob,
                candidate_model=items,
            )
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    step = tf.function(step, jit_compile=True)
    start = time.perf_counter()
    losses = []
    for _ in range(args.epochs):
        epoch = [float(step(u, i)) for u, i in batches(train, args.batch_size)]
        losses.append(float(np.mean(epoch)))
    seconds = time.perf_counter() - start
    result = top_k(users.embeddings.numpy(), items.embeddings.numpy(), test)
    return {**result, "loss": losses, "seconds": seconds}


def run_tfrs(data, args, seed):
    import tensorflow as tf
    import tensorflow_recommenders as tfrs
    import tf_keras

    train, test, num_users, num_items = data
    tf.random.set_seed(seed)
    tf_keras.utils.set_random_seed(seed)

    class Model(tfrs.Model):
        def __init__(self):
            super().__init__()
            self.users = tf_keras.layers.Embedding(num_users, args.dim)
            self.items = tf_keras.layers.Embedding(num_items, args.dim)
            self.task = tfrs.tasks.Retrieval()

        def compute_loss(self, features, training=False):
            return self.task(self.users(features["user"]), self.items(features["item"]))

    model = Model()
    model.compile(optimizer=tf_keras.optimizers.Adagrad(0.1))
    ds = tf.data.Dataset.from_tensor_slices({"user": train[0], "item": train[1]})
    start = time.perf_counter()
    history = model.fit(ds.batch(args.batch_size), epochs=args.epochs, verbose=0)
    seconds = time.perf_counter() - start
    user_table = model.users.embeddings.numpy()
    item_table = model.items.embeddings.numpy()
    result = top_k(user_table, item_table, test)
    # TFRS' own metric on its own model (optimistic about ties: a cross-check).
    metric = tfrs.metrics.FactorizedTopK(
        candidates=tfrs.layers.factorized_top_k.BruteForce().index(
            tf.constant(item_table), tf.range(num_items)
        ),
        ks=(100,),
    )
    metric.update_state(tf.gather(user_table, test[0]), tf.gather(item_table, test[1]))
    result["tfrs_factorized_top100"] = float(metric.result()[0])
    return {**result, "loss": [float(x) for x in history.history["loss"]], "seconds": seconds}


def movielens_settings(args):
    base = {"negatives": "in-batch", "logq": False, "lr": 0.1}
    rows = [{"name": "TFRS tfrs.tasks.Retrieval", "tfrs": True, **base, "loss": "tfrs"}]
    for loss in ("softmax_cross_entropy", "rankmax", "sparsemax"):
        rows.append({**base, "loss": loss})
    for loss in ("softmax_cross_entropy", "rankmax", "sparsemax"):
        rows.append({**base, "loss": loss, "logq": True})
    for loss in ("softmax_cross_entropy", "rankmax", "sparsemax"):
        rows.append({**base, "loss": loss, "logq": True, "negatives": "mixed"})
    sweep = [
        {**base, "loss": loss, "lr": lr, "sweep": True}
        for loss in ("softmax_cross_entropy", "rankmax", "sparsemax")
        for lr in args.sweep_lr
        if lr != 0.1
    ]
    return rows, sweep


def bench_movielens(args):
    data = movielens_data()
    rows, sweep = movielens_settings(args)
    out = []
    for setting in rows + sweep:
        seeds = range(1 if setting.get("sweep") else args.seeds)
        runs = []
        for seed in seeds:
            runs.append(
                run_tfrs(data, args, seed)
                if setting.get("tfrs")
                else run_keras3(setting, data, args, seed)
            )
        top100 = [r["top100"] for r in runs]
        print(
            f"{setting.get('name', setting['loss'])} negatives={setting['negatives']} "
            f"logq={setting['logq']} lr={setting['lr']}: top-100 {np.mean(top100):.4f} "
            f"({len(runs)} seeds, {np.mean([r['seconds'] for r in runs]):.1f} s/run)",
            flush=True,
        )
        out.append({"setting": setting, "runs": runs})
    return out


def fmt(values, digits=4):
    values = np.asarray(values, float)
    if values.size == 1:
        return f"{values[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f}"


def movielens_table(results, args):
    lines = [
        "## (a) MovieLens 100K, TFRS basic-retrieval recipe",
        "",
        f"80/20 split of the ratings (shuffle seed 42), embedding {args.dim}, Adagrad, batch "
        f"{args.batch_size}, {args.epochs} epochs, SUM reduction; in-batch negatives unless "
        f"'mixed' (+{args.sampled} unigram-sampled negatives per batch, exact logQ, "
        "accidental hits -inf). logQ: q = the movie's share of the training ratings. Test "
        "top-k over all movies, pessimistic ties (`losszoo.retrieval.candidate_ranks`), the "
        f"same function for every row. Cells: mean ± std over {args.seeds} init seeds.",
        "",
        "| model / loss | negatives | logQ | lr | "
        + " | ".join(f"test top-{k}" for k in KS)
        + " | s/run |",
        "|---|---|---|---|" + "---|" * len(KS) + "---|",
    ]
    tfrs_own = None
    for entry in results:
        s, runs = entry["setting"], entry["runs"]
        if s.get("sweep"):
            continue
        row = [s.get("name", f"Keras 3 task, {s['loss']}"), s["negatives"]]
        row += ["on" if s["logq"] else "off", str(s["lr"])]
        row += [fmt([r[f"top{k}"] for r in runs]) for k in KS]
        row.append(fmt([r["seconds"] for r in runs], 1))
        lines.append("| " + " | ".join(row) + " |")
        if s.get("tfrs"):
            tfrs_own = fmt([r["tfrs_factorized_top100"] for r in runs])
    if tfrs_own:
        lines += ["", f"TFRS' own `FactorizedTopK` top-100 on its model: {tfrs_own}."]
    lines += [
        "",
        "### Learning-rate sweep (in-batch, logQ off; test top-100 of one seed; sensitivity, "
        "not a tuned selection)",
        "",
        "| loss | " + " | ".join(f"lr {lr}" for lr in args.sweep_lr) + " |",
        "|---|" + "---|" * len(args.sweep_lr),
    ]
    for loss in ("softmax_cross_entropy", "rankmax", "sparsemax"):
        cells = []
        for lr in args.sweep_lr:
            match = [
                e["runs"][0]["top100"]
                for e in results
                if e["setting"]["loss"] == loss
                and e["setting"]["lr"] == lr
                and not e["setting"]["logq"]
                and e["setting"]["negatives"] == "in-batch"
            ]
            cells.append(f"{match[0]:.4f}" if match else "-")
        lines.append(f"| {loss} | " + " | ".join(cells) + " |")
    return lines


# --------------------------------------------------------------------------- (b) catalogue


def _two_tables(n, dim, sampled):
    """Seeded user / item tables (100,000 users, ``n`` items), their Adagrad and a sampled
    softmax task (log-uniform negatives, no in-batch ones): the setup both scale parts share."""
    import keras

    import losszoo.retrieval as R

    keras.utils.set_random_seed(0)
    users = keras.layers.Embedding(100_000, dim)
    items = keras.layers.Embedding(n, dim)
    users.build(None)
    items.build(None)
    task = R.Retrieval(
        sampler=R.LogUniformSampler(n),
        num_sampled_negatives=sampled,
        in_batch_negatives=False,
        seed=0,
    )
    return users, items, [users.embeddings, items.embeddings], keras.optimizers.Adagrad(0.1), task


def catalogue_case(kind, batch, args):
    """One step-time / memory case; runs in its own process (see :func:`bench_catalogue`)."""
    import tensorflow as tf

    import losszoo

    n, dim = args.items, args.dim
    users, items, variables, optimizer, task = _two_tables(n, dim, args.sampled)
    full = losszoo.get("softmax_cross_entropy", reduction="sum")

    def step(u, i):
        with tf.GradientTape() as tape:
            if kind == "sampled":
                loss = task(users(u), items(i), candidate_ids=i, candidate_model=items)
            else:
                loss = full(i, tf.matmul(users(u), items.embeddings, transpose_b=True))
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    step = tf.function(step, jit_compile=True)
    rng = np.random.default_rng(0)
    times = []
    for it in range(args.steps + 2):
        u = tf.constant(rng.integers(0, 100_000, batch), tf.int32)
        i = task.sampler.sample(batch, seed=it)  # positives: Zipf-like popularity
        start = time.perf_counter()
        float(step(u, i))
        times.append(time.perf_counter() - start)
    return {
        "kind": kind,
        "batch": batch,
        "step_ms": float(np.median(times[2:]) * 1e3),
        "first_step_s": times[0],
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def available_gb():
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def bench_catalogue(args):
    cases = [("sampled", b) for b in args.sampled_batch] + [("full", b) for b in args.full_batch]
    results = []
    for kind, batch in cases:
        # full softmax holds ~3 [batch, N] float32 arrays (logits, softmax, gradient)
        need = 3 * batch * args.items * 4 / 2**30 + 1.0 if kind == "full" else 1.0
        if need > 0.7 * available_gb():
            results.append({"kind": kind, "batch": batch, "skipped": f"needs ~{need:.0f} GB"})
            print(f"{kind} batch {batch}: skipped, needs ~{need:.0f} GB", flush=True)
            continue
        command = [sys.executable, __file__, "--case", kind, str(batch), *args.passthrough]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or ["?"])[-1][:200]
            results.append({"kind": kind, "batch": batch, "failed": reason})
            print(f"{kind} batch {batch}: failed: {reason}", flush=True)
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(result)
        print(
            f"{kind} batch {batch}: {result['step_ms']:.0f} ms/step, peak RSS "
            f"{result['peak_rss_gb']:.2f} GB",
            flush=True,
        )
    return results


def catalogue_table(results, args):
    lines = [
        f"## (b) Synthetic catalogue of {args.items:,} items",
        "",
        f"Embedding {args.dim}; positives drawn log-uniform; one training step = forward, "
        "backward and Adagrad update of the user (100,000) and item tables, XLA "
        f"(`jit_compile=True`); median of {args.steps} steps after 2 warm-up steps. Sampled: "
        f"the task with {args.sampled} log-uniform negatives per batch, plain sampled "
        "softmax (`in_batch_negatives=False`, exact logQ). Full: `softmax_cross_entropy` on "
        "the scores against every item. Peak memory: the process's maximum resident set "
        "(fresh process per case, including TensorFlow itself and both tables).",
        "",
        "| method | batch | step ms | peak RSS GB | first step s (compile) |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        label = "sampled softmax (8192 negatives)" if r["kind"] == "sampled" else "full softmax"
        if "skipped" in r or "failed" in r:
            why = r.get("skipped") or f"failed: {r['failed']}"
            lines.append(f"| {label} | {r['batch']} | not run: {why} | - | - |")
            continue
        lines.append(
            f"| {label} | {r['batch']} | {r['step_ms']:.0f} | {r['peak_rss_gb']:.2f} | "
            f"{r['first_step_s']:.1f} |"
        )
    return lines


# --------------------------------------------------------------------------- (c) stream

STREAM_LOSSES = {"softmax": "softmax_cross_entropy", "sparsemax": "sparsemax", "rankmax": "rankmax"}


def stream_case(kind, loss, n, batch, args):
    """One step-time / memory case of part (c), in its own process: ``kind`` is
    ``"streamed"`` (``catalogue_loss``), ``"materialised"`` (the registered loss on the
    ``[batch, n]`` scores) or ``"sampled"`` (the task, sampled softmax)."""
    import tensorflow as tf

    import losszoo

    dim = args.dim
    users, items, variables, optimizer, task = _two_tables(n, dim, args.sampled)
    registered = losszoo.get(STREAM_LOSSES[loss], reduction="sum")

    def step(u, i):
        with tf.GradientTape() as tape:
            q = users(u)
            if kind == "sampled":
                value = task(q, items(i), candidate_ids=i, candidate_model=items)
            elif kind == "streamed":
                per_row = losszoo.ops.catalogue_loss(
                    q, items.embeddings, i, loss=loss, chunk_size=args.chunk
                )
                value = tf.reduce_sum(per_row)
            else:
                value = registered(i, tf.matmul(q, items.embeddings, transpose_b=True))
        optimizer.apply(tape.gradient(value, variables), variables)
        return value

    step = tf.function(step, jit_compile=True)
    times = []
    for it in range(args.steps + 1):
        u = tf.constant(np.random.default_rng(it).integers(0, 100_000, batch), tf.int32)
        i = task.sampler.sample(batch, seed=it)
        start = time.perf_counter()
        float(step(u, i))
        times.append(time.perf_counter() - start)
    return {
        "kind": kind,
        "loss": loss,
        "items": n,
        "batch": batch,
        "step_ms": float(np.median(times[1:]) * 1e3),
        "first_step_s": times[0],
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def bench_stream(args):
    small, large, batch = args.stream_small, args.items, args.stream_batch
    cases = []
    for loss in args.stream_losses:
        cases += [("materialised", loss, small), ("streamed", loss, small)]
    cases.append(("sampled", "softmax", large))
    cases += [("streamed", loss, large) for loss in args.stream_losses]
    results = []
    for kind, loss, n in cases:
        label = f"{kind} {loss} N={n:,} batch {batch}"
        need = 4 * batch * n * 4 / 2**30 + 1.0 if kind == "materialised" else 1.5
        if need > 0.7 * available_gb():
            results.append({"kind": kind, "loss": loss, "items": n, "skipped": f"~{need:.0f} GB"})
            print(f"{label}: skipped, needs ~{need:.0f} GB", flush=True)
            continue
        command = [sys.executable, __file__, "--stream-case", kind, loss, str(n), str(batch)]
        command += [*args.passthrough, f"--chunk={args.chunk}"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or ["?"])[-1][:200]
            results.append({"kind": kind, "loss": loss, "items": n, "failed": reason})
            print(f"{label}: failed: {reason}", flush=True)
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(result)
        print(
            f"{label}: {result['step_ms']:.0f} ms/step, peak RSS {result['peak_rss_gb']:.2f} GB",
            flush=True,
        )
    return results


def stream_table(results, args):
    lines = [
        "## (c) Exact full-catalogue losses streamed over chunks (issue 34)",
        "",
        f"Embedding {args.dim}, batch {args.stream_batch}, positives drawn log-uniform; one "
        "training step = forward, backward and Adagrad update of the user (100,000) and item "
        f"tables, XLA (`jit_compile=True`); median of {args.steps} steps after 1 warm-up step. "
        "Streamed: `losszoo.ops.catalogue_loss` (chunks of "
        f"{args.chunk} items); materialised: the registered loss on the `[batch, N]` scores; "
        f"sampled: the task with {args.sampled} log-uniform negatives "
        "(`in_batch_negatives=False`). Peak memory: the process's maximum resident set (fresh "
        "process per case, TensorFlow and both tables included). Ratio: step time over the "
        "materialised step of the same loss and N (streamed rows at the small N), over "
        "sampled softmax at the large N.",
        "",
        "| method | loss | items | step ms | ratio | peak RSS GB | first step s |",
        "|---|---|---|---|---|---|---|",
    ]

    def find(kind, loss, n):
        return next(
            (r for r in results if (r["kind"], r["loss"], r["items"]) == (kind, loss, n)), None
        )

    for r in results:
        if "step_ms" not in r:
            why = r.get("skipped") or r.get("failed")
            lines.append(f"| {r['kind']} | {r['loss']} | {r['items']:,} | not run: {why} | |||")
            continue
        anchor = None
        if r["kind"] == "streamed":
            small = r["items"] == args.stream_small
            anchor = find("materialised", r["loss"], r["items"]) if small else None
            anchor = anchor or find("sampled", "softmax", r["items"])
        ratio = f"{r['step_ms'] / anchor['step_ms']:.2f}" if anchor and "step_ms" in anchor else ""
        lines.append(
            f"| {r['kind']} | {r['loss']} | {r['items']:,} | {r['step_ms']:.0f} | {ratio} | "
            f"{r['peak_rss_gb']:.2f} | {r['first_step_s']:.1f} |"
        )
    return lines


# --------------------------------------------------------------------------- main


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python benchmarks/bench_retrieval.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--part", choices=("movielens", "catalogue", "stream", "all"), default="all")
    p.add_argument("--seeds", type=int, default=3, help="init seeds per MovieLens row")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8192)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--sampled", type=int, default=None, help="sampled negatives per batch")
    p.add_argument("--sweep-lr", type=float, nargs="+", default=[0.03, 0.1, 0.3, 1.0])
    p.add_argument("--items", type=int, default=1_000_000, help="synthetic catalogue size")
    p.add_argument("--sampled-batch", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--full-batch", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--steps", type=int, default=5, help="timed steps per catalogue case")
    p.add_argument("--case", nargs=2, default=None, help=argparse.SUPPRESS)
    p.add_argument("--stream-small", type=int, default=200_000, help="(c): items, vs materialised")
    p.add_argument("--stream-batch", type=int, default=1024, help="(c): queries per step")
    p.add_argument("--stream-losses", nargs="+", default=list(STREAM_LOSSES))
    p.add_argument("--chunk", type=int, default=8192, help="(c): catalogue_loss chunk_size")
    p.add_argument("--stream-case", nargs=4, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="folder for the results (default: out/)")
    args = p.parse_args(argv)
    args.passthrough = [
        f"--items={args.items}",
        f"--dim={args.dim}",
        f"--steps={args.steps}",
        f"--sampled={8192 if args.sampled is None else args.sampled}",
    ]
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.stream_case:
        args.sampled = args.sampled or 8192
        kind, loss, n, batch = args.stream_case
        print(json.dumps(stream_case(kind, loss, int(n), int(batch), args)))
        return 0
    if args.case:
        args.sampled = args.sampled or 8192
        print(json.dumps(catalogue_case(args.case[0], int(args.case[1]), args)))
        return 0
    command = "python benchmarks/bench_retrieval.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    lines = [
        "# losszoo.retrieval benchmarks (issue 22)",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine} (shared with other jobs), {stamp}.",
        "",
    ]
    results = {}
    if args.part in ("movielens", "all"):
        sampled, args.sampled = args.sampled, args.sampled or 512
        results["movielens"] = bench_movielens(args)
        lines += movielens_table(results["movielens"], args) + [""]
        args.sampled = sampled
    if args.part in ("catalogue", "all"):
        args.sampled = args.sampled or 8192
        results["catalogue"] = bench_catalogue(args)
        lines += catalogue_table(results["catalogue"], args) + [""]
    if args.part == "stream":  # not in "all": minutes per case at 10^6 items
        args.sampled = args.sampled or 8192
        results["stream"] = bench_stream(args)
        lines += stream_table(results["stream"], args) + [""]
    out = Path(args.out or "out")
    out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.part == "all" else f"_{args.part}"
    md, js = out / f"{NAME}{suffix}.md", out / f"{NAME}{suffix}.json"
    md.write_text("\n".join(lines))
    js.write_text(json.dumps({"command": command, "results": results}, indent=1))
    print("\n".join(lines))
    print(f"wrote {md}\nwrote {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
