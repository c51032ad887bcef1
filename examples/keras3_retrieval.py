"""MovieLens 100K retrieval in pure Keras 3 with keras-rs: softmax vs sparsemax vs Rankmax.

The Keras 3 counterpart of ``examples/movielens_retrieval.py`` (which needs TensorFlow
Recommenders and so tf_keras). No TFRS, no tf_keras: a two-tower model (user-id and movie-id
embeddings, dot-product scores) is a plain ``keras.Model`` trained with ``model.fit`` and a
Keras 3 loss; keras-rs (``pip install 'losszoo[keras3-retrieval]'``) provides the retrieval
layer used for evaluation (``keras_rs.layers.BruteForceRetrieval``).

Losses (``--loss``): ``softmax`` (categorical cross-entropy on the scores), ``sparsemax``
(``losszoo.losses.SparsemaxLoss``) and ``rankmax`` (``losszoo.losses.RankmaxLoss``), all with
the same SUM reduction, optimizer, learning rate and L2 penalty as the TFRS example, so the
two tables can be read side by side.

Negatives (``--negatives``, one or both):

* ``full``: every movie is a candidate for every (user, positive) pair, labels are the movie
  ids (the Rankmax paper's setting and the TFRS example's default);
* ``in-batch``: the other positives of the batch are the negatives, labels are the identity
  matrix. A movie that appears twice in a batch is an *accidental hit* and is masked with
  ``-inf`` (every losszoo loss reads ``-inf`` as "not a candidate"; the softmax baseline here
  uses a masked log-softmax, since Keras' ``CategoricalCrossentropy`` returns NaN on ``-inf``
  scores). keras-rs' own ``RemoveAccidentalHits`` does not mask: in keras-rs 0.4.0 it adds
  ``SMALLEST_FLOAT = finfo(float32).smallest_normal / 100`` (about +1.2e-40) to the duplicate
  logits, which leaves them unchanged. With ``--sampling-correction`` (default on) the
  in-batch scores get keras-rs' ``SamplingProbabilityCorrection`` (the "logQ" correction,
  ``score - log q(movie)``, ``q`` the movie's share of the training pairs): popular movies
  are over-represented as in-batch negatives, and without it the model learns to demote
  them. Evaluation always ranks by the raw scores.

Metrics: the Rankmax paper's AP@10, Accuracy (top-1 hit) and Recall@100 (the user's training
movies removed from the ranking; for test also the validation movies), averaged over users
with a held-out movie (``losszoo.datasets.movielens.ranking_metrics``, the same code as the
TFRS example); and top-{1,5,10,50,100} hit rates of the held-out pairs over all movies,
retrieved with ``keras_rs.layers.BruteForceRetrieval`` (TFRS' FactorizedTopK definition).
Early stopping on validation AP@10.

Usage:
  PYTHONPATH=. python examples/keras3_retrieval.py                     # 1 seed, quick look
  PYTHONPATH=. python examples/keras3_retrieval.py --seeds 3 --out examples/results
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LOSSES = ("softmax", "sparsemax", "rankmax")
NEGATIVES = ("full", "in-batch")
TOPK = (1, 5, 10, 50, 100)
TAG = "keras3_retrieval"


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--loss",
        choices=(*LOSSES, "all"),
        default="all",
        help="loss to train with; 'all' runs the three",
    )
    p.add_argument(
        "--negatives",
        choices=NEGATIVES,
        nargs="+",
        default=list(NEGATIVES),
        help="negative sampling settings to run (one table row group each)",
    )
    p.add_argument(
        "--sampling-correction",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="in-batch only: subtract log(sampling probability) of each candidate "
        "(keras_rs.layers.SamplingProbabilityCorrection)",
    )
    p.add_argument("--dim", type=int, default=32, help="embedding dimension")
    p.add_argument("--lr", type=float, default=0.01, help="Adam learning rate")
    p.add_argument("--l2", type=float, default=1e-4, help="L2 penalty on the embedding tables")
    p.add_argument("--batch-size", type=int, default=512, help="training batch size")
    p.add_argument("--epochs", type=int, default=20, help="maximum epochs")
    p.add_argument(
        "--patience",
        type=int,
        default=3,
        help="stop after this many epochs without a better validation AP@10",
    )
    p.add_argument("--k", type=int, default=1, help="Rankmax k")
    p.add_argument("--margin", type=float, default=1.0, help="Rankmax margin (eta)")
    p.add_argument("--seeds", type=int, default=1, help="runs per setting (seeds 0..N-1)")
    p.add_argument(
        "--data-dir",
        default=None,
        help="MovieLens 100K folder; default: the losszoo cache, else download",
    )
    p.add_argument(
        "--out",
        default=None,
        help="output folder; default: a fresh out/keras3_retrieval-<UTC timestamp>",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="print one line per epoch instead of one progress bar per run",
    )
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error("--seeds must be >= 1")
    if args.out is None:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
        args.out = str(Path("out") / f"{TAG}-{stamp}")
    return args


# --------------------------------------------------------------------------- model + losses


def masked_softmax_cross_entropy(reduction="sum"):
    """Categorical cross-entropy on scores where ``-inf`` means "not a candidate"."""
    import keras
    import tensorflow as tf

    class MaskedSoftmaxCE(keras.losses.Loss):
        def call(self, y_true, y_pred):
            y_true = tf.cast(y_true, y_pred.dtype)
            log_p = tf.nn.log_softmax(y_pred, axis=-1)
            return -tf.reduce_sum(tf.where(y_true > 0, y_true * log_p, 0.0), axis=-1)

    return MaskedSoftmaxCE(reduction=reduction, name="softmax_ce")


def make_loss(name, negatives, args):
    import keras

    import losszoo

    if name == "softmax":
        if negatives == "full":
            return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
        return masked_softmax_cross_entropy("sum")
    if name == "sparsemax":
        return losszoo.losses.SparsemaxLoss(reduction="sum")
    return losszoo.losses.RankmaxLoss(k=args.k, margin=args.margin, reduction="sum")


def build_model(num_users, num_items, negatives, args, seed, item_probability=None):
    import keras
    import keras_rs
    import tensorflow as tf

    def table(size, offset):
        return keras.layers.Embedding(
            size,
            args.dim,
            embeddings_initializer=keras.initializers.RandomNormal(
                stddev=0.1, seed=seed * 2 + offset
            ),
            embeddings_regularizer=keras.regularizers.L2(args.l2),
        )

    class TwoTower(keras.Model):
        def __init__(self):
            super().__init__()
            self.users = table(num_users, 0)
            self.items = table(num_items, 1)
            self.correction = None
            if negatives == "in-batch" and args.sampling_correction:
                self.correction = keras_rs.layers.SamplingProbabilityCorrection()
                self.probability = tf.constant(item_probability, tf.float32)

        def call(self, inputs):
            query = self.users(inputs["user"])
            if negatives == "full":
                self.items.build(None)
                return tf.matmul(query, self.items.embeddings, transpose_b=True)
            item = inputs["item"]
            scores = tf.matmul(query, self.items(item), transpose_b=True)
            if self.correction is not None:
                q = tf.gather(self.probability, item)[None, :]
                scores = self.correction(scores, tf.broadcast_to(q, tf.shape(scores)))
            # Accidental hits: column j holds row i's own movie although j != i.
            same = tf.equal(item[:, None], item[None, :])
            hit = tf.logical_and(same, tf.logical_not(tf.eye(tf.shape(item)[0], dtype=tf.bool)))
            return tf.where(hit, tf.constant(-np.inf, scores.dtype), scores)

    return TwoTower()


def dataset(pairs, negatives, batch_size, seed):
    import tensorflow as tf

    users = pairs[:, 0].astype(np.int32)
    items = pairs[:, 1].astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices({"user": users, "item": items})
    ds = ds.shuffle(len(pairs), seed=seed, reshuffle_each_iteration=True).batch(batch_size)
    if negatives == "full":
        return ds.map(lambda x: (x, x["item"])).prefetch(2)
    return ds.map(lambda x: (x, tf.eye(tf.shape(x["item"])[0]))).prefetch(2)


# --------------------------------------------------------------------------- evaluation


def embeddings(model):
    return (np.asarray(model.users.embeddings.numpy()), np.asarray(model.items.embeddings.numpy()))


def paper_metrics(model, heldout, exclude):
    from losszoo.datasets import movielens

    u, v = embeddings(model)
    return movielens.ranking_metrics(u @ v.T, heldout, exclude, ks=(100,))


def topk_hits(model, pairs):
    """Share of held-out (user, movie) pairs whose movie is in the user's top k (all movies)."""
    import keras_rs

    u, v = embeddings(model)
    retrieval = keras_rs.layers.BruteForceRetrieval(k=max(TOPK), return_scores=False)
    retrieval.update_candidates(v)
    top = np.asarray(retrieval(u[pairs[:, 0]]))
    hit = top == pairs[:, 1:2]
    return {f"top{k}": float(hit[:, :k].any(1).mean()) for k in TOPK}


def train_one(name, negatives, seed, split, masks, args, progress):
    import keras

    keras.utils.set_random_seed(seed)
    counts = np.bincount(split.train[:, 1], minlength=split.num_items)
    model = build_model(
        split.num_users,
        split.num_items,
        negatives,
        args,
        seed,
        item_probability=counts / counts.sum(),
    )
    model.compile(optimizer=keras.optimizers.Adam(args.lr), loss=make_loss(name, negatives, args))
    train = dataset(split.train, negatives, args.batch_size, seed)
    history, best, best_weights, wait, epoch_times = [], -np.inf, None, 0, []
    for epoch in range(args.epochs):
        start = time.perf_counter()
        fit = model.fit(train, epochs=1, verbose=0)
        epoch_times.append(time.perf_counter() - start)
        val = paper_metrics(model, masks["val"], masks["train"])
        val["loss"] = float(fit.history["loss"][-1])
        if not np.isfinite(val["loss"]):
            raise FloatingPointError(
                f"{name}/{negatives} seed {seed}: loss {val['loss']} at epoch {epoch + 1}"
            )
        history.append(val)
        if args.verbose:
            print(
                f"  [{name} {negatives} seed {seed}] epoch {epoch + 1:3d}  loss "
                f"{val['loss']:10.2f}  val AP@10 {val['AP@10']:.4f}  Acc {val['Accuracy']:.4f}"
                f"  R@100 {val['R@100']:.4f}  ({epoch_times[-1]:.1f}s)",
                flush=True,
            )
        else:
            progress.update(epoch + 1, [("val AP@10", val["AP@10"])])
        if val["AP@10"] > best:
            best, best_weights, wait = val["AP@10"], model.get_weights(), 0
        else:
            wait += 1
            if wait >= args.patience:
                break
    if not args.verbose:
        progress.update(args.epochs, finalize=True)
    model.set_weights(best_weights)
    return {
        "val": paper_metrics(model, masks["val"], masks["train"]),
        "test": paper_metrics(model, masks["test"], masks["train"] | masks["val"]),
        "val_topk": topk_hits(model, split.validation),
        "test_topk": topk_hits(model, split.test),
        "best_epoch": int(np.argmax([h["AP@10"] for h in history])) + 1,
        "epochs_run": len(history),
        "epoch_seconds": float(np.median(epoch_times[1:] if len(epoch_times) > 1 else epoch_times)),
        "history": history,
    }


# --------------------------------------------------------------------------- report


def summary(values, digits=4):
    """``x`` for one seed; ``mean ± std`` (sample std) for several. No ± from one seed."""
    values = np.asarray(values, float)
    if values.size == 1:
        return f"{values[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f}"


def tfrs_reference():
    """The TFRS example's committed test row per loss (full negatives), if present."""
    path = Path(__file__).resolve().parent / "results" / "movielens_retrieval.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return {name: runs for name, runs in data.items() if name in LOSSES}


def table(results, args, command, data_summary):
    seeds = args.seeds
    spread = "value of one seed" if seeds == 1 else f"mean ± std over {seeds} seeds"
    lines = [
        "# MovieLens 100K retrieval in pure Keras 3 (keras-rs): softmax vs sparsemax vs rankmax",
        "",
        f"Command: `{command}`",
        "",
        f"Data: MovieLens 100K ({data_summary}); every rating is an implicit positive; random "
        "80/10/10 split of the (user, movie) pairs per seed (seeds 0.."
        f"{seeds - 1}). Model: two-tower (user/movie id embeddings, dim {args.dim}), Keras 3 "
        f"`model.fit`, Adam lr {args.lr}, L2 {args.l2}, batch {args.batch_size}, SUM reduction "
        f"(as the TFRS example); in-batch negatives: accidental hits masked by -inf, "
        f"sampling-probability (logQ) correction {'on' if args.sampling_correction else 'off'}"
        f"; Rankmax k={args.k}, margin={args.margin}. Early stopping on "
        f"validation AP@10 (patience {args.patience}, at most {args.epochs} epochs). Cells: "
        f"{spread}.",
        "",
        "Paper metrics rank all movies per user with the user's training movies removed "
        "(test: training and validation movies removed), averaged over users with a held-out "
        "movie. top-k: share of held-out pairs whose movie is in the top k of all movies "
        "(keras_rs.layers.BruteForceRetrieval, nothing removed; TFRS' FactorizedTopK).",
        "",
        "| negatives | loss | split | AP@10 | Accuracy | R@100 | "
        + " | ".join(f"top-{k}" for k in TOPK)
        + " | best epoch | s/epoch |",
        "|---|---|---|---|---|---|" + "---|" * len(TOPK) + "---|---|",
    ]
    for (negatives, name), runs in results.items():
        for part in ("val", "test"):
            row = [negatives, name, "validation" if part == "val" else "test"]
            row += [summary([r[part][key] for r in runs]) for key in ("AP@10", "Accuracy", "R@100")]
            row += [summary([r[f"{part}_topk"][f"top{k}"] for r in runs]) for k in TOPK]
            row.append(summary([r["best_epoch"] for r in runs], 1))
            row.append(summary([r["epoch_seconds"] for r in runs], 2))
            lines.append("| " + " | ".join(row) + " |")
    reference = tfrs_reference()
    if reference:
        lines += [
            "",
            "## Beside the TFRS example (examples/results/movielens_retrieval.md)",
            "",
            "Test split, same data split seeds, hyper-parameters and full negatives; TFRS "
            "(tf_keras) there, pure Keras 3 here. Cells: mean ± std over the seeds each ran.",
            "",
            "| loss | TFRS AP@10 | Keras 3 AP@10 | TFRS Accuracy | Keras 3 Accuracy | "
            "TFRS R@100 | Keras 3 R@100 | TFRS top-100 | Keras 3 top-100 |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name in LOSSES:
            ours = results.get(("full", name))
            theirs = reference.get(name)
            if not ours or not theirs:
                continue
            row = [name]
            for key in ("AP@10", "Accuracy", "R@100"):
                row += [
                    summary([r["test"][key] for r in theirs]),
                    summary([r["test"][key] for r in ours]),
                ]
            row += [
                summary([r["test_topk"]["top100"] for r in theirs]),
                summary([r["test_topk"]["top100"] for r in ours]),
            ]
            lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Paper (Table 2, ml-latest-small, its own tuning): Rankmax 0.154 AP@10 / 0.342 "
        "accuracy / 0.387 R@100; softmax 0.147 / 0.300 / 0.401; sparsemax 0.147 / 0.286 / "
        "0.384.",
        "",
    ]
    return "\n".join(lines)


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = sorted({negatives for negatives, _ in results}, key=NEGATIVES.index)
    fig, axes = plt.subplots(len(settings), 2, figsize=(11, 3.8 * len(settings)), squeeze=False)
    for row, negatives in enumerate(settings):
        for col, key in enumerate(("AP@10", "R@100")):
            ax = axes[row, col]
            for (neg, name), runs in results.items():
                if neg != negatives:
                    continue
                for i, run in enumerate(runs):
                    values = [h[key] for h in run["history"]]
                    ax.plot(
                        range(1, len(values) + 1),
                        values,
                        marker="o",
                        markersize=3,
                        color=f"C{LOSSES.index(name)}",
                        alpha=0.9 if i == 0 else 0.45,
                        label=name if i == 0 else None,
                    )
            ax.set_title(f"{negatives} negatives: validation {key}")
            ax.set_xlabel("epoch")
            ax.set_ylabel(f"validation {key}")
            ax.grid(alpha=0.3)
            ax.legend()
    fig.suptitle("MovieLens 100K two-tower retrieval, pure Keras 3 (one line per seed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    import keras

    from losszoo.datasets import movielens

    command = "PYTHONPATH=. python examples/keras3_retrieval.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    data = movielens.load_100k(args.data_dir)
    _, _, nu, ni = data.indexed()
    data_summary = f"{nu} users, {ni} movies, {data.num_ratings} ratings"
    names = LOSSES if args.loss == "all" else (args.loss,)
    settings = [n for n in NEGATIVES if n in args.negatives]
    results = {(negatives, name): [] for negatives in settings for name in names}
    for seed in range(args.seeds):
        split = movielens.split_pairs(data, seed=seed)
        masks = {
            part: movielens.pairs_to_mask(getattr(split, attr), nu, ni)
            for part, attr in (("train", "train"), ("val", "validation"), ("test", "test"))
        }
        for negatives, name in results:
            print(f"{name}, {negatives} negatives, seed {seed}", flush=True)
            progress = None if args.verbose else keras.utils.Progbar(args.epochs, unit_name="epoch")
            results[(negatives, name)].append(
                train_one(name, negatives, seed, split, masks, args, progress)
            )
    text = table(results, args, command, data_summary)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / f"{TAG}.md", out / f"{TAG}.json", out / f"{TAG}.png"]
    written[0].write_text(text)
    written[1].write_text(
        json.dumps(
            {
                "command": command,
                "args": {k: v for k, v in vars(args).items()},
                "runs": {f"{neg}/{name}": runs for (neg, name), runs in results.items()},
            },
            indent=1,
        )
    )
    plot(results, written[2])
    print()
    print(text)
    for path in written:
        print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
