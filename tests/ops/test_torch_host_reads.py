"""PyTorch: every op's fwd+bwd makes at most 4 host reads and copies at most 1 MiB to the host
(issue 33 item 3), validation on, counted at a small shape with the counter of
``benchmarks/torch_host_syncs.py`` (which patches ``torch.Tensor.item`` / ``__bool__`` /
``cpu`` / ...). On a GPU each read is a sync with the device.
"""

import importlib.util
import pathlib

import keras
import numpy as np
import pytest

import losszoo

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "torch", reason="host reads of PyTorch's eager loops and checks"
)

N, K = 8, 64
MAX_READS = 4
MAX_BYTES = 2**20


def _counter():
    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "torch_host_syncs.py"
    spec = importlib.util.spec_from_file_location("torch_host_syncs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _extra_cases(z):
    """Cases beyond the benchmark's: BCSoftmax's other solver paths and bound kinds."""
    import torch

    pi = torch.rand(N, K, generator=torch.Generator().manual_seed(0))
    pi = pi / pi.max(-1, keepdim=True).values
    return {
        "bcsoftmax (upper only, T = 0.05)": lambda z: losszoo.ops.bcsoftmax(
            z, upper=0.1, temperature=0.05
        ),
        "bcsoftmax (lower only, T = 1)": lambda z: losszoo.ops.bcsoftmax(z, lower=0.5 / K),
        "bcsoftmax (T = 10)": lambda z: losszoo.ops.bcsoftmax(
            z, lower=0.2 / K, upper=0.1, temperature=10.0
        ),
        "bcsoftmax (scale 0.01, T = 1)": lambda z: losszoo.ops.bcsoftmax(
            0.01 * z, lower=0.2 / K, upper=0.1
        ),
        "antipignistic_kl_loss": lambda z: losszoo.ops.antipignistic_kl_loss(pi, z),
        "vote_kl_loss": lambda z: losszoo.ops.vote_kl_loss(pi, z),
    }


def test_every_op_reads_the_host_at_most_four_times_per_call():
    counter = _counter()
    z, _, _ = counter._problems(N, K)
    cases = {**counter.cases(N, K), **_extra_cases(z)}
    counts = {}
    for name, fn in cases.items():
        reads, nbytes, _ = counter.count(fn, z)
        counts[name] = (reads, nbytes)
    over = {name: c for name, c in counts.items() if c[0] > MAX_READS or c[1] > MAX_BYTES}
    assert not over, f"(host reads, bytes) over {MAX_READS} / {MAX_BYTES}: {over}"
    assert any(reads > 0 for reads, _ in counts.values())  # the counter counts


def test_bcsoftmax_with_bad_input_still_names_the_argument():
    z = np.zeros((2, K), np.float32)
    z[1, 3] = np.nan
    with pytest.raises(ValueError, match=r"`logits` must not hold NaN .*rows \[1\]"):
        losszoo.ops.bcsoftmax(keras.ops.convert_to_tensor(z), lower=0.2 / K, upper=0.1)
    with pytest.raises(ValueError, match=r"`upper` must hold feasible probability bounds"):
        losszoo.ops.bcsoftmax(keras.ops.convert_to_tensor(np.zeros((2, K), np.float32)), upper=0.01)
