#!/bin/sh
# Runs the core's own CUDA attention kernels (core/src/attention/cuda_fallback*.cu) on the CPU
# through a small emulation of the CUDA execution model (shim/: one std::thread per CUDA thread,
# __syncthreads and warp shuffles on std::barrier, host float arithmetic without FMA
# contraction) and compares every output with the CPU backend BIT FOR BIT on random valid
# configurations (every layout, mask, window, bias, ALiBi, softmax variant, dropout, GQA,
# head sizes 1..300, sequences across several tiles, scratch in shared memory or in workspace
# slices). Bit equality holds because the kernels follow the CPU backend's tiles and sum orders
# and, emulated, use glibc's expf/logf too; on a GPU only CUDA's expf/logf differ.
# No GPU needed. Usage: ci/cuda_emu/run.sh [cases] [seed]
set -e
here=$(cd "$(dirname "$0")" && pwd)
core=$here/../../core
out=${TMPDIR:-/tmp}/te_cuda_emu
python3 "$here/gen.py" "$core/src/attention" "$out/gen"
g++ -std=c++20 -O2 -ffp-contract=off -pthread -w -I"$here/shim" -I"$core/src" -I"$core/include" \
  -DTE_VERSION_STRING='"emu"' -D__global__= -D__device__= -D__host__= -D__forceinline__=inline \
  "-D__launch_bounds__(x)=" "$here/harness.cpp" "$out/gen/cuda_fallback.cpp" \
  "$out/gen/cuda_fallback_bwd.cpp" "$core/src/attention/cpu.cpp" "$core/src/attention/cpu_bwd.cpp" \
  "$core/src/attention/cpu_common.cpp" "$core/src/runtime/status.cpp" "$core/src/runtime/tensor.cpp" \
  "$core/src/runtime/parallel.cpp" -o "$out/harness"
"$out/harness" "${1:-40}" "${2:-1}"
