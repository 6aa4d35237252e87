// CUDA backend of the activation backward (kernels.cuh has the kernels): one
// pass for grad_input (its FP8 bytes and columnwise copy included), the bias
// gradient's chunk partials and, when asked, the forward output's FP8
// columnwise copy; then the partials' sum when dbias is asked.
#include "activation/kernels.cuh"

namespace te::activation::cuda {

void backward(const BackwardArgs& a, te_stream stream) {
  const cudaStream_t s = cuda_stream(stream);
  const int64_t in_cols = input_cols(a.kind, a.cols);
  float* partial = a.dbias != nullptr ? a.workspace : nullptr;
  with_kind(a.kind, [&](auto kind) {
    constexpr te_activation K = decltype(kind)::value;
    cuda_elem::dispatch_input(a.input_dtype, [&](auto in_tag) {
      using In = decltype(in_tag);
      const Inputs<In> in{static_cast<const In*>(a.input),
                          static_cast<const In*>(a.grad),
                          a.rows,
                          a.cols,
                          in_cols,
                          in_cols};
      launch<K, true, In>(in, make_outputs(a.out, partial, &a.fwd, a.fwd_values_dtype),
                          a.out.rowwise_dtype, a.params, s);
    });
  });
  if (a.dbias == nullptr || in_cols == 0) return;
  cuda_elem::dispatch_input(a.dbias_dtype, [&](auto out_tag) {
    using Out = decltype(out_tag);
    dbias_kernel<Out><<<ceil_div(in_cols, kThreads), kThreads, 0, s>>>(
        partial, dbias_chunks(a.rows), in_cols, static_cast<Out*>(a.dbias));
    TE_CHECK_LAUNCH();
  });
}

}  // namespace te::activation::cuda
