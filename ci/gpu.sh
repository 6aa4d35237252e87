#!/usr/bin/env bash
# One command for the GPU machine: CUDA build of te-core for sm_90, all tests
# (GPU ones included), the standalone kernel drivers, then the benchmarks; the
# short table is printed last. Logs go to $OUT (the device tool's output folder)
# or build/gpu-out.
#
# TE_GPU_STAGES picks stages (default: all, in this order): build cudnn tests kernels bench.
# TE_CUDNN_FRONTEND_INCLUDE_DIR (cudnn-frontend headers) builds cuDNN attention in; stage
# cudnn then makes one guarded call and turns the cuDNN tests on (TE_TEST_CUDNN=1) or
# the backend off (NVTE_FUSED_ATTN=0) for the rest of the run.
# A machine that stays warm between two calls keeps the installed build, so a
# long session can be split, e.g. "build tests" then "kernels bench".
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-build/gpu-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# JAX (te-jax tests) must not take 75% of the GPU up front: torch tests share it.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
PY="${PYTHON:-python3}"
STAGES=" ${TE_GPU_STAGES:-build cudnn tests kernels bench} "
# te-pytorch is pure Python: used from the source tree (the machine has no
# network to fetch its build backend); transformer_engine is a namespace package.
export PYTHONPATH="$PWD/packages/te-pytorch/python${PYTHONPATH:+:$PYTHONPATH}"
has_stage() { [[ "$STAGES" == *" $1 "* ]]; }

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
"$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)" | tee "$OUT/versions.txt"
# te-jax's Flax tests (importorskip) skip on an image without flax: say so up front.
"$PY" -c "import flax; print('flax', flax.__version__)" 2>/dev/null | tee -a "$OUT/versions.txt" ||
  echo "flax not installed: te-jax's Flax tests skip" | tee -a "$OUT/versions.txt"

if has_stage build; then
  echo "== build te-core with CUDA (sm_90)"
  start=$(date +%s)
  # cuDNN fused attention joins the build when the cudnn-frontend headers are given
  # (TE_CUDNN_FRONTEND_INCLUDE_DIR; cudnn.h from the nvidia-cudnn wheel, nvrtc.h from nvcc's toolkit).
  cudnn=()
  if [ -n "${TE_CUDNN_FRONTEND_INCLUDE_DIR:-}" ]; then
    site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    cudnn_h=$(ls "$site"/nvidia/cudnn/include/cudnn.h "$site"/nvidia/*/include/cudnn.h 2>/dev/null | head -1)
    export TE_WITH_CUDNN=ON
    cudnn=(-Ccmake.define.TE_CUDNN_FRONTEND_INCLUDE_DIR="$TE_CUDNN_FRONTEND_INCLUDE_DIR"
      -Ccmake.define.TE_CUDNN_INCLUDE_DIR="$(dirname "$cudnn_h")"
      -Ccmake.define.TE_NVRTC_INCLUDE_DIR="$(dirname "$(command -v nvcc)")/../include")
  fi
  TE_WITH_CUDA=ON TE_CUDA_ARCHS=90 "$PY" -m pip install --no-build-isolation --no-deps -v "${cudnn[@]}" ./packages/te-core \
    > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
  grep -o "cuDNN attention [A-Z]*" "$OUT/build.log" | tail -1
  # te-jax's XLA FFI handlers, against this jaxlib and the te-core just built.
  "$PY" -m pip install --no-build-isolation --no-deps -v ./packages/te-jax >> "$OUT/build.log" 2>&1 ||
    { tail -60 "$OUT/build.log"; exit 1; }
  echo "built in $(( $(date +%s) - start )) s"
fi

if has_stage cudnn; then
  # One guarded cuDNN call first: if it dies, the tests run with NVTE_FUSED_ATTN=0
  # (the core's own kernel) instead of crashing every attention case.
  echo "== cuDNN smoke call"
  if timeout 120 "$PY" ci/cudnn_one_call.py > "$OUT/cudnn_run.log" 2>&1; then
    export TE_TEST_CUDNN=1
    echo "cuDNN call passed: the tests include the cuDNN cases"
  else
    export NVTE_FUSED_ATTN=0
    echo "cuDNN call failed (rc $?): tests run with NVTE_FUSED_ATTN=0"; tail -25 "$OUT/cudnn_run.log"
  fi
fi

tests_rc=0
if has_stage tests; then
  echo "== tests (CPU and GPU)"
  # pytest-xdist (on the device image) spreads the tests over processes sharing the GPU.
  workers=()
  if "$PY" -c "import xdist" 2>/dev/null; then workers=(-n "${TE_PYTEST_WORKERS:-8}"); fi
  set +e
  # -v: one line per test as it ends, so a run cut short by the device's time limit
  # still names what failed (the summary comes only at the end).
  "$PY" -m pytest -v -p no:cacheprovider "${workers[@]}" --durations=15 packages/te-core/tests \
    packages/te-pytorch/tests packages/te-jax/tests ${TE_GPU_PYTEST_ARGS:-} > "$OUT/tests.log" 2>&1
  tests_rc=$?
  set -e
  grep -E "(^| )(FAILED|ERROR) " "$OUT/tests.log" | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' | sort -u | head -40 || true
  tail -3 "$OUT/tests.log"
fi

if has_stage kernels; then
  echo "== standalone kernel drivers"
  # Candidate configurations of one kernel, timed and checked against the CPU backend.
  for driver in bench/kernels/run_*.sh; do
    if [ -f "$driver" ]; then
      bash "$driver" > "$OUT/$(basename "$driver" .sh).log" 2>&1 || echo "($driver failed)"
      tail -30 "$OUT/$(basename "$driver" .sh).log"
    fi
  done
fi

if has_stage bench; then
  echo "== benchmarks"
  for extra in ${TE_GPU_BENCHES:-bench/bench_norm.py bench/bench_activation.py bench/bench_te_pytorch_linear.py \
    bench/bench_te_pytorch_mlp.py bench/bench_host_overhead.py bench/bench_attention.py \
    bench/bench_te_pytorch_attention.py bench/bench_transformer_layer.py bench/bench_graphed.py}; do
    if [ -f "$extra" ]; then
      "$PY" "$extra" > "$OUT/$(basename "$extra" .py).log" 2>&1 || echo "($extra failed)"
      grep -v -i "warn" "$OUT/$(basename "$extra" .py).log" | tail -20
    fi
  done
  if [ -z "${TE_GPU_BENCHES:-}" ]; then  # (a chosen list of benches skips these two)
    # The timed choice of FP8 GEMM algorithms (opt-in until measured): the Linear table again.
    TE_GEMM_AUTOTUNE=all "$PY" bench/bench_te_pytorch_linear.py > "$OUT/bench_te_pytorch_linear_fp8tune.log" 2>&1 ||
      echo "(FP8-autotune Linear bench failed)"
    grep -v -i "warn" "$OUT/bench_te_pytorch_linear_fp8tune.log" | tail -13
    "$PY" bench/bench_core.py --markdown "$OUT/bench.md" ${TE_BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
    cat "$OUT/bench.md"
  fi
fi
exit $tests_rc
