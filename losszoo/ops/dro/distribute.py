"""DRO risks of the global batch, and the cross-replica sums and gathers they use (spec
``shared/specs/safe_kl_dro.md``; kernels in the other modules of :mod:`losszoo.ops.dro`;
also importable as ``losszoo.ops.distribute``).

On JAX and PyTorch (``keras.distribution``) one program computes the global batch, so a batch
reduction is already global: every ``*_global`` op is its single-device op and the
cross-replica helpers are identities. The rest of this docstring is about TensorFlow's
``tf.distribute``, the one backend with a replica context.

Inside the replica context of a strategy with ``N > 1`` replicas, each ``*_global`` risk
computes the risk ``V`` of the global batch (every replica's examples) with cross-replica
sums or gathers in the forward pass only, and returns ``V / N`` with the exact gradient of
``V`` for this replica's examples: Keras (and any loop that sums the replicas' losses and
gradients) then gets exactly the value and gradient of one device with the global batch,
however unevenly the batch is split. Elsewhere (one replica, or a cross-replica context)
each is its single-device op.

Under a single-process ``MirroredStrategy`` the cross-replica sums and gathers are plain
copies inside ``merge_call``, not collective ops: TF starts every ``MirroredStrategy``'s
collective keys at the same numbers, so collectives under a second strategy in the same
process met the first strategy's gradient all-reduce at the same keys and aborted (issue 19
item 15). Other strategies (multi-worker) use collectives.
"""

from __future__ import annotations

from keras import ops

from losszoo import _backend
from losszoo.contract import check_bool, dtype_name, is_tensor
from losszoo.ops.dro import _risks as risks
from losszoo.ops.dro._risks import check_lam, check_rho

__all__ = [
    "check_lam",
    "check_rho",
    "cvar_risk_global",
    "in_replica_context",
    "kl_dro_batch_lse_global",
    "kl_dro_sumexp_global",
    "num_replicas",
    "replica_gather",
    "replica_max",
    "replica_sum",
    "safe_kl_dro_risk_and_stats_global",
]


# ----------------------------------------------------------------------------- collectives
def num_replicas() -> int:
    """Replicas in sync of the current ``tf.distribute`` strategy (1 without one, and on JAX
    and PyTorch)."""
    if not _backend.TENSORFLOW:
        return 1
    return _tf.distribute.get_strategy().num_replicas_in_sync


def in_replica_context() -> bool:
    """Whether the code runs in a replica context of a strategy with more than one replica."""
    return num_replicas() > 1 and _tf.distribute.get_replica_context() is not None


def _cross_replica(values, combine, collective):
    """Combine a list of per-replica tensors across replicas (identity without distribution):
    by ``combine`` on the local copies inside ``merge_call`` under a single-process
    ``MirroredStrategy`` (see the module docstring), else by ``collective(ctx, values)``."""
    if not in_replica_context():  # one replica, or a cross-replica context (symbolic build)
        return values
    ctx = _tf.distribute.get_replica_context()
    strategy = _tf.distribute.get_strategy()
    use_merge = getattr(strategy.extended, "_use_merge_call", lambda: True)()
    if isinstance(strategy, _tf.distribute.MirroredStrategy) and use_merge:
        return ctx.merge_call(
            lambda s, *vs: [combine(list(s.experimental_local_results(v))) for v in vs],
            args=tuple(values),
        )
    return collective(ctx, values)


def replica_sum(values):
    """Sum a list of tensors across replicas (identity without distribution)."""
    return _cross_replica(
        values,
        lambda parts: _tf.add_n(parts),
        lambda ctx, vs: ctx.all_reduce(_tf.distribute.ReduceOp.SUM, vs),
    )


def replica_gather(values):
    """Concatenate a tensor (or each of a list of tensors) of every replica along axis 0, in
    replica order (identity without distribution)."""
    flat = values if isinstance(values, list) else [values]
    out = _cross_replica(
        flat,
        lambda parts: ops.concatenate(parts, 0),
        lambda ctx, vs: [ctx.all_gather(v, axis=0) for v in vs],
    )
    return out if isinstance(values, list) else out[0]


def replica_max(value):
    """The maximum of a scalar over the replicas (``value`` itself with one replica)."""
    if num_replicas() == 1:
        return value
    return ops.max(replica_gather(ops.reshape(value, [1])))


def _replica_any(flag, dtype):
    """A scalar bool that is true on every replica if it is true on any (``None`` stays)."""
    if flag is None:
        return None
    return replica_sum([ops.cast(flag, dtype)])[0] > 0


def _global_share(fn, l):
    """``V / N`` with the gradient ``g``, where ``fn(l)`` returns the global-batch risk ``V``
    (the same on every replica) and its exact gradient ``g = dV/dl`` for this replica's
    losses. No collective runs in the backward pass."""
    inv_n = 1.0 / num_replicas()

    @_backend.custom_gradient
    def share(l):
        value, g = fn(l)

        def grad(dv):
            return dv * g

        return value * ops.convert_to_tensor(inv_n, dtype_name(value)), grad

    return share(l)


def _shown_as(x, shown):
    """``shown`` as the value, with the gradient of ``x`` (``shown`` gets none)."""
    shown = ops.stop_gradient(ops.cast(shown, dtype_name(x)))

    @_backend.custom_gradient
    def f(x):
        return ops.copy(shown), lambda dv: dv

    return f(x)


_tf = _backend.tf if _backend.TENSORFLOW else None  # tf.distribute: TensorFlow only


# ----------------------------------------------------------------------------- global risks
def kl_dro_batch_lse_global(losses, lam, sample_weight=None):
    """:func:`losszoo.ops.kl_dro_batch_lse` of the global batch (shared max shift, summed
    parts); ``V / N`` per replica as the module docstring describes:
    ``V = lam log sum_i pi_i exp(l_i/lam)`` over the global batch.

    Args:
      losses: this replica's per-example losses, any shape (flattened).
      lam: temperature, Python float, finite and > 0.
      sample_weight: optional weights, finite and >= 0, a scalar or broadcastable over a
        prefix of the losses' shape (``pi_i`` normalised by the global weight sum).

    Returns:
      Scalar risk in the losses' dtype: the global batch's ``V / N`` in a replica context,
      else ``V`` of this batch.

    Example:
      >>> float(losszoo.ops.kl_dro_batch_lse_global([0.0, 0.0], lam=1.0))  # one replica
      0.0
    """
    if not in_replica_context():
        return risks.kl_dro_batch_lse(losses, lam, sample_weight)
    lam = check_lam(lam)
    l, s, original, bad = risks.prepare(losses, sample_weight)
    bad = _replica_any(risks.any_flag(bad, risks.live_nan(l, s)), dtype_name(l))

    def fn(l):
        val, ex, tot = risks.batch_lse_terms(l, s, lam, replica_max, replica_sum)
        return risks.poison(bad, val), risks.poison(bad, ops.divide_no_nan(ex, tot))

    return ops.cast(_global_share(fn, l), original)


def kl_dro_sumexp_global(losses, lam, sample_weight=None):
    """:func:`losszoo.ops.kl_dro_sumexp` of the global batch (``pi`` normalised by the global
    weight sum); ``V / N`` per replica as the module docstring describes:
    ``V = sum_i pi_i exp(l_i/lam)`` over the global batch.

    Args:
      losses: this replica's per-example losses, any shape (flattened).
      lam: temperature, Python float, finite and > 0.
      sample_weight: optional weights, finite and >= 0, a scalar or broadcastable over a
        prefix of the losses' shape (``pi_i`` normalised by the global weight sum).

    Returns:
      Scalar objective in the losses' dtype: the global batch's ``V / N`` in a replica context,
      else ``V`` of this batch.

    Example:
      >>> float(losszoo.ops.kl_dro_sumexp_global([0.0, 0.0], lam=1.0))  # one replica
      1.0
    """
    if not in_replica_context():
        return risks.kl_dro_sumexp(losses, lam, sample_weight)
    lam = check_lam(lam)
    l, s, original, bad = risks.prepare(losses, sample_weight)
    bad = _replica_any(bad, dtype_name(l))
    inv_lam = ops.convert_to_tensor(1.0 / lam, dtype_name(l))

    def fn(l):
        # as on one device: overflow, +inf or NaN anywhere in the global batch: no gradient
        val, pi, ex, unusable = risks.sumexp_terms(l, s, inv_lam, bad, replica_sum)
        return val, risks.poison(unusable, pi * ex * inv_lam)

    return ops.cast(_global_share(fn, l), original)


def cvar_risk_global(losses, rho, sample_weight=None):
    """:func:`losszoo.ops.cvar_risk` of the global batch: the tail masses come from the
    all-gathered losses in replica order (ties split as on one device), each replica keeps
    its own slice; ``V / N`` per replica as the module docstring describes:
    ``V = min_a a + (1/rho) sum_i pi_i (l_i - a)_+`` over the global batch.

    Args:
      losses: this replica's per-example losses, any shape (flattened).
      rho: tail level, Python float in (0, 1).
      sample_weight: optional weights, finite and >= 0, a scalar or broadcastable over a
        prefix of the losses' shape (``pi_i`` normalised by the global weight sum).

    Returns:
      Scalar risk in the losses' dtype: the global batch's ``V / N`` in a replica context,
      else ``V`` of this batch.

    Example:
      >>> float(losszoo.ops.cvar_risk_global([1.0, 2.0, 3.0, 4.0], rho=0.5))  # one replica
      3.5
    """
    if not in_replica_context():
        return risks.cvar_risk(losses, rho, sample_weight)
    rho = check_rho(rho)
    l, s, original, bad = risks.prepare(losses, sample_weight)
    bad = _replica_any(risks.any_flag(bad, risks.live_nan(l, s)), dtype_name(l))
    replica = _tf.distribute.get_replica_context().replica_id_in_sync_group
    n_local = _tf.shape(l)[:1]
    sizes, l_all, s_all = replica_gather([n_local, ops.stop_gradient(l), s])
    offset = ops.sum(sizes[:replica])
    q = _tf.slice(risks.cvar_tail_mass(l_all, s_all, rho), offset[None], n_local)
    q = ops.stop_gradient(q)
    inv_rho = ops.convert_to_tensor(1.0 / rho, dtype_name(l))

    def fn(l):
        (val,) = replica_sum([ops.sum(ops.where(q > 0, q * l, ops.zeros_like(l)))])
        return risks.poison(bad, val * inv_rho), risks.poison(bad, q * inv_rho)

    return ops.cast(_global_share(fn, l), original)


def _solve_alpha_if(solve, losses, sample_weight, lam, rho, dtype):
    """The optimal alpha of ``losses`` where ``solve`` (a scalar bool tensor), else 0."""
    return ops.cond(
        solve,
        lambda: ops.cast(risks.safe_kl_dro_solve_alpha(losses, lam, rho, sample_weight), dtype),
        lambda: ops.zeros([], dtype),
    )


# On JAX outside any ``jit``: one cached program per shape (the ``cond`` of new closures was
# compiled anew at every training step).
_SOLVE_ALPHA_IF = _backend.jit_on_jax(_solve_alpha_if, static_argnames=("lam", "rho", "dtype"))


def safe_kl_dro_risk_and_stats_global(
    losses, alpha, lam, rho, sample_weight=None, calibrate=True, solve_alpha=None
):
    """:func:`losszoo.ops.safe_kl_dro_risk_and_stats` of the global batch, for a trainer
    that owns ``alpha`` (the safe-KL loss): ``alpha`` is used as given, not checked (a
    non-finite alpha gives a non-finite value).

    With more than one replica the value is this replica's share of the global weighted
    mean (gradient) shown as ``V / N`` (value), and the statistics are those of the global
    batch (all-reduced sums; ``saturation`` the replicas' maximum).

    Args:
      losses, lam, rho, sample_weight, calibrate: as for :func:`losszoo.ops.safe_kl_dro_risk`.
      alpha: scalar tensor (its dtype is kept for ``stats["alpha"]``) or Python number.
      solve_alpha: ``None``, or a scalar bool tensor: where true, ``alpha`` is replaced by
        the optimal alpha of the global batch (:func:`losszoo.ops.safe_kl_dro_solve_alpha`
        on the all-gathered batch, run only then by an ``ops.cond``, no gradient).

    Returns:
      ``(value, stats)``: ``stats`` holds ``mean_w``, ``saturation``, ``grad_alpha`` and
      ``curvature`` as :func:`losszoo.ops.safe_kl_dro_risk_and_stats` gives them, plus
      ``alpha`` (the alpha used) and ``total_weight`` (``sum s``, the example count without
      weights, over the global batch).
    """
    lam, rho = check_lam(lam), check_rho(rho)
    calibrate = check_bool(calibrate, "calibrate")
    l, s, original, bad = risks.prepare(losses, sample_weight, ones=False)
    dt = dtype_name(l)
    alpha = ops.convert_to_tensor(alpha) if is_tensor(alpha) else risks.scalar_alpha(alpha, dt)
    if solve_alpha is not None:
        # No cross-replica synchronisation is allowed inside the cond, so the global batch
        # is all-gathered before it (every replica then solves the same global problem).
        l_all = replica_gather(ops.stop_gradient(l))
        s_all = None if s is None else replica_gather(s)
        with _backend.stop_recording():  # keeps XLA free of cond gradients
            solved = _SOLVE_ALPHA_IF(solve_alpha, l_all, s_all, lam, rho, dtype_name(alpha))
        alpha = ops.where(solve_alpha, solved, alpha)
    value, stats = risks.risk_and_stats(
        l, risks.scalar_alpha(alpha, dt), s, bad, lam, rho, calibrate
    )
    total = ops.cast(ops.size(l), dt) if s is None else ops.sum(s)
    if num_replicas() > 1:
        mean_w, curv = stats["mean_w"], stats["curvature"]
        sw_glob, s_glob, sc_glob, v_glob = replica_sum(
            [mean_w * total, total, curv * total, ops.where(total > 0, value * total, 0.0)]
        )
        saturation = replica_max(stats["saturation"])
        value = _shown_as(
            value * ops.divide_no_nan(total, s_glob),
            ops.divide_no_nan(v_glob, s_glob) / num_replicas(),
        )
        mean_w = ops.divide_no_nan(sw_glob, s_glob)
        stats = {
            "mean_w": mean_w,
            "saturation": saturation,
            "grad_alpha": ops.where(s_glob > 0, 1.0 - mean_w, ops.zeros_like(mean_w)),
            "curvature": ops.divide_no_nan(sc_glob, s_glob),
        }
        total = s_glob
    return ops.cast(value, original), {**stats, "alpha": alpha, "total_weight": total}
