"""Run TensorFlow-exported XLA programs with jaxlib: ``python benchmarks/run_xla.py FOLDER``.

Second half of the TF -> XLA -> jaxlib pipeline (issue 13); the first half is
``benchmarks/xla_export.py``, which writes FOLDER. This script needs only numpy and jax
(``pip install losszoo[xla-export]``): no TensorFlow, no losszoo, so it runs on a machine
where TensorFlow cannot be installed (e.g. an accelerator host with a different CUDA).

Pipeline, per module (one forward+backward step of one op or anchor at one shape):

1. ``manifest.json`` lists the cases; each names its modules (``*.hlo.pb.gz``: the
   ``HloModuleProto`` that TensorFlow's tf2xla bridge produced for the
   ``tf.function(jit_compile=True)`` step, *before* any backend optimisation, so the device
   that runs it optimises it for itself) and the recipe of its inputs.
2. The inputs are regenerated here from that recipe (:func:`make_inputs`: numpy PCG64 streams
   seeded per block of rows), so nothing large travels: the exporter called the same
   function, so both sides see bit-identical inputs.
3. The proto is wrapped in ``xla_client.XlaComputation``, converted to a StableHLO module by
   jaxlib's own HLO importer (``mlir.xla_computation_to_mlir_module``; TF's tuple-shaped entry
   result becomes a flat list of results), compiled with ``backend.compile_and_load`` for the
   first device JAX sees (CPU or GPU) and run on device-resident inputs. Parameters are passed
   positionally in the order of the step function's arguments (the order TF lowers them in);
   shapes and dtypes are checked against the module's program shape first.
4. Outputs are compared with TensorFlow's (``reference.npz`` beside the modules): all of an
   output when it was small enough to store, else its leading block ``out[:r, :c]`` (for
   ``--large`` the ops are row-independent, so the exporter computed those rows with a
   small-batch run of the same step); scalars reduced over a batch that TF could not run
   (``--large``) are not checked. Tolerances
   come from the manifest: ``|out - ref| <= atol * max(1, max|ref|) + rtol * |ref|``.
5. Each case's op and anchors are timed in interleaved rounds (every round calls each module
   once; the median per module is reported), and the table has ``benchmarks/run.py``'s columns
   plus one: whether the outputs matched TensorFlow's (with the largest scaled error).

Exit status 1 when a module fails to compile or run, or an output does not match; ``--json``
writes every row (used by tests/benchmarks/test_xla_export.py).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pathlib
import platform
import statistics
import sys
import time

import numpy as np

# ---------------------------------------------------------------------------------------
# Inputs: generated from a recipe on both sides (the exporter imports this module)
# ---------------------------------------------------------------------------------------

BLOCK = 16  # rows per RNG block: rows [0, BLOCK) never depend on the batch size


def _blocks(batch, seed, make_block):
    """Concatenate ``make_block(rng, rows)`` over blocks of BLOCK rows, each its own stream."""

    def fill(i):
        start = i * BLOCK
        part = make_block(np.random.default_rng([seed, i]), min(BLOCK, batch - start))
        for o, p in zip(out, part):
            o[start : start + len(p)] = p

    first = make_block(np.random.default_rng([seed, 0]), min(BLOCK, batch))
    # filled in place (4096 x 1e6 inputs are 16 GB each), blocks in parallel: numpy's
    # generators release the GIL while filling arrays
    out = [np.empty((batch, *p.shape[1:]), p.dtype) for p in first]
    for o, p in zip(out, first):
        o[: len(p)] = p
    blocks = range(1, -(-batch // BLOCK))
    if out[0].size > 1 << 24:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(os.cpu_count()) as pool:
            list(pool.map(fill, blocks))
    else:
        for i in blocks:
            fill(i)
    return out


def _logits_onehot(batch, k, seed=0):
    def block(rng, rows):
        x = rng.standard_normal((rows, k), dtype=np.float32)
        y = np.zeros((rows, k), np.float32)
        y[np.arange(rows), rng.integers(0, k, rows)] = 1.0
        return x, y

    return _blocks(batch, seed, block)


def _scores_ids(batch, n, seed=0, dense=False):
    def block(rng, rows):
        s = rng.standard_normal((rows, n), dtype=np.float32)
        ids = rng.integers(0, n, rows).astype(np.int32)
        if dense:
            y = np.zeros((rows, n), np.float32)
            y[np.arange(rows), ids] = 1.0
            return s, y
        return s, ids

    return _blocks(batch, seed, block)


def _bcsoftmax(batch, k, seed=0, temperature=0.7):
    """bench_bcsoftmax's problem (feasible random boxes) plus a scalar temperature."""

    def block(rng, rows):
        x = rng.normal(0, 3, (rows, k))
        b = rng.random((rows, k))
        b /= np.minimum(1.0, b.sum(1, keepdims=True) - 1e-6)
        a = rng.random((rows, k))
        a /= a.sum(1, keepdims=True)
        a *= rng.random((rows, 1)) * 0.5
        b = np.minimum(np.maximum(a, b) + 1e-6, 1.0)
        return x.astype(np.float32), a.astype(np.float32), b.astype(np.float32)

    return _blocks(batch, seed, block) + [np.float32(temperature)]


def _possibility(batch, k, seed=0):
    """bench_possibilistic's labels: ChaosNLI-like votes for K = 3, else the spec 6.2 staircase."""

    def block(rng, rows):
        logits = rng.standard_normal((rows, k), dtype=np.float32)
        if k == 3:
            votes = rng.multinomial(100, rng.dirichlet(np.ones(3)), size=rows)
            pi = np.maximum(votes / votes.max(1, keepdims=True), 1e-6)
        else:
            pi = np.zeros((rows, k))
            for i in range(rows):
                c = rng.integers(k)
                others = rng.permutation([j for j in range(k) if j != c])
                a = min(1 - 1e-6, max(0.0, 0.95 + 0.15 * rng.normal()))
                pi[i, c] = 1.0
                for r, j in enumerate(others):
                    pi[i, j] = min(1 - 1e-6, 1e-6 + max(0.0, a - r * 0.01))
        return logits, pi.astype(np.float32)

    return _blocks(batch, seed, block)


def _losses(batch, seed=0, alpha=1.5):
    """Per-example losses ~ Gamma(2) and a scalar dual variable, as in bench_dro."""
    return _blocks(
        batch, seed, lambda rng, rows: (rng.gamma(2.0, size=rows).astype(np.float32),)
    ) + [np.float32(alpha)]


GENERATORS = {
    "logits_onehot": _logits_onehot,
    "scores_ids": _scores_ids,
    "bcsoftmax": _bcsoftmax,
    "possibility": _possibility,
    "losses": _losses,
}


def make_inputs(recipe: dict, rows: int | None = None) -> list[np.ndarray]:
    """Inputs of a case from its recipe ``{"generator": name, "batch": B, ...kwargs}``.

    ``rows`` generates only the first ``rows`` rows (``rows <= BLOCK`` gives exactly the first
    rows of the full-batch inputs, whatever the batch size).
    """
    kwargs = dict(recipe)
    name = kwargs.pop("generator")
    if rows is not None:
        kwargs["batch"] = rows
    return [np.asarray(x) for x in GENERATORS[name](**kwargs)]


# ---------------------------------------------------------------------------------------
# jaxlib: HLO proto -> StableHLO -> executable
# ---------------------------------------------------------------------------------------


def _jax():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import jax

    jax.config.update("jax_enable_x64", True)  # keep float64 / int64 inputs as they are
    return jax


class XlaRunner:
    """Compiles and runs exported HLO module protos on the first device JAX sees."""

    def __init__(self, platform_name: str | None = None):
        self.jax = _jax()
        from jax._src.lib import xla_client  # jaxlib's XLA client, shipped with jax

        self.xc = xla_client
        self.device = (self.jax.devices(platform_name) if platform_name else self.jax.devices())[0]
        self.backend = self.device.client
        self.mlir = xla_client._xla.mlir  # jaxlib HLO <-> StableHLO helpers
        self._cache = {}

    def computation(self, proto: bytes):
        return self.xc.XlaComputation(proto)

    def custom_calls(self, proto: bytes) -> list[str]:
        """custom-call targets in the module (jaxlib must know each one)."""
        text = self.computation(proto).as_hlo_text()
        return sorted(
            {
                line.split('custom_call_target="')[1].split('"')[0]
                for line in text.splitlines()
                if 'custom_call_target="' in line
            }
        )

    def compile(self, proto: bytes):
        """Compile an ``HloModuleProto`` (cached); returns ``(executable, program_shape)``."""
        if proto not in self._cache:
            self._cache[proto] = self._compile(proto)
        return self._cache[proto]

    def _compile(self, proto: bytes):
        comp = self.computation(proto)
        stablehlo = self.mlir.xla_computation_to_mlir_module(comp)
        options = self.xc.CompileOptions()
        if hasattr(self.backend, "compile_and_load"):  # jax >= 0.6
            exe = self.backend.compile_and_load(
                stablehlo, self.xc.DeviceList((self.device,)), options
            )
        else:  # older jaxlib: compile() returns a loaded executable
            exe = self.backend.compile(stablehlo, options)
        return exe, comp.program_shape()

    def put(self, arrays):
        return [self.jax.device_put(a, self.device) for a in arrays]

    def run(self, exe, args):
        """Run and wait; returns the list of device outputs (a tuple result is flattened)."""
        outs = exe.execute(args)
        self.jax.block_until_ready(outs)
        return outs


def read_module(path: pathlib.Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def check_signature(program_shape, inputs) -> None:
    """Raise if the module's parameters do not match the regenerated inputs."""
    params = program_shape.parameter_shapes()
    if len(params) != len(inputs):
        raise ValueError(f"module has {len(params)} parameters, recipe gives {len(inputs)} inputs")
    for i, (p, x) in enumerate(zip(params, inputs)):
        if tuple(p.dimensions()) != x.shape or np.dtype(p.numpy_dtype()) != x.dtype:
            raise ValueError(
                f"parameter {i}: module expects {p}, input is {x.dtype}{list(x.shape)}"
            )


def compare(out: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> tuple[bool, float]:
    """``(ok, worst)``: worst = max |out-ref| / (atol*max(1,max|ref|) + rtol*|ref|); ok if <= 1.

    Non-finite entries must match exactly (NaN where TF has NaN, same-signed inf).
    """
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    if out.shape != ref.shape:
        return False, float("inf")
    fin = np.isfinite(ref)
    same_nonfinite = np.array_equal(np.isnan(out), np.isnan(ref)) and np.array_equal(
        out[np.isinf(ref)], ref[np.isinf(ref)]
    )
    if not fin.any():
        return bool(same_nonfinite), 0.0
    scale = max(1.0, float(np.max(np.abs(ref[fin]))))
    bound = atol * scale + rtol * np.abs(ref[fin])
    err = np.abs(out[fin] - ref[fin]) / bound
    worst = float(np.max(err)) if np.all(np.isfinite(err)) else float("inf")
    return bool(same_nonfinite and worst <= 1.0), worst


# ---------------------------------------------------------------------------------------
# Running a folder
# ---------------------------------------------------------------------------------------


def check_module(runner, folder, case, name, outs, reference):
    """Compare one module's outputs with TF's; returns ``(status, worst)``."""
    meta = case["modules"][name]
    worst, checked, ok = 0.0, 0, True
    for i, spec in enumerate(meta["outputs"]):
        key = f"{meta['key']}/{i}"
        if spec["reference"] == "none":
            continue
        ref = reference[key]
        out = np.asarray(outs[i])
        if spec["reference"] == "rows":  # a leading block out[:r, :c] of the output
            out = out[tuple(slice(0, n) for n in ref.shape)]
        good, w = compare(out, ref, case["rtol"], case["atol"])
        ok &= good
        worst = max(worst, w)
        checked += 1
    if not checked:
        return "no reference", worst
    return ("yes" if ok else "NO"), worst


def time_modules(runner, compiled: dict, repeats: int) -> dict:
    """Interleaved timing: each round runs every module once; median seconds per module."""
    times = {name: [] for name in compiled}
    for exe, args in compiled.values():
        runner.run(exe, args)  # second warm-up (the check run was the first)
    for r in range(repeats):
        names = list(compiled) if r % 2 == 0 else list(compiled)[::-1]
        for name in names:
            exe, args = compiled[name]
            start = time.perf_counter()
            runner.run(exe, args)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def run_case(runner, folder, case, reference, repeats=None, check_only=False):
    """Compile, check and time one case (op + anchors); returns one result row."""
    row = {
        "op": case["op"],
        "shape": case["shape"],
        "target": case.get("target", ""),
        "modules": {},
        "error": None,
    }
    try:
        inputs = make_inputs(case["inputs"])
        args = None
        compiled = {}
        for name in [case["op"], *case["anchors"]]:
            meta = case["modules"][name]
            proto = read_module(folder / meta["file"])
            start = time.perf_counter()
            exe, shape = runner.compile(proto)
            compile_s = time.perf_counter() - start
            check_signature(shape, inputs)
            if args is None:
                args = runner.put(inputs)
            outs = runner.run(exe, args)
            status, worst = check_module(runner, folder, case, name, outs, reference)
            row["modules"][name] = {
                "match": status,
                "worst": worst,
                "compile_s": compile_s,
                "custom_calls": runner.custom_calls(proto),
            }
            compiled[name] = (exe, args)
            del outs
        if not check_only:
            reps = repeats or case.get("repeats", 10)
            timed = time_modules(runner, compiled, reps)
            for name, sec in timed.items():
                row["modules"][name]["ms"] = sec * 1e3
    except Exception as err:  # noqa: BLE001  (report it, go on with the other cases)
        row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
    return row


def format_row(row, mode) -> str:
    """One Markdown row in run.py's columns (+ "matches TF")."""
    if row["error"]:
        return (
            f"| {row['op']} | {row['shape']} | {mode} | FAILED | {row['error']} | "
            f"{row['target']} | - |"
        )
    mods = row["modules"]
    op = mods[row["op"]]
    anchors = [a for a in mods if a != row["op"]]
    matches = "; ".join(
        f"{'' if n == row['op'] else n + ': '}{m['match']} ({m['worst']:.2g})"
        for n, m in mods.items()
    )
    if "ms" not in op:
        return f"| {row['op']} | {row['shape']} | {mode} | - | - | {row['target']} | {matches} |"
    ratios = "; ".join(
        f"{a}: {op['ms'] / mods[a]['ms']:.2f}x ({mods[a]['ms']:.2f})" for a in anchors
    )
    return (
        f"| {row['op']} | {row['shape']} | {mode} | {op['ms']:.2f} | {ratios or '-'} | "
        f"{row['target']} | {matches} |"
    )


def machine_line(runner, manifest) -> str:
    import jaxlib

    dev = runner.device
    return (
        f"{platform.node()} | {platform.processor() or platform.machine()} | "
        f"{os.cpu_count()} cores | {dev.platform}: {dev.device_kind} | "
        f"Python {platform.python_version()} | jax {runner.jax.__version__} | "
        f"jaxlib {jaxlib.__version__} | NumPy {np.__version__} | "
        f"{time.strftime('%Y-%m-%d')} | exported from TF {manifest['tensorflow']} "
        f"({manifest['preset']} shapes)"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("folder", type=pathlib.Path, help="folder written by xla_export.py")
    parser.add_argument(
        "--only", action="append", help="run cases whose op contains this text (repeatable)"
    )
    parser.add_argument("--platform", help="JAX platform to use (cpu, gpu); default: JAX's")
    parser.add_argument("--repeats", type=int, help="timed rounds per case (default: manifest)")
    parser.add_argument("--check-only", action="store_true", help="compile and check, no timing")
    parser.add_argument("--json", type=pathlib.Path, help="write all result rows here")
    args = parser.parse_args(argv)

    folder = args.folder
    manifest = json.loads((folder / "manifest.json").read_text())
    runner = XlaRunner(args.platform)
    reference = np.load(folder / manifest["reference"])
    mode = f"xla via jax ({runner.device.platform})"
    print(f"machine: {machine_line(runner, manifest)}\n")
    print(
        "| op | shape | mode | fwd+bwd ms | ratio to anchors (anchor ms) | target | "
        "matches TF (worst err / tol) |"
    )
    print("|---|---|---|---|---|---|---|")
    rows, failed = [], 0
    for case in manifest["cases"]:
        if args.only and not any(s in case["op"] for s in args.only):
            continue
        row = run_case(runner, folder, case, reference, args.repeats, args.check_only)
        rows.append(row)
        bad = row["error"] or any(m["match"] == "NO" for m in row["modules"].values())
        failed += bool(bad)
        print(format_row(row, mode), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": runner.device.platform, "rows": rows}, indent=1))
    if failed:
        print(f"\n{failed} case(s) failed to compile, run or match TensorFlow", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
