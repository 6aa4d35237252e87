// Definitions of cuda_kind.h's per-kind functions over kernels.cuh, and the
// macro that instantiates them for one kind (used by the generated
// cuda_kind_<name>.cu files, see cuda_kind.cu.in).
#pragma once

#include "activation/cuda_kind.h"
#include "activation/kernels.cuh"

namespace te::activation::cuda {

template <te_activation K>
void forward_kind(const ForwardArgs& a, te_stream stream) {
  cuda_elem::dispatch_input(a.input_dtype, [&](auto in_tag) {
    using In = decltype(in_tag);
    const Inputs<In> in{static_cast<const In*>(a.input), nullptr, a.rows, a.cols,
                        input_cols(K, a.cols),           a.cols};
    launch<K, false, In>(in, make_outputs(a.out, nullptr), a.out.rowwise_dtype, a.params,
                         cuda_stream(stream));
  });
}

template <te_activation K>
void backward_kind(const BackwardArgs& a, float* dbias_partials, te_stream stream) {
  const int64_t in_cols = input_cols(K, a.cols);
  cuda_elem::dispatch_input(a.input_dtype, [&](auto in_tag) {
    using In = decltype(in_tag);
    const Inputs<In> in{static_cast<const In*>(a.input),
                        static_cast<const In*>(a.grad),
                        a.rows,
                        a.cols,
                        in_cols,
                        in_cols};
    launch<K, true, In>(in, make_outputs(a.out, dbias_partials, &a.fwd, a.fwd_values_dtype),
                        a.out.rowwise_dtype, a.params, cuda_stream(stream));
  });
}

}  // namespace te::activation::cuda

#define TE_ACTIVATION_INSTANTIATE_KIND(K)                                 \
  namespace te::activation::cuda {                                        \
  template void forward_kind<K>(const ForwardArgs&, te_stream);           \
  template void backward_kind<K>(const BackwardArgs&, float*, te_stream); \
  }
