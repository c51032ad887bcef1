"""Make registered loss and metric names work in tf_keras (Keras 2), and TFRS.

tf_keras resolves strings through its global custom objects. There a registered name or
alias (``"rankmax"``) maps to a loss *function*, as tf_keras' own snake-case names do
(``"categorical_crossentropy"``), and the class name (``"RankmaxLoss"``) maps to a tf_keras
``Loss`` adapter class (see :func:`tf_keras_loss`). A function, not a class, is what makes a
``.keras`` file of a model compiled with ``loss="rankmax"`` load and evaluate: tf_keras'
``compile_from_config`` resolves the saved string to the custom object itself and calls it
as ``fn(y_true, y_pred)``; a class would be instantiated with the tensors as arguments.
A loss registered with ``batch_risk=True`` (the DRO losses) gets an adapter that computes its
risk of the batch, not a reduction of its per-example ``call``.

Metrics: in tf_keras a registered metric name, alias or class name maps to a tf_keras
``Metric`` adapter class (see :func:`_tf_keras_metric_adapter`) that holds the Keras 3
metric and forwards ``update_state`` / ``result`` / ``reset_state`` to it, so
``compile(metrics=["ece"])`` streams the same values in tf_keras as in Keras 3 (tf_keras
instantiates a class given by name with no arguments, hence the defaults must work).

TensorFlow Recommenders 0.7 uses tf_keras, so this is what makes
``tfrs.tasks.Retrieval(loss=losszoo.tf_keras_loss("rankmax"))`` and ``tf.keras`` models work.
Both need ``TF_USE_LEGACY_KERAS=1`` in the environment before TensorFlow is imported (TFRS
refuses Keras 3); ``import keras`` stays Keras 3 and losszoo's own classes are Keras 3.

Importing this module subscribes it to the registry (:func:`losszoo.registry._core.subscribe`).
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import keras
import tensorflow as tf

from losszoo import _backend
from losszoo.registry import _core
from losszoo.registry._keras import keys


def _tables(entry) -> list[tuple[dict, dict]]:
    """``(lookup table, {key: object})`` pairs through which tf_keras resolves the entry's
    names (none for heads, or without tf_keras). Names tf_keras already has keep their
    meaning."""
    if entry.kind not in ("loss", "metric") or not tf_keras_available():
        return []
    if entry.kind == "metric":
        # tf_keras.metrics.get(name) returns a global custom object as it is (a class would be
        # wrapped as a metric function) but instantiates a class among its metrics module's
        # globals: metric names go there (pinned by the tf_keras metric tests)
        adapter = _tf_keras_metric_adapter(entry.cls)
        _tf_keras()
        return [(_backend.tf_keras_metric_globals(), dict.fromkeys(keys(entry), adapter))]
    # a loss: name and aliases -> function, class name -> adapter class
    objects = dict.fromkeys((entry.name, *entry.aliases), _tf_keras_function(entry.cls, entry.name))
    objects[entry.cls.__name__] = _tf_keras_adapter(entry.cls)
    own = vars(_tf_keras().losses)  # never shadow tf_keras' own loss names
    custom = _tf_keras().utils.get_custom_objects()
    return [(custom, {k: v for k, v in objects.items() if k not in own})]


def _is_batch_risk(cls: type) -> bool:
    """Whether ``cls`` (or the registered loss it derives from) was registered as a batch risk:
    a risk over the whole batch computed in ``__call__``, whose ``call`` only gives the
    per-example base losses (Keras' contract), so it must not be reduced."""
    return getattr(_core.entry_of(cls, "loss"), "batch_risk", False)


@functools.cache
def tf_keras_available() -> bool:
    """Whether the ``tf_keras`` package is installed."""
    return importlib.util.find_spec("tf_keras") is not None


def _tf_keras():
    import tf_keras

    return tf_keras


@functools.cache
def _tf_keras_function(keras3_loss_cls: type, name: str):
    """The loss as a tf_keras loss function ``fn(y_true, y_pred)`` with default arguments.

    Per-example losses return one value per example (tf_keras then applies sample weights
    and its default mean reduction, as for ``"categorical_crossentropy"``); batch risks
    return the scalar risk of the unweighted batch.
    """
    batch_risk = _is_batch_risk(keras3_loss_cls)

    def loss_function(y_true, y_pred):
        with tf.init_scope():  # a stateful loss creates its variables: outside the graph
            loss = keras3_loss_cls()
        if any(isinstance(v, (tf.Variable, keras.Variable)) for v in vars(loss).values()):
            raise TypeError(
                f"{name!r} keeps state between training steps ({keras3_loss_cls.__name__}), "
                f"which a tf_keras loss given by name cannot hold. Pass an instance instead: "
                f"compile(loss=losszoo.tf_keras_loss({name!r}, ...))."
            )
        if batch_risk:
            return loss(y_true, y_pred)
        return loss.call(y_true, y_pred)

    loss_function.__name__ = loss_function.__qualname__ = name
    loss_function.__module__ = keras3_loss_cls.__module__
    loss_function.__doc__ = (
        f"tf_keras loss function for :class:`{keras3_loss_cls.__module__}."
        f"{keras3_loss_cls.__name__}` with its default arguments (what ``compile(loss="
        f"{name!r})`` uses in tf_keras). Configure it with ``losszoo.tf_keras_loss``."
    )
    return loss_function


@functools.cache
def _tf_keras_adapter(keras3_loss_cls: type) -> type:
    """A tf_keras ``Loss`` subclass computing the same values as a Keras 3 loss.

    For per-example losses tf_keras applies sample weights and its reduction to what
    ``call`` returns, exactly as Keras 3 does for the original class, and the op underneath
    is the same TensorFlow code.

    For a loss registered with ``batch_risk=True`` (the DRO losses), reducing what ``call``
    returns per example would silently be plain ERM. Its adapter calls the Keras 3 loss's
    ``__call__`` instead (the whole risk, sample weights as reference probabilities; safe-KL
    alpha moves in training steps by the GradientTape rule, as tf_keras' and TFRS'
    ``train_step`` record a tape and their ``test_step`` does not), and its ``reduction`` is
    ``SUM`` whatever is asked: the risk is not a per-example mean, and tf_keras then counts the
    replicas' shares of the global-batch risk correctly in its loss metric. Its config is the
    Keras 3 loss's whole config.
    """
    tf_keras = _tf_keras()
    batch_risk = _is_batch_risk(keras3_loss_cls)

    class Adapter(tf_keras.losses.Loss):
        def __init__(self, reduction=tf_keras.losses.Reduction.AUTO, name=None, **config: Any):
            if batch_risk:
                reduction = tf_keras.losses.Reduction.SUM  # whatever is asked, see above
            if not isinstance(reduction, str) or (name is not None and not isinstance(name, str)):
                raise TypeError(
                    f"`reduction` must be a tf_keras Reduction string and `name` a string or "
                    f"None; got {type(reduction).__name__} and {type(name).__name__}. Build "
                    f"the loss with losszoo.tf_keras_loss({keras3_loss_cls.__name__!r}, ...) "
                    "or pass the registered name as a string to compile()."
                )
            self._losszoo_config = dict(config)
            self.losszoo_loss = keras3_loss_cls(**config)
            super().__init__(reduction=reduction, name=name or self.losszoo_loss.name)

        if batch_risk:

            def __call__(self, y_true, y_pred, sample_weight=None):
                return self.losszoo_loss(y_true, y_pred, sample_weight=sample_weight)

        def call(self, y_true, y_pred):
            return self.losszoo_loss.call(y_true, y_pred)

        def get_config(self):
            config = {**super().get_config(), **self._losszoo_config}
            if batch_risk:
                inner = self.losszoo_loss.get_config()
                config.update(
                    (k, v) for k, v in inner.items() if k not in ("name", "reduction", "dtype")
                )
            return config

    return _publish(
        Adapter, keras3_loss_cls, "same arguments plus tf_keras' `reduction` and `name`"
    )


def _publish(adapter: type, keras3_cls: type, arguments: str) -> type:
    """Name ``adapter`` after ``keras3_cls`` and register it with tf_keras' serialization."""
    adapter.__name__ = adapter.__qualname__ = keras3_cls.__name__
    adapter.__module__ = keras3_cls.__module__
    adapter.__doc__ = (
        f"tf_keras (Keras 2) version of :class:`{keras3_cls.__module__}."
        f"{keras3_cls.__name__}`; {arguments}."
    )
    package = keras3_cls.__module__.split(".")[0]
    return _tf_keras().utils.register_keras_serializable(package=package)(adapter)


@functools.cache
def _tf_keras_metric_adapter(keras3_metric_cls: type) -> type:
    """A tf_keras ``Metric`` subclass streaming the values of a Keras 3 metric.

    It takes the Keras 3 class's arguments, builds the Keras 3 metric and forwards
    ``update_state``, ``result`` and ``reset_state`` to it (the state lives in the Keras 3
    metric's variables, which are ``tf.Variable`` objects under the TensorFlow backend).
    """
    tf_keras = _tf_keras()

    class MetricAdapter(tf_keras.metrics.Metric):
        def __init__(self, name=None, dtype=None, **config: Any):
            given = {k: v for k, v in (("name", name), ("dtype", dtype)) if v is not None}
            metric = keras3_metric_cls(**given, **config)
            super().__init__(name=metric.name, dtype=dtype)
            self._losszoo_config = dict(config)
            self.losszoo_metric = metric

        def update_state(self, y_true, y_pred, sample_weight=None):
            return self.losszoo_metric.update_state(y_true, y_pred, sample_weight=sample_weight)

        def result(self):
            return self.losszoo_metric.result()

        def reset_state(self):
            self.losszoo_metric.reset_state()

        def get_config(self):
            return {**super().get_config(), **self._losszoo_config}

    return _publish(MetricAdapter, keras3_metric_cls, "same arguments")


def tf_keras_loss(loss, **config: Any):
    """Return a tf_keras (Keras 2) loss computing a registered losszoo loss, TFRS-ready.

    Made for ``tfrs.tasks.Retrieval(loss=...)`` in TensorFlow Recommenders 0.7 (and any
    tf_keras model). **The default reduction is SUM over the batch**, the reduction of
    ``tfrs.tasks.Retrieval``'s default loss (``CategoricalCrossentropy(reduction=SUM)``), so a
    recipe tuned for TFRS' default (e.g. the basic-retrieval tutorial's Adagrad 0.1, batch
    8192) trains as well with a losszoo loss swapped in. A batch-mean loss would have
    gradients ``batch_size`` times smaller there and barely learn. For a mean, pass
    ``reduction="sum_over_batch_size"`` (what ``compile(loss="rankmax")`` uses in tf_keras,
    as for tf_keras' own string losses).

    Batch risks (the DRO losses ``cvar``, ``kl_dro_batch_lse``, ``safe_kl_dro``, ...) are a
    single risk of the batch, on the scale of a mean; ``reduction`` does not apply to them.
    In a recipe tuned for TFRS' summed loss their gradients are about ``batch_size`` times
    smaller (on the synthetic TFRS-recipe test, top-10 0.06 against 0.95 for the default
    loss); raise the learning rate accordingly. Losses that need a static class axis (the
    possibilistic ones) do not fit in-batch retrieval, whose class axis is the batch.

    tf_keras and TFRS need ``TF_USE_LEGACY_KERAS=1`` in the environment before TensorFlow is
    first imported (otherwise ``tf.keras`` is Keras 3 and TFRS fails to import).

    Args:
      loss: a registered loss name (``"rankmax"``), a losszoo Keras 3 loss class, or an
        instance (whose config is copied; ``config`` then overrides it).
      **config: constructor arguments of the losszoo loss, plus tf_keras' ``reduction``
        (default ``"sum"``) and ``name``.

    Returns:
      A tf_keras ``Loss`` instance; its class is registered for tf_keras serialization, so
      models compiled with it save to ``.keras`` and load without ``custom_objects``.

    Example:
      >>> # TF_USE_LEGACY_KERAS=1 python ...
      >>> import tensorflow_recommenders as tfrs
      >>> task = tfrs.tasks.Retrieval(loss=losszoo.tf_keras_loss("rankmax"))
    """
    if not tf_keras_available():
        raise ImportError(
            "tf_keras_loss needs the `tf_keras` package: pip install 'losszoo[retrieval]'."
        )
    reduction = config.pop("reduction", _tf_keras().losses.Reduction.SUM)
    if isinstance(loss, str):
        cls = _core.get_class(loss, "loss")
    elif isinstance(loss, type):
        cls = loss
    else:
        cls = type(loss)
        base = {k: v for k, v in loss.get_config().items() if k not in ("reduction", "dtype")}
        config = {**base, **config}
    return _tf_keras_adapter(cls)(reduction=reduction, **config)


_core.subscribe(_tables)
