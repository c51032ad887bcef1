#!/usr/bin/env bash
# The GPU rows of issues 33 and 34 in one command, on a machine with CUDA, JAX and PyTorch but
# no TensorFlow and no network (the device machine). From the repository root:
#   bash benchmarks/device_check.sh OUT_DIR
# Needs, beside the working tree, .whl/ with the wheels the machine lacks, for its Python:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     -d .whl keras==3.15.1 namex optree entmax liger-kernel
# (optax, Triton, JAX and PyTorch are on the machine). Each part has its own time limit, and
# writes its table to OUT_DIR as it goes, so a part cut short still returns its rows
# (benchmarks/bench_gpu.py says what each part measures). About 8 minutes in all.
set -uo pipefail
out="${1:?usage: device_check.sh OUT_DIR}"
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python3 -c "import jax, torch; print('jax', jax.__version__, 'torch', torch.__version__)" \
  | tee -a "$out/gpu.txt"
bench="python3 benchmarks/bench_gpu.py"
KERAS_BACKEND=jax timeout 120 $bench --part sparsemax 2>&1 | tee "$out/jax_sparsemax.md"
KERAS_BACKEND=jax timeout 100 $bench --part catalogue 2>&1 | tee "$out/jax_catalogue.md"
KERAS_BACKEND=torch timeout 90 $bench --part torch 2>&1 | tee "$out/torch.md"
KERAS_BACKEND=torch timeout 60 $bench --part catalogue 2>&1 | tee "$out/torch_catalogue.md"
KERAS_BACKEND=jax timeout 130 $bench --part bcsoftmax 2>&1 | tee "$out/jax_bcsoftmax.md"
