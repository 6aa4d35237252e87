// The GEMM handler (te/gemm.h): D = op(A) op(B) (+ bias), FP8 or high
// precision, with the bias gradient of the wgrad GEMM when asked. The
// workspace te-core's CUDA backend needs (cuBLASLt's, FP8 transposes) comes
// from XLA's scratch allocator, stream-ordered like the call itself.
#include <vector>

#include "common.h"
#include "te/gemm.h"

namespace te_jax {
namespace {

using ffi::AnyBuffer;
using ffi::Error;
using ffi::Result;

Error gemm(const Device& d, AnyBuffer a, AnyBuffer b, AnyBuffer a_scale_inv, AnyBuffer b_scale_inv,
           AnyBuffer bias, Result<AnyBuffer> out, Result<AnyBuffer> bias_grad, bool transa,
           bool transb, bool use_split_accumulator) {
  te_tensor ta, tb, tasi, tbsi, tbias, td, tbg, tws;
  te_tensor *pasi, *pbsi, *pbias, *pbg, *pws;
  if (Error e = describe_all(d, {{a, "a", &ta},
                                 {b, "b", &tb},
                                 {a_scale_inv, "a_scale_inv", &tasi, &pasi},
                                 {b_scale_inv, "b_scale_inv", &tbsi, &pbsi},
                                 {bias, "bias", &tbias, &pbias},
                                 {*out, "out", &td},
                                 {*bias_grad, "bias_grad", &tbg, &pbg}});
      e.failure())
    return e;
  te_gemm_params p{};
  p.a = &ta;
  p.a_scale_inv = pasi;
  p.transa = transa ? 1 : 0;
  p.b = &tb;
  p.b_scale_inv = pbsi;
  p.transb = transb ? 1 : 0;
  p.d = &td;
  p.bias = pbias;
  p.bias_grad = pbg;
  p.alpha = 1.0f;
  p.beta = 0.0f;
  p.use_split_accumulator = use_split_accumulator ? 1 : 0;
  size_t bytes = 0;
  if (te_status s = te_gemm_workspace_size(&p, &bytes); s != TE_SUCCESS) return from_status(s);
  std::vector<unsigned char> host_workspace;
  if (Error e = allocate_workspace(d, bytes, "te_gemm", &host_workspace, &tws, &pws); e.failure())
    return e;
  p.workspace = pws;
  return from_status(te_gemm(&p, d.stream));
}

#define TE_JAX_GEMM_ARGS(b) \
  b.Arg<AnyBuffer>()        \
      .Arg<AnyBuffer>()     \
      .Arg<AnyBuffer>()     \
      .Arg<AnyBuffer>()     \
      .Arg<AnyBuffer>()     \
      .Ret<AnyBuffer>()     \
      .Ret<AnyBuffer>()     \
      .Attr<bool>("transa") \
      .Attr<bool>("transb") \
      .Attr<bool>("use_split_accumulator")

}  // namespace

// (In te_jax, not the anonymous namespace: the handlers are extern "C" symbols.)
TE_JAX_DEFINE_HANDLERS(te_jax_gemm, gemm, TE_JAX_GEMM_ARGS);

}  // namespace te_jax
