// CPU backend of the swizzle family: one byte at a time, rows in parallel.
#include "runtime/parallel.h"
#include "swizzle/backend.h"
#include "swizzle/layout.h"

namespace te::swizzle::cpu {

void swizzle(const SwizzleArgs& a) {
  parallel_for(a.rows, 256, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < a.cols; ++c) {
        const int64_t compact = r * a.cols + c;
        const int64_t swizzled = swizzled_offset_of(r, c, a.rows, a.cols, a.columnwise);
        if (a.unswizzle) {
          a.output[compact] = a.input[swizzled];
        } else {
          a.output[swizzled] = a.input[compact];
        }
      }
    }
  });
}

}  // namespace te::swizzle::cpu
