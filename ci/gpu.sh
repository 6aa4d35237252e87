#!/usr/bin/env bash
# One command for the GPU machine: CUDA build of te-core for sm_90, all tests
# (GPU ones included), then the benchmarks; the short table is printed last.
# Logs go to $OUT (the device tool's output folder) or build/gpu-out.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-build/gpu-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
"$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)" | tee "$OUT/versions.txt"

echo "== build te-core with CUDA (sm_90)"
start=$(date +%s)
TE_WITH_CUDA=ON TE_CUDA_ARCHS=90 "$PY" -m pip install --no-build-isolation --no-deps -v ./packages/te-core \
  > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"

echo "== tests (CPU and GPU)"
# te-pytorch is pure Python: used from the source tree (the machine has no
# network to fetch its build backend); transformer_engine is a namespace package.
export PYTHONPATH="$PWD/packages/te-pytorch/python${PYTHONPATH:+:$PYTHONPATH}"
set +e
"$PY" -m pytest -q -p no:cacheprovider packages/te-core/tests packages/te-pytorch/tests \
  ${TE_GPU_PYTEST_ARGS:-} > "$OUT/tests.log" 2>&1
tests_rc=$?
set -e
tail -25 "$OUT/tests.log"

echo "== benchmarks"
for extra in bench/bench_norm.py bench/bench_activation.py bench/bench_te_pytorch_linear.py \
  bench/bench_host_overhead.py; do
  if [ -f "$extra" ]; then "$PY" "$extra" 2>&1 | tee "$OUT/$(basename "$extra" .py).log"; fi
done
"$PY" bench/bench_core.py --markdown "$OUT/bench.md" ${TE_BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
exit $tests_rc
