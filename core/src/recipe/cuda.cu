// CUDA backend of the delayed-scaling update (te/recipe.h): one block per
// group, one thread per amax-history column, all groups in as few launches as
// possible. Per column, exactly as recipe/cpu.cpp:
//   last = buffer[j] if buffer && buffer[j] != 0 else H[0][j]
//   if last != 0: roll (H[i] = H[i+1] for 0 < i < L-1, H[L-1] = last, H[0] = 0),
//                 window max over the rolled values
//   amax = last (MOST_RECENT) or the window max;  scale = delayed_scale(...)
//   scale_inv = 1 / scale (IEEE division)
// A column is owned by one thread, which reads row i+1 before it writes row i,
// so the in-place roll needs no synchronization.
//
// The groups travel by value in the kernel parameters (no device allocation,
// graph-capturable). Launches are chunked to kGroupsPerLaunch groups so the
// parameter block stays under the classic 4 KB limit: larger parameter blocks
// (32 KB) need CUDA >= 12.1 drivers and make every launch copy more.
#include <algorithm>

#include "recipe/backend.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_launch.h"

namespace te::recipe::cuda {
namespace {

struct GroupParams {
  float* history;  // [L, num_scales]
  float* scale;
  float* scale_inv;  // may be null
  int64_t num_scales;
  int64_t buffer_offset;  // first element of this group in the reduction buffer
};

constexpr int kGroupsPerLaunch = 96;
constexpr int kThreads = 128;

struct LaunchParams {
  GroupParams groups[kGroupsPerLaunch];
  const float* reduction_buffer;  // may be null
  int64_t history_length;
  float scaled_max;
  bool most_recent;
};
static_assert(sizeof(LaunchParams) <= 4096, "kernel parameters must fit in 4 KB");

// __grid_constant__: groups[blockIdx.x] is read in place from the parameter
// space instead of copying the whole array to local memory.
__global__ void __launch_bounds__(kThreads)
    delayed_update_kernel(const __grid_constant__ LaunchParams p) {
  const GroupParams& g = p.groups[blockIdx.x];
  const int64_t L = p.history_length, stride = g.num_scales;
  for (int64_t j = threadIdx.x; j < g.num_scales; j += blockDim.x) {
    float* h = g.history + j;
    const float reduced =
        p.reduction_buffer != nullptr ? p.reduction_buffer[g.buffer_offset + j] : 0.0f;
    const float last = reduced != 0.0f ? reduced : h[0];
    float window_max = 0.0f;
    if (last != 0.0f) {
      for (int64_t i = 0; i < L; ++i) {
        const float a = i < L - 1 ? h[(i + 1) * stride] : last;
        window_max = fmaxf(window_max, a);
        h[i * stride] = i > 0 ? a : 0.0f;
      }
    }
    const float amax = p.most_recent ? last : window_max;
    const float scale = delayed_scale(amax, g.scale[j], p.scaled_max);
    g.scale[j] = scale;
    if (g.scale_inv != nullptr) g.scale_inv[j] = __fdiv_rn(1.0f, scale);
  }
}

}  // namespace

void delayed_scaling_update(const DelayedUpdateArgs& args, te_stream stream) {
  LaunchParams p{};
  p.reduction_buffer = args.reduction_buffer;
  p.history_length = args.history_length;
  p.scaled_max = args.scaled_max;
  p.most_recent = args.algo == TE_AMAX_COMPUTE_MOST_RECENT;
  int64_t offset = 0;
  const size_t total = args.groups.size();
  for (size_t first = 0; first < total; first += kGroupsPerLaunch) {
    const int count = static_cast<int>(std::min<size_t>(kGroupsPerLaunch, total - first));
    for (int i = 0; i < count; ++i) {
      const AmaxGroup& g = args.groups[first + i];
      p.groups[i] = {g.history, g.scale, g.scale_inv, g.num_scales, offset};
      offset += g.num_scales;
    }
    delayed_update_kernel<<<count, kThreads, 0, cuda_stream(stream)>>>(p);
    TE_CHECK_LAUNCH();
  }
}

}  // namespace te::recipe::cuda
