"""The `losszoo` command line: bare call prints help (exit 0), program name, `list`; the
console script (:mod:`losszoo_cli`) answers `--help` and `list` without importing losszoo,
Keras or TensorFlow; `python -m losszoo` gives the same answers after importing losszoo."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import losszoo
import losszoo_cli
from losszoo.__main__ import main
from losszoo.registry import PLUGIN_GROUP

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
    assert scripts == {"losszoo": "losszoo_cli:main"}


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


# What the console script `losszoo` runs (its file as pip writes it; an editable install made
# before the entry point moved to losszoo_cli still runs losszoo.__main__, so it is not used).
SCRIPT = "import sys; from losszoo_cli import main; sys.exit(main())"


def test_builtin_entries_read_from_source_equal_the_live_registry():
    live = [
        (e.name, e.aliases, e.kind, f"{e.cls.__module__}.{e.cls.__qualname__}", e.description)
        for e in losszoo.entries()
        if e.source == "losszoo"
    ]
    assert losszoo_cli.builtin_entries() == live
    assert losszoo_cli.PLUGIN_GROUP == PLUGIN_GROUP
    assert losszoo_cli.KINDS == losszoo.registry.KINDS


@pytest.mark.parametrize("args", [["--help"], ["list", "--kind", "metric"], ["list"]])
def test_console_script_does_not_import_losszoo_or_keras(args):
    if losszoo_cli._plugins_installed():
        pytest.skip("a plugin is installed: `list` must import losszoo to read its names")
    result = _cli("-c", SCRIPT, *args)
    assert result.returncode == 0, result.stderr[-2000:]
    modules = _imported(result.stderr)
    assert "losszoo_cli" in modules and "argparse" in modules  # importtime did record imports
    heavy = ("losszoo", "tensorflow", "keras", "tf_keras", "jax", "torch")
    assert not {m for m in modules if m.split(".")[0] in heavy}
    if args[0] == "list":
        kind = args[2] if len(args) > 2 else None
        expected = losszoo_cli.format_table(losszoo_cli.registry_rows(kind), losszoo_cli.HEADER)
        assert result.stdout.strip() == expected
    else:
        assert result.stdout.startswith("usage: losszoo ")


def test_python_m_losszoo_answers_the_same():
    result = _cli("-m", "losszoo", "list", "--kind", "metric")
    assert result.returncode == 0, result.stderr[-2000:]
    expected = losszoo_cli.format_table(losszoo_cli.registry_rows("metric"), losszoo_cli.HEADER)
    assert result.stdout.strip() == expected
    help_ = _cli("-m", "losszoo", "--help")
    assert help_.returncode == 0 and help_.stdout.startswith("usage: losszoo ")
