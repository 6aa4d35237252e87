// Backends of the transpose family: [rows, cols] -> [cols, rows] of
// element_bytes-sized elements (1, 2, 4 or 8).
#pragma once

#include <cstdint>

#include "te/types.h"

namespace te::transpose {

namespace cpu {
void transpose(const void* input, void* output, int64_t rows, int64_t cols, int element_bytes);
}

#ifdef TE_WITH_CUDA
namespace cuda {
void transpose(const void* input, void* output, int64_t rows, int64_t cols, int element_bytes,
               te_stream stream);
}
#endif

}  // namespace te::transpose
