"""Registry: names, lookup errors, taken names, plugins from real dist-info folders, CLI."""

import subprocess
import sys
import textwrap

import keras
import pytest

import losszoo
from losszoo.__main__ import main as cli_main
from losszoo.registry import register


def test_names_and_get():
    assert "sparsemax" in losszoo.names("loss")
    assert "sparsemax" in losszoo.names("head")
    assert set(losszoo.names()) >= {"sparsemax"}
    loss = losszoo.get("sparsemax", reduction="sum", normalize_labels=False)
    assert loss.reduction == "sum" and loss.normalize_labels is False
    assert losszoo.get("sparsemax", kind="head", axis=1).axis == 1


def test_unknown_name_lists_close_matches():
    with pytest.raises(KeyError, match="sparsemax"):
        losszoo.get("sparsmax")
    with pytest.raises(ValueError, match="kind"):
        losszoo.get("sparsemax", kind="optimizer")


def test_taken_name_and_alias_raise():
    taken = "name.='sparsemax': that name is already taken.*SparsemaxLoss"
    with pytest.raises(ValueError, match=taken):

        @register("sparsemax", kind="loss")
        class Duplicate(keras.losses.Loss):
            def call(self, y_true, y_pred):
                return y_pred

    with pytest.raises(ValueError, match="'sparsemax_loss': that name is already taken"):

        @register("fresh_name_for_alias_test", kind="loss", aliases=("sparsemax_loss",))
        class Duplicate2(keras.losses.Loss):
            def call(self, y_true, y_pred):
                return y_pred

    assert "fresh_name_for_alias_test" not in losszoo.names()
    assert losszoo.get_class("sparsemax") is losszoo.losses.SparsemaxLoss


def test_cli_list(capsys):
    assert cli_main(["list"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "sparsemax" in line]
    assert any("| loss" in line and "SparsemaxLoss" in line for line in lines)
    assert any("| head" in line and "heads.sparsemax.Sparsemax" in line for line in lines)
    header = [cell.strip() for cell in out.splitlines()[0].split("|")[1:-1]]
    assert header == ["name", "kind", "class", "description"]


PLUGIN_GOOD = """
import keras
import losszoo

@losszoo.register("plugin_hinge", kind="loss", description="a plugin's loss")
class PluginHinge(keras.losses.Loss):
    def call(self, y_true, y_pred):
        return keras.ops.mean(keras.ops.relu(1.0 - y_true * y_pred), axis=-1)
"""

PLUGIN_BROKEN = """
raise ImportError("this plugin needs a package that is not installed")
"""

PLUGIN_TAKEN = """
import keras
import losszoo

@losszoo.register("taken_plugin_ok", kind="loss")
class FirstIsFine(keras.losses.Loss):
    def call(self, y_true, y_pred):
        return y_pred

@losszoo.register("sparsemax", kind="loss")
class Impostor(keras.losses.Loss):
    def call(self, y_true, y_pred):
        return y_pred
"""


def make_distribution(root, dist, module, source):
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[losszoo.plugins]\n{dist} = {module}\n")


def test_plugins_from_real_distributions(tmp_path):
    make_distribution(tmp_path, "good-plugin", "lz_good_plugin", PLUGIN_GOOD)
    make_distribution(tmp_path, "broken-plugin", "lz_broken_plugin", PLUGIN_BROKEN)
    make_distribution(tmp_path, "taken-plugin", "lz_taken_plugin", PLUGIN_TAKEN)
    script = textwrap.dedent(
        f"""
        import sys, warnings
        sys.path.insert(0, {str(tmp_path)!r})
        warnings.simplefilter("always")
        import keras, losszoo
        names = losszoo.names("loss")        # first lookup discovers the plugins
        print("NAMES", names)
        print("SPARSEMAX", losszoo.get_class("sparsemax").__name__)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(loss="plugin_hinge")  # a plugin's name works in compile
        print("LOSS", type(model.loss).__name__ if not isinstance(model.loss, str) else model.loss)
        print("PLUGIN_CLASS", keras.losses.get("plugin_hinge").__class__.__name__)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=240,
        env={**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert result.returncode == 0, result.stderr
    out, err = result.stdout, result.stderr
    names = eval(out.split("NAMES ")[1].splitlines()[0])
    assert "plugin_hinge" in names and "sparsemax" in names
    # a plugin that fails, or that takes a name, is skipped as a whole with a warning naming it
    assert "taken_plugin_ok" not in names
    assert "SPARSEMAX SparsemaxLoss" in out
    assert "PLUGIN_CLASS PluginHinge" in out
    assert "broken-plugin" in err and "failed to load" in err and "not installed" in err
    assert "taken-plugin" in err and "'sparsemax': that name is already taken" in err


def test_import_under_another_backend_fails_clearly():
    env = {**__import__("os").environ, "KERAS_BACKEND": "numpy"}
    result = subprocess.run(
        [sys.executable, "-c", "import losszoo"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert "KERAS_BACKEND=tensorflow" in result.stderr
