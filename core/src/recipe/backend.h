// Backends of the delayed-scaling update (see te/recipe.h for the formula).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/numerics.h"
#include "te/recipe.h"
#include "te/types.h"

namespace te::recipe {

// One group: history [history_length, num_scales], scale and scale_inv [num_scales].
struct AmaxGroup {
  float* history;
  float* scale;
  float* scale_inv;  // may be null
  int64_t num_scales;
};

struct DelayedUpdateArgs {
  const float* reduction_buffer;  // may be null; sum of num_scales elements
  std::vector<AmaxGroup> groups;
  int64_t history_length;
  te_amax_compute_algo algo;
  float scaled_max;  // fp8_max * 2^-margin
};

namespace cpu {
void delayed_scaling_update(const DelayedUpdateArgs& args);
}

#ifdef TE_WITH_CUDA
namespace cuda {
void delayed_scaling_update(const DelayedUpdateArgs& args, te_stream stream);
}
#endif

// The per-column update rule shared by both backends: given the column's amax
// (window max or most recent), the new scale. Host and device (TE_HD); the
// division is IEEE round-to-nearest on both (nvcc's default -prec-div=true).
TE_HD float delayed_scale(float amax, float old_scale, float scaled_max) {
  float scale = (amax > 0.0f && amax <= 3.40282347e38f) ? scaled_max / amax : old_scale;
  if (scale > 3.40282347e38f) scale = 3.40282347e38f;  // tiny amax: inf -> FLT_MAX
  return scale;
}

}  // namespace te::recipe
