"""``possibilistic_projection``: ``p* = argmin_{p in F(pi)} KL(p || softmax(z))``.

Orchestration: validate (contract rules ``LOGITS`` and ``POSSIBILITY``), build the
constraints, run the interior point (default, certified) or Dykstra, certify every row on
the original constraints (:mod:`._certificates`), finish uncertified rows by warm-started
Dykstra, short-circuit trivial rows (no strict drop: uniform on the support; support <= 1 or
invalid: ``q``). Float64 throughout: on JAX it needs ``jax_enable_x64`` (a RuntimeError
says so otherwise). Derivation: ``docs/design/possibilistic_solver.md``.
"""

from __future__ import annotations

import warnings

import numpy as np
from keras import ops

from losszoo import _backend
from losszoo._backend import maximum, no_autograph
from losszoo.contract import LOGITS, POSSIBILITY, nan_where, row_has_nan
from losszoo.ops.possibilistic._certificates import _violation_and_gap
from losszoo.ops.possibilistic._config import (
    F64,
    STOPPING_CODE,
    ProjectionConfig,
    ProjectionInfo,
    resolve_config,
)
from losszoo.ops.possibilistic._constraints import (
    PossibilityConstraints,
    constraints_2d,
    sanitize,
    unsort,
)
from losszoo.ops.possibilistic._dykstra import DYKSTRA_JIT, dykstra_core
from losszoo.ops.possibilistic._inputs import prepare
from losszoo.ops.possibilistic._interior_point import IPM_JIT, _ipm_solve


def finish_info(info: ProjectionInfo, restore) -> ProjectionInfo:
    """Back to the leading dims; an eager RuntimeWarning when a valid row's projection was
    not certified."""
    info = ProjectionInfo(*(restore(t) for t in info))
    valid, converged = _backend.static_value(info.valid), _backend.static_value(info.converged)
    if valid is None or converged is None:
        return info
    bad = valid & ~converged
    if bad.any():
        worst = float(np.max(np.where(bad, _backend.static_value(info.residual), 0.0)))
        warnings.warn(
            f"possibilistic projection: {int(bad.sum())} row(s) not certified (worst residual "
            f"{worst:.3g}); see info.converged / info.residual (raise `max_cycles`).",
            RuntimeWarning,
            stacklevel=3,
        )
    return info


def _project_2d(lq_full, cons: PossibilityConstraints, cfg: ProjectionConfig, jit):
    """lq_full [B, K] float64 log q (normalised on the support). Returns p [B, K], info."""
    k = lq_full.shape[-1]
    batch = ops.shape(lq_full)[0]
    valid = cons.valid
    if k == 1:
        zeros = ops.zeros([batch], F64)
        never = ops.zeros([batch], "int32")
        info = ProjectionInfo(
            never, never, zeros, zeros, zeros, valid, valid, ops.zeros([batch, 3, 0], F64)
        )
        return ops.exp(lq_full), info
    order = cons.order
    pt = cons.sorted_possibility
    in_support = pt > 0.0
    lq = ops.where(
        in_support, maximum(_backend.take_along_axis(lq_full, order), np.log(cfg.q_clip)), -np.inf
    )
    m = _backend.reduce_max(lq, axis=-1, keepdims=True)
    lq = lq - (m + ops.log(ops.sum(ops.exp(lq - m), axis=-1, keepdims=True)))
    n = cons.num_support
    has_strict = ops.any(cons.strict, axis=-1)
    run = valid & (n >= 2) & has_strict
    pt_next = pt[:, 1:]
    ratio = ops.where(
        cons.active,
        cons.dominance_bound / ops.where(cons.active, pt_next, 1.0),
        ops.ones_like(pt_next),
    )
    tm = ops.transpose
    cst = {
        "pt_next": tm(pt_next),
        "ratio": tm(ratio),
        "lo": tm(cons.gap_lower),
        "up": tm(cons.gap_upper),
        "act": tm(cons.active),
    }
    tol = ops.convert_to_tensor(cfg.tol, F64)
    gap_tol = ops.convert_to_tensor(cfg.gap_tol, F64)

    def dykstra(rows, stopping_code, lam_init=None, finish=False):
        """Certified / paper / fixed Dykstra on ``rows``: ``(x, lam, cycles, (V, gap))``."""
        return (DYKSTRA_JIT if jit else dykstra_core)(
            tm(lq),
            cst,
            rows,
            tol,
            gap_tol,
            ops.convert_to_tensor(cfg.max_cycles, "int32"),
            ops.convert_to_tensor(stopping_code, "int32"),
            lam_init,
            finish=finish,
        )

    # Short-circuits: no strict drop -> uniform on the support; n <= 1 or invalid -> q.
    uniform = ops.where(in_support, 1.0 / ops.cast(maximum(n, 1), F64)[:, None], 0.0)
    trivial = ops.where((valid & (n >= 2) & ~has_strict)[:, None], uniform, ops.exp(lq))
    x_trivial = tm(ops.log(trivial))
    zero_lam = ops.zeros_like(ops.stack([cst["lo"]] * 3))

    def certificates(points, lams, lqs):
        """(V, gap) of several candidates [K, B] each in one certificate on [K, n B]: one
        copy of its program instead of one per candidate (uniform / q rows are exact by
        construction: they get ``lam = 0`` and ``log q`` = the point itself)."""
        cat = ops.concatenate
        cst_n = {key: cat([val] * len(points), 1) for key, val in cst.items()}
        lam_n = cat(lams, 2)
        v, gap = _violation_and_gap(cat(points, 1), *ops.unstack(lam_n), cst_n, lq=cat(lqs, 1))
        return ops.split(v, len(points)), ops.split(gap, len(points))

    if cfg.solver == "interior_point":
        x_primal, x_dual, lam, iterations = (IPM_JIT if jit else _ipm_solve)(
            lq, cons, run, tol, gap_tol
        )
        # The dual point when it certifies (exact on degenerate rows, where the primal
        # converges like sqrt(mu)), else the primal iterate when it does; the certificate of
        # the trivial rows' point in the same call.
        (v_d, v_p, v_t), (gap_d, gap_p, gap_t) = certificates(
            [x_dual, x_primal, x_trivial], [lam, lam, zero_lam], [tm(lq), tm(lq), x_trivial]
        )
        dual_ok = (v_d <= cfg.tol) & (ops.abs(gap_d) <= cfg.gap_tol)
        primal_ok = (v_p <= cfg.tol) & (ops.abs(gap_p) <= cfg.gap_tol)
        x = ops.where(dual_ok[None, :], x_dual, x_primal)
        v = ops.where(run, ops.where(dual_ok, v_d, v_p), v_t)
        gap = ops.where(run, ops.where(dual_ok, gap_d, gap_p), gap_t)
        # Rows neither certifies (float64 exhausted near the solution) are finished by
        # certified Dykstra warm-started from the interior-point multipliers.
        finish = run & ~(dual_ok | primal_ok)

        def dykstra_finish():
            x2, lam2, cycles, (v2, gap2) = dykstra(finish, 1, tuple(ops.unstack(lam)), True)
            return (
                ops.where(finish[None, :], x2, x),
                ops.where(finish[None, None, :], lam2, lam),
                cycles,
                ops.where(finish, v2, v),
                ops.where(finish, gap2, gap),
            )

        x, lam, cycles, v, gap = ops.cond(
            ops.any(finish), dykstra_finish, lambda: (x, lam, ops.zeros([batch], "int32"), v, gap)
        )
    else:
        x, lam, cycles, _ = dykstra(run, STOPPING_CODE[cfg.stopping])
        iterations = cycles
        (v, v_t), (gap, gap_t) = certificates([x, x_trivial], [lam, zero_lam], [tm(lq), x_trivial])
        v, gap = ops.where(run, v, v_t), ops.where(run, gap, gap_t)
    p_sorted = ops.where(run[:, None], ops.exp(tm(x)), trivial)
    lam = ops.where(run[None, None, :], lam, ops.zeros_like(lam))  # [3, m1, B]
    converged = v <= cfg.tol
    if cfg.stopping != "paper":
        converged = converged & (ops.abs(gap) <= cfg.gap_tol)
    sg = ops.stop_gradient
    info = ProjectionInfo(
        iterations=sg(iterations),
        cycles=sg(cycles),
        max_violation=sg(v),
        duality_gap=sg(gap),
        residual=sg(maximum(v, ops.abs(gap))),
        converged=sg(converged & valid),
        valid=valid,
        multipliers=sg(ops.transpose(lam, (2, 0, 1))),
    )
    return sg(unsort(p_sorted, order)), info


# On JAX outside any ``jit`` (Keras' ``jit_compile=False``), the whole projection as one cached
# program per shape: run op by op, the finish's ``cond`` was compiled anew at every call (about
# 1 s per training step at [16, 3] on 2 cores). Unchanged on the other backends.
_PROJECT_2D_JAX = _backend.jit_on_jax(_project_2d, static_argnames=("cfg", "jit"))


def projection_from_z(z64, pi64, cfg, jit):
    """z64 [B, K] float64 logits (may carry a gradient) -> (p*, info, masked z).

    In 'restrict' mode ``z`` is masked to the support. Rows breaking the rules (and, in
    'restrict' mode, rows whose whole support is masked by -inf) are NaN and not valid.
    """
    if z64.shape[0] == 0:  # no rows: the solver's loops index one, so solve a dummy row
        one = (1, z64.shape[1])
        p, info, _ = projection_from_z(ops.zeros(one, F64), ops.ones(one, F64), cfg, jit)
        return p[:0], ProjectionInfo(*(field[:0] for field in info)), z64
    zm = z64
    if cfg.support_mode == "restrict":
        pi, valid = sanitize(pi64)
        zm = ops.where((pi > 0.0) | ~valid[:, None], z64, -np.inf)
    lq = ops.log_softmax(zm, axis=-1)
    cons = constraints_2d(pi64, cfg)
    p, info = (_PROJECT_2D_JAX if jit else _project_2d)(ops.stop_gradient(lq), cons, cfg, jit)
    invalid = POSSIBILITY.invalid(pi64) | LOGITS.invalid(z64) | row_has_nan(lq)
    info = info._replace(valid=info.valid & ~invalid, converged=info.converged & ~invalid)
    return nan_where(invalid[:, None], p), info, zm


@no_autograph
def possibilistic_projection(
    logits,
    possibility,
    config: ProjectionConfig | None = None,
    *,
    jit: bool = True,
    **options,
):
    """KL projection ``p* = argmin_{p in F(pi)} KL(p || q)``, ``q = softmax(logits)``.

    Solved in float64 and batched over examples with different ``pi``: by default
    (``stopping="certified"``) with the interior-point solver on the tie-reduced chain (a
    closed form for two-block rows such as one-hot labels), each row certified on the
    original constraints by the exact duality gap and finished by warm-started Dykstra only
    where the interior point cannot certify it; ``method="dykstra"`` (and the ``"paper"`` /
    ``"fixed"`` rules) runs Dykstra's algorithm with KL projections in its
    one-scalar-per-constraint dual form (spec 2.4). The constraints are those of
    :func:`possibility_constraints`; derivations in ``docs/design/possibilistic_solver.md``.

    The projection is a *target*: no gradient flows through it (spec 4); use
    :func:`possibilistic_projection_loss` for the loss ``KL(p* || q)`` whose exact gradient
    is ``softmax(z) - p*``.

    Args:
      logits: ``[..., K]`` logits or log-probabilities (``log_softmax`` is applied, so both
        give the same ``q``). Rows must keep ``contract.LOGITS`` (``-inf`` masks a class).
        Leading dims may be unknown at trace time (TensorFlow), ``K`` must be static.
      possibility: ``[..., K]`` possibility degrees; rows must keep
        ``contract.POSSIBILITY`` (values in ``[0, 1]``, maximum 1).
      config: a :class:`ProjectionConfig` (tolerances, stopping rule, constraint options,
        solver); default ``ProjectionConfig()``.
      jit: run the iterations in a cached XLA function (TensorFlow ``jit_compile``,
        ``jax.jit``; PyTorch runs them eagerly).
      **options: instead of ``config``, its fields as keywords (``tol=1e-6, eps_cap=0.05``).

    Returns:
      ``(projection, info)``: ``projection`` has the shape and floating dtype of the logits
      (float32 for integer input); ``info`` is a :class:`ProjectionInfo` of ``[...]``
      tensors (iterations, cycles, max_violation, duality_gap, residual, converged, valid,
      multipliers).

    Raises:
      ValueError: naming ``logits`` / ``possibility`` for rows breaking their rule (eagerly;
        a graph assertion in TensorFlow graphs; traced under XLA / ``jax.jit`` those rows
        are NaN), or naming an option outside its range.
      RuntimeError: on JAX without ``jax_enable_x64``.

    Example:
      >>> p, info = possibilistic_projection(np.log([[0.48, 0.261, 0.259]]),
      ...                                    [[1.0, 0.51, 0.5]])
      >>> keras.ops.convert_to_numpy(p).round(6)
      array([[0.49    , 0.255981, 0.254019]])
    """
    cfg = resolve_config(config, options)
    z64, pi64, restore, dtype = prepare(
        "possibilistic_projection", logits, possibility, "possibility", POSSIBILITY
    )
    p, info, _ = projection_from_z(ops.stop_gradient(z64), pi64, cfg, jit)
    return ops.cast(restore(p), dtype), finish_info(info, restore)
