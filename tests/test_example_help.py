"""Every example answers ``--help`` and a bad option before Keras (or TensorFlow) starts.

Its options are defined before its heavy imports: ``--help`` took 21-34 s on a loaded 2-core
machine while TensorFlow started (issue 35 item 5); now it takes under a second.
"""

import subprocess
import sys

from tests.references import REPO_ROOT

EXAMPLES = sorted(p for p in (REPO_ROOT / "examples").glob("*.py") if not p.name.startswith("_"))

PROBE = """
import runpy, sys
heavy = ("keras", "tensorflow", "jax", "torch", "losszoo")
for path in sys.argv[1:]:
    for argv, code in (["--help"], 0), (["--no-such-option"], 2):
        sys.argv = [path, *argv]
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as exit:
            assert exit.code == code, (path, argv, exit.code)
        else:
            raise AssertionError(f"{path} {argv} did not exit")
        loaded = [m for m in heavy if m in sys.modules]
        assert not loaded, f"{path} {argv} imported {loaded}"
print("ok", len(sys.argv))
"""


def test_examples_answer_help_without_importing_keras():
    assert len(EXAMPLES) >= 8
    run = subprocess.run(
        [sys.executable, "-c", PROBE, *map(str, EXAMPLES)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "usage: python examples/tour.py" in run.stdout
