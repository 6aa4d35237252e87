#!/bin/sh
# Runs CUDA kernels of the core on the CPU through a small emulation of the CUDA execution
# model (shim/: one std::thread per CUDA thread, __syncthreads and warp shuffles on
# std::barrier, host float arithmetic without FMA contraction) and compares every output with
# the CPU backend BIT FOR BIT on random valid configurations:
#   - the attention fallback (core/src/attention/cuda_fallback*.cu): every layout, mask, window,
#     bias, ALiBi, softmax variant, dropout, GQA, head sizes 1..300, sequences across several
#     tiles, scratch in shared memory or in workspace slices;
#   - the RoPE and fused softmax kernels (every format incl. thd and context parallelism, every
#     softmax variant, FP32/BF16/FP16).
# Bit equality holds because the kernels follow the CPU backends' tiles and sum orders and,
# emulated, use glibc's expf/logf/sinf/cosf too; on a GPU only CUDA's versions of those differ.
# No GPU needed. Usage: ci/cuda_emu/run.sh [cases] [seed]
set -e
here=$(cd "$(dirname "$0")" && pwd)
src=$here/../../core/src
out=${TMPDIR:-/tmp}/te_cuda_emu
python3 "$here/gen.py" "$src" "$out/gen"
flags="-std=c++20 -O2 -ffp-contract=off -pthread -w -I$here/shim -I$src -I$src/../include \
  -DTE_VERSION_STRING=\"emu\" -DTE_WITH_CUDA -D__global__= -D__device__= -D__host__= \
  -D__forceinline__=inline -D__launch_bounds__(x)="
runtime="$src/runtime/status.cpp $src/runtime/tensor.cpp $src/runtime/parallel.cpp"
g++ $flags "$here/harness.cpp" "$out/gen/attention_cuda_fallback.cpp" \
  "$out/gen/attention_cuda_fallback_bwd.cpp" "$src/attention/cpu.cpp" "$src/attention/cpu_bwd.cpp" \
  "$src/attention/cpu_common.cpp" $runtime -o "$out/attention"
g++ $flags "$here/harness_rope_softmax.cpp" "$out/gen/rope_cuda.cpp" "$out/gen/softmax_cuda.cpp" \
  "$src/rope/cpu.cpp" "$src/softmax/cpu.cpp" $runtime -o "$out/rope_softmax"
"$out/attention" "${1:-40}" "${2:-1}"
"$out/rope_softmax" "${1:-40}" "${2:-1}"
