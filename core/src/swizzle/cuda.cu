// CUDA backend of the swizzle family: a grid-stride loop, one byte per thread
// and step. Reads (compact side) are coalesced; writes land within 512-byte
// tiles. Scale buffers are 1/32 (MXFP8) or 1/16 (NVFP4) of the data they
// scale, so this simple form is not on any critical path.
#include "runtime/cuda_check.h"
#include "runtime/cuda_launch.h"
#include "swizzle/backend.h"
#include "swizzle/layout.h"

namespace te::swizzle::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) swizzle_kernel(const SwizzleArgs a) {
  const int64_t n = a.rows * a.cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < n; i += stride) {
    const int64_t swizzled =
        swizzled_offset_of(i / a.cols, i % a.cols, a.rows, a.cols, a.columnwise);
    if (a.unswizzle) {
      a.output[i] = __ldg(a.input + swizzled);
    } else {
      a.output[swizzled] = __ldg(a.input + i);
    }
  }
}

}  // namespace

void swizzle(const SwizzleArgs& args, te_stream stream) {
  const int64_t blocks = persistent_blocks(reinterpret_cast<const void*>(swizzle_kernel), kThreads,
                                           ceil_div(args.rows * args.cols, kThreads));
  swizzle_kernel<<<blocks, kThreads, 0, cuda_stream(stream)>>>(args);
  TE_CHECK_LAUNCH();
}

}  // namespace te::swizzle::cuda
