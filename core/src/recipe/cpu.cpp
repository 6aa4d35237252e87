// CPU backend of the delayed-scaling update: the executable spec of the
// amax-history roll (te/recipe.h).
#include <algorithm>
#include <cmath>

#include "recipe/backend.h"

namespace te::recipe::cpu {

void delayed_scaling_update(const DelayedUpdateArgs& args) {
  const int64_t L = args.history_length;
  int64_t offset = 0;
  for (const AmaxGroup& g : args.groups) {
    const int64_t stride = g.num_scales;
    for (int64_t j = 0; j < g.num_scales; ++j) {
      float* h = g.history + j;
      const float reduced = args.reduction_buffer ? args.reduction_buffer[offset + j] : 0.0f;
      const float last = reduced != 0.0f ? reduced : h[0];
      float window_max = 0.0f;
      if (last != 0.0f) {
        for (int64_t i = 0; i < L; ++i) {
          const float a = i < L - 1 ? h[(i + 1) * stride] : last;
          window_max = std::fmax(window_max, a);
          h[i * stride] = i > 0 ? a : 0.0f;
        }
      }
      const float amax = args.algo == TE_AMAX_COMPUTE_MOST_RECENT ? last : window_max;
      const float scale = delayed_scale(amax, g.scale[j], args.scaled_max);
      g.scale[j] = scale;
      if (g.scale_inv) g.scale_inv[j] = 1.0f / scale;
    }
    offset += g.num_scales;
  }
}

}  // namespace te::recipe::cpu
