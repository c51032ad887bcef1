"""``possibilistic_projection``: ``p* = argmin_{p in F(pi)} KL(p || softmax(z))``.

Orchestration: validate (contract rules of :mod:`._inputs`), build the constraints, run the
interior point (default, certified) or Dykstra, certify every row on the original constraints
(:mod:`._certificates`), finish uncertified rows by warm-started Dykstra, short-circuit
trivial rows (no strict drop: uniform on the support; support <= 1 or invalid: ``q``).
Derivation: ``docs/design/possibilistic_solver.md``.
"""

from __future__ import annotations

import warnings

import numpy as np
import tensorflow as tf

from losszoo.contract import nan_where, row_has_nan
from losszoo.ops.possibilistic._certificates import _violation_and_gap
from losszoo.ops.possibilistic._config import (
    _F64,
    _STOPPING_CODE,
    ProjectionConfig,
    _check_compute_dtype,
)
from losszoo.ops.possibilistic._constraints import (
    PossibilityConstraints,
    _constraints_2d,
    _sanitize,
    _unsort,
)
from losszoo.ops.possibilistic._dykstra import _run_core
from losszoo.ops.possibilistic._inputs import (
    _as_float,
    _check_same_shape,
    _flatten,
    _logits_invalid,
    _possibility_invalid,
    _validate_logits,
    _validate_possibility,
)
from losszoo.ops.possibilistic._interior_point import _IPM_JIT, _IPM_MAX_ITER, _ipm_solve


def _warn_uncertified(info):
    """Eager RuntimeWarning when a valid row's projection was not certified."""
    if not tf.executing_eagerly():
        return
    bad = info["valid"] & ~info["converged"]
    if bool(tf.reduce_any(bad)):
        n = int(tf.reduce_sum(tf.cast(bad, tf.int32)))
        worst = float(tf.reduce_max(tf.where(bad, info["residual"], 0.0)))
        warnings.warn(
            f"possibilistic projection: {n} row(s) not certified (worst residual {worst:.3g}); "
            "see info['converged'] / info['residual'] (raise `max_cycles`).",
            RuntimeWarning,
            stacklevel=4,
        )


def _project_2d(
    lq_full,
    cons: PossibilityConstraints,
    cfg: ProjectionConfig,
    unroll_max_k,
    jit,
):
    """lq_full [B, K] float64 log q (normalised on the support). Returns p [B, K], info."""
    tol, gap_tol, max_cycles, stopping = cfg.tol, cfg.gap_tol, cfg.max_cycles, cfg.stopping
    k = lq_full.shape[-1]
    m1 = k - 1
    batch = tf.shape(lq_full)[0]
    valid = cons.valid
    if m1 == 0:
        p = tf.exp(lq_full)
        zeros = tf.zeros([batch], _F64)
        info = {
            "iterations": tf.zeros([batch], tf.int32),
            "cycles": tf.zeros([batch], tf.int32),
            "residual": zeros,
            "max_violation": zeros,
            "duality_gap": zeros,
            "converged": valid,
            "valid": valid,
            "lambda": tf.zeros([batch, 3, 0], _F64),
        }
        return p, info
    order = cons.order
    pt = cons.sorted_possibility
    in_support = pt > 0.0
    lq = tf.gather(lq_full, order, batch_dims=1)
    neg_inf = tf.constant(-np.inf, _F64)
    lq = tf.where(in_support, tf.maximum(lq, np.log(cfg.q_clip)), neg_inf)
    m = tf.reduce_max(lq, axis=-1, keepdims=True)
    lq = lq - (m + tf.math.log(tf.reduce_sum(tf.exp(lq - m), axis=-1, keepdims=True)))
    n = cons.num_support
    has_strict = tf.reduce_any(cons.strict, axis=-1)
    run = valid & (n >= 2) & has_strict
    pt_next = pt[:, 1:]
    ratio = tf.where(
        cons.active,
        cons.dominance_bound / tf.where(cons.active, pt_next, 1.0),
        tf.ones_like(pt_next),
    )

    def tm(t):
        return tf.transpose(t)

    cst = {
        "pt_next": tm(pt_next),
        "lo": tm(cons.gap_lower),
        "up": tm(cons.gap_upper),
        "act": tm(cons.active),
    }

    def dykstra(rows, stopping_code, lam_init=None, compact=True):
        """Certified / paper / fixed Dykstra on ``rows``: ``(x, lam, cycles)``."""
        x, lam, cycles, _, _ = _run_core(
            tm(lq),
            tm(pt_next),
            tm(ratio),
            tm(cons.gap_lower),
            tm(cons.gap_upper),
            tm(cons.active),
            rows,
            tf.constant(tol, _F64),
            tf.constant(gap_tol, _F64),
            tf.constant(max_cycles, tf.int32),
            tf.constant(stopping_code, tf.int32),
            unroll=bool(k <= unroll_max_k),
            jit=jit,
            lam_init=lam_init,
            compact=compact,
        )
        return x, lam, cycles

    if cfg.solver == "interior_point":
        fn = _IPM_JIT if jit else _ipm_solve
        x_primal, x_dual, lam, iterations = fn(
            lq,
            pt,
            cons.strict,
            cons.gap_lower,
            cons.gap_upper,
            in_support,
            run,
            tf.constant(tol, _F64),
            tf.constant(gap_tol, _F64),
            tf.constant(_IPM_MAX_ITER, tf.int32),
        )
        # The dual point when it certifies (exact on degenerate rows, where the primal
        # converges like sqrt(mu)), else the primal iterate when it does.
        certified = []
        for cand in (x_dual, x_primal):
            v0, gap0 = _violation_and_gap(cand, lam[0], lam[1], lam[2], cst, lq=tm(lq))
            certified.append((v0 <= tol) & (tf.abs(gap0) <= gap_tol))
        x = tf.where(certified[0][None, :], x_dual, x_primal)
        # Rows neither certifies (float64 exhausted near the solution) are finished by
        # certified Dykstra warm-started from the interior-point multipliers.
        finish = run & ~(certified[0] | certified[1])

        def dykstra_finish():
            x2, lam2, cycles = dykstra(finish, 1, tuple(tf.unstack(lam)), compact=False)
            return (
                tf.where(finish[None, :], x2, x),
                tf.where(finish[None, None, :], lam2, lam),
                cycles,
            )

        x, lam, cycles = tf.cond(
            tf.reduce_any(finish), dykstra_finish, lambda: (x, lam, tf.zeros([batch], tf.int32))
        )
    else:
        x, lam, cycles = dykstra(run, _STOPPING_CODE[stopping])
        iterations = cycles
    x = tf.transpose(x)
    # Short-circuits: no strict drop -> uniform on the support; n <= 1 or invalid -> q.
    uniform = tf.where(in_support, 1.0 / tf.cast(tf.maximum(n, 1), _F64)[:, None], 0.0)
    p_sorted = tf.where(run[:, None], tf.exp(x), tf.exp(lq))
    p_sorted = tf.where((valid & (n >= 2) & ~has_strict)[:, None], uniform, p_sorted)
    lam = tf.where(run[None, None, :], lam, tf.zeros_like(lam))  # [3, m1, B]
    # Diagnostics of the returned point (uniform / q rows included: they are exact by
    # construction, so only the projected rows get the KL(p || p(lam)) term of the gap).
    v, gap = _violation_and_gap(
        tf.transpose(tf.math.log(p_sorted)),
        lam[0],
        lam[1],
        lam[2],
        cst,
        lq=tf.where(run[None, :], tm(lq), tf.math.log(tm(p_sorted))),
    )
    if stopping == "paper":
        converged = v <= tol
    else:
        converged = (v <= tol) & (tf.abs(gap) <= gap_tol)
    p = _unsort(p_sorted, order)
    info = {
        "iterations": tf.stop_gradient(iterations),
        "cycles": tf.stop_gradient(cycles),
        "residual": tf.stop_gradient(tf.maximum(v, tf.abs(gap))),
        "max_violation": tf.stop_gradient(v),
        "duality_gap": tf.stop_gradient(gap),
        "converged": tf.stop_gradient(converged & valid),
        "valid": valid,
        "lambda": tf.stop_gradient(tf.transpose(lam, [2, 0, 1])),
    }
    return tf.stop_gradient(p), info


def _log_q(z, support=None):
    """log softmax of float64 logits, optionally restricted to ``support`` (bool)."""
    if support is not None:
        z = tf.where(support, z, tf.constant(-np.inf, _F64))
    return tf.nn.log_softmax(z, axis=-1), z


def _support_of(possibility2d, support_mode):
    if support_mode != "restrict":
        return None
    pi, valid = _sanitize(possibility2d)
    return (pi > 0.0) | ~valid[:, None]


def _prepare(logits, possibility):
    z = _as_float(logits, "logits")
    pi = tf.stop_gradient(_as_float(possibility, "possibility"))
    _check_same_shape(z, pi, "logits", "possibility")
    z2, restore = _flatten(z, "logits")
    pi2, _ = _flatten(pi, "possibility", k=z2.shape[-1])
    z2 = _validate_logits(z2, "logits")
    pi2 = _validate_possibility(pi2, "possibility")
    return z, z2, tf.cast(pi2, _F64), restore


def _projection_from_z(z2, pi2, cfg, unroll_max_k, jit):
    """z2 [B, K] float64 logits (may carry a tape) -> (p*, info, masked z, log q)."""
    support = _support_of(pi2, cfg.support_mode)
    lq, zm = _log_q(z2, support)
    cons = _constraints_2d(
        pi2, cfg.eps_cap, cfg.tie_tol, cfg.support_mode, cfg.floor, cfg.gap_policy
    )
    p, info = _project_2d(tf.stop_gradient(lq), cons, cfg, unroll_max_k, jit)
    return p, info, zm, lq


def _finish_info(info, invalid, restore):
    """Invalid rows are neither valid nor converged; back to the leading dims; warn."""
    info["valid"] = info["valid"] & ~invalid
    info["converged"] = info["converged"] & ~invalid
    info = {key: restore(val) for key, val in info.items()}
    _warn_uncertified(info)
    return info


def possibilistic_projection(
    logits_or_log_probs,
    possibility,
    tol: float = 1e-8,
    max_cycles: int = 2000,
    stopping: str = "certified",
    support_mode: str = "floor",
    gap_tol: float = 1e-10,
    floor: float = 1e-6,
    eps_cap: float = 1e-9,
    tie_tol: float = 0.0,
    gap_policy: str = "wide",
    q_clip: float = 1e-15,
    compute_dtype: str = "float64",
    unroll_max_k: int = 8,
    jit: bool = True,
    method: str | None = None,
    name: str | None = None,
):
    """KL projection ``p* = argmin_{p in F(pi)} KL(p || q)``, ``q = softmax(logits)``.

    Solved in float64 and batched over examples with different ``pi``: by default
    (``stopping="certified"``) with the interior-point solver on the tie-reduced chain (a
    closed form for two-block rows such as one-hot labels), each row certified on the
    original constraints by the exact duality gap and finished by warm-started Dykstra only
    where the interior point cannot certify it (``docs/design/possibilistic_solver.md``);
    ``method="dykstra"`` (and the ``"paper"`` / ``"fixed"`` rules) runs Dykstra's algorithm
    with KL projections in its one-scalar-per-constraint dual form (spec 2.4). The constraints
    are those of :func:`possibility_constraints`; the closed-form steps and the stopping
    rules are derived in ``docs/design/possibilistic_solver.md``.

    The projection is a *target*: it is returned behind ``tf.stop_gradient`` (no gradient
    flows through the iterations, spec 4); use :func:`possibilistic_projection_loss` for the
    loss ``KL(p* || q)`` whose exact gradient is ``softmax(z) - p*``.

    Args:
      logits_or_log_probs: ``[..., K]`` logits or log-probabilities (``log_softmax`` is
        applied, so both give the same ``q``); ``-inf`` masks a class; NaN, ``+inf`` and
        rows of only ``-inf`` are rejected. Leading dims may be unknown at trace time,
        ``K`` must be static.
      possibility: ``[..., K]`` possibility degrees in ``[0, 1]`` with row maximum 1;
        other rows are rejected (``ValueError`` eagerly, an assertion in graphs; NaN rows
        under XLA).
      tol: feasibility tolerance ``tau`` on the max violation ``V``.
      max_cycles: maximum number of Dykstra cycles (each visits all 3(K-1) constraints);
        with the interior point, the budget of its Dykstra finish.
      stopping: ``"certified"`` (``V <= tol`` and ``|gap| <= gap_tol``), ``"paper"``
        (``V <= tol``) or ``"fixed"`` (exactly ``max_cycles`` cycles).
      support_mode: ``"floor"`` or ``"restrict"`` (spec 5).
      gap_tol: duality-gap tolerance of the certified rule.
      floor, eps_cap, tie_tol, gap_policy: constraint options (:func:`possibility_constraints`).
      q_clip: ``log q`` is clamped at ``log(q_clip)`` and renormalised before projecting.
      compute_dtype: must stay ``"float64"`` unless ``tol`` and ``eps_cap`` are >= 1e-5
        (the kernel then still runs in float64; the argument documents the weaker regime).
      unroll_max_k: unroll the inner constraint loops in Python when ``K <= unroll_max_k``.
      jit: run the iterations in a cached ``tf.function(jit_compile=True)``.
      method: ``None`` (the interior point for ``stopping="certified"``, Dykstra for the
        other rules), ``"interior_point"`` or ``"dykstra"``.
      name: optional name scope.

    Returns:
      ``(projection, info)``: ``projection`` has the shape and floating dtype of the logits;
      ``info`` is a dict of ``[...]`` tensors: ``iterations`` (int32: interior-point
      iterations, 0 for closed-form rows; Dykstra cycles with ``method="dykstra"``),
      ``cycles`` (int32: Dykstra cycles), ``max_violation`` ``V``, ``duality_gap``
      (``KL(p||q) - g(lam)``, float64), ``residual`` (``max(V, |gap|)``), ``converged``
      (certified: ``V <= tol`` and ``|gap| <= gap_tol``), ``valid`` (bool), and ``lambda``
      (``[..., 3, K-1]`` float64 multipliers for pref/low/up, in sorted order).

    Example:
      >>> p, info = possibilistic_projection(tf.math.log([[0.48, 0.261, 0.259]]),
      ...                                    [[1.0, 0.51, 0.5]])
      >>> p.numpy().round(6)
      array([[0.49    , 0.255981, 0.254019]], dtype=float32)
    """
    cfg = ProjectionConfig(
        tol=tol,
        max_cycles=max_cycles,
        stopping=stopping,
        support_mode=support_mode,
        gap_tol=gap_tol,
        floor=floor,
        eps_cap=eps_cap,
        tie_tol=tie_tol,
        gap_policy=gap_policy,
        q_clip=q_clip,
        method=method,
    )
    _check_compute_dtype(compute_dtype, cfg)
    with tf.name_scope(name or "possibilistic_projection"):
        z, z2, pi2, restore = _prepare(logits_or_log_probs, possibility)
        dtype = z.dtype if z.dtype.is_floating else tf.float32
        z2 = tf.stop_gradient(tf.cast(z2, _F64))
        p, info, _, lq = _projection_from_z(z2, pi2, cfg, unroll_max_k, jit)
        # row_has_nan(lq): in 'restrict' mode, every class of the support masked by -inf.
        invalid = _possibility_invalid(pi2) | _logits_invalid(z2) | row_has_nan(lq)
        p = nan_where(invalid[:, None], p)
        info = _finish_info(info, invalid, restore)
        return tf.cast(restore(p), dtype), info
