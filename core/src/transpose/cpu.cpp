// CPU transpose in square tiles, so reads and writes both stay in cache.
#include <algorithm>
#include <cstring>

#include "runtime/parallel.h"
#include "transpose/backend.h"

namespace te::transpose::cpu {
namespace {

constexpr int64_t kTile = 64;

template <class T>
void transpose_typed(const T* in, T* out, int64_t rows, int64_t cols) {
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  parallel_for(row_tiles, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = t * kTile, r1 = std::min(rows, r0 + kTile);
      for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
        const int64_t c1 = std::min(cols, c0 + kTile);
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) out[c * rows + r] = in[r * cols + c];
      }
    }
  });
}

}  // namespace

void transpose(const void* input, void* output, int64_t rows, int64_t cols, int element_bytes) {
  switch (element_bytes) {
    case 1:
      transpose_typed(static_cast<const uint8_t*>(input), static_cast<uint8_t*>(output), rows,
                      cols);
      break;
    case 2:
      transpose_typed(static_cast<const uint16_t*>(input), static_cast<uint16_t*>(output), rows,
                      cols);
      break;
    case 4:
      transpose_typed(static_cast<const uint32_t*>(input), static_cast<uint32_t*>(output), rows,
                      cols);
      break;
    default:
      transpose_typed(static_cast<const uint64_t*>(input), static_cast<uint64_t*>(output), rows,
                      cols);
      break;
  }
}

}  // namespace te::transpose::cpu
