"""The Python blocks of the README and of docs/ run on the backend under test (issue 31 item 10).

``tests/test_readme.py`` runs every README block (the TensorFlow-only ones included) on
TensorFlow, top to bottom in one namespace. Here each Markdown page under ``docs/`` is run the
same way on whichever backend the suite runs on (``KERAS_BACKEND``), so a block that works only
on TensorFlow must say so: it imports ``tensorflow`` (or TFRS / tf_keras), and those blocks are
the only ones left out on JAX and PyTorch.
"""

from pathlib import Path

import keras
import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "```python" in p.read_text())
TENSORFLOW_ONLY = ("import tensorflow", "import tf_keras", "from tensorflow")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_docs_python_blocks_run_on_this_backend(page):
    examples = list(Sybil(parsers=[PythonCodeBlockParser()]).parse(page))
    assert examples, f"{page} has a python fence but Sybil parsed no block"
    backend = keras.backend.backend()
    for example in examples:
        if backend != "tensorflow" and any(t in example.region.parsed for t in TENSORFLOW_ONLY):
            continue
        try:
            example.evaluate()
        except Exception as err:
            raise AssertionError(
                f"{page.name} block at line {example.line} failed on {backend}: "
                f"{type(err).__name__}: {err}"
            ) from err
