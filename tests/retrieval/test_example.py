"""examples/keras3_retrieval.py on a small synthetic MovieLens, into a temporary folder."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "keras3_retrieval.py"


def load():
    spec = importlib.util.spec_from_file_location("example_keras3_retrieval", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def synthetic_movielens(folder, users=30, items=60, per_user=10):
    """GroupLens layout: u.data (user item rating timestamp) and u.item (19 genre flags)."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    lines = [
        f"{u}\t{i}\t3\t{880000000 + u * 100 + n}\n"
        for u in range(1, users + 1)
        for n, i in enumerate(rng.choice(items, per_user, replace=False) + 1)
    ]
    (folder / "u.data").write_text("".join(lines))
    flags = "|".join(["0"] * 19)
    (folder / "u.item").write_bytes(
        "".join(
            f"{i}|Movie {i} (1995)|01-Jan-1995||http://x|{flags}\n" for i in range(1, 61)
        ).encode("latin-1")
    )


def test_example_runs_and_writes_its_files(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LOSSZOO_CACHE_DIR", str(tmp_path / "cache"))  # never the real cache
    synthetic_movielens(tmp_path / "ml")
    out = tmp_path / "r"
    results = load().main(
        [
            "--data-dir",
            str(tmp_path / "ml"),
            "--dim",
            "4",
            "--batch-size",
            "64",
            "--epochs",
            "2",
            "--loss",
            "rankmax",
            "--negatives",
            "in-batch",
            "mixed",
            "--sampled",
            "8",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    for suffix in (".md", ".json", ".png"):
        assert f"wrote {out / ('keras3_retrieval' + suffix)}" in printed
    assert set(results) == {("in-batch", "rankmax"), ("mixed", "rankmax")}
    rows = [r for r in (out / "keras3_retrieval.md").read_text().splitlines() if "| rankmax" in r]
    assert len(rows) == 4 and all("±" not in r for r in rows)
    values = [float(x) for r in rows for x in re.findall(r"\d+\.\d+", r)]
    assert values and all(0.0 <= v for v in values)
    saved = json.loads((out / "keras3_retrieval.json").read_text())
    run = saved["runs"]["mixed/rankmax"][0]
    assert 0.0 <= run["test"]["top1"] <= run["test"]["top100"] <= 1.0
    assert (out / "keras3_retrieval.md").read_text().startswith("# MovieLens")


def test_help_lists_every_option_with_its_default(capsys):
    with pytest.raises(SystemExit):
        load().main(["--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: python examples/keras3_retrieval.py")
    blocks = re.split(r"\n  (?=-)", text.split("options:", 1)[1])
    for block in blocks[1:]:
        if not block.startswith("-h"):
            assert "(default:" in " ".join(block.split()), block.split()[0]
