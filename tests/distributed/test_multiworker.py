"""MultiWorkerMirroredStrategy, 2 worker processes on 127.0.0.1, custom training loop.

Keras 3.15's ``fit`` fails under MultiWorkerMirroredStrategy (upstream); the documented
recipe is ``strategy.run`` + ``model.compute_loss`` (see ``_mwms_worker.py``). Both workers
must end with the single-device weights, per-step losses and DRO state for every registered
loss tried. Ports are picked free at run time; the whole test is bounded by a timeout.

To bound CI time (each loss costs a graph trace in each of three processes) it covers one
loss per family: sparsemax, rankmax, a possibilistic KL baseline (vote_kl) and the DRO
losses; every registered loss runs under MirroredStrategy in test_mirrored.py.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import losszoo

pytestmark = pytest.mark.tensorflow_only(reason="tf.distribute.MultiWorkerMirroredStrategy")

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300
LOSSES = ("sparsemax", "rankmax", "vote_kl", "safe_kl_dro", "kl_dro_sumexp", "cvar")


def _free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _launch(args, out):
    args = [*args, "--losses", ",".join(LOSSES)]
    env = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    env.pop("TF_CONFIG", None)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.distributed._mwms_worker", *args, "--out", str(out)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait(procs):
    logs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=TIMEOUT_S)
            logs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, f"worker failed (rc {p.returncode}):\n{log[-3000:]}"


def _runs(tmp):
    ports = ",".join(map(str, _free_ports(2)))
    outs = [tmp / f"worker{i}.json" for i in range(2)] + [tmp / "single.json"]
    procs = [_launch(["--index", str(i), "--ports", ports], outs[i]) for i in range(2)]
    procs.append(_launch([], outs[2]))  # the single-device reference, same code path
    _wait(procs)
    return [json.loads(p.read_text()) for p in outs]


@pytest.mark.slow
def test_two_workers_match_single_device(tmp_path):
    """Every loss of ``LOSSES``, from one run of the three processes. One test, not one per
    loss around a module fixture: pytest-xdist (``-n 2``) ran that fixture, the three
    processes, once in each of its workers."""
    runs = _runs(tmp_path)
    for name in LOSSES:
        _check(runs, name)


def _check(runs, name):
    assert name in losszoo.names("loss"), name
    worker0, worker1, single = (r[name] for r in runs)
    for worker in (worker0, worker1):
        np.testing.assert_allclose(
            worker["losses"],
            single["losses"],
            rtol=1e-5,
            atol=1e-7,
            err_msg=f"{name}: per-step loss differs from one device",
        )
        for a, b in zip(worker["weights"], single["weights"]):
            np.testing.assert_allclose(
                a, b, rtol=1e-5, atol=1e-6, err_msg=f"{name}: weights differ from one device"
            )
        assert worker["state"] == pytest.approx(single["state"], rel=1e-5, abs=1e-7), name
    first = np.concatenate([np.ravel(w) for w in single["weights"]])
    assert np.all(np.isfinite(first)) and single["losses"][0] != single["losses"][-1], name
