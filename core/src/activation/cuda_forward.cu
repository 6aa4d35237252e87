// CUDA backend of the activation forward (kernels.cuh has the kernels).
#include "activation/kernels.cuh"

namespace te::activation::cuda {

void forward(const ForwardArgs& a, te_stream stream) {
  with_kind(a.kind, [&](auto kind) {
    constexpr te_activation K = decltype(kind)::value;
    cuda_elem::dispatch_input(a.input_dtype, [&](auto in_tag) {
      using In = decltype(in_tag);
      const Inputs<In> in{static_cast<const In*>(a.input), nullptr, a.rows, a.cols,
                          input_cols(K, a.cols),           a.cols};
      launch<K, false, In>(in, make_outputs(a.out, nullptr), a.out.rowwise_dtype, a.params,
                           cuda_stream(stream));
    });
  });
}

}  // namespace te::activation::cuda
