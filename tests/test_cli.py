"""The `losszoo` command line: bare call prints help (exit 0), program name, `list`."""

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
