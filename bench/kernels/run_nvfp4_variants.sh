#!/usr/bin/env bash
# Builds bench/kernels/nvfp4_quantize_variants.cu straight from the core's
# sources (no CMake, no Python) and runs it: correctness of every NVFP4
# quantize kernel candidate against the CPU backend, then their speed on
# 32768x4096 BF16 against a device-to-device copy. Extra arguments go to the
# driver (--check-only: skip the timing). Needs nvcc, g++ and an sm_90 GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
# (Not under $OUT: objects there crowd the logs out of what the device tool returns.)
build="${TMPDIR:-/tmp}/nvfp4_variants_build"
mkdir -p "$build"
# First the host check of the packed route's helpers (core/src/nvfp4/packed.h).
g++ -O2 -std=c++17 -I core/src -I core/include core/tests/nvfp4_packed_check.cpp -o "$build/packed_check"
"$build/packed_check"
flags=(-std=c++17 -O3 -arch=sm_90 -DTE_WITH_CUDA -DTE_VERSION_STRING='"bench"' -I core/include -I core/src -Xptxas -v)
sources=(bench/kernels/nvfp4_quantize_variants.cu core/src/nvfp4/cuda.cu core/src/nvfp4/cpu.cpp
  core/src/runtime/parallel.cpp core/src/runtime/status.cpp core/src/runtime/tensor.cpp
  core/src/runtime/device.cpp core/src/runtime/cuda_launch.cu)
# One compiler per source, in parallel; -Xptxas -v reports registers and spills.
source bench/kernels/nvcc_objects.sh
compile_objects
nvcc -arch=sm_90 "${objects[@]}" -o "$build/nvfp4_quantize_variants"
echo "ptxas, fast kernel candidates:"
awk '/Compiling entry function .*fast15quantize_kernel/ {
       match($0, /CandidateILi[0-9]+/); c = substr($0, RSTART + 12, RLENGTH - 12);
       t = ($0 ~ /bfloat16/) ? "bf16" : "fp16"; want = 1 }
     want && /spill stores/ { split($0, f, " "); spill = f[5] }
     want && /Used [0-9]+ registers/ { match($0, /Used [0-9]+/);
       printf "  candidate %s %s: %s registers, %s bytes spilled\n", c, t, substr($0, RSTART + 5, RLENGTH - 5), spill;
       want = 0 }' "$build/nvfp4_quantize_variants.cu.o.log" | sort
"$build/nvfp4_quantize_variants" "$@"
