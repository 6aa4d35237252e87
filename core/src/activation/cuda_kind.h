// The CUDA activation backend one kind at a time. forward_kind<K> and
// backward_kind<K> are defined in cuda_kind.cuh and instantiated in one
// translation unit per kind, which CMake generates from cuda_kind.cu.in: the
// kernels of the twelve kinds (every input and output type, fused or not)
// then compile in parallel instead of in one long file. cuda.cu dispatches
// on the run-time kind.
#pragma once

#include "activation/backend.h"

namespace te::activation::cuda {

template <te_activation K>
void forward_kind(const ForwardArgs& a, te_stream stream);

// The elementwise pass of the backward (grad_input, its FP8 copies, the
// forward output's columnwise copy when asked, the bias-gradient partials);
// backward() then sums the partials.
template <te_activation K>
void backward_kind(const BackwardArgs& a, float* dbias_partials, te_stream stream);

}  // namespace te::activation::cuda
