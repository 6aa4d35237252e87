// CUDA backend of the delayed-scaling update (te/recipe.h): one block per
// group, one warp per amax-history column, all groups in as few launches as
// possible. Per column, exactly as recipe/cpu.cpp:
//   last = buffer[j] if buffer && buffer[j] != 0 else H[0][j]
//   if last != 0: roll (H[i] = H[i+1] for 0 < i < L-1, H[L-1] = last, H[0] = 0),
//                 window max over the rolled values
//   amax = last (MOST_RECENT) or the window max;  scale = delayed_scale(...)
//   scale_inv = 1 / scale (IEEE division)
// A column is owned by one warp. Its lanes roll it in passes of 32 * kRowsPerLane
// rows: every lane loads its rows' successors (all loads in flight at once; a
// thread per column walking the 1024 rows of the default history one load at a
// time took 0.1 ms per launch on the H200), __syncwarp, then stores them. A
// pass reads row `end` before the next pass writes it, so the in-place roll is
// exact. The window max is a warp max of fmaxf (exact, order-independent).
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

constexpr int kRowsPerLane = 8;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// Rolls column j of g's history (see the header) and returns its window max
// (to every lane).
__device__ float roll_column(const GroupParams& g, int64_t j, int64_t L, float last, int lane) {
  float* h = g.history + j;
  const int64_t stride = g.num_scales;
  float window_max = 0.0f;
  for (int64_t base = 0; base < L; base += 32 * kRowsPerLane) {
    float rolled[kRowsPerLane];
#pragma unroll
    for (int k = 0; k < kRowsPerLane; ++k) {
      const int64_t i = base + lane + 32 * k;
      rolled[k] = i < L - 1 ? h[(i + 1) * stride] : last;
      if (i < L) window_max = fmaxf(window_max, rolled[k]);
    }
    __syncwarp();
#pragma unroll
    for (int k = 0; k < kRowsPerLane; ++k) {
      const int64_t i = base + lane + 32 * k;
      if (i < L) h[i * stride] = i > 0 ? rolled[k] : 0.0f;
    }
    __syncwarp();
  }
  for (int offset = 16; offset > 0; offset /= 2)
    window_max = fmaxf(window_max, __shfl_xor_sync(kFullMask, window_max, offset));
  return window_max;
}

// __grid_constant__: groups[blockIdx.x] is read in place from the parameter
// space instead of copying the whole array to local memory.
__global__ void __launch_bounds__(kThreads)
    delayed_update_kernel(const __grid_constant__ LaunchParams p) {
  const GroupParams& g = p.groups[blockIdx.x];
  const int lane = threadIdx.x % 32;
  for (int64_t j = threadIdx.x / 32; j < g.num_scales; j += kThreads / 32) {
    const float reduced =
        p.reduction_buffer != nullptr ? p.reduction_buffer[g.buffer_offset + j] : 0.0f;
    const float last = reduced != 0.0f ? reduced : g.history[j];
    __syncwarp();  // (every lane has read H[0][j] before the roll rewrites it)
    const float window_max = last != 0.0f ? roll_column(g, j, p.history_length, last, lane) : 0.0f;
    if (lane == 0) {
      const float amax = p.most_recent ? last : window_max;
      const float scale = delayed_scale(amax, g.scale[j], p.scaled_max);
      g.scale[j] = scale;
      if (g.scale_inv != nullptr) g.scale_inv[j] = __fdiv_rn(1.0f, scale);
    }
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
