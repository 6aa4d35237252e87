#!/usr/bin/env bash
# Builds and runs the MXFP8 quantize variants driver (mxfp8_quantize_variants.cu)
# straight from the core's sources, no CMake: nvcc -O3 for sm_90 (H100/H200).
#   bench/kernels/run_mxfp8_variants.sh            # check bytes vs CPU, then time
#   bench/kernels/run_mxfp8_variants.sh --time-only
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${TMPDIR:-/tmp}/mxfp8_quantize_variants"
src="$root/core/src"
# The core's own flags (core/CMakeLists.txt): relaxed constexpr for CUDA, no FP
# contraction on the host (the CPU reference is bit-exact).
nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Xcompiler -pthread,-ffp-contract=off \
  -DTE_VERSION_STRING='"variants"' -I "$root/core/include" -I "$src" \
  "$root/bench/kernels/mxfp8_quantize_variants.cu" "$src/mxfp8/cpu.cpp" "$src/runtime/parallel.cpp" \
  "$src/runtime/status.cpp" "$src/runtime/tensor.cpp" "$src/runtime/cuda_launch.cu" -o "$out"
[ "${BUILD_ONLY:-0}" = 1 ] || "$out" "$@"
