"""Registry: names, lookup errors, taken names, plugins from real dist-info folders, CLI."""

import subprocess
import sys
import textwrap

import keras
import numpy as np
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


def test_get_and_get_class_reject_a_name_that_is_not_a_string():
    for call in (losszoo.get_class, losszoo.get):
        with pytest.raises(TypeError, match=r"`name` must be a registered name.*got 3 \(int\)"):
            call(3)
        with pytest.raises(TypeError, match="`name`"):
            call(["sparsemax"], kind="loss")


PLUGIN_DIRECT = """
import keras
import losszoo


def setup():
    @losszoo.register("plugin_direct_mae", kind="loss")
    class PluginDirectMAE(keras.losses.Loss):
        def call(self, y_true, y_pred):
            return keras.ops.mean(keras.ops.abs(y_true - y_pred), axis=-1)
"""


def _floats(out, keys):
    lines = (line.split(" ", 1) for line in out.splitlines() if " " in line)
    return {key: float(value) for key, value in lines if key in keys}


def _run(script, tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, result.stderr


@pytest.mark.tensorflow_only(reason="the plugin name is also compiled into a tf_keras model")
def test_plugins_load_at_import_for_compile_and_load_model(tmp_path):
    # issue 19 item 13: a plugin's name must resolve right after `import losszoo`, with no
    # losszoo lookup first, in compile (Keras 3 and tf_keras) and in load_model.
    make_distribution(tmp_path, "good-plugin", "lz_good_plugin", PLUGIN_GOOD)
    make_distribution(tmp_path, "broken-plugin", "lz_broken_plugin", PLUGIN_BROKEN)
    (tmp_path / "lz_direct_plugin.py").write_text(textwrap.dedent(PLUGIN_DIRECT))
    info = tmp_path / "direct-plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: direct-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[losszoo.plugins]\ndirect-plugin = lz_direct_plugin:setup\n"
    )
    out, err = _run(
        """
        import sys, warnings
        warnings.simplefilter("always")
        import numpy as np, keras, losszoo
        print("LAZY_DATASETS", "losszoo.datasets" not in sys.modules)
        print("DATASETS", losszoo.datasets.load_100k.__name__)
        x = np.random.default_rng(0).normal(size=(32, 3)).astype("float32")
        y = np.sign(x[:, :1])
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", loss="plugin_hinge")
        model.fit(x, y, batch_size=32, verbose=0)
        print("EVAL", repr(model.evaluate(x, y, batch_size=32, verbose=0)))
        print("WANT", repr(float(np.maximum(0, 1 - y * model.predict(x, verbose=0)).mean())))
        model.save("hinge.keras")
        import tf_keras
        m2 = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(1)])
        m2.compile("sgd", loss="plugin_hinge")
        print("TFK", repr(m2.evaluate(x, y, batch_size=32, verbose=0)))
        print("TFK_WANT", repr(float(np.maximum(0, 1 - y * m2.predict(x, verbose=0)).mean())))
        """,
        tmp_path,
    )
    assert "LAZY_DATASETS True" in out and "DATASETS load_100k" in out
    values = _floats(out, ("EVAL", "WANT", "TFK", "TFK_WANT"))
    np.testing.assert_allclose(values["EVAL"], values["WANT"], rtol=1e-5)
    np.testing.assert_allclose(values["TFK"], values["TFK_WANT"], rtol=1e-5)
    # a broken plugin warns at import, naming itself, and the import goes on
    assert "losszoo plugin broken-plugin" in err and "not installed" in err
    assert "RuntimeWarning" in err
    # A fresh process: load_model straight after the import. The plugin module imported
    # first (it imports losszoo itself) is loaded once its import has finished, not
    # reported as broken.
    out, err = _run(
        """
        import warnings
        warnings.simplefilter("always")
        import lz_direct_plugin
        import numpy as np, keras, losszoo
        x = np.random.default_rng(0).normal(size=(32, 3)).astype("float32")
        y = np.sign(x[:, :1])
        model = keras.models.load_model("hinge.keras")
        print("LOADED", type(model.loss).__name__)
        print("EVAL", repr(model.evaluate(x, y, batch_size=32, verbose=0)))
        print("WANT", repr(float(np.maximum(0, 1 - y * model.predict(x, verbose=0)).mean())))
        print("NAMES", losszoo.names("loss"))
        """,
        tmp_path,
    )
    values = _floats(out, ("EVAL", "WANT"))
    np.testing.assert_allclose(values["EVAL"], values["WANT"], rtol=1e-5)
    names = eval(out.split("NAMES ")[1].splitlines()[0])
    assert {"plugin_hinge", "plugin_direct_mae"} <= set(names)
    assert "direct-plugin" not in err


def _import_losszoo(env_changes, tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if k != "KERAS_BACKEND"}
    env.update(env_changes)
    return subprocess.run(
        [sys.executable, "-c", "import losszoo"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )


def test_backend_error_says_where_the_setting_came_from(tmp_path):
    (tmp_path / "keras.json").write_text('{"backend": "numpy"}')
    result = _import_losszoo({"KERAS_HOME": str(tmp_path)}, tmp_path)
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("ImportError")
    assert f"{tmp_path / 'keras.json'} sets \"backend\": 'numpy'" in message
    assert "environment variable" not in message
    # the environment variable alone names another backend (it wins over keras.json)
    result = _import_losszoo({"KERAS_HOME": str(tmp_path), "KERAS_BACKEND": "numpy"}, tmp_path)
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("ImportError") and "TensorFlow, JAX or PyTorch backend" in message
    assert "the environment variable KERAS_BACKEND is 'numpy'" in message
    assert "keras.json" in message  # the remedy names both places


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_import_on_jax_and_torch_works_and_tf_only_pieces_say_why(backend, tmp_path):
    code = (
        "import losszoo, keras\n"
        "print('BACKEND', keras.backend.backend(), 'sparsemax' in losszoo.names())\n"
        "try:\n    losszoo.tf_keras_loss(loss='sparsemax', k=2)\n"  # the real signature
        "except ImportError as e:\n    print('TFKERAS', e)\n"
    )
    env = {**__import__("os").environ, "KERAS_BACKEND": backend}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr
    assert f"BACKEND {backend} True" in result.stdout
    assert (
        "TFKERAS losszoo.tf_keras_loss" in result.stdout and "TensorFlow backend" in result.stdout
    )


def test_batch_risk_is_declared_at_register():
    """Issue 20 item 4: the DRO losses declare ``batch_risk=True``; the declaration is read
    from the entry (aliases and subclasses share it), never inferred from methods."""
    from losszoo.registry import entry, entry_of

    declared = {e.name for e in losszoo.entries("loss") if e.batch_risk}
    assert declared == {"safe_kl_dro", "kl_dro_batch_lse", "kl_dro_sumexp", "cvar"}
    assert entry("cvar_risk").batch_risk and not entry("sparsemax").batch_risk

    class MyCVaR(losszoo.losses.CVaRLoss):
        pass

    assert entry_of(MyCVaR).name == "cvar" and entry_of(dict) is None
    with pytest.raises(ValueError, match="batch_risk"):
        register("some_head", kind="head", batch_risk=True)
    with pytest.raises(TypeError, match="batch_risk"):
        register("some_loss", batch_risk=1)


@pytest.mark.parametrize("declared", [True, False])
def test_tf_keras_glue_follows_the_batch_risk_declaration(declared):
    """The tf_keras adapter and loss function of a loss registered with ``batch_risk=True``
    call the loss (the risk: here the batch maximum); without the declaration they reduce its
    per-example ``call`` (the mean), whatever methods the class has."""
    tf_keras = pytest.importorskip("tf_keras")
    import tensorflow as tf

    from losszoo.registry import _core

    class ToyMax(keras.losses.Loss):
        def per_example_losses(self, y_true, y_pred):  # no longer read: not a declaration
            return self.call(y_true, y_pred)

        def call(self, y_true, y_pred):
            return tf.reduce_mean(tf.square(y_true - y_pred), -1)

        def __call__(self, y_true, y_pred, sample_weight=None):
            return tf.reduce_max(self.call(y_true, y_pred))

    name = f"toy_batch_max_{declared}".lower()
    ToyMax.__name__ = ToyMax.__qualname__ = f"ToyMax{declared}"
    register(name, kind="loss", batch_risk=declared)(ToyMax)
    try:
        y = np.zeros((3, 1), np.float32)
        p = np.array([[1.0], [2.0], [3.0]], np.float32)
        want = 9.0 if declared else 14.0 / 3.0
        adapter = losszoo.tf_keras_loss(name, reduction="sum_over_batch_size")
        assert float(adapter(y, p)) == pytest.approx(want)
        fn = tf_keras.utils.get_custom_objects()[name]
        assert float(tf.reduce_mean(fn(y, p))) == pytest.approx(want)
    finally:
        _core._unregister(("loss", name))
    assert name not in tf_keras.utils.get_custom_objects()
