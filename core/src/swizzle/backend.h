// Backends of the swizzle family: permute a compact [rows, cols] matrix of
// one-byte block scales into the GEMM layout (or back, when unswizzle).
#pragma once

#include <cstdint>

#include "te/types.h"

namespace te::swizzle {

struct SwizzleArgs {
  const uint8_t* input;
  uint8_t* output;
  int64_t rows, cols;  // of the compact matrix
  bool columnwise;
  bool unswizzle;  // swizzled input -> compact output
};

namespace cpu {
void swizzle(const SwizzleArgs& args);
}

#ifdef TE_WITH_CUDA
namespace cuda {
void swizzle(const SwizzleArgs& args, te_stream stream);
}
#endif

}  // namespace te::swizzle
