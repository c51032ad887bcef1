"""Issue 21 acceptance: the README's Keras code blocks run on JAX and PyTorch too.

The same Sybil parse as ``tests/test_readme.py`` (which runs every block on TensorFlow), run
top to bottom in one namespace on the current backend, leaving out the blocks that need
TensorFlow itself (they import ``tensorflow``: the TFRS recipe and the ``tf.function`` demo of
the fail-loud contract). On JAX the run has 64-bit mode on, as the README says the
possibilistic projection needs.
"""

from pathlib import Path

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser

from tests.harness import BACKEND, float64

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.skipif(BACKEND == "tensorflow", reason="tests/test_readme.py runs them all on TF")
def test_readme_keras_blocks_run_on_this_backend():
    import losszoo
    from losszoo.registry import _core

    examples = list(Sybil(parsers=[PythonCodeBlockParser()]).parse(README))
    run = [e for e in examples if "import tensorflow" not in e.region.parsed]
    assert 0 < len(examples) - len(run) <= 2, "only the TFRS and tf.function blocks are left out"
    before = {(e.kind, e.name) for e in losszoo.entries()}
    try:
        with float64():
            for example in run:
                try:
                    example.evaluate()
                except Exception as err:
                    raise AssertionError(
                        f"README.md block at line {example.line} failed on {BACKEND}: "
                        f"{type(err).__name__}: {err}"
                    ) from err
    finally:
        for key in {(e.kind, e.name) for e in losszoo.entries()} - before:
            _core._unregister(key)
