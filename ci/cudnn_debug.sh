#!/usr/bin/env bash
# Diagnosis of the cuDNN attention path on the GPU machine: builds te-core with
# TE_WITH_CUDNN=ON (cudnn-frontend headers from $TE_CUDNN_FRONTEND_INCLUDE_DIR,
# cudnn.h from the nvidia-cudnn wheel) into build/cudnn-site (the regular
# install stays), then runs one small attention call through the core under a
# SIGSEGV handler that prints the native stack, with cuDNN's and the
# frontend's logs on. Everything goes to $OUT/cudnn_*.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-build/gpu-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
CUDNN_INC=$(dirname "$(ls "$SITE"/nvidia/cudnn/include/cudnn.h "$SITE"/nvidia/*/include/cudnn.h 2>/dev/null | head -1)")
NVRTC_INC=$(dirname "$(command -v nvcc)")/../include
echo "cudnn.h in $CUDNN_INC; nvrtc.h in $NVRTC_INC; frontend in ${TE_CUDNN_FRONTEND_INCLUDE_DIR:-?}"
rm -rf build/cudnn-site
start=$(date +%s)
TE_WITH_CUDA=ON TE_CUDA_ARCHS=90 TE_WITH_CUDNN=ON "$PY" -m pip install --no-build-isolation --no-deps -v \
  --target build/cudnn-site -Cbuild-dir=build/cudnn-build \
  -Ccmake.define.TE_CUDNN_FRONTEND_INCLUDE_DIR="$TE_CUDNN_FRONTEND_INCLUDE_DIR" \
  -Ccmake.define.TE_CUDNN_INCLUDE_DIR="$CUDNN_INC" -Ccmake.define.TE_NVRTC_INCLUDE_DIR="$NVRTC_INC" \
  ./packages/te-core > "$OUT/cudnn_build.log" 2>&1 || { tail -40 "$OUT/cudnn_build.log"; exit 1; }
echo "cuDNN build in $(( $(date +%s) - start )) s"
LIB=$(ls build/cudnn-site/transformer_engine/core/libte_core.so)
echo "exported symbols other than te_*: $(nm -D --defined-only "$LIB" | awk '{print $3}' | grep -vc '^te_')"
ldd "$LIB" | grep -i "stdc\|cudnn\|cublas" || true
cat > build/segv.c <<'C'
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static void on_segv(int sig) {
  void* frames[64];
  int n = backtrace(frames, 64);
  fprintf(stderr, "\n=== signal %d: native stack ===\n", sig);
  backtrace_symbols_fd(frames, n, 2);
  _exit(128 + sig);
}
__attribute__((constructor)) static void install(void) {
  signal(SIGSEGV, on_segv);
  signal(SIGABRT, on_segv);
  signal(SIGBUS, on_segv);
}
C
gcc -shared -fPIC -o build/segv.so build/segv.c
export PYTHONPATH="$PWD/build/cudnn-site:$PWD/packages/te-pytorch/python"
export CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG="$OUT/cudnn_backend.log"
export CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE="$OUT/cudnn_frontend.log"
LD_PRELOAD="$PWD/build/segv.so" timeout 120 "$PY" ci/cudnn_one_call.py > "$OUT/cudnn_run.log" 2>&1
rc=$?
echo "rc $rc"
tail -40 "$OUT/cudnn_run.log"
if [ "$rc" = 0 ]; then
  # The one call survived: the cuDNN tests against the float64 oracle, then the timing.
  unset CUDNN_LOGLEVEL_DBG CUDNN_LOGDEST_DBG CUDNN_FRONTEND_LOG_INFO CUDNN_FRONTEND_LOG_FILE
  TE_TEST_CUDNN=1 timeout 300 "$PY" -m pytest -q -p no:cacheprovider -n 8 packages/te-core/tests/test_attention_cudnn.py \
    > "$OUT/cudnn_tests.log" 2>&1
  echo "cuDNN tests rc $?"; grep -E "^(FAILED|ERROR)" "$OUT/cudnn_tests.log" | head -20; tail -3 "$OUT/cudnn_tests.log"
  timeout 120 "$PY" bench/bench_attention.py > "$OUT/cudnn_bench_attention.log" 2>&1; echo "bench rc $?"
  grep -v -i warn "$OUT/cudnn_bench_attention.log" | tail -15
  exit 0
fi
if command -v gdb > /dev/null; then
  timeout 120 gdb -batch -ex run -ex bt -ex "info sharedlibrary" --args "$PY" ci/cudnn_one_call.py > "$OUT/cudnn_gdb.log" 2>&1
  grep -A30 "SIGSEGV\|^#0" "$OUT/cudnn_gdb.log" | head -50
else
  echo "(no gdb)"
fi
