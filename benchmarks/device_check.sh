#!/usr/bin/env bash
# The GPU check of issue 21 item 8, in one command, on a machine with CUDA, JAX and PyTorch but
# no TensorFlow and no network (the device machine). From the repository root:
#   bash benchmarks/device_check.sh OUT_DIR
# Needs, beside the working tree: .whl/ (keras, namex, optree wheels for the machine's Python:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     -d .whl keras==3.15.1 namex optree)
# and .gpu/shared/specs (the spec oracles the tests read: cp -r ../shared/specs .gpu/shared/),
# plus .gpu/cpu_jax.npz (`KERAS_BACKEND=jax python benchmarks/outputs.py --save .gpu/cpu_jax.npz`
# run on the CPU machine, with jax_enable_x64 as below). Writes to OUT_DIR: the GPU, the JAX
# test run, outputs against the CPU, and the benchmark tables on JAX and PyTorch.
set -uo pipefail
out="${1:?usage: device_check.sh OUT_DIR}"
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 LOSSZOO_SHARED="$PWD/.gpu/shared"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
# the op / loss / fit tests on JAX (the possibilistic, README and example tests are left to CPU CI:
# they are compile-bound and the device minutes are few)
KERAS_BACKEND=jax timeout 200 python3 -m pytest -q -p no:cacheprovider tests/ops/test_sparsemax.py \
  tests/ops/test_rankmax.py tests/ops/test_bcsoftmax.py tests/ops/test_dro.py \
  tests/losses/test_keras_fit.py 2>&1 | tail -30 | tee "$out/tests_jax.txt"
KERAS_BACKEND=jax JAX_ENABLE_X64=1 timeout 60 python3 benchmarks/outputs.py \
  --compare .gpu/cpu_jax.npz 2>&1 | tee "$out/outputs_vs_cpu.md"
KERAS_BACKEND=jax timeout 180 python3 benchmarks/run.py --backend jax 2>&1 | tee "$out/bench_jax.md"
KERAS_BACKEND=torch timeout 60 python3 benchmarks/run.py --backend torch --quick --only sparsemax \
  --only rankmax --only bcsoftmax 2>&1 | tee "$out/bench_torch.md"
