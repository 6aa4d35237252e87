// Block-scaled formats (te/mxfp8.h, te/fp8_block.h, te/gemm_block.h): MXFP8 and
// FP8-block quantization and the GEMM on block-scaled operands. Each operand of
// te_jax_gemm_block is its data, its scales and (NVFP4 only) its global amax;
// the scaling modes are attributes, so one handler serves every format
// te_gemm_block takes.
#include <vector>

#include "common.h"
#include "te/fp8_block.h"
#include "te/gemm_block.h"
#include "te/mxfp8.h"
#include "te/nvfp4.h"

namespace te_jax {
namespace {

using ffi::AnyBuffer;
using ffi::Error;
using ffi::Result;

// The input and the four outputs of a block quantization (rowwise data and
// scales, columnwise data and scales); a placeholder result means "not asked".
struct BlockCopies {
  te_tensor x, row, row_si, col, col_si;
  te_tensor *prow, *prow_si, *pcol, *pcol_si;
};

Error describe_copies(const Device& d, const AnyBuffer& x, Result<AnyBuffer>& row,
                      Result<AnyBuffer>& row_si, Result<AnyBuffer>& col, Result<AnyBuffer>& col_si,
                      BlockCopies* c) {
  return describe_all(d, {{x, "x", &c->x},
                          {*row, "rowwise", &c->row, &c->prow},
                          {*row_si, "rowwise_scale_inv", &c->row_si, &c->prow_si},
                          {*col, "columnwise", &c->col, &c->pcol},
                          {*col_si, "columnwise_scale_inv", &c->col_si, &c->pcol_si}});
}

// The binding of describe_copies' buffers: x, then the four outputs.
#define TE_JAX_BLOCK_COPIES(b) \
  b.Arg<AnyBuffer>().Ret<AnyBuffer>().Ret<AnyBuffer>().Ret<AnyBuffer>().Ret<AnyBuffer>()

// MXFP8 copies of x with their E8M0 scales (compact layout).
Error quantize_mxfp8(const Device& d, AnyBuffer x, Result<AnyBuffer> row, Result<AnyBuffer> row_si,
                     Result<AnyBuffer> col, Result<AnyBuffer> col_si, bool use_2d_blocks) {
  BlockCopies c;
  if (Error e = describe_copies(d, x, row, row_si, col, col_si, &c); e.failure()) return e;
  return from_status(te_mxfp8_quantize(&c.x, c.prow, c.prow_si, c.pcol, c.pcol_si,
                                       use_2d_blocks ? 1 : 0, 0, d.stream));
}

#define TE_JAX_QUANTIZE_MXFP8_ARGS(b) TE_JAX_BLOCK_COPIES(b).Attr<bool>("use_2d_blocks")

// FP8 block scaling (te/fp8_block.h, GEMM-ready layout: columnwise data
// transposed, scales padded): 1x128 / 128x1 blocks (block_dim 1) or 128x128
// tiles (block_dim 2).
Error quantize_fp8_block(const Device& d, AnyBuffer x, Result<AnyBuffer> row,
                         Result<AnyBuffer> row_si, Result<AnyBuffer> col, Result<AnyBuffer> col_si,
                         int32_t block_dim, bool force_pow2_scales, float amax_epsilon) {
  BlockCopies c;
  if (Error e = describe_copies(d, x, row, row_si, col, col_si, &c); e.failure()) return e;
  return from_status(te_fp8_block_quantize(
      &c.x, c.prow, c.prow_si, c.pcol, c.pcol_si, static_cast<te_fp8_block_dim>(block_dim),
      TE_FP8_BLOCK_GEMM_READY, force_pow2_scales ? 1 : 0, amax_epsilon, d.stream));
}

#define TE_JAX_QUANTIZE_FP8_BLOCK_ARGS(b) \
  TE_JAX_BLOCK_COPIES(b)                  \
      .Attr<int32_t>("block_dim")         \
      .Attr<bool>("force_pow2_scales")    \
      .Attr<float>("amax_epsilon")

// NVFP4 data travels as packed bytes (uint8 [..., n], two E2M1 values each): the
// core's FP4 tensor of the same bytes is [..., 2n].
void as_fp4(te_tensor* t) {
  t->dtype = TE_DTYPE_FLOAT4E2M1;
  if (t->ndim > 0) t->shape[t->ndim - 1] *= 2;
}

// The global amaxes of NVFP4's two directions (te_nvfp4_compute_amax).
Error nvfp4_amax(const Device& d, AnyBuffer x, Result<AnyBuffer> amax_row,
                 Result<AnyBuffer> amax_col, bool random_hadamard, int32_t rht_sign_mask) {
  te_tensor tx, tr, tc;
  if (Error e = describe_all(
          d,
          {{x, "x", &tx}, {*amax_row, "amax_rowwise", &tr}, {*amax_col, "amax_columnwise", &tc}});
      e.failure())
    return e;
  te_nvfp4_options o{};
  o.random_hadamard = random_hadamard ? 1 : 0;
  o.rht_sign_mask = static_cast<uint32_t>(rht_sign_mask);
  return from_status(te_nvfp4_compute_amax(&tx, &tr, &tc, &o, d.stream));
}

#define TE_JAX_NVFP4_AMAX_ARGS(b)    \
  b.Arg<AnyBuffer>()                 \
      .Ret<AnyBuffer>()              \
      .Ret<AnyBuffer>()              \
      .Attr<bool>("random_hadamard") \
      .Attr<int32_t>("rht_sign_mask")

// NVFP4 copies of x with the given global amaxes; rng_state is the (seed,
// offset) pair as four int32 words (JAX without x64 has no int64 arrays),
// read as the core's INT64 [2].
Error nvfp4_quantize(const Device& d, AnyBuffer x, AnyBuffer amax_row, AnyBuffer amax_col,
                     AnyBuffer rng, Result<AnyBuffer> row, Result<AnyBuffer> row_scale,
                     Result<AnyBuffer> col, Result<AnyBuffer> col_scale, bool block_2d,
                     bool stochastic_rounding, bool random_hadamard, int32_t rht_sign_mask) {
  BlockCopies c;
  te_tensor tar, tac, trng;
  te_tensor *par, *pac, *prng;
  if (Error e = describe_copies(d, x, row, row_scale, col, col_scale, &c); e.failure()) return e;
  if (Error e = describe_all(d, {{amax_row, "amax_rowwise", &tar, &par},
                                 {amax_col, "amax_columnwise", &tac, &pac},
                                 {rng, "rng_state", &trng, &prng}});
      e.failure())
    return e;
  if (c.prow != nullptr) as_fp4(c.prow);
  if (c.pcol != nullptr) as_fp4(c.pcol);
  if (prng != nullptr) {
    trng.dtype = TE_DTYPE_INT64;
    trng.ndim = 1;
    trng.shape[0] = 2;
  }
  te_nvfp4_options o{};
  o.block_2d = block_2d ? 1 : 0;
  o.stochastic_rounding = stochastic_rounding ? 1 : 0;
  o.random_hadamard = random_hadamard ? 1 : 0;
  o.rht_sign_mask = static_cast<uint32_t>(rht_sign_mask);
  o.rng_state = prng;
  return from_status(
      te_nvfp4_quantize(&c.x, par, c.prow, c.prow_si, pac, c.pcol, c.pcol_si, &o, d.stream));
}

#define TE_JAX_NVFP4_QUANTIZE_ARGS(b)    \
  b.Arg<AnyBuffer>()                     \
      .Arg<AnyBuffer>()                  \
      .Arg<AnyBuffer>()                  \
      .Arg<AnyBuffer>()                  \
      .Ret<AnyBuffer>()                  \
      .Ret<AnyBuffer>()                  \
      .Ret<AnyBuffer>()                  \
      .Ret<AnyBuffer>()                  \
      .Attr<bool>("block_2d")            \
      .Attr<bool>("stochastic_rounding") \
      .Attr<bool>("random_hadamard")     \
      .Attr<int32_t>("rht_sign_mask")

struct Operand {
  te_tensor data, scale_inv, amax;
  te_tensor *scale_inv_ptr = nullptr, *amax_ptr = nullptr;
};

Error describe_operand(const Device& d, const AnyBuffer& data, const AnyBuffer& scale_inv,
                       const AnyBuffer& amax, const char* which, Operand* out) {
  const std::string n(which);
  const std::string si = n + "_scale_inv", am = n + "_amax";
  return describe_all(d, {{data, which, &out->data},
                          {scale_inv, si.c_str(), &out->scale_inv, &out->scale_inv_ptr},
                          {amax, am.c_str(), &out->amax, &out->amax_ptr}});
}

te_gemm_operand gemm_operand(Operand& o, int32_t scaling) {
  if (scaling == TE_SCALING_NVFP4) as_fp4(&o.data);
  te_gemm_operand g{};
  g.data = &o.data;
  g.scaling = static_cast<te_scaling_mode>(scaling);
  g.scale_inv = o.scale_inv_ptr;
  g.amax = o.amax_ptr;
  g.swizzled_scales = 0;
  return g;
}

// D = op(A) op(B) (+ bias) on block-scaled operands (te_gemm_block).
Error gemm_block(const Device& d, AnyBuffer a, AnyBuffer a_scale_inv, AnyBuffer a_amax, AnyBuffer b,
                 AnyBuffer b_scale_inv, AnyBuffer b_amax, AnyBuffer bias, Result<AnyBuffer> out,
                 int32_t a_scaling, int32_t b_scaling, bool transa, bool transb) {
  Operand oa, ob;
  te_tensor tbias, td, tws;
  te_tensor *pbias, *pws;
  if (Error e = describe_operand(d, a, a_scale_inv, a_amax, "a", &oa); e.failure()) return e;
  if (Error e = describe_operand(d, b, b_scale_inv, b_amax, "b", &ob); e.failure()) return e;
  if (Error e = describe_all(d, {{bias, "bias", &tbias, &pbias}, {*out, "out", &td}}); e.failure())
    return e;
  te_gemm_block_params p{};
  p.a = gemm_operand(oa, a_scaling);
  p.transa = transa ? 1 : 0;
  p.b = gemm_operand(ob, b_scaling);
  p.transb = transb ? 1 : 0;
  p.d = &td;
  p.bias = pbias;
  p.alpha = 1.0f;
  p.beta = 0.0f;
  size_t bytes = 0;
  if (te_status s = te_gemm_block_plan(&p, nullptr, &bytes); s != TE_SUCCESS) return from_status(s);
  std::vector<unsigned char> host_workspace;
  if (Error e = allocate_workspace(d, bytes, "te_gemm_block", &host_workspace, &tws, &pws);
      e.failure())
    return e;
  return from_status(te_gemm_block(&p, pws, nullptr, d.stream));
}

#define TE_JAX_GEMM_BLOCK_ARGS(b) \
  b.Arg<AnyBuffer>()              \
      .Arg<AnyBuffer>()           \
      .Arg<AnyBuffer>()           \
      .Arg<AnyBuffer>()           \
      .Arg<AnyBuffer>()           \
      .Arg<AnyBuffer>()           \
      .Arg<AnyBuffer>()           \
      .Ret<AnyBuffer>()           \
      .Attr<int32_t>("a_scaling") \
      .Attr<int32_t>("b_scaling") \
      .Attr<bool>("transa")       \
      .Attr<bool>("transb")

}  // namespace

// (In te_jax, not the anonymous namespace: the handlers are extern "C" symbols.)
TE_JAX_DEFINE_HANDLERS(te_jax_quantize_mxfp8, quantize_mxfp8, TE_JAX_QUANTIZE_MXFP8_ARGS);
TE_JAX_DEFINE_HANDLERS(te_jax_quantize_fp8_block, quantize_fp8_block,
                       TE_JAX_QUANTIZE_FP8_BLOCK_ARGS);
TE_JAX_DEFINE_HANDLERS(te_jax_nvfp4_amax, nvfp4_amax, TE_JAX_NVFP4_AMAX_ARGS);
TE_JAX_DEFINE_HANDLERS(te_jax_nvfp4_quantize, nvfp4_quantize, TE_JAX_NVFP4_QUANTIZE_ARGS);
TE_JAX_DEFINE_HANDLERS(te_jax_gemm_block, gemm_block, TE_JAX_GEMM_BLOCK_ARGS);

}  // namespace te_jax
