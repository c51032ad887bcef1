"""The GPU rows of issues 33 and 34, one process per backend; each part prints a Markdown table.

Parts (``--part``, repeatable; JAX parts run under ``jax.jit``, PyTorch ones eagerly):

* ``sparsemax`` (JAX): fwd+bwd (``value_and_grad`` of the summed loss with respect to the
  logits, class ids as labels) of ``losszoo.ops.sparsemax_loss`` at the issue's shapes, as
  the op dispatches (``_sparsemax._sorts``) and with the threshold from a sort and from the
  Newton search at every shape (on whole rows; on candidate chunks with its unrolled start,
  and with its loop alone), against softmax cross-entropy
  (``optax``, integer labels: the anchor) and optax's ``multiclass_sparsemax_loss``; the
  heads: ``losszoo.ops.sparsemax``
  against ``softmax`` and ``keras.ops.sparsemax`` (sort-based), each summed against fixed
  weights ``sin(0..K-1)``.
* ``bcsoftmax`` (JAX): fwd+bwd of ``sum(bcsoftmax(x, 0.2/K, 0.1, T) * sin(0..K-1))``,
  ``x ~ N(0, 3)``, at T in {10, 1, 0.1, 0.05}: the default (candidate solver below T = 1,
  safeguarded Newton from 1 on), the safeguarded Newton at every T (the temperature passed as
  an array), the candidate solver at T >= 1 too, and at T = 0.1 the spec's sort-based
  Algorithm A (``method="sort"``, whose cost does not depend on T), against
  ``softmax(x / T)`` weighted the same way.
* ``torch`` (PyTorch): the sparsemax loss with validation on and off, the sparsemax head,
  BCSoftmax and Rankmax (k = 1) against ``torch.nn.functional.cross_entropy`` / ``softmax``,
  and beside them entmax's ``sparsemax_loss`` / ``sparsemax`` and Liger-Kernel's Triton
  sparsemax (``LigerSparsemaxFunction``) when those packages import.
* ``catalogue`` (JAX or PyTorch, by ``KERAS_BACKEND``): one Adagrad step on a user table
  (100,000 x d) and an item table (N x d): ``losszoo.ops.catalogue_loss`` (streamed, chunks of
  ``--chunk``) for softmax, sparsemax and Rankmax, the registered loss on the materialised
  ``[batch, N]`` scores, and sampled softmax (``--sampled`` log-uniform negatives, logQ
  correction, written out here). Memory: on JAX the compiled step's temporary buffers
  (``memory_analysis().temp_size_in_bytes``: what the step needs beyond its inputs and
  outputs), on PyTorch ``torch.cuda.max_memory_allocated`` of the step (peak stats reset
  before each case; tables and optimiser state included). First, the exactness check at
  N = 20,000: the streamed loss and gradients against the materialised ones.

Timings: each case's functions are compiled and run once, then ``--rounds`` rounds time
``--repeats`` calls of each, one function after another (the order rotates per round); the
table gives the medians of the per-call times and of the per-round ratios to the anchor.

Example (the device script, ``benchmarks/device_check.sh``, runs these):
  KERAS_BACKEND=jax python benchmarks/bench_gpu.py --part sparsemax --part catalogue
  KERAS_BACKEND=torch python benchmarks/bench_gpu.py --part torch --quick
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from harness import _wait  # noqa: E402  (benchmarks/ is the script's folder)
from keras import ops as kops  # noqa: E402

import losszoo  # noqa: E402
from losszoo.ops import _sparsemax  # noqa: E402

BACKEND = keras.backend.backend()
SPARSEMAX_SHAPES = (
    "256x1000 128x1024 32x100000 128x32768 2048x32768 4096x32768 1024x1000000".split()
)
BCSOFTMAX_SHAPES = "128x1024 1024x4096 128x32768 4096x1024 1024x32768 1024x100000".split()
TEMPERATURES = (10.0, 1.0, 0.1, 0.05)
TORCH_SHAPES = "256x1000 128x32768 32x100000 2048x32768".split()


def shape_of(text: str) -> tuple[int, int]:
    rows, cols = text.split("x")
    return int(rows), int(cols)


# ------------------------------------------------------------------ timing, both backends


def race(fns: dict, args: tuple, rounds: int, repeats: int, anchor: str) -> dict:
    """Median ms per call of each function and median per-round ratio to ``anchor``; a
    function that raises is reported by its error instead."""
    ok, failed = {}, {}
    for name, fn in fns.items():
        try:
            _wait(fn(*args))  # compile / warm up
            ok[name] = fn
        except Exception as e:  # noqa: BLE001 - a peer's limit (e.g. Liger's block size)
            failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"
    times = {name: [] for name in ok}
    names = list(ok)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            _wait(None)
            start = time.perf_counter()
            for _ in range(repeats):
                out = ok[name](*args)
            _wait(out)
            times[name].append((time.perf_counter() - start) / repeats * 1e3)
    result = {name: {"error": why} for name, why in failed.items()}
    for name in names:
        ratios = [a / b for a, b in zip(times[name], times.get(anchor, []))]
        result[name] = {
            "ms": statistics.median(times[name]),
            "ratio": statistics.median(ratios) if ratios else math.nan,
        }
    return result


def print_rows(case: str, result: dict, anchor: str) -> None:
    for name, r in result.items():
        if "error" in r:
            print(f"| {case} | {name} | failed: {r['error']} | |", flush=True)
        else:
            ratio = "anchor" if name == anchor else f"{r['ratio']:.2f}x"
            print(f"| {case} | {name} | {r['ms']:.3f} | {ratio} |", flush=True)


def header(title: str, anchor: str) -> None:
    print(f"\n### {title} ({BACKEND}; ratio: per-round median against {anchor})\n")
    print("| case | function | ms | ratio |\n|---|---|---|---|", flush=True)


# ------------------------------------------------------------------ JAX parts


def _jax_fwd_bwd(loss):
    """``jit(value_and_grad(sum(loss(x, *rest))))`` with respect to ``x``."""
    import jax
    import jax.numpy as jnp

    return jax.jit(jax.value_and_grad(lambda x, *rest: jnp.sum(loss(x, *rest))))


def part_sparsemax(args) -> None:
    import jax
    import jax.numpy as jnp
    import optax

    def variant(**patch):
        """The op traced with module attributes of ``_sparsemax`` replaced (read at trace time):
        ``_sorts`` / ``_whole_rows`` (the GPU dispatch), ``_GPU_NEWTON_STEPS`` (the unrolled
        start of the search on candidate chunks; 0: its loop alone)."""

        def loss(x, y):
            saved = {name: getattr(_sparsemax, name) for name in patch}
            for name, value in patch.items():
                setattr(_sparsemax, name, value)
            try:
                return losszoo.ops.sparsemax_loss(y, x)
            finally:
                for name, value in saved.items():
                    setattr(_sparsemax, name, value)

        return loss

    never, always = (lambda shape: False), (lambda shape: True)
    chunks = {"_sorts": never, "_whole_rows": never}
    losses = {
        "softmax_ce (optax, ids)": optax.softmax_cross_entropy_with_integer_labels,
        "losszoo sparsemax_loss": lambda x, y: losszoo.ops.sparsemax_loss(y, x),
        "losszoo sparsemax_loss, sort threshold": variant(_sorts=always),
        "losszoo sparsemax_loss, Newton on whole rows": variant(_sorts=never, _whole_rows=always),
        "losszoo sparsemax_loss, Newton on candidate chunks": variant(**chunks),
        "losszoo sparsemax_loss, candidate chunks, loop only": variant(
            **chunks, _GPU_NEWTON_STEPS=0
        ),
        "optax multiclass_sparsemax_loss": optax.losses.multiclass_sparsemax_loss,
    }
    heads = {
        "softmax head": jax.nn.softmax,
        "losszoo sparsemax head": losszoo.ops.sparsemax,
        "keras.ops.sparsemax head": keras.ops.sparsemax,
    }
    header("sparsemax loss and head, fwd+bwd, jax.jit", "softmax_ce / softmax head")
    for text in args.shapes or SPARSEMAX_SHAPES:
        b, k = shape_of(text)
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.normal(size=(b, k)).astype(np.float32))
        y = jnp.asarray(rng.integers(0, k, b).astype(np.int32))
        w = jnp.sin(jnp.arange(k, dtype=jnp.float32))
        fns = {name: _jax_fwd_bwd(f) for name, f in losses.items()}
        anchor = "softmax_ce (optax, ids)"
        print_rows(text, race(fns, (x, y), args.rounds, args.repeats, anchor), anchor)
        fns = {name: _jax_fwd_bwd(lambda x, w, f=f: f(x) * w) for name, f in heads.items()}
        print_rows(
            text, race(fns, (x, w), args.rounds, args.repeats, "softmax head"), "softmax head"
        )


def part_bcsoftmax(args) -> None:
    import jax
    import jax.numpy as jnp

    from losszoo.ops import _bcsoftmax

    def candidates(*a, **kw):  # bcsoftmax with the candidate solver at any temperature
        choose, _bcsoftmax._use_candidates = _bcsoftmax._use_candidates, lambda t: True
        try:
            return _bcsoftmax.bcsoftmax(*a, **kw)
        finally:
            _bcsoftmax._use_candidates = choose

    header("BCSoftmax at every temperature, fwd+bwd, jax.jit, bounds [0.2/K, 0.1]", "softmax")
    for text in args.shapes or BCSOFTMAX_SHAPES:
        b, k = shape_of(text)
        x = jnp.asarray(np.random.default_rng(0).normal(0.0, 3.0, (b, k)).astype(np.float32))
        w = jnp.sin(jnp.arange(k, dtype=jnp.float32))
        for t in TEMPERATURES:
            bc = losszoo.ops.bcsoftmax
            heads = {
                "softmax": lambda x: jax.nn.softmax(x / t),
                "bcsoftmax (default)": lambda x: bc(x, 0.2 / k, 0.1, temperature=t),
                "bcsoftmax, safeguarded Newton": lambda x: bc(
                    x, 0.2 / k, 0.1, temperature=jnp.asarray(t, jnp.float32)
                ),
            }
            if t >= 1.0:  # the candidate solver, which the default takes below T = 1 only
                heads["bcsoftmax, candidate solver"] = lambda x: candidates(
                    x, 0.2 / k, 0.1, temperature=t
                )
            if t == 0.1:  # its cost does not depend on T: one row per shape
                heads["bcsoftmax, sort (Algorithm A)"] = lambda x: bc(
                    x, 0.2 / k, 0.1, temperature=t, method="sort"
                )
            fns = {n: _jax_fwd_bwd(lambda x, w, f=f: f(x) * w) for n, f in heads.items()}
            result = race(fns, (x, w), args.rounds, args.repeats, "softmax")
            print_rows(f"{text} T={t:g}", result, "softmax")


# ------------------------------------------------------------------ PyTorch part


def _torch_fwd_bwd(loss):
    import torch

    def step(x, *rest):
        x = x.detach().requires_grad_(True)
        value = loss(x, *rest).sum()
        (grad,) = torch.autograd.grad(value, x)
        return value.detach(), grad

    return step


def part_torch(args) -> None:
    import torch
    import torch.nn.functional as F

    device = "cuda" if torch.cuda.is_available() else "cpu"
    peers = {}
    try:
        import entmax

        peers["entmax"] = entmax
    except ImportError:
        pass
    try:
        from liger_kernel.ops.sparsemax import LigerSparsemaxFunction

        peers["liger"] = LigerSparsemaxFunction
    except Exception as e:  # noqa: BLE001 - not installed, or no Triton / GPU here
        print(f"Liger-Kernel not used: {type(e).__name__}: {e}")

    def unchecked(f):
        def run(*a):
            with losszoo.validation(False):
                return f(*a)

        return run

    def sparsemax_loss(x, y):
        return losszoo.ops.sparsemax_loss(y, x)

    losses = {
        "torch cross_entropy": lambda x, y: F.cross_entropy(x, y, reduction="none"),
        "losszoo sparsemax_loss": sparsemax_loss,
        "losszoo sparsemax_loss, validation off": unchecked(sparsemax_loss),
        "losszoo rankmax_loss k=1": lambda x, y: losszoo.ops.rankmax_loss(y, x),
    }
    if "entmax" in peers:
        losses["entmax sparsemax_loss"] = lambda x, y: peers["entmax"].sparsemax_loss(x, y)
    heads = {
        "torch softmax head": lambda x: torch.softmax(x, -1),
        "losszoo sparsemax head": losszoo.ops.sparsemax,
        "losszoo bcsoftmax T=1": lambda x: losszoo.ops.bcsoftmax(x, 0.2 / x.shape[-1], 0.1),
        "losszoo bcsoftmax T=0.1": lambda x: losszoo.ops.bcsoftmax(
            x, 0.2 / x.shape[-1], 0.1, temperature=0.1
        ),
    }
    if "entmax" in peers:
        heads["entmax sparsemax head"] = lambda x: peers["entmax"].sparsemax(x, -1)
    if "liger" in peers:
        heads["Liger-Kernel sparsemax head"] = lambda x: peers["liger"].apply(x, -1)
    header(f"PyTorch eager on {device}, fwd+bwd; peers: {sorted(peers) or 'none'}", "torch")
    for text in args.shapes or TORCH_SHAPES:
        b, k = shape_of(text)
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(b, k, generator=gen).to(device)
        y = torch.randint(0, k, (b,), generator=gen).to(device)
        w = torch.sin(torch.arange(k, dtype=torch.float32)).to(device)
        fns = {name: _torch_fwd_bwd(f) for name, f in losses.items()}
        anchor = "torch cross_entropy"
        print_rows(text, race(fns, (x, y), args.rounds, args.repeats, anchor), anchor)
        fns = {name: _torch_fwd_bwd(lambda x, w, f=f: f(x) * w) for name, f in heads.items()}
        anchor = "torch softmax head"
        print_rows(text, race(fns, (x, w), args.rounds, args.repeats, anchor), anchor)


# ------------------------------------------------------------------ full catalogue


MATERIALISED = {"softmax": "softmax_cross_entropy", "sparsemax": "sparsemax", "rankmax": "rankmax"}
USERS = 100_000


def catalogue_losses(n: int, args) -> dict:
    """``name -> loss(q, items, pos, neg, logq_neg, logq_pos)`` summed over the batch."""

    def streamed(loss):
        def run(q, items, pos, *_):
            return kops.sum(
                losszoo.ops.catalogue_loss(q, items, pos, loss=loss, chunk_size=args.chunk)
            )

        return run

    def materialised(loss):
        registered = losszoo.get(MATERIALISED[loss], reduction="sum")

        def run(q, items, pos, *_):
            return registered(pos, kops.matmul(q, kops.transpose(items)))

        return run

    def sampled(q, items, pos, neg, logq_neg, logq_pos):
        positive = kops.sum(q * kops.take(items, pos, axis=0), -1, keepdims=True) - logq_pos
        negative = kops.matmul(q, kops.transpose(kops.take(items, neg, axis=0))) - logq_neg
        logits = kops.concatenate([positive, negative], -1)
        return kops.sum(kops.logsumexp(logits, -1) - positive[:, 0])

    fns = {f"streamed {loss}": streamed(loss) for loss in args.losses}
    fns[f"sampled softmax ({args.sampled} negatives, logQ)"] = sampled
    if not args.no_materialised:
        fns.update({f"materialised {loss}": materialised(loss) for loss in args.losses})
    return fns


def catalogue_inputs(n: int, batch: int, seed: int, args):
    from losszoo.retrieval import LogUniformSampler

    rng = np.random.default_rng(seed)
    sampler = LogUniformSampler(n)
    pos = kops.convert_to_numpy(sampler.sample(batch, seed=seed)).astype(np.int32)
    neg = kops.convert_to_numpy(sampler.sample(args.sampled, seed=seed + 1)).astype(np.int32)
    q_pos, q_neg = (kops.convert_to_numpy(sampler.probability(ids)) for ids in (pos, neg))
    logq_pos = np.log(q_pos.astype(np.float64) * args.sampled)
    logq_neg = np.log(q_neg.astype(np.float64) * args.sampled)
    users = rng.integers(0, USERS, batch).astype(np.int32)
    return (
        users,
        pos,
        neg,
        logq_neg.astype(np.float32)[None, :],
        logq_pos.astype(np.float32)[:, None],
    )


def _tables(n: int, dim: int):
    rng = np.random.default_rng(0)
    return (
        (0.05 * rng.normal(size=(USERS, dim))).astype(np.float32),
        (0.05 * rng.normal(size=(n, dim))).astype(np.float32),
    )


def part_catalogue(args) -> None:
    step_of = {"jax": _jax_adagrad_step, "torch": _torch_adagrad_step}[BACKEND]
    check_exact(args)
    n, batch = args.items, args.batch
    memory = "step temporaries" if BACKEND == "jax" else "peak allocated"
    print(
        f"\n### one Adagrad step ({BACKEND}), N = {n:,} items, batch {batch}, d = {args.dim}, "
        f"chunks of {args.chunk}; median of {args.steps} steps after one\n"
    )
    print(f"| method | step ms | {memory} GB | first step s |\n|---|---|---|---|")
    users, items = _tables(n, args.dim)
    data = catalogue_inputs(n, batch, 0, args)
    for name, loss in catalogue_losses(n, args).items():
        try:
            ms, gb, first = step_of(loss, users, items, data, args)
            print(f"| {name} | {ms:.1f} | {gb:.2f} | {first:.1f} |", flush=True)
        except Exception as e:  # noqa: BLE001 - e.g. out of memory: the row says so
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            print(f"| {name} | failed: {why} | | |", flush=True)


def _jax_adagrad_step(loss, users, items, data, args):
    import jax
    import jax.numpy as jnp

    def step(params, accum, uids, pos, neg, logq_neg, logq_pos):
        def objective(params):
            u, it = params
            return loss(jnp.take(u, uids, axis=0), it, pos, neg, logq_neg, logq_pos)

        value, grads = jax.value_and_grad(objective)(params)
        accum = jax.tree.map(lambda a, g: a + g * g, accum, grads)
        params = jax.tree.map(
            lambda p, g, a: p - 0.1 * g / jnp.sqrt(a + 1e-7), params, grads, accum
        )
        return value, params, accum

    params = (jnp.asarray(users), jnp.asarray(items))
    accum = jax.tree.map(lambda p: jnp.full_like(p, 0.1), params)
    inputs = tuple(jnp.asarray(a) for a in data)
    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, accum, *inputs).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes / 2**30
    times = []
    for _ in range(args.steps + 1):
        start = time.perf_counter()
        value, params, accum = compiled(params, accum, *inputs)
        float(value)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1e3, temp, times[0]


def _torch_adagrad_step(loss, users, items, data, args):
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    params = [torch.tensor(t, device=device, requires_grad=True) for t in (users, items)]
    optimizer = torch.optim.Adagrad(params, lr=0.1, initial_accumulator_value=0.1)
    uids, *rest = (torch.as_tensor(a, device=device) for a in data)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps + 1):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        value = loss(params[0][uids], params[1], *rest)
        value.backward()
        optimizer.step()
        float(value.detach())
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else math.nan
    del params, optimizer
    return statistics.median(times[1:]) * 1e3, peak, times[0]


def check_exact(args, n: int = 20_000, batch: int = 512) -> None:
    """Streamed against materialised at ``n`` items: loss and both gradients, max relative
    difference (``|a - b| / max|b|``), with exclusions of 16 ids per row; on JAX with float32
    matmuls (``default_matmul_precision("highest")``: a GPU's default, TF32, rounds the
    scores of both to about 1e-3)."""
    users, items = _tables(n, args.dim)
    uids, pos, *_ = catalogue_inputs(n, batch, 1, args)
    rng = np.random.default_rng(2)
    exclude = rng.integers(0, n, (batch, 16)).astype(np.int32)
    exclude = np.where(exclude == pos[:, None], -1, exclude)
    q = users[uids] * 20.0  # scores of a few units: supports of a few items
    print(f"\n### exactness at N = {n:,}, batch {batch}, 16 excluded ids per row ({BACKEND})\n")
    print("| loss | value rel diff | d queries rel diff | d table rel diff |\n|---|---|---|---|")
    for loss in args.losses:
        registered = losszoo.get(MATERIALISED[loss], reduction="sum")

        def streamed(q, t, loss=loss):
            return kops.sum(
                losszoo.ops.catalogue_loss(
                    q, t, pos, loss=loss, exclude=exclude, chunk_size=args.chunk
                )
            )

        def materialised(q, t, registered=registered):
            scores = kops.matmul(q, kops.transpose(t))
            mask = np.zeros((batch, n), bool)
            rows = np.repeat(np.arange(batch), exclude.shape[1])
            keep = exclude.reshape(-1) >= 0
            mask[rows[keep], exclude.reshape(-1)[keep]] = True
            return registered(pos, kops.where(mask, -np.inf, scores))

        a, b = _value_and_grads(streamed, q, items), _value_and_grads(materialised, q, items)
        diffs = [np.max(np.abs(u - v)) / max(np.max(np.abs(v)), 1e-30) for u, v in zip(a, b)]
        print(f"| {loss} | " + " | ".join(f"{d:.1e}" for d in diffs) + " |", flush=True)


def _value_and_grads(f, q, t):
    if BACKEND == "jax":
        import jax

        with jax.default_matmul_precision("highest"):  # a GPU's default is TF32
            value, grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(q, t)
        return [np.asarray(value), *(np.asarray(g) for g in grads)]
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, t = (torch.tensor(a, device=device, requires_grad=True) for a in (q, t))
    value = f(q, t)
    grads = torch.autograd.grad(value, (q, t))
    return [value.detach().cpu().numpy(), *(g.cpu().numpy() for g in grads)]


# ------------------------------------------------------------------ main


PARTS = {
    "sparsemax": part_sparsemax,
    "bcsoftmax": part_bcsoftmax,
    "torch": part_torch,
    "catalogue": part_catalogue,
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", action="append", choices=PARTS, required=True)
    parser.add_argument("--shapes", nargs="+", help="BxK shapes instead of the part's own")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10, help="calls per round")
    parser.add_argument("--items", type=int, default=1_000_000, help="catalogue: N")
    parser.add_argument("--batch", type=int, default=4096, help="catalogue: queries per step")
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=8192)
    parser.add_argument("--sampled", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=3, help="catalogue: timed steps")
    parser.add_argument("--losses", nargs="+", default=list(MATERIALISED))
    parser.add_argument("--no-materialised", action="store_true")
    args = parser.parse_args(argv)
    device = "cpu"
    if BACKEND == "jax":
        import jax

        device = str(jax.devices()[0].device_kind)
    elif BACKEND == "torch":
        import torch

        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    given = " ".join(sys.argv[1:] if argv is None else argv)
    print(f"# bench_gpu: {BACKEND} on {device}, {stamp}")
    print(f"command: python benchmarks/bench_gpu.py {given}")
    for part in args.part:
        with contextlib.suppress(KeyboardInterrupt):
            PARTS[part](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
