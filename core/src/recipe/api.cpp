#include <cmath>
#include <string>

#include "recipe/backend.h"
#include "runtime/device.h"
#include "runtime/element.h"
#include "runtime/tensor.h"

using namespace te;
using namespace te::recipe;

extern "C" te_status te_recipe_delayed_scaling_update(
    const te_tensor* amax_reduction_buffer, te_tensor* const* amax_histories,
    te_tensor* const* scales, te_tensor* const* scale_invs, size_t num_tensors,
    te_amax_compute_algo algo, te_dtype fp8_dtype, float margin, te_stream stream) {
  return guarded("te_recipe_delayed_scaling_update", [&] {
    if (num_tensors == 0) return;
    if (amax_histories == nullptr || scales == nullptr)
      fail(TE_ERROR_INVALID_ARGUMENT, "arguments 'amax_histories' and 'scales' are required");
    if (algo != TE_AMAX_COMPUTE_MAX && algo != TE_AMAX_COMPUTE_MOST_RECENT)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'algo' must be 'max' or 'most_recent', got code ",
           static_cast<int>(algo));
    if (!is_fp8(fp8_dtype))
      fail(TE_ERROR_INVALID_DTYPE, "argument 'fp8_dtype' must be float8_e4m3 or float8_e5m2, got ",
           dtype_name(fp8_dtype));
    if (!(margin >= 0.0f) || std::isinf(margin))
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'margin' must be finite and >= 0, got ", margin);

    DelayedUpdateArgs args{};
    args.algo = algo;
    args.scaled_max = fp8_format(fp8_dtype).max_finite * std::pow(2.0f, -margin);
    const te_tensor& first = *amax_histories[0];
    int64_t total_scales = 0;
    for (size_t k = 0; k < num_tensors; ++k) {
      const std::string h_name = concat("amax_histories[", k, "]");
      const std::string s_name = concat("scales[", k, "]");
      const std::string i_name = concat("scale_invs[", k, "]");
      Arg h(amax_histories[k], h_name.c_str());
      h.output().dtype(TE_DTYPE_FLOAT32).same_device(first, "amax_histories[0]");
      if (amax_histories[k]->ndim != 2)
        fail(TE_ERROR_INVALID_ARGUMENT, "argument '", h_name,
             "' must be 2-D [history_length, n], got ", shape_string(*amax_histories[k]));
      const int64_t L = amax_histories[k]->shape[0], n = amax_histories[k]->shape[1];
      if (L < 1)
        fail(TE_ERROR_INVALID_ARGUMENT, "argument '", h_name, "' must have history_length >= 1");
      if (k == 0) args.history_length = L;
      if (L != args.history_length)
        fail(TE_ERROR_INVALID_ARGUMENT, "all amax histories must have the same length; '", h_name,
             "' has ", L, ", amax_histories[0] has ", args.history_length);
      Arg(scales[k], s_name.c_str())
          .output()
          .dtype(TE_DTYPE_FLOAT32)
          .numel(n)
          .same_device(first, "amax_histories[0]");
      float* inv = nullptr;
      if (scale_invs != nullptr && scale_invs[k] != nullptr) {
        Arg(scale_invs[k], i_name.c_str())
            .output()
            .dtype(TE_DTYPE_FLOAT32)
            .numel(n)
            .same_device(first, "amax_histories[0]");
        inv = static_cast<float*>(scale_invs[k]->data);
      }
      args.groups.push_back({static_cast<float*>(amax_histories[k]->data),
                             static_cast<float*>(scales[k]->data), inv, n});
      total_scales += n;
    }
    if (amax_reduction_buffer != nullptr) {
      Arg(amax_reduction_buffer, "amax_reduction_buffer")
          .dtype(TE_DTYPE_FLOAT32)
          .numel(total_scales)
          .same_device(first, "amax_histories[0]");
      args.reduction_buffer = static_cast<const float*>(amax_reduction_buffer->data);
    }
    TE_DISPATCH(first, cpu::delayed_scaling_update(args),
                cuda::delayed_scaling_update(args, stream));
  });
}

// Deprecated alias (te/recipe.h): forwards to the new name.
extern "C" te_status te_delayed_scaling_update(const te_tensor* amax_reduction_buffer,
                                               te_tensor* const* amax_histories,
                                               te_tensor* const* scales,
                                               te_tensor* const* scale_invs, size_t num_tensors,
                                               te_amax_compute_algo algo, te_dtype fp8_dtype,
                                               float margin, te_stream stream) {
  return te_recipe_delayed_scaling_update(amax_reduction_buffer, amax_histories, scales, scale_invs,
                                          num_tensors, algo, fp8_dtype, margin, stream);
}
