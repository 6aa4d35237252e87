#!/usr/bin/env bash
# Builds bench/kernels/gemm_search.cu straight from the core's sources (no
# CMake, no Python) and runs it: for each FP8 GEMM of our Linear and
# LayerNormMLP steps (8192 tokens), is any cuBLASLt configuration faster than
# the heuristic's first answer that te-core runs? Arguments go to the driver:
# --budget SECONDS (default 200, all shapes together), --only SUBSTRING (e.g.
# "L4096->28672"). Needs nvcc, libcublasLt and an sm_90 GPU. CUBLAS_ROOT
# (optional) names a cuBLAS outside the CUDA toolkit, with include/ and lib/.
set -euo pipefail
cd "$(dirname "$0")/../.."
# (Not under $OUT: objects there crowd the logs out of what the device tool returns.)
build="${TMPDIR:-/tmp}/gemm_search_build"
mkdir -p "$build"
extra=()
lt_lib=(-lcublasLt)
if [ -n "${CUBLAS_ROOT:-}" ]; then
  extra=(-I "$CUBLAS_ROOT/include" -L "$CUBLAS_ROOT/lib" -Xlinker -rpath="$CUBLAS_ROOT/lib")
  # A wheel's lib/ has only the versioned name (libcublasLt.so.13).
  if [ ! -e "$CUBLAS_ROOT/lib/libcublasLt.so" ]; then
    lt_lib=("-l:$(basename "$(ls "$CUBLAS_ROOT"/lib/libcublasLt.so.* | head -n 1)")")
  fi
fi
# Tile, stages and cluster names from the cublasLt.h this build sees: its
# enumerators survive preprocessing ("CUBLASLT_MATMUL_TILE_128x256 = 27,").
printf '#include <cublasLt.h>\n' > "$build/names_src.cu"
nvcc -E "${extra[@]}" "$build/names_src.cu" | awk '
  function row(table, name, id) { rows[table] = rows[table] sprintf("    {%s, \"%s\"},\n", id, name) }
  match($0, /CUBLASLT_MATMUL_TILE_[0-9]+x[0-9]+ = [0-9]+/) {
    split(substr($0, RSTART + 21, RLENGTH - 21), f, " = "); row("kTileNames", f[1], f[2]) }
  match($0, /CUBLASLT_MATMUL_STAGES_[0-9]+x[0-9A-Z]+ = [0-9]+/) {
    split(substr($0, RSTART + 23, RLENGTH - 23), f, " = "); row("kStagesNames", f[1], f[2]) }
  match($0, /CUBLASLT_CLUSTER_SHAPE_[0-9]+x[0-9]+x[0-9]+ = [0-9]+/) {
    split(substr($0, RSTART + 23, RLENGTH - 23), f, " = "); row("kClusterNames", f[1], f[2]) }
  END {
    n = split("kTileNames kStagesNames kClusterNames", names, " ")
    for (i = 1; i <= n; ++i)
      printf "static const IdName %s[] = {\n    {0, \"%s\"},\n%s};\n", names[i],
             (names[i] == "kClusterNames") ? "auto" : "undef", rows[names[i]]
  }' > "$build/gemm_search_names.inc"
flags=(-std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -DTE_WITH_CUDA -DTE_VERSION_STRING='"bench"' -I core/include
  -I core/src -I "$build" "${extra[@]}")
# The driver includes core/src/gemm/{cublaslt.cpp,cuda.cu}; these are what they call.
sources=(bench/kernels/gemm_search.cu core/src/gemm/cuda_plan.cpp core/src/gemm/autotune.cpp
  core/src/gemm/algo_variants.cpp core/src/gemm/kernels.cu core/src/gemm/bias_grad.cu core/src/runtime/status.cpp
  core/src/runtime/tensor.cpp core/src/runtime/cuda_launch.cu)
source bench/kernels/nvcc_objects.sh
compile_objects
nvcc -arch=sm_90 "${extra[@]}" "${objects[@]}" "${lt_lib[@]}" -o "$build/gemm_search"
if [ "${GEMM_SEARCH_BUILD_ONLY:-0}" = 1 ]; then exit 0; fi
"$build/gemm_search" "$@"
