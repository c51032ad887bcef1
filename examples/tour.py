"""A tour of losszoo: one small digits classifier trained with each method.

    python examples/tour.py                  # about 1.5 minutes on a 2-core CPU
    python examples/tour.py --only sparsemax --epochs 5
    python examples/tour.py --smoke          # every method, 1 epoch: a quick check (CI)
    python examples/tour.py --out examples/results   # rewrite examples/results/tour.md

scikit-learn's bundled 8x8 digits (1797 images, no download) are split 60/20/20; every
entry trains the same MLP (64 -> 64 -> 10 logits) with its loss, turns the test logits into
probabilities with its head, and the script prints one table: accuracy, negative
log-likelihood (where every true-class probability is positive; sparse heads can give
exact zeros), top-label ECE (15 bins), the share of exactly-zero probabilities, and
training time (including the calibrator's fit on the validation split, for the calibrated
rows). One progress bar per method, then the table; the table is also written to
``tour.md`` (``tour_smoke.md`` with ``--smoke``) in the output folder. Results of the default
run: examples/results/tour.md.

Add a method by appending a ``TourEntry`` to ``TOUR``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

SMOKE_TRAIN, SMOKE_VAL = 1024, 320  # --smoke: the first training and validation digits


def build_parser():
    """The options (argparse only: defined before Keras is imported)."""
    parser = _common.make_parser("tour", __doc__)
    parser.add_argument("--epochs", type=int, default=30, help="training epochs per method")
    parser.add_argument(
        "--calib-epochs",
        type=int,
        default=500,
        help="epochs of each calibrator's fit on the validation split (the paper's protocol)",
    )
    parser.add_argument("--seed", type=int, default=0, help="data split and initialisation seed")
    parser.add_argument(
        "--only", action="append", help="run only entries whose name contains this (repeatable)"
    )
    parser.add_argument(
        "--verbose",
        type=int,
        default=0,
        choices=(0, 1, 2),
        help="0: one progress bar per method; 1, 2: Keras' fit log",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="every method at its smallest settings: 1 epoch, 2 calibrator epochs, the first "
        f"{SMOKE_TRAIN} training and {SMOKE_VAL} validation digits; writes tour_smoke.md",
    )
    return parser


if __name__ == "__main__":  # --help and bad options answer here, before Keras starts
    build_parser().parse_args()


import keras  # noqa: E402
import numpy as np  # noqa: E402

import losszoo  # noqa: E402

SCRIPT = "tour"


@dataclasses.dataclass
class Digits:
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_digits(seed: int) -> Digits:
    """Digits scaled to [0, 1], split 60/20/20 with a fixed seed."""
    from sklearn.datasets import load_digits as sk_digits

    x, y = sk_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    a, b = int(0.6 * len(x)), int(0.8 * len(x))
    return Digits(x[:a], y[:a], x[a:b], y[a:b], x[b:], y[b:])


# Whole batches of 64 in --smoke: each method's step is compiled for one batch shape only.


def smoke_subset(data: Digits) -> Digits:
    """The first ``SMOKE_TRAIN`` training and ``SMOKE_VAL`` validation digits (test unchanged)."""
    return dataclasses.replace(
        data,
        x_train=data.x_train[:SMOKE_TRAIN],
        y_train=data.y_train[:SMOKE_TRAIN],
        x_val=data.x_val[:SMOKE_VAL],
        y_val=data.y_val[:SMOKE_VAL],
    )


def class_ids(data: Digits, split: str) -> np.ndarray:
    return getattr(data, f"y_{split}")


@dataclasses.dataclass
class TourEntry:
    """One row of the tour.

    Attributes:
      name: row label.
      loss: factory of what ``model.compile(loss=...)`` receives (a registered name works).
      head: factory of the layer mapping logits to probabilities at test time.
      targets: ``targets(data, split) -> labels`` given to ``fit`` (default: class ids).
      calibrate: a ``losszoo.calibration.fit_calibrator`` method (e.g. ``"pb-c"``); when set,
        the calibrator is fitted on the validation logits and replaces ``head``.
    """

    name: str
    loss: Callable[[], Any]
    head: Callable[[], keras.layers.Layer]
    targets: Callable[[Digits, str], np.ndarray] = class_ids
    calibrate: str | None = None


TOUR: list[TourEntry] = [
    TourEntry(
        name="softmax cross-entropy",
        loss=lambda: keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        head=lambda: keras.layers.Softmax(),
    ),
    TourEntry(
        name="sparsemax",
        loss=lambda: "sparsemax",
        head=lambda: losszoo.heads.Sparsemax(),
    ),
    TourEntry(
        name="safe-KL DRO risk (CE, lam=1, rho=0.1)",
        loss=lambda: losszoo.losses.SafeKLDRORisk(
            keras.losses.SparseCategoricalCrossentropy(from_logits=True), lam=1.0, rho=0.1
        ),
        head=lambda: keras.layers.Softmax(),
    ),
    TourEntry(
        name="bcsoftmax head (CE-trained, bounds [0.002, 0.95])",
        loss=lambda: keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        head=lambda: losszoo.heads.BCSoftmax(lower=0.002, upper=0.95),
    ),
    TourEntry(
        name="softmax CE + temperature scaling (fit on validation)",
        loss=lambda: keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        head=lambda: keras.layers.Softmax(),
        calibrate="ts",
    ),
    TourEntry(
        name="softmax CE + probability bounding PB-C (fit on validation)",
        loss=lambda: keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        head=lambda: keras.layers.Softmax(),
        calibrate="pb-c",
    ),
    TourEntry(  # Rankmax ranks by raw scores; softmax only turns them into probabilities here
        name="rankmax (k=1, margin=1; softmax head for probabilities)",
        loss=lambda: "rankmax",
        head=lambda: keras.layers.Softmax(),
    ),
    TourEntry(  # labels: possibility from the distance of x to each class's training mean
        name="possibilistic projection (staircase possibility labels)",
        loss=lambda: "possibilistic_projection",
        head=lambda: keras.layers.Softmax(),
        targets=lambda data, split: possibility_targets(data, split),
    ),
]


def possibility_targets(data: Digits, split: str, alpha: float = 0.6) -> np.ndarray:
    """Possibility labels as in the paper's synthetic study: pi_y = 1, the other classes
    ranked by the distance of x to their training prototype (class mean),
    pi = 1e-6 + max(0, alpha - 0.05 (rank - 1))."""
    x, y = getattr(data, f"x_{split}"), getattr(data, f"y_{split}")
    protos = np.stack([data.x_train[data.y_train == c].mean(0) for c in range(10)])
    dist = ((x[:, None, :] - protos[None]) ** 2).sum(-1)
    dist[np.arange(len(y)), y] = -1.0  # the true class ranks first
    rank = np.argsort(np.argsort(dist, axis=1, kind="stable"), axis=1)
    pi = 1e-6 + np.maximum(0.0, alpha - 0.05 * (rank - 1))
    pi[np.arange(len(y)), y] = 1.0
    return pi.astype(np.float32)


def build_model(num_features: int, num_classes: int) -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((num_features,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(num_classes),
        ]
    )


def evaluate(probs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    p_true = probs[np.arange(len(labels)), labels]
    return {
        "accuracy": float(np.mean(probs.argmax(1) == labels)),
        "nll": float(-np.mean(np.log(p_true))) if np.all(p_true > 0) else float("nan"),
        "ece": losszoo.calibration.ece(probs, labels),
        "zero_share": float(np.mean(probs == 0)),
    }


def run_entry(
    entry: TourEntry, data: Digits, epochs: int, calib_epochs: int, seed: int, verbose: int
) -> dict:
    progress = _common.RunProgress(
        entry.name, epochs, enabled=verbose == 0, metrics=("loss", "val_loss")
    )
    keras.utils.set_random_seed(seed)
    model = build_model(data.x_train.shape[1], 10)
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=entry.loss())
    start = time.perf_counter()
    model.fit(
        data.x_train,
        entry.targets(data, "train"),
        validation_data=(data.x_val, entry.targets(data, "val")),
        epochs=epochs,
        batch_size=64,
        verbose=verbose,
        callbacks=[progress.callback()],
    )
    test_logits = model.predict(data.x_test, verbose=0)
    if entry.calibrate:
        val_logits = model.predict(data.x_val, verbose=0)
        head = losszoo.calibration.fit_calibrator(
            val_logits, None, data.y_val, entry.calibrate, epochs=calib_epochs
        )
    else:
        head = entry.head()
    seconds = time.perf_counter() - start
    probs = np.asarray(head(test_logits))
    return {"method": entry.name, **evaluate(probs, data.y_test), "train_s": seconds}


def format_rows(results: list[dict]) -> str:
    header = (
        "| method | test accuracy | test NLL | test ECE | zero probabilities | train time (s) |"
    )
    lines = [header, "|---|---|---|---|---|---|"]
    for r in results:
        nll = "n/a (p_true = 0 somewhere)" if np.isnan(r["nll"]) else f"{r['nll']:.3f}"
        lines.append(
            f"| {r['method']} | {r['accuracy']:.3f} | {nll} | {r['ece']:.3f} | "
            f"{100 * r['zero_share']:.1f}% | "
            f"{r['train_s']:.1f} |"
        )
    return "\n".join(lines)


NOTE = """Rankmax and the possibilistic loss are trained for ranking / graded labels; the softmax
over their scores is only a way to read probabilities here, so their NLL and ECE are not the
point."""


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.smoke:
        args.epochs, args.calib_epochs = 1, 2

    data = load_digits(args.seed)
    if args.smoke:
        data = smoke_subset(data)
    entries = [e for e in TOUR if not args.only or any(o in e.name for o in args.only)]
    if not entries:
        parser.error(f"--only matched nothing; entries: {[e.name for e in TOUR]}")
    out = _common.output_dir(args.out, SCRIPT)
    start = time.perf_counter()
    results = [
        run_entry(entry, data, args.epochs, args.calib_epochs, args.seed, args.verbose)
        for entry in entries
    ]
    seconds = time.perf_counter() - start
    summary = (
        f"Digits: {len(data.x_train)} train / {len(data.x_val)} val / "
        f"{len(data.x_test)} test, {args.epochs} epochs, seed {args.seed}. " + _common.seeds_note(1)
    )
    table = format_rows(results)
    print(f"\n{summary}\n\n{table}\n")
    text = (
        f"# Tour of losszoo on digits\n\nCommand: `{_common.command_line(SCRIPT, argv)}` "
        f"(2-core CPU, {seconds:.0f} s)\n\n{summary}\n\n{table}\n\n{NOTE}\n"
    )
    _common.wrote(out / f"{SCRIPT}{'_smoke' if args.smoke else ''}.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
