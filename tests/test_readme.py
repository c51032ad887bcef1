"""Every code block of README.md, run with Sybil (top to bottom, one shared namespace).

- ``python`` blocks are executed as written (small random inputs are defined in the README
  itself). The TensorFlow Recommenders block needs ``TF_USE_LEGACY_KERAS=1`` before TensorFlow
  is imported, which tests/conftest.py sets.
- ``bash`` blocks are the two set-up commands: the test command must be what ``.ci/run`` runs,
  and every extra and script they name must exist (the tour itself runs in test_examples.py).
- ``toml`` blocks must parse and use the entry-point group the registry reads.
- The registry table between the ``registry-table`` markers must be what ``losszoo list``
  prints today.
"""

import re
import shlex
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser

import losszoo
from losszoo.__main__ import main as cli_main
from losszoo.registry import _core
from tests.harness import BACKEND, float64

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _check_bash(example):
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for line in example.parsed.strip().splitlines():
        for part in line.split("&&"):
            words = shlex.split(part)
            if words[:2] == ["pip", "install"]:
                spec = words[2]
                assert spec.startswith(".["), f"README installs {spec!r}, not the checkout"
                for extra in spec[2:-1].split(","):
                    assert extra in extras, f"README names extra {extra!r}; pyproject lacks it"
            elif words[:1] == ["python"] and words[1].endswith(".py"):
                assert (ROOT / words[1]).is_file(), f"README runs missing {words[1]}"
        if "pytest" in line:
            assert line.strip() in [c.strip() for c in ci], (
                f".ci/run must run the README's test command {line.strip()!r}"
            )


def _check_toml(example):
    tomllib = pytest.importorskip("tomllib")
    data = tomllib.loads(example.parsed)
    groups = data["project"]["entry-points"]
    assert list(groups) == [_core.PLUGIN_GROUP]


PARSERS = [
    PythonCodeBlockParser(),
    CodeBlockParser(language="bash", evaluator=_check_bash),
    CodeBlockParser(language="toml", evaluator=_check_toml),
]


@pytest.mark.tensorflow_only(
    reason="every block, TFRS and tf.function too; "
    "test_readme_keras_blocks_run_on_this_backend runs the Keras blocks on this backend"
)
def test_readme_code_blocks_run():
    document = Sybil(parsers=PARSERS).parse(README)
    examples = list(document)
    fenced = re.findall(r"^```(\w*)", README.read_text(), re.M)[::2]  # opening fences
    assert len(examples) == sum(lang in ("python", "bash", "toml") for lang in fenced)
    assert set(fenced) <= {"python", "bash", "toml", ""}, f"unchecked block languages {fenced}"
    before = {(e.kind, e.name) for e in losszoo.entries()}
    try:
        for example in examples:
            try:
                example.evaluate()
            except Exception as err:
                raise AssertionError(
                    f"README.md block at line {example.line} failed: {type(err).__name__}: {err}"
                ) from err
    finally:
        for key in {(e.kind, e.name) for e in losszoo.entries()} - before:
            _core._unregister(key)  # the plugin example's name
    assert "focal_sparsemax" not in losszoo.names("loss")


def test_readme_registry_table_is_current(capsys):
    text = README.read_text()
    table = re.search(
        r"<!-- registry-table:start -->\n(.*?)<!-- registry-table:end -->", text, re.S
    ).group(1)
    assert cli_main(["list"]) == 0
    printed = capsys.readouterr().out

    def rows(text):
        text = text.replace("`", "")  # README quotes class paths
        cells = [re.sub(r"\s*\|\s*", "|", line.strip()) for line in text.strip().splitlines()]
        return [row for row in cells if not set(row) <= set("|-")]

    assert rows(table) == rows(printed), (
        "README's registry table is stale: paste `python -m losszoo list` between the markers"
    )


# Issue 21 acceptance: the README's Keras code blocks run on JAX and PyTorch too, top to bottom
# in one namespace, leaving out the blocks that import TensorFlow (the TFRS recipe and the
# tf.function demo of the fail-loud contract). On JAX with 64-bit mode on, as the README says
# the possibilistic projection needs.
@pytest.mark.skipif(BACKEND == "tensorflow", reason="test_readme_code_blocks_run runs all on TF")
def test_readme_keras_blocks_run_on_this_backend():
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
