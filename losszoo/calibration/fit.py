"""Post-hoc calibration: fit a calibrator on held-out data, frozen base model (spec section 5.4)."""

from __future__ import annotations

import functools
import json
import weakref

import keras
import numpy as np
from keras import ops

from losszoo import _backend, registry
from losszoo._logits import attached_logits, making_layer
from losszoo.calibration.metrics import _class_ids
from losszoo.contract import LOGITS, check_finite, check_number, validation
from losszoo.heads.calibration import LogitBounding, ProbabilityBounding, TemperatureScaling

_VERBOSE = ("auto", 0, 1, 2)

#: calibrator -> how many ``-`` parts its short names may add (``"pb-c-l"``: bound_fn, bounds).
_VARIANT_PARTS = {TemperatureScaling: 0, LogitBounding: 1, ProbabilityBounding: 2}


def make_calibrator(method: str = "temperature_scaling", **kwargs) -> keras.layers.Layer:
    """Build a calibrator layer from a name.

    The short names' parts set the layer's ``bound_fn`` (``c`` = ``"constant"``, ``l`` =
    ``"linear"``) and, for probability bounding, ``bounds`` (``l`` = ``"lower"``, ``u`` =
    ``"upper"``; default ``"both"``), unless ``kwargs`` give them.

    Args:
      method: case-insensitive; ``"temperature_scaling"``/``"ts"``,
        ``"probability_bounding"``/``"pb"``, ``"logit_bounding"``/``"lb"`` (the calibrators'
        registered head names and aliases), or the paper's short names ``"pb-c"``,
        ``"pb-l"``, ``"pb-c-l"`` (lower bound only), ``"pb-c-u"`` (upper only), ``"pb-l-l"``,
        ``"pb-l-u"``, ``"lb-c"``, ``"lb-l"``. A name with a ``-`` reads ``_`` as ``-`` too.
      **kwargs: passed to the layer (e.g. ``fit_temperature=False``).

    Returns:
      A new, unfitted :class:`losszoo.heads.TemperatureScaling`,
      :class:`losszoo.heads.ProbabilityBounding` or :class:`losszoo.heads.LogitBounding`.

    Raises:
      TypeError: ``method`` is not a string.
      ValueError: naming ``method`` when it names no calibrator (e.g. ``"sparsemax"``, a
        head that is not one), or naming a layer argument the layer rejects.

    Example:
      >>> layer = losszoo.calibration.make_calibrator("pb-c-l")
      >>> type(layer).__name__, layer.bound_fn, layer.bounds
      ('ProbabilityBounding', 'constant', 'lower')
    """
    if not isinstance(method, str):
        raise TypeError(f"`method` must be a string, got {method!r}.")
    name = method.lower().replace("_", "-") if "-" in method else method.lower()
    head, *variant = name.split("-")
    try:  # the calibrators' registered head names and aliases ("ts")
        cls = registry.get_class(head, "head")
    except KeyError:
        cls = None
    if len(variant) > _VARIANT_PARTS.get(cls, -1):
        raise ValueError(f"`method`: unknown calibration method {method!r}.")
    if variant:
        kwargs.setdefault("bound_fn", {"c": "constant", "l": "linear"}.get(variant[0], variant[0]))
    if len(variant) == 2:
        kwargs.setdefault("bounds", {"l": "lower", "u": "upper"}.get(variant[1], variant[1]))
    return cls(**kwargs)


class LogitsNotAttached(ValueError):
    """The model's output is a softmax/sigmoid whose logits are not attached to it."""

    MESSAGE = (
        "the model ends in a softmax or sigmoid whose logits are not attached to its output, "
        "so its probabilities cannot be calibrated as logits. End the model in the logits "
        "(drop the softmax), or pass the validation logits instead."
    )


@keras.saving.register_keras_serializable(package="losszoo")
class AttachedLogits(keras.layers.Layer):
    """The logits behind a model's output: identity on logits.

    On probabilities that carry their logits (Keras' softmax or sigmoid, which attach
    ``_keras_logits``, or a losszoo head's ``_losszoo_logits``; see
    :func:`losszoo._logits.attached_logits`) it returns those logits. On the output of a
    softmax or sigmoid op without them it raises :class:`LogitsNotAttached` (calibrating
    probabilities as if they were logits gives badly calibrated models, silently).
    """

    def call(self, inputs):
        logits = attached_logits(inputs)
        if logits is not None:
            return logits
        op = getattr(inputs, "op", None)  # graph tensors only; eager ones carry no op
        if op is not None and op.type in ("Softmax", "Sigmoid"):
            raise LogitsNotAttached(LogitsNotAttached.MESSAGE)
        return inputs

    def compute_output_shape(self, input_shape):
        return input_shape


def _nll(labels, probs):
    """Per-example ``-log p[y]`` (floored at 1e-30) of calibrated probabilities."""
    labels = ops.reshape(ops.cast(labels, "int32"), (-1, 1))
    return -ops.log(ops.maximum(ops.take_along_axis(probs, labels, axis=-1)[:, 0], 1e-30))


@functools.lru_cache(maxsize=16)
def _trainer(cls, config, shapes, learning_rate, epsilon):
    """A twin of a calibrator (class ``cls``, JSON ``config``) in a compiled Keras model on
    inputs of ``shapes``, with its optimiser: ``(layer, model, state, initial state)``.

    Cached per configuration and reset to its initial state before each fit,
    so calling :func:`fit_calibrator` again reuses the compiled training step (a new one per
    call would retrace every time, and TensorFlow warns about it). The step is Keras' own
    (``train_on_batch``), so it runs on every backend: compiled by XLA on JAX, a
    ``tf.function`` on TensorFlow, eager on PyTorch.
    """
    layer = cls.from_config(json.loads(config))
    inputs = [keras.Input(shape) for shape in shapes]
    inputs = inputs if len(inputs) == 2 else inputs[0]
    model = keras.Model(inputs, layer(inputs))
    optimizer = keras.optimizers.Adam(learning_rate=learning_rate, epsilon=epsilon)
    model.compile(optimizer=optimizer, loss=_nll, jit_compile=_backend.NAME == "jax")
    optimizer.build(model.trainable_variables)
    state = [*model.weights, *optimizer.variables]
    return layer, model, state, [np.array(v.numpy()) for v in state]


@keras.saving.register_keras_serializable(package="losszoo")
class _PreActivation(keras.layers.Layer):
    """``layer`` (a Keras layer with an ``activation``, e.g. ``Dense(K, activation="softmax")``)
    without its activation: its logits, computed with its own weights."""

    def __init__(self, layer, **kwargs):
        super().__init__(**kwargs)
        if isinstance(layer, dict):
            layer = keras.saving.deserialize_keras_object(layer)
        self.inner = layer

    def build(self, input_shape):
        if not self.inner.built:
            self.inner.build(input_shape)

    def get_config(self):
        return {**super().get_config(), "layer": keras.saving.serialize_keras_object(self.inner)}

    def compute_output_shape(self, input_shape):
        return self.inner.compute_output_shape(input_shape)

    def call(self, inputs):
        squash, self.inner.activation = self.inner.activation, keras.activations.linear
        try:
            return self.inner.call(inputs)
        finally:
            self.inner.activation = squash


def _preactivation(base):
    """The logits tensor behind ``base``'s output where the backend cannot attach them to its
    arrays (JAX: Keras' softmax sets ``_keras_logits`` on TensorFlow and PyTorch tensors
    only), read from the graph: the input of a final ``Softmax`` / ``Activation`` layer, or the
    final layer without its softmax / sigmoid. ``None`` elsewhere (other backends, a final
    layer called more than once or inside a nested model: the attached-logits rule applies)."""
    if _backend.NAME != "jax":
        return None
    layer, _ = making_layer(base.outputs[0])
    if layer is None or not any(layer is own for own in base.layers):
        return None
    squashes = (keras.activations.softmax, keras.activations.sigmoid)
    try:
        inputs = layer.input  # raises for a layer with several inbound nodes
    except (AttributeError, ValueError):
        return None
    if isinstance(layer, keras.layers.Softmax) or (
        isinstance(layer, keras.layers.Activation) and layer.activation in squashes
    ):
        return inputs
    if getattr(layer, "activation", None) in squashes:
        return _PreActivation(layer, name="pre_activation")(inputs)
    return None


# Logits (and features) extractors per base model, so that fitting several calibrators on one
# model reuses the extractor's traced predict function.
_EXTRACTORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _extractor(base, needs, features_layer):
    """``(extractor model, logits tensor, features tensor or None)`` for ``base``."""
    key = (needs, features_layer)
    cached = _EXTRACTORS.setdefault(base, {})
    if key not in cached:
        logits_t = _preactivation(base)
        if logits_t is None:
            logits_t = AttachedLogits(name="attached_logits")(base.outputs[0])
        feats_t = None
        if needs:
            feats_t = (
                base.get_layer(features_layer).output if features_layer else base.layers[-1].input
            )
        extractor = keras.Model(base.inputs, [logits_t, feats_t] if needs else logits_t)
        cached[key] = (extractor, logits_t, feats_t)
    return cached[key]


class _Shuffled(keras.utils.PyDataset):
    """The validation logits (and features) and labels in minibatches of ``batch_size``, a new
    order each epoch (epoch ``e`` uses ``numpy.random.default_rng((seed, e))``: Keras' own
    shuffling draws from the global RNG, and ``seed`` must decide the fit).

    Endless, read by ``fit`` with ``steps_per_epoch``: an iterator that lives across epochs (a
    finite one is a new ``tf.data`` pipeline each epoch on TensorFlow, ~8x slower here).
    """

    def __init__(self, logits, feats, labels, batch_size, seed):
        super().__init__()
        self.logits, self.feats, self.labels = logits, feats, labels
        self.batch_size, self.seed = batch_size, seed
        self.steps = -(-len(labels) // batch_size)
        self.epoch, self.order = None, None

    @property
    def num_batches(self):
        return None  # endless

    def __getitem__(self, index):
        epoch, step = divmod(index, self.steps)
        if epoch != self.epoch:
            rng = np.random.default_rng((self.seed, epoch))
            self.epoch, self.order = epoch, rng.permutation(len(self.labels))
        sel = self.order[step * self.batch_size : (step + 1) * self.batch_size]
        x = self.logits[sel] if self.feats is None else (self.logits[sel], self.feats[sel])
        return x, self.labels[sel]


class _EpochProgress(keras.callbacks.Callback):
    """One progress bar over the epochs (a calibrator's epoch is a few steps), with the
    training NLL."""

    def on_train_begin(self, logs=None):
        self.bar = keras.utils.Progbar(
            self.params["epochs"], stateful_metrics=["nll"], unit_name="epoch"
        )
        self.seen, self.nll = 0, []

    def on_epoch_end(self, epoch, logs=None):
        self.seen, self.nll = epoch + 1, [("nll", float((logs or {})["loss"]))]
        self.bar.update(self.seen, self.nll)

    def on_train_end(self, logs=None):
        if self.seen < self.params["epochs"]:  # stopped early: finish the line
            self.bar.update(self.seen, self.nll, finalize=True)


def _input_structure(base):
    """The base's inputs as it takes them: one tensor (not a list of one, which would make the
    calibrated model, and the ``serve`` signature of its export, take a list), or its list or
    dict of several."""
    if len(base.inputs) == 1:
        return base.inputs[0]
    try:
        return base.input  # a functional model's own structure (list or dict)
    except AttributeError:
        return base.inputs


def fit_calibrator(
    model_or_logits,
    x_val,
    y_val,
    method: str = "temperature_scaling",
    *,
    epochs: int = 500,
    batch_size: int = 128,
    learning_rate: float = 1e-3,
    epsilon: float = 1e-8,
    features_layer: str | None = None,
    seed: int = 0,
    verbose="auto",
    callbacks=None,
    early_stopping: float | None = 0.0,
    patience: int = 20,
    return_history: bool = False,
    **calibrator_kwargs,
):
    """Fit a post-hoc calibrator on held-out data and return the calibrated Keras model.

    Only the calibrator's parameters are trained (the base model is frozen), by Adam with the
    paper's defaults (lr 1e-3, epsilon 1e-8, minibatches of 128, up to 500 epochs) on the NLL
    of the calibrated probabilities (spec section 5.4),

        NLL = -(1/N) sum_i log p_cal(x_i)[y_i],

    with Keras' own ``Model.fit`` (so Keras callbacks work as in any ``fit``), stopping early
    once the epoch's NLL has not decreased (by more than ``early_stopping``) for ``patience``
    epochs, keeping the best epoch's parameters. Logits and features of the validation data are
    computed once and cached. Initial values: tau = 1.5; PB bounds slightly active
    (``a'`` = -4, ``b'`` = 4; an inactive bound gets no gradient, a very active one takes many
    steps to relax); LB pre-activations 0 (the spec's recommendation).

    Args:
      model_or_logits: a Keras model whose output is *logits*, or carries them: a model that
        ends in Keras' softmax or sigmoid (``Dense(K, activation="softmax")``, which attaches
        its logits as ``_keras_logits``) or in a losszoo head that attaches them is calibrated
        on those logits (:class:`AttachedLogits`; on JAX, whose arrays carry no attached
        logits, a final Keras softmax / sigmoid is read from the graph instead: the input of a
        ``Softmax`` / ``Activation`` layer, or the final layer without its activation), and
        the calibrated model maps its inputs
        to the calibrated probabilities. Or an array of validation logits ``[N, K]``.
      x_val: the model's validation inputs; with logits given, the validation features ``z``
        ``[N, d]`` (needed by the linear variants) or None.
      y_val: integer labels ``[N]``.
      method: see :func:`make_calibrator` (``"ts"``, ``"pb-c"``, ``"pb-l"``, ``"lb-c"``, ...).
      epochs, batch_size, learning_rate, epsilon: the optimiser protocol (``epochs`` is the
        most; early stopping may end sooner).
      features_layer: name of the layer whose output is the embedding ``z`` for the linear
        variants; default: the input of the model's last layer.
      seed: shuffling seed (epoch ``e`` visits the examples in the order of
        ``numpy.random.default_rng((seed, e)).permutation(N)``); the global RNGs are untouched.
      verbose: ``"auto"`` or 1: one progress bar over the epochs, with the NLL; 2: one line
        per epoch (Keras' ``fit(verbose=2)``); 0: silent.
      callbacks: Keras callbacks for the fit (``keras.callbacks.EarlyStopping``,
        ``TensorBoard``, ...). They see the compiled twin of the calibrator that is trained
        (``callback.model``; one input, or ``[logits, features]``) and the log ``"loss"``
        (the epoch's NLL); its weights are copied into the returned calibrator at the end.
      early_stopping: the smallest decrease of the epoch's NLL that counts as an improvement
        (``keras.callbacks.EarlyStopping(monitor="loss", min_delta=early_stopping,
        patience=patience, restore_best_weights=True)``); the default 0 stops only once the
        NLL has stopped decreasing (no epoch below the best for ``patience`` epochs); a
        positive value stops sooner, at a slightly higher NLL; ``None`` trains all ``epochs``.
      patience: epochs without improvement before stopping.
      return_history: also return the per-epoch training NLL (one value per epoch run).
      **calibrator_kwargs: passed to the calibrator layer.

    Raises:
      ValueError: (or TypeError) naming the argument, before any fitting: NaN / +inf / all -inf
        logits (``model_or_logits``, also when computed by the model), labels that are not
        integer ids in ``[0, K)`` (``y_val``), NaN/Inf features (``x_val``), mismatched lengths,
        bad ``epochs`` / ``batch_size`` / ``learning_rate`` / ``epsilon`` / ``seed`` /
        ``verbose`` / ``early_stopping`` / ``patience`` / ``callbacks``, unknown
        ``method``, a model whose output is a softmax/sigmoid op with no logits attached
        (``model_or_logits``: its probabilities cannot be calibrated as logits). Fitting runs
        on the host (no XLA case); repeated calls reuse their traced functions.

    Returns:
      A Keras model: the frozen base followed by the calibrator (inputs: the base's inputs), or,
      for logits input, a model on ``logits`` (and ``features``). It saves and loads by name
      (``keras.saving.load_model`` after ``import losszoo``). With ``return_history``, a tuple
      ``(model, history)``.

    Example:
      >>> rng = np.random.default_rng(0)
      >>> val_logits = 4 * rng.normal(size=(64, 3)).astype("float32")
      >>> y_val = np.where(rng.random(64) < 0.7, val_logits.argmax(1), rng.integers(0, 3, 64))
      >>> calibrated = losszoo.calibration.fit_calibrator(val_logits, None, y_val, "pb-c",
      ...                                                 epochs=5, verbose=0)
      >>> probs = calibrated.predict(val_logits[:4], verbose=0)
      >>> probs.shape, bool(np.allclose(probs.sum(-1), 1.0, atol=1e-5))
      ((4, 3), True)
    """
    epochs = check_number(epochs, "epochs", low=1, integer=True)
    batch_size = check_number(batch_size, "batch_size", low=1, integer=True)
    learning_rate = check_number(learning_rate, "learning_rate", low=0.0, low_open=True)
    epsilon = check_number(epsilon, "epsilon", low=0.0, low_open=True)
    seed = check_number(seed, "seed", low=0, integer=True)
    if isinstance(verbose, bool) or not isinstance(verbose, (str, int)) or verbose not in _VERBOSE:
        raise ValueError(f'`verbose` must be "auto", 0, 1 or 2, got {verbose!r}.')
    early_stopping = check_number(
        early_stopping, "early_stopping", low=0.0, allow_none=True, tensor_ok=False
    )
    patience = check_number(patience, "patience", low=0, integer=True, tensor_ok=False)
    callbacks = list(callbacks or [])
    for callback in callbacks:
        if not isinstance(callback, keras.callbacks.Callback):
            raise TypeError(f"`callbacks`: expected keras.callbacks.Callback, got {callback!r}.")
    calibrator = make_calibrator(method, **calibrator_kwargs)
    needs = getattr(calibrator, "bound_fn", None) == "linear"
    if np.size(y_val) == 0:
        raise ValueError("`y_val` is empty: nothing to fit on.")
    if isinstance(model_or_logits, keras.Model):
        base = model_or_logits
        extractor, logits_t, feats_t = _extractor(base, needs, features_layer)
        try:
            out = extractor.predict(x_val, batch_size=512, verbose=0)
        except LogitsNotAttached:  # Keras wraps the message; state it plainly
            raise ValueError(f"`model_or_logits`: {LogitsNotAttached.MESSAGE}") from None
        logits, feats = (out[0], out[1]) if needs else (out, None)
    else:
        if needs and x_val is None:
            raise ValueError(f"Method {method!r} is linear in the features: pass them as `x_val`.")
        base = None
        logits, feats = model_or_logits, x_val if needs else None
    logits = np.asarray(logits, np.float32)
    if logits.ndim != 2:
        raise ValueError(
            f"`model_or_logits`: the validation logits must be [N, K], got shape {logits.shape}."
        )
    LOGITS.check(logits, "model_or_logits")  # NaN / +inf / all -inf rows: before fitting
    labels = _class_ids(y_val, "y_val", *logits.shape).astype(np.int32)
    if needs:
        feats = np.asarray(feats, np.float32)
        if feats.shape[0] != len(logits):
            raise ValueError(f"`x_val`: {feats.shape[0]} feature rows for {len(logits)} examples.")
        feats = feats.reshape(len(logits), -1)
        with validation(True):  # host data, checked before fitting whatever the switch says
            check_finite(feats, "x_val")
    # Train a compiled twin of the calibrator by Adam on minibatches (Keras' own fit), then
    # copy its weights.
    sample = [logits[:2], feats[:2]] if feats is not None else logits[:2]
    config = {k: v for k, v in calibrator.get_config().items() if k != "name"}
    shapes = tuple(np.shape(t)[1:] for t in keras.tree.flatten(sample))
    twin, twin_model, state, initial = _trainer(
        type(calibrator), json.dumps(config, sort_keys=True), shapes, learning_rate, epsilon
    )
    for variable, value in zip(state, initial):
        variable.assign(value)
    data = _Shuffled(logits, feats, labels, batch_size, seed)
    if early_stopping is not None:
        callbacks.append(
            keras.callbacks.EarlyStopping(
                monitor="loss",
                min_delta=early_stopping,
                patience=patience,
                restore_best_weights=True,
            )
        )
    if verbose in ("auto", 1):
        callbacks.append(_EpochProgress())
    fitted = twin_model.fit(
        data,
        epochs=epochs,
        steps_per_epoch=data.steps,
        shuffle=False,
        verbose=2 if verbose == 2 else 0,
        callbacks=callbacks,
    )
    history = [float(v) for v in fitted.history["loss"]]
    calibrator(sample)  # build
    calibrator.set_weights(twin.get_weights())

    if base is not None:
        base.trainable = False
        inputs = _input_structure(base)
        name = f"calibrated_{base.name}"
    else:
        logits_t = keras.Input((logits.shape[1],), name="logits")
        feats_t = keras.Input((feats.shape[1],), name="features") if needs else None
        inputs = [logits_t, feats_t] if needs else logits_t
        name = "calibrator"
    model = keras.Model(inputs, calibrator([logits_t, feats_t] if needs else logits_t), name=name)
    return (model, history) if return_history else model
