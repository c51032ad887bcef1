"""Global-batch DRO risks under ``keras.distribution.DataParallel`` on 2 JAX devices equal one
device: the ops (values and gradients of a sharded batch) and a short ``fit`` of the DRO
losses (weights and the safe-KL loss's alpha). JAX only; the 2 host devices need
``XLA_FLAGS`` before JAX starts, so the check runs in a fresh process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.harness import BACKEND

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import json
import jax
import keras
import numpy as np
import losszoo
from losszoo import ops

assert len(jax.devices()) == 2, jax.devices()
r = np.random.default_rng(0)
l = r.gamma(2.0, size=8).astype("float32")
s = r.uniform(0.5, 2.0, size=8).astype("float32")
risks = {
    "safe_kl": lambda l, s: ops.safe_kl_dro_risk(l, 1.2, 0.7, 0.2, s),
    "batch_lse": lambda l, s: ops.kl_dro_batch_lse_global(l, 0.7, s),
    "sumexp": lambda l, s: ops.kl_dro_sumexp_global(l, 0.7, s),
    "cvar": lambda l, s: ops.cvar_risk_global(l, 0.3, s),
    "solve_alpha": lambda l, s: ops.safe_kl_dro_solve_alpha(l, 0.7, 0.2, s),
}
dist = keras.distribution.DataParallel(devices=jax.devices())
layout = dist.get_data_layout(l.shape)
ls, ss = (keras.distribution.distribute_tensor(a, layout) for a in (l, s))
assert len(ls.sharding.device_set) == 2
out = {}
for name, fn in risks.items():
    one = [np.asarray(v).tolist() for v in jax.jit(jax.value_and_grad(fn))(l, s)]
    two = [np.asarray(v).tolist() for v in jax.jit(jax.value_and_grad(fn))(ls, ss)]
    out[name] = (one, two)


def fit(name, distributed):
    keras.distribution.set_distribution(dist if distributed else None)
    keras.utils.set_random_seed(0)
    x = r.normal(size=(16, 4)).astype("float32")
    y = r.integers(0, 3, size=16)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=name)
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    found = losszoo.losses.dro.find_dro_losses(model)
    alpha = float(found[0].alpha) if found else None
    return [w.tolist() for w in model.get_weights()], alpha


for name in ("safe_kl_dro", "cvar", "kl_dro_batch_lse"):
    r = np.random.default_rng(1)
    single = fit(name, False)
    r = np.random.default_rng(1)
    out["fit_" + name] = (single, fit(name, True))
print("RESULT" + json.dumps(out))
"""


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution.DataParallel runs on JAX only")
def test_global_batch_risks_on_two_devices_equal_one_device():
    env = {
        **os.environ,
        "KERAS_BACKEND": "jax",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(ROOT),
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    run = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT"))
    results = json.loads(line[len("RESULT") :])
    for name, (one, two) in results.items():
        if name.startswith("fit_"):
            (w1, alpha1), (w2, alpha2) = one, two
            for a, b in zip(w1, w2):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)
            assert (alpha1 is None) == (alpha2 is None)
            if alpha1 is not None:
                assert alpha1 != 0.0
                np.testing.assert_allclose(alpha2, alpha1, rtol=1e-5, err_msg=name)
        else:
            (v1, g1), (v2, g2) = one, two
            np.testing.assert_allclose(v2, v1, rtol=1e-6, err_msg=name)
            np.testing.assert_allclose(g2, g1, rtol=1e-6, atol=1e-8, err_msg=name)
    assert len(results) == 8
