"""The contract tests' session setup: on JAX they run with 64-bit mode on.

Their references are float64 oracles fed float64 inputs (offsets of 1e8, tolerances of 1e-7);
JAX without ``jax_enable_x64`` would compute those inputs in float32. Float32 inputs stay
float32 either way. Elsewhere the fixture does nothing.
"""

import pytest

from losszoo._backend import enable_float64


@pytest.fixture(autouse=True)
def _float64_on_jax():
    with enable_float64():
        yield
