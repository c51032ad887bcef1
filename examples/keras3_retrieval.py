"""MovieLens 100K two-tower retrieval in pure Keras 3 on the losszoo retrieval task.

A two-tower model (user-id and movie-id embeddings, dot-product scores) is a plain
``keras.Model`` whose ``compute_loss`` calls ``losszoo.retrieval.Retrieval`` (the Keras 3
counterpart of ``tfrs.tasks.Retrieval``; no TFRS, no tf_keras), trained with ``model.fit``
(XLA). Options of the task exposed here: the loss (``--loss``), in-batch or mixed negatives
(``--negatives``; mixed adds ``--sampled`` negatives per batch from the unigram sampler over
the training counts, with their exact sampling probability; full scores every movie with the
exact loss, ``losszoo.retrieval.full_catalogue.FullCatalogueRetrieval``), logQ correction
(``--logq``: q = the movie's share of the training pairs), accidental hits masked with -inf
(on), hard-negative mining and temperature.

Defaults follow TFRS' basic-retrieval recipe (embedding 32, Adagrad 0.1, batch 8192, SUM
reduction), with logQ on (it raised test top-100 from 0.24 to 0.39 for softmax there; see
BENCHMARKS.md) and 5 epochs. Data: every rating is a positive, random 80/10/10 split of the
(user, movie) pairs per seed. Metrics: top-k hit rates of held-out pairs over all movies
(``losszoo.retrieval.CatalogueTopK``, pessimistic ties, nothing removed), on validation
after every epoch (``model.evaluate``) and on test at the end.

Usage:
  python examples/keras3_retrieval.py                            # three losses, 1 seed
  python examples/keras3_retrieval.py --seeds 3 --out examples/results
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

SCRIPT = "keras3_retrieval"
LOSSES = ("softmax_cross_entropy", "rankmax", "sparsemax")
NEGATIVES = ("in-batch", "mixed", "full")
KS = (1, 10, 50, 100)


def parse_args(argv=None):
    p = _common.make_parser(SCRIPT, __doc__)
    p.add_argument("--loss", choices=(*LOSSES, "all"), default="all", help="loss of the task")
    p.add_argument(
        "--negatives",
        choices=NEGATIVES,
        nargs="+",
        default=["in-batch"],
        help="negative settings to run (mixed: in-batch plus sampled; full: every movie, the "
        "exact loss streamed over chunks, losszoo.retrieval.full_catalogue)",
    )
    p.add_argument(
        "--sampled",
        type=int,
        default=512,
        help="mixed only: negatives drawn per batch (unigram sampler)",
    )
    p.add_argument(
        "--logq",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="logQ correction of in-batch columns (q = training share of the movie)",
    )
    p.add_argument(
        "--num-hard-negatives",
        type=int,
        default=None,
        help="keep only the positive and this many hardest negatives per row",
    )
    p.add_argument("--temperature", type=float, default=None, help="divide scores by this")
    p.add_argument("--dim", type=int, default=32, help="embedding dimension")
    p.add_argument("--lr", type=float, default=0.1, help="Adagrad learning rate")
    p.add_argument("--batch-size", type=int, default=8192, help="training batch size")
    p.add_argument("--epochs", type=int, default=5, help="training epochs")
    p.add_argument("--seeds", type=int, default=1, help="runs per setting (seeds 0..N-1)")
    p.add_argument(
        "--data-dir",
        default=None,
        help="MovieLens 100K folder; default: the losszoo cache, else download",
    )
    p.add_argument("--verbose", action="store_true", help="Keras' per-epoch logs")
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error("--seeds must be >= 1")
    return args


def build_model(num_users, num_items, counts, loss, negatives, args, seed):
    import keras

    import losszoo.retrieval as R
    from losszoo.retrieval.full_catalogue import FullCatalogueRetrieval

    mixed, full = negatives == "mixed", negatives == "full"
    task = R.Retrieval(
        loss=loss,
        temperature=args.temperature,
        remove_accidental_hits=True,
        num_hard_negatives=args.num_hard_negatives,
        sampler=R.UnigramSampler(counts + 1.0) if mixed else None,  # +1: any movie can be drawn
        num_sampled_negatives=args.sampled if mixed else 0,
        metrics=R.CatalogueTopK(ks=KS),
        seed=seed,
    )
    if full:  # every movie is a negative: no sampling, no logQ, no accidental hits
        task = FullCatalogueRetrieval(
            loss=loss, temperature=args.temperature, metrics=R.CatalogueTopK(ks=KS)
        )

    class TwoTower(keras.Model):
        def __init__(self):
            super().__init__()
            self.users = keras.layers.Embedding(num_users, args.dim)
            self.items = keras.layers.Embedding(num_items, args.dim)
            self.users.build(None)  # built here, so fit's build has nothing to warn about
            self.items.build(None)
            self.task = task
            task.task_metrics[0].candidates = lambda: self.items.embeddings

        def call(self, x):
            return self.users(x["user"])

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
            if full:
                return self.task(
                    self.users(x["user"]),
                    self.items.embeddings,
                    x["item"],
                    compute_metrics=not training,
                )
            return self.task(
                self.users(x["user"]),
                self.items(x["item"]),
                candidate_ids=x["item"],
                candidate_sampling_probability=x["q"] if args.logq else None,
                candidate_model=self.items,
                compute_metrics=not training,
            )

    keras.utils.set_random_seed(seed)
    model = TwoTower()
    # XLA on TensorFlow and JAX. On PyTorch, jit_compile=True means torch.compile: 5 minutes
    # of tracing for this model on a 2-core CPU (Keras' "auto" leaves it off there too).
    jit = keras.backend.backend() != "torch"
    model.compile(optimizer=keras.optimizers.Adagrad(args.lr), jit_compile=jit)
    return model


def features(pairs, q):
    return {
        "user": pairs[:, 0].astype(np.int32),
        "item": pairs[:, 1].astype(np.int32),
        "q": q[pairs[:, 1]].astype(np.float32),
    }


def train_one(loss, negatives, seed, split, args, progress):
    counts = np.bincount(split.train[:, 1], minlength=split.num_items).astype(np.float64)
    q = (counts + 1.0) / (counts + 1.0).sum()  # +1: no probability 0 for unseen movies
    model = build_model(split.num_users, split.num_items, counts, loss, negatives, args, seed)
    order = np.random.default_rng(seed).permutation(len(split.train))
    train = features(split.train[order], q)
    history, times = [], []
    for _ in range(args.epochs):
        start = time.perf_counter()
        fit = model.fit(train, batch_size=args.batch_size, epochs=1, verbose=0, shuffle=True)
        times.append(time.perf_counter() - start)
        val = model.evaluate(
            features(split.validation, q), batch_size=4096, verbose=0, return_dict=True
        )
        row = {f"top{k}": float(val[f"top_{k}"]) for k in KS}
        row["loss"] = float(fit.history["loss"][-1])
        if not np.isfinite(row["loss"]):
            raise FloatingPointError(f"{loss}/{negatives} seed {seed}: loss {row['loss']}")
        history.append(row)
        progress.update({"loss": row["loss"], "val top-100": row["top100"]})
        if args.verbose:
            print(f"  epoch {len(history)}: {row}", flush=True)
    test = model.evaluate(features(split.test, q), batch_size=4096, verbose=0, return_dict=True)
    return {
        "val": history[-1],
        "test": {f"top{k}": float(test[f"top_{k}"]) for k in KS},
        "epoch_seconds": float(np.median(times[1:] if len(times) > 1 else times)),
        "history": history,
    }


def table(results, args, command, data_summary):
    lines = [
        "# MovieLens 100K retrieval in pure Keras 3: the losszoo retrieval task",
        "",
        f"Command: `{command}`",
        "",
        f"Data: MovieLens 100K ({data_summary}); every rating is a positive; random 80/10/10 "
        f"split of the (user, movie) pairs per seed. Model: two-tower, embedding {args.dim}, "
        f"`model.fit` (XLA), Adagrad {args.lr}, batch {args.batch_size}, {args.epochs} "
        "epochs, `losszoo.retrieval.Retrieval` (SUM reduction, accidental hits -inf, logQ "
        f"{'on' if args.logq else 'off'}"
        + (f", {args.num_hard_negatives} hard negatives" if args.num_hard_negatives else "")
        + (f", temperature {args.temperature}" if args.temperature else "")
        + f"; mixed: +{args.sampled} unigram-sampled negatives per batch). Top-k: share of "
        "held-out pairs whose movie is in the user's top k of all movies "
        f"(`CatalogueTopK`, pessimistic ties). {_common.seeds_note(args.seeds)}",
        "",
        "| loss | negatives | split | " + " | ".join(f"top-{k}" for k in KS) + " | s/epoch |",
        "|---|---|---|" + "---|" * len(KS) + "---|",
    ]
    for (negatives, loss), runs in results.items():
        for part in ("val", "test"):
            row = [loss, negatives, "validation" if part == "val" else "test"]
            row += [_common.fmt_stat([r[part][f"top{k}"] for r in runs]) for k in KS]
            row.append(_common.fmt_stat([r["epoch_seconds"] for r in runs], 2))
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for idx, ((negatives, loss), runs) in enumerate(results.items()):
        for i, run in enumerate(runs):
            epochs = range(1, len(run["history"]) + 1)
            style = {"color": f"C{idx}", "marker": "o", "alpha": 0.9 if i == 0 else 0.45}
            label = f"{loss}, {negatives}" if i == 0 else None
            axes[0].plot(epochs, [h["top100"] for h in run["history"]], label=label, **style)
            axes[1].plot(epochs, [h["top10"] for h in run["history"]], label=label, **style)
    for ax, key in zip(axes, ("top-100", "top-10")):
        ax.set_title(f"validation {key} over all movies")
        ax.set_xlabel("epoch")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("MovieLens 100K two-tower retrieval, Keras 3 + losszoo.retrieval")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    from losszoo.datasets import movielens

    command = _common.command_line(SCRIPT, argv)
    data = movielens.load_100k(args.data_dir)
    _, _, num_users, num_items = data.indexed()
    data_summary = f"{num_users} users, {num_items} movies, {data.num_ratings} ratings"
    losses = LOSSES if args.loss == "all" else (args.loss,)
    settings = [n for n in NEGATIVES if n in args.negatives]
    results = {(negatives, loss): [] for negatives in settings for loss in losses}
    for seed in range(args.seeds):
        split = movielens.split_pairs(data, seed=seed)
        for negatives, loss in results:
            progress = _common.RunProgress(
                f"{loss}, {negatives} negatives, seed {seed}",
                args.epochs,
                metrics=("loss", "val top-100"),
            )
            results[(negatives, loss)].append(
                train_one(loss, negatives, seed, split, args, progress)
            )
    out = _common.output_dir(args.out, SCRIPT)
    text = table(results, args, command, data_summary)
    (out / f"{SCRIPT}.md").write_text(text)
    (out / f"{SCRIPT}.json").write_text(
        json.dumps(
            {
                "command": command,
                "args": vars(args),
                "runs": {f"{neg}/{loss}": runs for (neg, loss), runs in results.items()},
            },
            indent=1,
        )
    )
    plot(results, out / f"{SCRIPT}.png")
    print()
    print(text)
    for suffix in (".md", ".json", ".png"):
        _common.wrote(out / f"{SCRIPT}{suffix}")
    return results


if __name__ == "__main__":
    main()
