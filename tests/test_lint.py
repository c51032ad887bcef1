"""The tree is ruff-clean: lint rules and formatting as configured in pyproject.toml."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "command", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"]
)
def test_ruff(command):
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, f"ruff {' '.join(command)}:\n{result.stdout}{result.stderr}"
