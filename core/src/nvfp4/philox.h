// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC 2011), the counter-based generator the NVFP4 stochastic rounding uses, so
// that the CPU and CUDA backends draw the same random word for each element.
// Usable in host and device code.
#pragma once

#include <cstdint>

#include "runtime/numerics.h"  // TE_HD

namespace te::nvfp4 {

struct PhiloxWords {
  uint32_t w[4];
};

// Constants of the published algorithm: round multipliers and Weyl key bumps.
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

// Ten rounds; the key is bumped between rounds (before rounds 2..10).
TE_HD PhiloxWords philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                uint32_t k1) {
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
#ifdef __CUDA_ARCH__
    // High and low halves of the 32x32-bit products; the GPU fuses each pair
    // into one IMAD.WIDE.U32 (the 64-bit product form costs an extra add).
    const uint32_t hi0 = __umulhi(kPhiloxM0, c0), lo0 = kPhiloxM0 * c0;
    const uint32_t hi1 = __umulhi(kPhiloxM1, c2), lo1 = kPhiloxM1 * c2;
#else
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
#endif
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return PhiloxWords{{c0, c1, c2, c3}};
}

// The random stream of one (seed, offset): words 4n..4n+3 are Philox of the
// counter (n_lo, n_hi, offset_lo, offset_hi) with the key (seed_lo, seed_hi).
struct RandomStream {
  uint64_t seed;
  uint64_t offset;

  // Words 4n..4n+3.
  TE_HD PhiloxWords block(uint64_t n) const {
    return philox4x32_10(static_cast<uint32_t>(n), static_cast<uint32_t>(n >> 32),
                         static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32),
                         static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  }
  // Word j. (Selects without indexing by a runtime value, which would put
  // the words in local memory on the GPU.)
  TE_HD uint32_t word(uint64_t j) const {
    const PhiloxWords b = block(j >> 2);
    const uint32_t lane = static_cast<uint32_t>(j & 3);
    return lane == 0 ? b.w[0] : lane == 1 ? b.w[1] : lane == 2 ? b.w[2] : b.w[3];
  }

  // Words first .. first + 15 for first % 4 == 0: four Philox calls.
  TE_HD void aligned_block_words(uint64_t first, uint32_t r[16]) const {
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int q = 0; q < 4; ++q) {
      const PhiloxWords b = block((first >> 2) + q);
      r[4 * q] = b.w[0];
      r[4 * q + 1] = b.w[1];
      r[4 * q + 2] = b.w[2];
      r[4 * q + 3] = b.w[3];
    }
  }

  // The words of a 16-element block whose element i has word index
  // first + i * stride. Contiguous aligned blocks take 4 Philox calls, not 16.
  TE_HD void block_words(uint64_t first, uint64_t stride, uint32_t r[16]) const {
    if (stride == 1 && (first & 3) == 0) {
      aligned_block_words(first, r);
    } else {
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
      for (int i = 0; i < 16; ++i) r[i] = word(first + static_cast<uint64_t>(i) * stride);
    }
  }
};

}  // namespace te::nvfp4
