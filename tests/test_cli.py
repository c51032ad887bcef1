"""The `losszoo` command line: bare call prints help (exit 0), program name, `list`; `--help`
answers without importing TensorFlow."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import losszoo
from losszoo.__main__ import main

ROOT = Path(__file__).resolve().parents[1]


def test_bare_call_prints_help_and_exits_0(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: losszoo ")
    assert "list" in out


def test_help_names_the_program_losszoo(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: losszoo ")
    assert "python -m losszoo [" not in out


def test_console_script_points_at_main():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"losszoo": "losszoo.__main__:main"}


def test_list_prints_every_registered_name(capsys):
    assert main(["list", "--kind", "loss"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines()[2:] if line.startswith("|")]
    names = {row.split("|")[1].split("(")[0].strip() for row in rows}
    assert names == set(losszoo.names("loss"))
    assert all(row.split("|")[2].strip() == "loss" for row in rows)


def test_unknown_kind_is_rejected(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["list", "--kind", "optimizer"])
    assert exit_info.value.code == 2
    assert "--kind" in capsys.readouterr().err


def _cli(*args):
    """Run the command line in a fresh process with -X importtime (imports go to stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND",)}
    return subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"},
        cwd=ROOT,
    )


def _imported(stderr):
    return {line.split("|")[-1].strip() for line in stderr.splitlines() if "import time:" in line}


@pytest.mark.parametrize("how", ["-m", "script"])
def test_help_does_not_import_tensorflow(how):
    script = Path(sys.executable).parent / "losszoo"
    if how == "script" and not script.is_file():
        pytest.skip("the losszoo console script is not installed next to this interpreter")
    result = _cli(*(["-m", "losszoo"] if how == "-m" else [str(script)]), "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage: losszoo ")
    modules = _imported(result.stderr)
    assert "losszoo" in modules and "argparse" in modules  # importtime did record imports
    assert not {m for m in modules if m.split(".")[0] in ("tensorflow", "keras", "tf_keras")}


def test_list_in_a_fresh_process_loads_the_registry():
    result = _cli("-m", "losszoo", "list", "--kind", "metric")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines()[2:] if line.startswith("|")]
    assert {row.split("|")[1].split("(")[0].strip() for row in rows} == set(losszoo.names("metric"))
