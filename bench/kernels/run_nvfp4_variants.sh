#!/usr/bin/env bash
# Builds bench/kernels/nvfp4_quantize_variants.cu straight from the core's
# sources (no CMake, no Python) and runs it: correctness of every NVFP4
# quantize kernel candidate against the CPU backend, then their speed on
# 32768x4096 BF16 against a device-to-device copy. Extra arguments go to the
# driver (--check-only: skip the timing). Needs nvcc and an sm_90 GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${OUT:-/tmp}/nvfp4_variants_build"
mkdir -p "$build"
flags=(-std=c++17 -O3 -arch=sm_90 -DTE_WITH_CUDA -DTE_VERSION_STRING='"bench"' -I core/include -I core/src)
sources=(bench/kernels/nvfp4_quantize_variants.cu core/src/nvfp4/cuda.cu core/src/nvfp4/cpu.cpp
  core/src/runtime/parallel.cpp core/src/runtime/status.cpp core/src/runtime/tensor.cpp
  core/src/runtime/device.cpp core/src/runtime/cuda_launch.cu)
# One compiler per source, in parallel; -Xptxas -v reports registers and spills.
pids=()
objects=()
for src in "${sources[@]}"; do
  obj="$build/$(basename "$src").o"
  objects+=("$obj")
  nvcc "${flags[@]}" -Xptxas -v -c "$src" -o "$obj" 2> "$obj.log" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
if [ "$status" != 0 ]; then cat "$build"/*.log; exit 1; fi
nvcc -arch=sm_90 "${objects[@]}" -o "$build/nvfp4_quantize_variants"
echo "ptxas, fast kernels (registers, spills):"
grep -A2 "fast15quantize_kernel" "$build/nvfp4_quantize_variants.cu.o.log" | grep -E "registers|spill" || true
"$build/nvfp4_quantize_variants" "$@"
