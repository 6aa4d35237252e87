// CUDA backend of the RoPE family (te/rope.h). One block per token at a time
// (grid-stride over tokens); its threads stride over the token's h * d
// elements. The position rule and the element formula are the CPU backend's
// (rope/backend.h, _rn arithmetic); sin/cos are CUDA's FP32 sinf/cosf (no fast
// math), evaluated per element: a rotated element reads its own angle's
// cosine and, forward, its own sine (backward: the partner's).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "rope/backend.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_elem.cuh"
#include "runtime/cuda_launch.h"

namespace te::rope::cuda {
namespace {

constexpr int kThreads = 128;

template <class T>
__global__ void __launch_bounds__(kThreads) rope_kernel(Args a) {
  using te::cuda_elem::from_float;
  using te::cuda_elem::to_float;
  const T* in = static_cast<const T*>(a.in);
  T* out = static_cast<T*>(a.out);
  const int64_t row = a.h * a.d;
  for (int64_t tok = blockIdx.x; tok < a.tokens; tok += gridDim.x) {
    const Place pl = place(a, tok);
    const T* src = in + tok * row;
    T* dst = out + tok * row;
    const float* angles = pl.pos >= 0 ? a.freqs + pl.pos * a.d2 : nullptr;
    for (int64_t e = threadIdx.x; e < row; e += blockDim.x) {
      const int64_t i = e % a.d;
      if (!pl.in_sequence || i >= a.d2) {
        dst[e] = src[e];
        continue;
      }
      float sign = 0.0f;
      const int64_t p = partner(i, a.d2, a.interleaved, &sign);
      const float nan = __int_as_float(0x7FC00000);
      const float fi = angles ? angles[i] : nan;
      const float fs = angles ? angles[a.backward ? p : i] : nan;
      const float xi = to_float(src[e]);
      const float xp = to_float(src[e - i + p]);
      dst[e] = from_float<T>(rotate(xi, xp, cosf(fi), sinf(fs), sign, a.backward));
    }
  }
}

}  // namespace

void run(const Args& a, te_stream stream) {
  te::cuda_elem::dispatch_input(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const void* kernel = reinterpret_cast<const void*>(&rope_kernel<T>);
    const int64_t blocks = persistent_blocks(kernel, kThreads, a.tokens);
    rope_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, cuda_stream(stream)>>>(a);
    TE_CHECK_LAUNCH();
  });
}

}  // namespace te::rope::cuda
