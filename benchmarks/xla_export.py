"""Export every op's XLA program from TensorFlow: ``python benchmarks/xla_export.py --out DIR``.

First half of the TF -> XLA -> jaxlib pipeline (issue 13); ``benchmarks/run_xla.py DIR`` is
the second half and runs the programs with jaxlib alone (CPU or GPU, no TensorFlow needed).

For each case (an op at one shape, with the anchors it is compared with, as in
``benchmarks/run.py``) and each of its functions, the exporter

1. builds the harness's forward+backward step (``harness.forward_backward``: the summed
   output and its gradients w.r.t. the differentiated inputs) as
   ``tf.function(step, jit_compile=True)``;
2. regenerates the inputs from a numpy recipe (``run_xla.make_inputs``: the same function the
   runner calls, so inputs never travel), runs the step in TensorFlow (XLA on the CPU) and
   keeps its outputs as the reference;
3. exports the program with ``step.experimental_get_compiler_ir(*inputs)(stage=
   "hlo_serialized")``: the ``HloModuleProto`` straight out of tf2xla, before any backend pass,
   so the runner's device optimises it for itself. Its parameters are the step's arguments
   in order; its result is a tuple of the non-None outputs of the step (``None`` gradients,
   e.g. an anchor that ignores an input, are dropped by TensorFlow). The manifest lists the
   module's ``custom-call`` targets (a foreign XLA may not know them; none so far: TF lowers
   ``top_k`` and ``argsort`` to a plain HLO ``sort``) and counts of its sort / while /
   conditional instructions.

Folder layout: ``manifest.json`` (format version, TF version, preset, and per case: op,
shape, target, repeats, tolerances, input recipe, anchors, and per function the module file,
its outputs with shapes and how they are referenced, and the custom calls),
``modules/*.hlo.pb.gz`` (gzip: constants such as paper_alg5's K^2 masks shrink 20-100x)
and ``reference.npz`` (key ``"<module key>/<output index>"``). An output is stored whole up to
``--cap`` bytes, else as its leading block ``out[:r, :c]`` (up to ``run_xla.BLOCK`` rows, cut
to the cap), so the bench folder stays around 10 MiB, far below the 64 MiB that may travel to
an accelerator. Presets:

* default: the shapes of ``benchmarks/bench_*.py``;
* ``--small``: one tiny shape per op, same code paths (sparsemax's chunked start at
  K = 32768, possibilistic's rolled loops at K = 20), every op of ``losszoo.ops`` that the
  bench modules time but only the anchors that are ops or softmax, for CI
  (tests/benchmarks/test_xla_export.py);
* ``--large``: GPU-only shapes (sparsemax / rankmax 4096 x 1e6, bcsoftmax 1024 x 32768). TF
  cannot run these here, so the program is traced from ``tf.TensorSpec`` shapes and the
  reference is TF's run of the same step on the first ``run_xla.BLOCK`` rows (the ops are
  row-independent and those rows' inputs do not depend on the batch size); batch-reduced
  outputs (the summed value, a scalar temperature's gradient) are not checked.

The functions are those of the bench modules where they exist (same programs as run.py),
plus BCSoftmax with a learned temperature, the Rankmax projection and the DRO baselines.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import pathlib
import re
import shutil
import sys
import time
from collections.abc import Callable

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import bench_bcsoftmax as bb
import bench_dro as bd
import bench_possibilistic as bp
import bench_rankmax as br
import bench_sparsemax as bs
import numpy as np
import tensorflow as tf
from harness import forward_backward
from run_xla import BLOCK, make_inputs

from losszoo import ops

FORMAT = 1
DEFAULT_CAP = 128 << 10  # bytes per stored output


@dataclasses.dataclass
class Spec:
    """One case: ``op`` at ``shape`` against ``anchors``, inputs from ``recipe``."""

    op: str
    shape: str
    fn: Callable
    recipe: dict
    anchors: dict
    wrt: tuple = (0,)
    target: str = ""
    repeats: int = 20
    rtol: float = 1e-4
    atol: float = 1e-5
    rowwise: bool = True  # rows of the outputs depend only on the same rows of the inputs


# ---- functions not in the bench modules -------------------------------------------------


def _sin_k(x):
    return tf.sin(tf.range(x.shape[-1], dtype=x.dtype))


def bcsoftmax_t(x, a, b, t):
    """BCSoftmax with learned bounds and temperature (gradients for all four inputs)."""
    return ops.bcsoftmax(x, a, b, temperature=t) * _sin_k(x)


def bcsoftmax_sort_t(x, a, b, t):
    return ops.bcsoftmax(x, a, b, temperature=t, method="sort") * _sin_k(x)


def softmax_t(x, a, b, t):
    return tf.nn.softmax(x / t) * _sin_k(x)


def paper_alg5_t(x, a, b, t):
    return bb.paper_alg5(x / t, a, b)


def rankmax_k1_head(scores, ids):
    # a dense cotangent without an [n] constant in the module (n = 1e6 in --large)
    return ops.rankmax(ids, scores, k=1) * tf.stop_gradient(tf.sin(scores))


def rankmax_k10_head(scores, ids):
    return ops.rankmax(ids, scores, k=10) * tf.stop_gradient(tf.sin(scores))


def softmax_head(scores, ids):
    return tf.nn.softmax(scores) * tf.stop_gradient(tf.sin(scores))


def rankmax_k10_dense(scores, labels):
    return ops.rankmax_loss(labels, scores, k=10)


def projection_nli(logits, pi):
    return ops.possibilistic_projection(logits, pi, eps_cap=0.05, tol=1e-6, max_cycles=500)[0]


def projection_synthetic(logits, pi):
    return ops.possibilistic_projection(logits, pi, tol=1e-8, max_cycles=2000)[0]


def sumexp(l, alpha):
    return ops.kl_dro_sumexp(l, bd.LAM) + 0.0 * alpha


def cvar(l, alpha):
    return ops.cvar_risk(l, bd.RHO) + 0.0 * alpha


# ---- presets --------------------------------------------------------------------------


def specs(preset: str) -> list[Spec]:
    """The cases of a preset (``"bench"``, ``"small"`` or ``"large"``)."""
    small, large = preset == "small", preset == "large"
    out = []

    # sparsemax
    if large:
        shapes = [(4096, 1_000_000, "")]
    elif small:  # K = 32768: three levels of chunk maxima before the full Newton loop
        shapes = [(4, 32768, "")]
    else:
        shapes = [(256, 1000, "<= 1.5x softmax_ce (xla)"), (32, 100_000, "<= 2x softmax_ce (xla)")]
    for batch, k, target in shapes:
        anchors = {"softmax_ce": bs.softmax_ce}
        if not (large or small):  # a full sort per row: not worth a GPU-only shape
            anchors["keras.ops.sparsemax"] = bs.keras_sparsemax
        for name, fn in (("sparsemax_loss", bs.sparsemax_loss), ("sparsemax", bs.sparsemax_head)):
            out.append(
                Spec(
                    name,
                    f"{batch}x{k}",
                    fn,
                    {"generator": "logits_onehot", "batch": batch, "k": k},
                    anchors,
                    target=target,
                    repeats=3 if large else 20,
                )
            )

    # rankmax (loss with ids and dense labels, projection)
    if large:
        shapes = [(4096, 1_000_000, "candidates")]
    elif small:
        shapes = [(8, 64, "in-batch")]
    else:
        shapes = [(512, 512, "in-batch"), (256, 100_000, "candidates")]
    for batch, n, label in shapes:
        recipe = {"generator": "scores_ids", "batch": batch, "n": n}
        reps = 3 if large else 20
        sm = {"softmax_ce": br.softmax_ce}
        out += [
            Spec(
                "rankmax_loss k=1",
                f"{batch}x{n} {label}",
                br.rankmax_k1,
                recipe,
                sm,
                target="<= 1.2x softmax_ce (xla)",
                repeats=reps,
            ),
            Spec(
                "rankmax_loss k=10",
                f"{batch}x{n} {label}",
                br.rankmax_k10,
                recipe,
                sm,
                target="ratio reported",
                repeats=reps,
            ),
            Spec(
                "rankmax k=1",
                f"{batch}x{n} {label}",
                rankmax_k1_head,
                recipe,
                {"softmax": softmax_head},
                repeats=reps,
            ),
            Spec(
                "rankmax k=10",
                f"{batch}x{n} {label}",
                rankmax_k10_head,
                recipe,
                {"softmax": softmax_head},
                repeats=reps,
            ),
        ]
        if n <= 512:
            dense = dict(recipe, dense=True)
            out += [
                Spec(
                    "rankmax_loss k=1 dense labels",
                    f"{batch}x{n} {label} (eye)",
                    br.rankmax_k1,
                    dense,
                    sm,
                    repeats=reps,
                ),
                Spec(
                    "rankmax_loss k=10 dense labels",
                    f"{batch}x{n} {label} (eye)",
                    rankmax_k10_dense,
                    dense,
                    sm,
                    repeats=reps,
                ),
            ]

    # bcsoftmax with learned bounds and temperature
    ks = [32] if small else [32768] if large else [32, 128, 1024, 32768]
    batch = 8 if small else 1024 if large else 128
    for k in ks:
        anchors = {"softmax": softmax_t}
        if k <= 128 and not small:
            anchors["paper_alg5"] = paper_alg5_t
        if k <= 1024 or large:
            anchors["alg_A_sort"] = bcsoftmax_sort_t
        out.append(
            Spec(
                "bcsoftmax (bounds + temperature)",
                f"{batch}x{k}",
                bcsoftmax_t,
                {"generator": "bcsoftmax", "batch": batch, "k": k},
                anchors,
                wrt=(0, 1, 2, 3),
                target="<= 3x softmax at K=1024" if k == 1024 else "",
                repeats=10 if k < 32768 else 3,
            )
        )

    # possibilistic projection (float64 Dykstra inside): the loss and the projection itself
    if not large:
        anchors = {"softmax_ce": bp.softmax_ce}
        if not small:
            anchors["antipignistic_kl"] = bp.antipignistic_kl
        for (batch, k), loss, proj, what, target in (
            (
                (8, 3) if small else (256, 3),
                bp.projection_loss_nli,
                projection_nli,
                "certified, eps_cap .05, tol 1e-6",
                "<= 10 ms per step",
            ),
            (
                (8, 20) if small else (128, 20),
                bp.projection_loss_synthetic,
                projection_synthetic,
                "certified, tol 1e-8",
                "<= 300 ms per batch",
            ),
        ):
            recipe = {"generator": "possibility", "batch": batch, "k": k}
            reps = 5 if k == 20 else 20
            out.append(
                Spec(
                    f"possibilistic_projection_loss ({what})",
                    f"{batch}x{k}",
                    loss,
                    recipe,
                    anchors,
                    target=target,
                    repeats=reps,
                )
            )
            out.append(
                Spec(
                    f"possibilistic_projection fwd ({what})",
                    f"{batch}x{k}",
                    proj,
                    recipe,
                    {} if small else {"softmax_ce": bp.softmax_ce},
                    wrt=(),
                    repeats=reps,
                )
            )

    # safe-KL DRO risk and the baselines
    if not large:
        anchors = {
            "mean": bd.plain_mean,
            "reduce_logsumexp": bd.reduce_logsumexp,
            "kl_dro_batch_lse": bd.batch_lse,
            "kl_dro_sumexp": sumexp,
            "cvar_risk": cvar,
        }
        if small:  # the baselines are ops too; reduce_logsumexp is plain TF
            del anchors["reduce_logsumexp"]
        for batch in (64,) if small else (10, 1024, 2**20):
            out.append(
                Spec(
                    "safe_kl_dro_risk",
                    f"B={batch}",
                    bd.safe_kl,
                    {"generator": "losses", "batch": batch},
                    anchors,
                    wrt=(0, 1),
                    target="report ratio vs mean",
                    rowwise=False,
                )
            )
    return out


# ---- export ---------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")[:60]


def _flat(out) -> list[np.ndarray]:
    return [t.numpy() for t in tf.nest.flatten(out) if t is not None]


NOTABLE = ("custom-call", "sort", "while", "conditional", "topk", "call")


def _inspect(proto: bytes, ir) -> tuple[list[str], dict]:
    """``(custom-call targets, counts of NOTABLE opcodes)`` of a module proto."""
    try:
        from tensorflow.compiler.xla.service import hlo_pb2
    except ImportError:  # no proto bindings: read the targets from the HLO text stage
        text = ir(stage="hlo")
        return sorted(set(re.findall(r'custom_call_target="([^"]+)"', text))), {}
    module = hlo_pb2.HloModuleProto.FromString(proto)
    insts = [i for c in module.computations for i in c.instructions]
    targets = sorted({i.custom_call_target for i in insts if i.opcode == "custom-call"})
    counts = {op: sum(i.opcode == op for i in insts) for op in NOTABLE}
    return targets, {op: n for op, n in counts.items() if n}


def export_module(fn, spec: Spec, inputs, large: bool, cap: int, reference: str = "xla"):
    """Trace, run and export one function; returns ``(proto, ir, outputs_meta, refs)``.

    ``reference``: run the step for the reference outputs under XLA (``"xla"``, the program
    that is exported) or as a plain ``tf.function`` (``"graph"``: no XLA compile in TF, which
    is most of the export time; the ops promise that both agree).
    """
    step = tf.function(forward_backward(fn, spec.wrt), jit_compile=True)
    ref_step = step if reference == "xla" else tf.function(forward_backward(fn, spec.wrt))
    if large:
        batch = spec.recipe["batch"]
        tensor_specs = [
            tf.TensorSpec([batch, *x.shape[1:]] if x.ndim else [], x.dtype) for x in inputs
        ]
        ir = step.experimental_get_compiler_ir(*tensor_specs)
        rows_out = _flat(ref_step(*[tf.constant(x) for x in inputs]))  # TF, first rows
        full_shapes = [
            list(o.shape)
            for o in tf.nest.flatten(step.get_concrete_function(*tensor_specs).structured_outputs)
            if o is not None
        ]
    else:
        args = [tf.constant(x) for x in inputs]
        ir = step.experimental_get_compiler_ir(*args)
        full = _flat(ref_step(*args))
    proto = ir(stage="hlo_serialized")
    meta, refs = [], []
    if large:
        for o, shape in zip(rows_out, full_shapes):
            rowwise = (
                spec.rowwise
                and len(shape) > 0
                and o.ndim == len(shape)
                and o.shape[0] == inputs[0].shape[0]
                and shape[0] == spec.recipe["batch"]
            )
            meta.append(
                {"shape": shape, "dtype": o.dtype.name, "reference": "rows" if rowwise else "none"}
            )
            refs.append(o if rowwise else None)
    else:
        for o in full:
            whole = o.nbytes <= cap or o.ndim == 0
            meta.append(
                {
                    "shape": list(o.shape),
                    "dtype": o.dtype.name,
                    "reference": "full" if whole else "rows",
                }
            )
            refs.append(o)
    refs = [
        r if r is None or r.ndim == 0 or r.nbytes <= cap else _leading_block(r, cap) for r in refs
    ]
    return proto, ir, meta, refs


def _leading_block(x: np.ndarray, cap: int) -> np.ndarray:
    """``x[:r, :c]`` with at most BLOCK rows, as many as fit in ``cap`` bytes (at least one
    row; a row wider than ``cap`` is cut to its first columns)."""
    row = x[0].nbytes
    rows = int(min(BLOCK, len(x), max(1, cap // max(row, 1))))
    x = x[:rows]
    if x.nbytes > cap and x.ndim >= 2:
        cols = max(1, cap // (rows * x.itemsize * int(np.prod(x.shape[2:]))))
        x = x[:, :cols]
    return np.ascontiguousarray(x)


def export(
    preset: str,
    out: pathlib.Path,
    only=None,
    cap: int = DEFAULT_CAP,
    log=print,
    cases: list[Spec] | None = None,
    reference: str = "xla",
):
    """Write the folder for ``preset`` (or for ``cases``, exported the preset's way: traced
    from shapes and referenced by rows for ``"large"``); returns the manifest dict."""
    if out.exists():
        shutil.rmtree(out)
    (out / "modules").mkdir(parents=True)
    large = preset == "large"
    manifest = {
        "format": FORMAT,
        "tensorflow": tf.__version__,
        "preset": preset,
        "created": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "reference": "reference.npz",
        "reference_mode": reference,
        "block_rows": BLOCK,
        "cases": [],
    }
    reference = {}
    done = {}  # (function name, recipe) -> module entry, so shared anchors are exported once
    for spec in specs(preset) if cases is None else cases:
        if only and not any(s in spec.op for s in only):
            continue
        inputs = make_inputs(spec.recipe, rows=BLOCK if large else None)
        case = {
            "op": spec.op,
            "shape": spec.shape,
            "target": spec.target,
            "repeats": spec.repeats,
            "rtol": spec.rtol,
            "atol": spec.atol,
            "inputs": spec.recipe,
            "wrt": list(spec.wrt),
            "anchors": list(spec.anchors),
            "input_shapes": [
                [spec.recipe["batch"], *x.shape[1:]] if x.ndim else [] for x in inputs
            ],
            "modules": {},
        }
        for name, fn in [(spec.op, spec.fn), *spec.anchors.items()]:
            key = (id(fn), json.dumps(spec.recipe, sort_keys=True), spec.wrt)
            if key not in done:
                start = time.perf_counter()
                proto, ir, meta, refs = export_module(fn, spec, inputs, large, cap, reference)
                targets, counts = _inspect(proto, ir)
                mkey = f"{len(done):03d}_{_slug(fn.__name__)}_{_slug(spec.shape)}"
                path = f"modules/{mkey}.hlo.pb.gz"
                (out / path).write_bytes(gzip.compress(proto, mtime=0))
                for i, r in enumerate(refs):
                    if r is not None:
                        reference[f"{mkey}/{i}"] = r
                done[key] = {
                    "file": path,
                    "key": mkey,
                    "function": fn.__name__,
                    "bytes": len(proto),
                    "outputs": meta,
                    "custom_calls": targets,
                    "hlo_ops": counts,
                }
                log(
                    f"  exported {name} {spec.shape}: {len(proto) / 1024:.0f} KiB, "
                    f"{time.perf_counter() - start:.1f} s"
                    + (
                        f", custom calls {done[key]['custom_calls']}"
                        if done[key]["custom_calls"]
                        else ""
                    )
                )
            case["modules"][name] = done[key]
        manifest["cases"].append(case)
    np.savez_compressed(out / "reference.npz", **reference)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=pathlib.Path("xla_export"),
        help="folder to (re)create (default: ./xla_export)",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--small", action="store_true", help="tiny shapes (CI)")
    size.add_argument("--large", action="store_true", help="GPU-only shapes")
    parser.add_argument(
        "--only", action="append", help="cases whose op contains this text (repeatable)"
    )
    parser.add_argument(
        "--reference",
        choices=("xla", "graph"),
        default="xla",
        help="how TF computes the reference outputs: the exported program "
        "under XLA (default) or as a plain tf.function (faster export)",
    )
    parser.add_argument(
        "--cap",
        type=int,
        default=DEFAULT_CAP,
        help="largest output stored whole, bytes (else its first rows)",
    )
    args = parser.parse_args(argv)
    preset = "small" if args.small else "large" if args.large else "bench"
    start = time.perf_counter()
    manifest = export(preset, args.out, args.only, args.cap, reference=args.reference)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(
        f"{len(manifest['cases'])} cases, "
        f"{len({m['key'] for c in manifest['cases'] for m in c['modules'].values()})} modules, "
        f"{size / 2**20:.1f} MiB in {args.out} ({time.perf_counter() - start:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
