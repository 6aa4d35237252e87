// The 16-point random Hadamard transform of NVFP4's columnwise operand (see
// te/nvfp4.h): v' = v H, H = (1/4) diag(S) H16. A fixed FP32 operation order
// (sign flips, butterflies h = 1, 2, 4, 8, then * 0.25) makes every backend
// produce the same bits; only additions, subtractions and one exact-or-rounded
// multiply per element, so no FMA contraction can change the result.
#pragma once

#include <cstdint>

#include "runtime/numerics.h"  // TE_HD

namespace te::nvfp4 {

constexpr int kHadamardSize = 16;

TE_HD void random_hadamard_16(float v[kHadamardSize], uint32_t sign_mask) {
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int i = 0; i < kHadamardSize; ++i)  // v[i] = -v[i] where bit i is set, without a branch
    v[i] = bit_cast_value<float>(bit_cast_value<uint32_t>(v[i]) ^ (((sign_mask >> i) & 1u) << 31));
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int h = 1; h < kHadamardSize; h <<= 1) {
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int j = 0; j < kHadamardSize; ++j) {
      if (j & h) continue;  // j is the first of the pair (j, j + h)
      const float a = v[j], b = v[j + h];
      v[j] = a + b;
      v[j + h] = a - b;
    }
  }
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int i = 0; i < kHadamardSize; ++i) v[i] = v[i] * 0.25f;
}

}  // namespace te::nvfp4
