"""One worker of the MultiWorkerMirroredStrategy test (run as a subprocess), or the reference.

``python -m tests.distributed._mwms_worker --index I --ports P0,P1 --out FILE`` joins a
2-worker cluster on 127.0.0.1 (``TF_CONFIG`` built here), trains every registered loss with a
custom training loop (``strategy.run`` + ``model.compute_loss``, Keras 3's ``fit`` fails
under MultiWorkerMirroredStrategy in 3.15) and writes per-step losses, final weights and DRO
state as JSON. Without ``--ports`` it runs the same loop on one device (the reference).
Each worker feeds its half of the same global batch.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

STEPS = 3
LEARNING_RATE = 0.1


def train_all(strategy, index: int, workers: int, names) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    import losszoo
    from tests import distributed as dist

    results = {}
    for name in names or losszoo.names("loss"):
        x, y = dist.data(name)
        per_worker = len(x) // workers
        xs, ys = (
            x[index * per_worker : (index + 1) * per_worker],
            y[index * per_worker : (index + 1) * per_worker],
        )
        with strategy.scope():
            model = dist.build_model()
            loss = dist.make_loss(name)
            model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE), loss=loss)
            model.optimizer.build(model.trainable_variables)

        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                pred = model(xb, training=True)
                value = model.compute_loss(x=xb, y=yb, y_pred=pred, training=True)
            grads = tape.gradient(value, model.trainable_variables)
            model.optimizer.apply(grads, model.trainable_variables)
            return value

        @tf.function
        def step(xb, yb):
            per_replica = strategy.run(replica_step, args=(xb, yb))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        def dataset_fn(context):
            return tf.data.Dataset.from_tensors((xs, ys)).repeat()

        batches = iter(strategy.distribute_datasets_from_function(dataset_fn))
        losses = [float(step(*next(batches))) for _ in range(STEPS)]
        results[name] = {
            "losses": losses,
            "weights": [np.asarray(w).tolist() for w in model.get_weights()],
            "state": dist.dro_state(loss),
        }
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--index", type=int, default=0, help="this worker's task index")
    p.add_argument("--ports", default=None, help="comma-separated ports of the 2 workers")
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--losses", default="", help="comma-separated loss names (default: all)")
    args = p.parse_args()
    if args.ports:
        ports = args.ports.split(",")
        os.environ["TF_CONFIG"] = json.dumps(
            {
                "cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
                "task": {"type": "worker", "index": args.index},
            }
        )
    import tensorflow as tf

    if args.ports:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        workers = len(ports)
    else:
        strategy = tf.distribute.get_strategy()
        workers = 1
    names = [n for n in args.losses.split(",") if n]
    results = train_all(strategy, args.index, workers, names)
    with open(args.out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
