"""TFRS' basic-retrieval tutorial on Keras 3 and losszoo: the port changes only the import.

The model code below (``build_model``) is written as TFRS' tutorial writes it: a user tower
and a movie tower, ``tfrs.tasks.Retrieval`` whose ``tfrs.metrics.FactorizedTopK`` ranks each
held-out movie among all movies, and a ``tfrs.Model`` subclass with ``compute_loss(features,
training)``; with the pieces TFRS users add to it: their own
``CategoricalCrossentropy(from_logits=True)``, ``batch_metrics`` and
``compute_metrics`` / ``compute_batch_metrics``. Ported, ``import tensorflow_recommenders as
tfrs`` became ``from losszoo.retrieval import tfrs``; nothing else changed.

Backends: on TensorFlow the movie candidates are the tutorial's ``tf.data`` dataset of
embedding batches (``movies.batch(128).map(movie_model)``); on JAX (and PyTorch), where
``tf.data`` cannot run a JAX layer, they are a callable returning the list of embedding
batches, computed at every metric update (``candidates`` below). Towers look up integer ids
(the tutorial's ``StringLookup`` of titles is TensorFlow-only and is data plumbing).

Recipe as in the tutorial: embedding 32, Adagrad 0.1, batch 8192, 3 epochs, 80/20 random
split of the ratings (seed 42), top-k over all movies on the test part. Data: a small
synthetic set by default (users prefer a block of movies); ``--movielens``: MovieLens 100K
through ``losszoo.datasets``.

Usage:
  python examples/tfrs_tutorial_port.py                    # synthetic, a few seconds
  python examples/tfrs_tutorial_port.py --movielens        # the tutorial's data
  KERAS_BACKEND=jax python examples/tfrs_tutorial_port.py
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

SCRIPT = "tfrs_tutorial_port"


def parse_args(argv=None):
    p = _common.make_parser(SCRIPT, __doc__)
    p.add_argument("--movielens", action="store_true", help="MovieLens 100K, not synthetic")
    p.add_argument("--data-dir", default=None, help="MovieLens folder (default: the cache)")
    p.add_argument("--users", type=int, default=200, help="synthetic: users")
    p.add_argument("--movies", type=int, default=300, help="synthetic: movies")
    p.add_argument("--ratings", type=int, default=8000, help="synthetic: ratings")
    p.add_argument("--dim", type=int, default=32, help="embedding dimension")
    p.add_argument("--lr", type=float, default=0.1, help="Adagrad learning rate")
    p.add_argument("--batch-size", type=int, default=8192, help="training batch size")
    p.add_argument("--epochs", type=int, default=3, help="training epochs")
    return p.parse_args(argv)


def load_ratings(args):
    """``(user ids, movie ids, number of users, number of movies)``, 0-based."""
    if args.movielens:
        from losszoo.datasets import movielens

        return movielens.load_100k(args.data_dir).indexed()
    rng = np.random.default_rng(0)
    users = rng.integers(0, args.users, args.ratings)
    block = max(args.movies // 20, 1)  # each user rates from a block of movies
    movies = (users * block + rng.integers(0, block, args.ratings)) % args.movies
    return users, movies, args.users, args.movies


def candidates(movie_ids, movie_model):
    """The catalogue as the tutorial gives it (TensorFlow), or as a callable of batches."""
    import keras

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        movies = tf.data.Dataset.from_tensor_slices(movie_ids)
        return movies.batch(128).map(movie_model)
    batches = [movie_ids[i : i + 128] for i in range(0, len(movie_ids), 128)]
    return lambda: [movie_model(batch) for batch in batches]


def build_model(num_users, movie_ids, args):
    import keras

    from losszoo.retrieval import tfrs  # was: import tensorflow_recommenders as tfrs

    # ---- from here on, TFRS code as its users write it -------------------------------------
    embedding_dimension = args.dim
    user_model = keras.Sequential([keras.layers.Embedding(num_users, embedding_dimension)])
    movie_model = keras.Sequential([keras.layers.Embedding(len(movie_ids), embedding_dimension)])

    metrics = tfrs.metrics.FactorizedTopK(candidates=candidates(movie_ids, movie_model))
    task = tfrs.tasks.Retrieval(
        loss=keras.losses.CategoricalCrossentropy(from_logits=True, reduction="sum"),
        metrics=metrics,
        batch_metrics=[keras.metrics.TopKCategoricalAccuracy(k=10, name="batch_top_10")],
    )

    class MovielensModel(tfrs.Model):
        def __init__(self, user_model, movie_model):
            super().__init__()
            self.movie_model = movie_model
            self.user_model = user_model
            self.task = task

        def compute_loss(self, features, training=False):
            user_embeddings = self.user_model(features["user_id"])
            positive_movie_embeddings = self.movie_model(features["movie_id"])
            return self.task(
                user_embeddings,
                positive_movie_embeddings,
                compute_metrics=not training,
                compute_batch_metrics=not training,
            )

    model = MovielensModel(user_model, movie_model)
    model.compile(optimizer=keras.optimizers.Adagrad(learning_rate=args.lr))
    return model


def main(argv=None):
    args = parse_args(argv)
    import keras

    users, movies, num_users, num_movies = load_ratings(args)
    keras.utils.set_random_seed(42)
    order = np.random.default_rng(42).permutation(len(users))
    cut = int(0.8 * len(users))
    features = {"user_id": users.astype("int32"), "movie_id": movies.astype("int32")}
    train = {k: v[order[:cut]] for k, v in features.items()}
    test = {k: v[order[cut:]] for k, v in features.items()}

    model = build_model(num_users, np.arange(num_movies, dtype="int32"), args)
    history = model.fit(train, batch_size=args.batch_size, epochs=args.epochs, verbose=0)
    results = model.evaluate(test, batch_size=4096, verbose=0, return_dict=True)
    results = {k: float(v) for k, v in results.items()}
    results["train_loss"] = [float(x) for x in history.history["loss"]]

    data = "MovieLens 100K" if args.movielens else "synthetic"
    lines = [
        f"# TFRS' basic-retrieval tutorial, ported ({data}, {keras.backend.backend()})",
        "",
        f"Command: `{_common.command_line(SCRIPT, argv)}`",
        "",
        "| metric | test |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v:.4f} |" for k, v in results.items() if k != "train_loss"]
    out = _common.output_dir(args.out, SCRIPT)
    (out / f"{SCRIPT}.md").write_text("\n".join(lines) + "\n")
    (out / f"{SCRIPT}.json").write_text(json.dumps({"args": vars(args), **results}, indent=1))
    print("\n".join(lines))
    for suffix in (".md", ".json"):
        _common.wrote(out / f"{SCRIPT}{suffix}")
    return results


if __name__ == "__main__":
    main()
