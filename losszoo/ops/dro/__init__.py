"""Safe-KL DRO risk (Gladin et al., "Improved Stochastic Optimization of LogSumExp") and
its KL-DRO baselines, as ops (the Keras losses are :mod:`losszoo.losses.dro`; the design is
``docs/design/dro.md``).

Spec: ``shared/specs/safe_kl_dro.md`` sections 1.5 (objective), 2.1 (baselines), 2.5
(kernel), 3.1-3.4 (gradients, stability, dtype), 4 (CVaR link), 6 (edge inputs), 7 (C0).

One module per concern, sharing their helpers by plain (package-internal) names: ``_risks``
(the risks of one batch: safe-KL with its statistics, weights and batch alpha, the batch
LogSumExp, sum-of-exp and CVaR baselines, and the argument checks, flat losses and weights
and invalid-input flags every module uses), ``_exact`` (the streaming exact risk) and
:mod:`~losszoo.ops.dro.distribute` (every risk over the global batch of ``tf.distribute``
replicas; also ``losszoo.ops.distribute``).

Notation: per-example losses ``l_i`` (any shape, flattened: every entry is one sample),
sample weights ``s_i >= 0`` (default 1) and ``pi_i = s_i / sum_j s_j``, temperature
``lam > 0``, accuracy ``rho in (0, 1)``, dual scalar ``alpha`` (loss units).

Edge inputs (spec 6): entries with ``s_i = 0`` are ignored entirely (also NaN/inf there);
an all-zero or empty batch gives value 0 and zero gradients; a ``+inf`` loss gives value
``+inf`` with finite gradients (``kl_dro_sumexp``, whose gradient is infinite there: value
``+inf`` and every gradient entry NaN); ``-inf`` gets weight 0; NaN with ``s_i > 0``
propagates (NaN value, never silently dropped).
Half-precision inputs are computed in float32 and the result cast back; float64 stays
float64.

Fail-loud contract (README, "Bad input"): hyper-parameters (``lam``, ``rho``,
``iterations``, ``calibrate``) are checked when called and raise naming the argument.
Sample weights keep :data:`losszoo.contract.NON_NEGATIVE` and ``alpha`` must be finite:
eagerly a ``ValueError``, in a TensorFlow graph an assertion (both skippable with
``losszoo.set_validation(False)``). Traced under XLA or ``jax.jit``, where assertions do not
exist, such values make the result and its gradients NaN (a scalar flag folded into the
kernels, always on). Written once with ``keras.ops``: TensorFlow, JAX and PyTorch.
"""

from losszoo.ops.dro._exact import (
    kl_dro_exact_batch_max,
    kl_dro_exact_state_result,
    kl_dro_exact_state_update,
)
from losszoo.ops.dro._risks import (
    cvar_risk,
    kl_dro_batch_lse,
    kl_dro_sumexp,
    safe_kl_dro_risk,
    safe_kl_dro_risk_and_stats,
    safe_kl_dro_solve_alpha,
    safe_kl_dro_weights,
)
from losszoo.ops.dro.distribute import (
    cvar_risk_global,
    kl_dro_batch_lse_global,
    kl_dro_sumexp_global,
)
