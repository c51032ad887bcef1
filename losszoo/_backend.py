"""The one place that knows which Keras backend runs: TensorFlow, JAX or PyTorch.

Kernels are written once with ``keras.ops``; this module supplies what ``keras.ops`` lacks or
does differently per backend: custom gradients (any number of tensor inputs and outputs),
reading a value on the host when it is known, graph assertions (TensorFlow graphs only),
whether XLA compiles the code being traced and whether float64 is available.

Conventions of :func:`custom_gradient`, the same on every backend: the decorated function
takes tensors only, positionally (bind Python options with a closure), and returns
``(outputs, grad)`` where ``grad(*upstream)`` returns one gradient per input (``None`` for an
input without gradient, e.g. integer ids). Keras' own ``ops.custom_gradient`` cannot take
two outputs or a non-tensor argument on PyTorch, and swallows exceptions there.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os

import keras
import numpy as np

NAME = keras.backend.backend()
"""The Keras backend losszoo runs on (read once, at import, as Keras itself does)."""

TENSORFLOW = NAME == "tensorflow"
if TENSORFLOW:  # Keras has imported it already
    import tensorflow as tf


def _keras_json_backend():
    """``(path, backend)`` of the ``keras.json`` Keras reads (``$KERAS_HOME`` or ``~/.keras``);
    ``backend`` is None when the file is missing, unreadable or has no ``"backend"`` key."""
    from keras.src.backend.config import keras_home  # no public name

    path = os.path.expanduser(os.path.join(keras_home(), "keras.json"))
    try:
        with open(path) as f:
            return path, json.load(f).get("backend")
    except (OSError, ValueError, AttributeError):
        return path, None


SUPPORTED = ("tensorflow", "jax", "torch")


def require_supported_backend() -> None:
    """Raise ImportError unless Keras runs on TensorFlow, JAX or PyTorch.

    The message says where the setting came from: the environment variable ``KERAS_BACKEND``
    or the ``"backend"`` key of Keras' ``keras.json`` (its path).
    """
    if NAME in SUPPORTED:
        return
    env = os.environ.get("KERAS_BACKEND") or None  # Keras ignores an empty value too
    path, from_json = _keras_json_backend()
    if env == NAME:
        source = f"the environment variable KERAS_BACKEND is {NAME!r}"
    elif from_json == NAME:
        source = f'Keras\' configuration file {path} sets "backend": {NAME!r}'
    else:
        source = f"Keras was started with the {NAME!r} backend"
    raise ImportError(
        f"losszoo runs on the TensorFlow, JAX or PyTorch backend of Keras 3, but {source}. Set "
        "KERAS_BACKEND to one of them before importing keras or losszoo (for example "
        '`export KERAS_BACKEND=jax`), or set "backend" in keras.json.'
    )


def require_tensorflow(feature: str) -> None:
    """Raise ImportError naming ``feature`` unless Keras runs on TensorFlow."""
    if not TENSORFLOW:
        raise ImportError(
            f"{feature} needs the TensorFlow backend of Keras (it is built on TensorFlow-only "
            f"APIs); Keras runs on {NAME!r}. Set KERAS_BACKEND=tensorflow before importing "
            "keras or losszoo to use it."
        )


# --------------------------------------------------------------------------------------------
# Custom gradients


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _jax_custom_gradient(f):
    import jax
    import jax.numpy as jnp

    @functools.wraps(f)
    def wrapper(*args):
        @jax.custom_gradient
        def g(*a):
            outputs, grad = f(*a)
            several = isinstance(outputs, (tuple, list))

            def vjp(cotangent):
                grads = _as_tuple(grad(*_as_tuple(cotangent)))
                return tuple(
                    _jax_zero_cotangent(x) if gx is None else jnp.asarray(gx, x.dtype)
                    for x, gx in zip(a, grads)
                )

            return (tuple(outputs) if several else outputs), vjp

        return g(*map(jnp.asarray, args))

    return wrapper


def _jax_zero_cotangent(x):
    import jax
    import jax.numpy as jnp

    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


def _torch_custom_gradient(f):
    import torch

    class _Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            outputs, grad = f(*args)
            ctx.grad = grad
            ctx.dtypes = [a.dtype for a in args]
            return outputs

        @staticmethod
        def backward(ctx, *upstream):
            grads = _as_tuple(ctx.grad(*upstream))
            return tuple(
                None if g is None or not dtype.is_floating_point else g.to(dtype)
                for g, dtype in zip(grads, ctx.dtypes)
            )

    @functools.wraps(f)
    def wrapper(*args):
        return _Function.apply(*map(keras.ops.convert_to_tensor, args))

    return wrapper


def custom_gradient(f):
    """Decorate ``f(*tensors) -> (outputs, grad)`` with a hand-derived gradient.

    ``outputs`` is a tensor or a tuple of tensors; ``grad(*upstream)`` gets one upstream
    gradient per output and returns one gradient per input (a tensor, or ``None``).
    TensorFlow: ``tf.custom_gradient``; JAX: ``jax.custom_gradient`` (works under ``jit`` and
    ``vmap``; integer inputs get the float0 zero cotangent); PyTorch: a
    ``torch.autograd.Function`` (exceptions in ``f`` propagate).
    """
    if TENSORFLOW:
        return tf.custom_gradient(f)
    if NAME == "jax":
        return _jax_custom_gradient(f)
    return _torch_custom_gradient(f)  # losszoo refuses to import on other backends


# --------------------------------------------------------------------------------------------
# Host values, tracing and assertions


def static_value(x):
    """``x`` as a numpy array when its value is known without running a graph, else None.

    Python numbers, numpy arrays and the tensors :func:`is_concrete` accepts are known (reading
    them syncs with the device); so are TensorFlow graph constants. Graph tensors, JAX tracers,
    variables and Keras symbolic tensors are not.
    """
    if isinstance(x, (int, float, np.ndarray, np.generic, list, tuple)):
        return np.asarray(x)
    if is_concrete(x):
        return keras.ops.convert_to_numpy(x)
    if TENSORFLOW and not isinstance(x, (keras.KerasTensor, keras.Variable)):
        try:
            return tf.get_static_value(x)  # None for variables
        except (TypeError, ValueError):
            return None
    return None


def is_concrete(x) -> bool:
    """Whether ``x`` is a backend tensor holding values: an eager TensorFlow tensor, a JAX
    array that is not a tracer, a PyTorch tensor outside ``torch.compile`` and Keras' shape
    inference. No copy is made."""
    if isinstance(x, (keras.KerasTensor, keras.Variable)):
        return False
    if NAME == "tensorflow":
        return isinstance(x, tf.Tensor) and not tf.is_symbolic_tensor(x)
    if NAME == "jax":
        import jax

        return isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
    import torch
    from keras.src.backend.common.symbolic_scope import in_symbolic_scope  # no public name

    # Keras infers shapes on torch with placeholder tensors ("meta" device, or ones inside its
    # symbolic scope): those are not values.
    return (
        isinstance(x, torch.Tensor)
        and not torch.compiler.is_compiling()
        and x.device.type != "meta"
        and not in_symbolic_scope()
    )


def in_shape_inference() -> bool:
    """Whether Keras is inferring shapes (``compute_output_spec``: placeholders, not values)."""
    from keras.src.backend.common.symbolic_scope import in_symbolic_scope  # no public name

    return in_symbolic_scope()


LOOPS_READ_HOST = NAME == "torch"
"""Whether ``keras.ops.while_loop`` / ``cond`` read their condition on the host: PyTorch runs
them in Python, one sync with the device per trip (TensorFlow and JAX compile them)."""


def read_flags(*flags) -> tuple[bool, ...]:
    """Several scalar bool tensors with values (eager) read on the host in ONE read: packed
    as the bits of one int32 on the device, then ``int()`` (one sync, 4 bytes; reading them
    one by one is a sync each on a GPU). At most 31 flags."""
    if len(flags) > 31:
        raise ValueError(f"read_flags packs at most 31 flags, got {len(flags)}.")
    bits = [keras.ops.cast(f, "int32") * (1 << i) for i, f in enumerate(flags)]
    packed = int(keras.ops.sum(keras.ops.stack(bits)))
    return tuple(bool(packed >> i & 1) for i in range(len(flags)))


@functools.cache
def compiles_for_gpu() -> bool:
    """Whether compiled programs run on a GPU here: JAX's default backend is a GPU, or
    TensorFlow sees one (it places ops there by default). False on PyTorch, whose eager ops
    need no such choice. Read once per process; kernels use it to pick, per shape, the
    variant with fewer kernel launches where launches dominate (a GPU runs a small problem's
    loop trips slower than a sort)."""
    if NAME == "jax":
        import jax

        return jax.default_backend() in ("gpu", "cuda", "rocm")
    if NAME == "tensorflow":
        return bool(tf.config.list_logical_devices("GPU"))
    return False


def in_graph_without_xla() -> bool:
    """Whether code is being traced into a TensorFlow graph that XLA will not compile (the
    one place where assertion ops run; under XLA they vanish, on JAX they do not exist)."""
    if NAME != "tensorflow":
        return False
    return not tf.executing_eagerly() and not in_xla_context()


def max_propagates_nan() -> bool:
    """Whether ``keras.ops.max`` / ``maximum`` return NaN for a NaN input here: TensorFlow's
    own kernels (``Max`` and ``Maximum`` use Eigen's ``PropagateNaN`` on CPU and GPU), eager
    or in a graph. Not relied on under XLA, on JAX or on PyTorch."""
    return TENSORFLOW and not in_xla_context()


def in_xla_context() -> bool:
    """Whether TensorFlow is tracing code that XLA will compile (``jit_compile=True``).

    On JAX and PyTorch this is False: there the question is only whether a value is known
    (:func:`static_value`), since neither has assertion ops.
    """
    if NAME != "tensorflow":
        return False
    from tensorflow.python.ops import control_flow_util  # no public equivalent

    if tf.executing_eagerly():
        return False
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def tape_recording() -> bool:
    """Whether a TensorFlow ``GradientTape`` is recording (False on JAX and PyTorch).

    ``tensorflow.python.eager.record`` (checked against TF 2.21): ``tf.GradientTape`` has no
    public query.
    """
    if NAME != "tensorflow":
        return False
    from tensorflow.python.eager import record  # no public equivalent (TF 2.21)

    return bool(record.could_possibly_record())


def stop_recording():
    """A context pausing every TensorFlow gradient tape (a no-op on JAX and PyTorch).

    ``tensorflow.python.eager.record`` (checked against TF 2.21): only a tape's own
    ``stop_recording`` is public, and the code that needs this does not hold the tape.
    """
    if NAME != "tensorflow":
        return contextlib.nullcontext()
    from tensorflow.python.eager import record  # no public equivalent (TF 2.21)

    return record.stop_recording()


def assert_all(condition, message: str, x):
    """``x`` depending on a graph assertion that ``condition`` (a bool tensor) holds
    everywhere. Only inside a TensorFlow graph without XLA; elsewhere ``x`` unchanged (eager
    values are checked on the host before, traced XLA code poisons with NaN instead)."""
    if not in_graph_without_xla():
        return x
    if condition.shape.rank != 0:
        condition = tf.reduce_all(condition)
    check = tf.debugging.Assert(condition, [message])
    with tf.control_dependencies([check]):
        return tf.identity(x)


def assert_finite(x, message: str):
    """``x`` checked for NaN and Inf inside a TensorFlow graph without XLA (one
    ``CheckNumerics`` op, cheaper than :func:`assert_all`'s three); elsewhere, and for
    non-float ``x``, ``x`` unchanged."""
    if not in_graph_without_xla() or not keras.backend.is_float_dtype(x.dtype):
        return x
    return tf.debugging.assert_all_finite(x, message)


# --------------------------------------------------------------------------------------------
# Float64


@contextlib.contextmanager
def enable_float64():
    """Float64 available inside the block: on JAX ``jax_enable_x64`` is turned on, then
    restored; elsewhere a no-op."""
    if NAME != "jax":
        yield
        return
    import jax

    previous = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


def require_float64(feature: str) -> None:
    """Raise RuntimeError naming ``feature`` when float64 is not available: JAX without
    ``jax_enable_x64`` silently computes float64 requests in float32."""
    if NAME != "jax":
        return
    import jax

    if not jax.config.read("jax_enable_x64"):
        raise RuntimeError(
            f"{feature} computes in float64, which JAX provides only with 64-bit mode on: run "
            "`jax.config.update('jax_enable_x64', True)` (or set JAX_ENABLE_X64=1) before "
            "building tensors."
        )


# --------------------------------------------------------------------------------------------
# keras.ops that lose float64 on PyTorch
#
# Keras 3.15's PyTorch backend promotes with ``dtypes.result_type`` on torch dtypes, which
# reads float64 as float32: ``ops.maximum``, ``minimum``, ``cumsum``, ``matmul`` and
# ``divide_no_nan`` (among others) of float64 tensors return float32 there. These
# replacements keep the inputs' dtype on PyTorch and are ``keras.ops`` elsewhere; kernels
# that compute in float64 (or accept float64 input) use them.


def _dtype_preserving(name, torch_fn=None, operands=2):
    """``keras.ops.<name>``, except on PyTorch: ``torch_fn`` (default ``torch.<name>``) on
    the first ``operands`` arguments promoted to one dtype (the rest, e.g. ``axis``, passed
    as they are)."""
    keras_fn = getattr(keras.ops, name)
    if NAME != "torch":
        return keras_fn
    import torch

    torch_fn = torch_fn or getattr(torch, name)

    @functools.wraps(keras_fn)
    def fn(*args, **kwargs):
        xs = [
            a if isinstance(a, (int, float)) else keras.ops.convert_to_tensor(a)
            for a in args[:operands]
        ]
        tensors = [x for x in xs if isinstance(x, torch.Tensor)]
        dtype = functools.reduce(torch.promote_types, [t.dtype for t in tensors])
        # Python numbers become 0-d host tensors, which torch uses with tensors on any
        # device (no copy to the device)
        xs = [
            x.to(dtype) if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=dtype) for x in xs
        ]
        return torch_fn(*xs, *args[operands:], **kwargs)

    return fn


def _torch_divide_no_nan(a, b):
    import torch

    return torch.where(b == 0, torch.zeros_like(a), a / torch.where(b == 0, 1, b))


def _torch_cumsum(x, axis=None):
    import torch

    return torch.cumsum(x.reshape(-1) if axis is None else x, dim=0 if axis is None else axis)


maximum = _dtype_preserving("maximum")
minimum = _dtype_preserving("minimum")
matmul = _dtype_preserving("matmul")
divide_no_nan = _dtype_preserving("divide_no_nan", _torch_divide_no_nan)
cumsum = _dtype_preserving("cumsum", _torch_cumsum, operands=1)


# --------------------------------------------------------------------------------------------
# Reductions that accept empty batches
#
# Keras 3.15's ``ops.max`` / ``ops.min`` raise "Cannot compute the max of an empty tensor"
# for any tensor with a zero-size axis on TensorFlow (eagerly, with an assertion that reads
# the size on the host at every call) and on PyTorch, even when the reduced axis is not
# empty: a batch of 0 rows then fails instead of giving 0 results. These reduce a [0, K]
# tensor over its class axis to [0] as JAX, XLA and NumPy do.


def _reduction(name, tf_fn, torch_name):
    keras_fn = getattr(keras.ops, name)
    if NAME == "jax":
        return keras_fn

    @functools.wraps(keras_fn)
    def fn(x, axis=None, keepdims=False):
        if axis is None:  # a reduction to one number: empty input has none (Keras' error)
            return keras_fn(x, axis=axis, keepdims=keepdims)
        if TENSORFLOW:
            return tf_fn(x, axis=axis, keepdims=keepdims)
        import torch

        x = keras.ops.convert_to_tensor(x)
        return getattr(torch, torch_name)(x, dim=axis, keepdim=keepdims)

    return fn


reduce_max = _reduction("max", tf.reduce_max if TENSORFLOW else None, "amax")
reduce_min = _reduction("min", tf.reduce_min if TENSORFLOW else None, "amin")


# --------------------------------------------------------------------------------------------
# Gathers without Keras' TensorFlow overhead
#
# Keras' TensorFlow ``take_along_axis`` / ``take`` cast indices to int64, broadcast both
# operands with dynamic shapes and rewrite negative indices on every call: extra ops inside
# hot loops. Kernels index with in-range, non-negative indices whose leading shape equals the
# data's, which is ``tf.gather`` with ``batch_dims`` (the op the TensorFlow kernels used).


def take_along_axis(x, indices, axis=-1):
    """``keras.ops.take_along_axis`` along the last axis, for ``indices`` with the leading
    shape of ``x`` and values in range; ``tf.gather(batch_dims=rank-1)`` on TensorFlow (an
    unknown leading size must be unknown on both sides: the same batch)."""
    rank = len(x.shape)
    same_rows = len(indices.shape) == rank and all(
        a == b for a, b in zip(indices.shape[:-1], x.shape[:-1])
    )
    if TENSORFLOW and axis in (-1, rank - 1) and same_rows:
        return tf.gather(x, indices, batch_dims=rank - 1)
    return keras.ops.take_along_axis(x, indices, axis=axis)


def take(x, indices, axis=None):
    """``keras.ops.take`` for in-range, non-negative ``indices``; ``tf.gather`` on
    TensorFlow."""
    if TENSORFLOW and axis is not None:
        return tf.gather(x, indices, axis=axis)
    return keras.ops.take(x, indices, axis=axis)


# --------------------------------------------------------------------------------------------
# Compiling


def no_autograph(fn):
    """``fn`` left as written when a ``tf.function`` traces it (AutoGraph would rewrite its
    Python control flow over static options); unchanged on other backends."""
    if TENSORFLOW:
        return tf.autograph.experimental.do_not_convert(fn)
    return fn


def jit_on_jax(fn, static_argnames=()):
    """``fn`` under a cached ``jax.jit`` on JAX (``static_argnames``: its Python options);
    unchanged elsewhere. For kernels with loops or branches called outside any ``jit``:
    JAX runs such a call op by op and compiles each ``while_loop`` / ``cond`` anew at every
    call (their bodies are new closures), 0.9-5 s per call at 64x512 on 2 cores; under one
    cached ``jit`` they compile once per shape (also under an eager ``jax.grad``). Inside a
    staged trace (``jax.jit``, ``jax.export``, Keras' compiled step) ``fn`` is called as it
    is: a nested ``jit`` there would add nothing, and TensorFlow could not load the exported
    StableHLO of a calibrated model that held one."""
    if NAME != "jax":
        return fn
    import jax

    jitted = jax.jit(fn, static_argnames=static_argnames)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        staged = any(
            isinstance(x, jax.core.Tracer) and _staged(x) for x in jax.tree_util.tree_leaves(args)
        )
        return (fn if staged else jitted)(*args, **kwargs)

    wrapper._cache_size = jitted._cache_size
    return wrapper


def _staged(tracer) -> bool:
    """Whether a JAX tracer (or one it wraps, under ``grad`` / ``vmap``) is being staged into
    a program rather than evaluated."""
    import jax

    while isinstance(tracer, jax.core.Tracer):
        if type(tracer).__name__ == "DynamicJaxprTracer":
            return True
        tracer = getattr(tracer, "primal", getattr(tracer, "val", None))
    return False


def compiled(fn, static_argnames=()):
    """``fn`` compiled by XLA and cached: ``tf.function(jit_compile=True)`` on TensorFlow,
    ``jax.jit`` on JAX (``static_argnames`` are Python options); unchanged on PyTorch."""
    if TENSORFLOW:
        return tf.function(fn, jit_compile=True, autograph=False)
    if NAME == "jax":
        import jax

        return jax.jit(fn, static_argnames=static_argnames)
    return fn


# --------------------------------------------------------------------------------------------
# Keras' and tf_keras' private names
#
# What losszoo reaches that Keras offers no public way to (each checked against Keras 3.15.1
# and tf_keras 2.21; :mod:`losszoo._keras_hooks` and :mod:`losszoo.registry` say why each is
# needed). A Keras release that moves one fails loudly: an ImportError naming it, pinned by
# tests/registry/test_keras_integration.py and the tf_keras metric tests.


def keras_trainer_classes():
    """``(Trainer, JAXTrainer)``: Keras 3's trainer base class, whose ``_compute_loss`` every
    backend's trainer calls, and the JAX trainer (None on other backends). ``Trainer`` is None
    when this Keras has no such module."""
    try:
        from keras.src.trainers.trainer import Trainer  # no public name (3.15.1)
    except ImportError:  # pragma: no cover - Keras layout changed
        Trainer = None
    if NAME != "jax":
        return Trainer, None
    from keras.src.backend.jax.trainer import JAXTrainer  # no public name (3.15.1)

    return Trainer, JAXTrainer


def keras_name_table(kind: str) -> dict:
    """The dict in which ``keras.losses.get`` (``kind="loss"``) or ``keras.metrics.get``
    (``"metric"``) looks a plain string up: ``ALL_OBJECTS_DICT`` of Keras 3's private
    ``keras.src.losses`` / ``keras.src.metrics`` (the global custom-object registry is read
    only for dict identifiers)."""
    import importlib

    module = {"loss": "keras.src.losses", "metric": "keras.src.metrics"}[kind]
    table = getattr(importlib.import_module(module), "ALL_OBJECTS_DICT", None)
    if not isinstance(table, dict):
        raise ImportError(
            f"losszoo cannot find {module}.ALL_OBJECTS_DICT in this Keras version "
            "(string lookup in compile() would not find losszoo names). Please report this "
            "together with your Keras version."
        )
    return table


def tf_keras_metric_globals() -> dict:
    """The globals of tf_keras' private ``tf_keras.src.metrics``, where ``tf_keras.metrics.get``
    instantiates a class it finds by name (a global custom object would be returned as it is,
    a class wrapped as a metric function). The caller has imported tf_keras (the kernels'
    import contract keeps tf_keras out of this module)."""
    import sys

    module = sys.modules.get("tf_keras.src.metrics")
    if module is None or not callable(getattr(module, "deserialize", None)):
        raise ImportError(
            "losszoo cannot find tf_keras.src.metrics in this tf_keras version (losszoo metric "
            "names would not work in tf_keras' compile()). Please report this together with "
            "your tf_keras version."
        )
    return vars(module)
