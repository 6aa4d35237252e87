#!/usr/bin/env bash
# Static SASS instruction counts of the NVFP4 fast quantize kernel's per-tile
# work (bench/kernels/nvfp4_count_sass.cu), per candidate, per element and
# direction (both directions of a full BF16 tile; each thread owns
# kTileRows * 128 / threads elements per direction). Needs nvcc and
# cuobjdump (CUDA_BIN=/path/to/bin if it is not on PATH; NVIDIA's
# nvidia-cuda-cuobjdump wheel has one). No GPU.
# Usage: bash bench/kernels/count_nvfp4_sass.sh [candidate ...]   (default: 2 11 12 13 14)
set -euo pipefail
cd "$(dirname "$0")/../.."
cuobjdump="${CUDA_BIN:+$CUDA_BIN/}cuobjdump"
build="${TMPDIR:-/tmp}/nvfp4_count_build"
mkdir -p "$build"
candidates=("$@")
[ ${#candidates[@]} -gt 0 ] || candidates=(2 11 12 13 14)
printf "%-10s %8s %10s %9s  %s\n" candidate SASS elements per-elem "top opcodes"
for c in "${candidates[@]}"; do
  cubin="$build/count_$c.cubin"
  nvcc -std=c++17 -O3 -arch=sm_90 -DTE_WITH_CUDA -DCANDIDATE="$c" \
    -I core/include -I core/src -cubin bench/kernels/nvfp4_count_sass.cu -o "$cubin" 2> "$cubin.log"
  # Elements per thread and direction: tile rows * 128 / threads.
  elems=$(grep -oE "Candidate<$c> : Config<[0-9]+, [0-9]+" core/src/nvfp4/cuda_quantize_fast.cuh |
    awk -F'[<,]' '{print $3 * 128 / $4}')
  "$cuobjdump" -sass "$cubin" | grep -E '^\s+/\*[0-9a-f]{4}\*/' |
    sed -E 's/^\s+\/\*[0-9a-f]{4}\*\/\s+//; s/^@!?U?P[0-9T] //' | awk '{print $1}' |
    sed 's/\..*//; s/;//' | grep -vE '^(NOP|EXIT)$' > "$build/ops_$c.txt"
  total=$(wc -l < "$build/ops_$c.txt")
  top=$(sort "$build/ops_$c.txt" | uniq -c | sort -rn | head -12 | awk '{printf "%s %s, ", $2, $1}')
  printf "%-10s %8d %10d %9.2f  %s\n" "$c" "$total" "$((2 * elems))" \
    "$(echo "$total / (2 * $elems)" | bc -l)" "$top"
done
