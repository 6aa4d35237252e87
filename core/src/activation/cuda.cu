// CUDA backend of the activation family: dispatch on the kind to the per-kind
// functions of cuda_kind.h (kernels in kernels.cuh), then, in the backward,
// the bias gradient's sum of the chunk partials.
#include "activation/cuda_kind.h"
#include "activation/kernels.cuh"

namespace te::activation::cuda {

void forward(const ForwardArgs& a, te_stream stream) {
  with_kind(a.kind, [&](auto kind) { forward_kind<decltype(kind)::value>(a, stream); });
}

// One pass for grad_input (its FP8 bytes and columnwise copy included), the
// bias gradient's chunk partials and, when asked, the forward output's FP8
// columnwise copy; then the partials' sum when dbias is asked.
void backward(const BackwardArgs& a, te_stream stream) {
  float* partial = a.dbias != nullptr ? a.workspace : nullptr;
  with_kind(a.kind, [&](auto kind) { backward_kind<decltype(kind)::value>(a, partial, stream); });
  const int64_t in_cols = input_cols(a.kind, a.cols);
  if (a.dbias == nullptr || in_cols == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  cuda_elem::dispatch_input(a.dbias_dtype, [&](auto out_tag) {
    using Out = decltype(out_tag);
    dbias_kernel<Out><<<ceil_div(in_cols, kThreads), kThreads, 0, s>>>(
        partial, dbias_chunks(a.rows), in_cols, static_cast<Out*>(a.dbias));
    TE_CHECK_LAUNCH();
  });
}

}  // namespace te::activation::cuda
