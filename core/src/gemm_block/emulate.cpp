// The emulated path of te/gemm_block.h: dequantize each operand with its
// format's own dequantize backend, then multiply with te_gemm's backend.
//   CPU   FP32 operands in host scratch: D is bit-for-bit te_gemm on the FP32
//         dequantized operands.
//   CUDA  BF16 operands in the caller's workspace: D is te_gemm on those BF16
//         operands (same plan, same cuBLASLt call as the dense GEMM would make).
// NVFP4 scales given swizzled are first put back in the compact layout (the
// NVFP4 dequantize reads compact scales); MXFP8's dequantize reads both.
#include <vector>

#include "fp8_block/backend.h"
#include "fp8_block/layout.h"
#include "gemm_block/backend.h"
#include "mxfp8/backend.h"
#include "nvfp4/backend.h"
#include "swizzle/backend.h"

namespace te::gemm_block::emulated {
namespace {

fp8_block::DequantizeArgs fp8_block_args(const BlockOperand& op, void* out, te_dtype out_dtype) {
  const te_fp8_block_dim dim =
      op.scaling == TE_SCALING_FP8_BLOCK_1D ? TE_FP8_BLOCK_1D : TE_FP8_BLOCK_2D;
  fp8_block::DequantizeArgs a{};
  a.data = static_cast<const uint8_t*>(op.data);
  a.fp8_dtype = op.dtype;
  a.rows = op.rows;
  a.cols = op.cols;
  a.scale_inv = static_cast<const float*>(op.scales);
  a.map = fp8_block::scale_map(op.rows, op.cols, dim, TE_FP8_BLOCK_GEMM_READY, false);
  a.output = out;
  a.output_dtype = out_dtype;
  return a;
}

mxfp8::DequantizeArgs mxfp8_args(const BlockOperand& op, void* out, te_dtype out_dtype) {
  mxfp8::DequantizeArgs a{};
  a.input = static_cast<const uint8_t*>(op.data);
  a.fp8_dtype = op.dtype;
  a.scales = static_cast<const uint8_t*>(op.scales);
  a.rows = op.rows;
  a.cols = op.cols;
  a.scale_rows = op.scale_rows;
  a.scale_cols = op.scale_cols;
  a.columnwise = op.columnwise;
  a.swizzled = op.swizzled;
  a.output = out;
  a.output_dtype = out_dtype;
  return a;
}

nvfp4::DequantizeArgs nvfp4_args(const BlockOperand& op, const uint8_t* compact_scales, void* out,
                                 te_dtype out_dtype) {
  return nvfp4::DequantizeArgs{static_cast<const uint8_t*>(op.data),
                               compact_scales,
                               op.rows,
                               op.cols,
                               op.scale_cols,
                               op.amax,
                               out,
                               out_dtype};
}

// NVFP4 scales have blocks along the stored rows: the rowwise swizzle variant.
swizzle::SwizzleArgs unswizzle_args(const BlockOperand& op, uint8_t* compact) {
  return swizzle::SwizzleArgs{static_cast<const uint8_t*>(op.scales),
                              compact,
                              op.scale_rows,
                              op.scale_cols,
                              /*columnwise=*/false,
                              /*unswizzle=*/true};
}

bool needs_unswizzle(const BlockOperand& op) {
  return op.scaling == TE_SCALING_NVFP4 && op.swizzled;
}

size_t bf16_bytes(const BlockOperand& op) { return size_t(op.rows) * size_t(op.cols) * 2; }

size_t scale_bytes(const BlockOperand& op) {
  return needs_unswizzle(op) ? size_t(op.scale_rows) * size_t(op.scale_cols) : 0;
}

void dequantize_cpu(const BlockOperand& op, float* out) {
  if (op.rows == 0 || op.cols == 0) return;
  switch (op.scaling) {
    case TE_SCALING_MXFP8: mxfp8::cpu::dequantize(mxfp8_args(op, out, TE_DTYPE_FLOAT32)); break;
    case TE_SCALING_NVFP4: {
      std::vector<uint8_t> compact;
      const uint8_t* scales = static_cast<const uint8_t*>(op.scales);
      if (needs_unswizzle(op)) {
        compact.resize(scale_bytes(op));
        swizzle::cpu::swizzle(unswizzle_args(op, compact.data()));
        scales = compact.data();
      }
      nvfp4::cpu::dequantize(nvfp4_args(op, scales, out, TE_DTYPE_FLOAT32));
      break;
    }
    default: fp8_block::cpu::dequantize(fp8_block_args(op, out, TE_DTYPE_FLOAT32));
  }
}

// Byte offsets in the CUDA workspace, from its start rounded up to 256.
struct Layout {
  size_t a = 0, b = 0, a_scales = 0, b_scales = 0, gemm = 0;
  size_t gemm_bytes = 0, total = 0;
};

Layout layout(const BlockGemm& g) {
  Layout l;
  size_t offset = 0;
  auto take = [&offset](size_t bytes) {
    const size_t at = offset;
    offset += align_up(bytes);
    return at;
  };
  l.a = take(bf16_bytes(g.a));
  l.b = take(bf16_bytes(g.b));
  l.a_scales = take(scale_bytes(g.a));
  l.b_scales = take(scale_bytes(g.b));
  l.gemm = offset;
  l.gemm_bytes = gemm::cuda_workspace_size(g.dense);  // the BF16 GEMM's own plan
  l.total = kAlignment + offset + l.gemm_bytes;       // + slack to align the caller's pointer
  return l;
}

}  // namespace

size_t cuda_workspace_size(const BlockGemm& g) { return layout(g).total; }

void run_cpu(const BlockGemm& g) {
  std::vector<float> a(size_t(g.a.rows) * size_t(g.a.cols));
  std::vector<float> b(size_t(g.b.rows) * size_t(g.b.cols));
  dequantize_cpu(g.a, a.data());
  dequantize_cpu(g.b, b.data());
  gemm::GemmArgs dense = g.dense;  // transa/transb, epilogue and shapes as validated
  dense.a.data = a.data();
  dense.a.dtype = TE_DTYPE_FLOAT32;
  dense.b.data = b.data();
  dense.b.dtype = TE_DTYPE_FLOAT32;
  gemm::cpu::gemm(dense);
}

#ifdef TE_WITH_CUDA
namespace {

void dequantize_cuda(const BlockOperand& op, void* out, uint8_t* compact_scales, te_stream stream) {
  if (op.rows == 0 || op.cols == 0) return;
  switch (op.scaling) {
    case TE_SCALING_MXFP8:
      mxfp8::cuda::dequantize(mxfp8_args(op, out, TE_DTYPE_BFLOAT16), stream);
      break;
    case TE_SCALING_NVFP4: {
      const uint8_t* scales = static_cast<const uint8_t*>(op.scales);
      if (needs_unswizzle(op)) {
        swizzle::cuda::swizzle(unswizzle_args(op, compact_scales), stream);
        scales = compact_scales;
      }
      nvfp4::cuda::dequantize(nvfp4_args(op, scales, out, TE_DTYPE_BFLOAT16), stream);
      break;
    }
    default: fp8_block::cuda::dequantize(fp8_block_args(op, out, TE_DTYPE_BFLOAT16), stream);
  }
}

}  // namespace

void run_cuda(const BlockGemm& g, void* workspace, size_t workspace_bytes, te_stream stream) {
  const Layout l = layout(g);
  char* base = align_up(workspace);
  dequantize_cuda(g.a, base + l.a, reinterpret_cast<uint8_t*>(base + l.a_scales), stream);
  dequantize_cuda(g.b, base + l.b, reinterpret_cast<uint8_t*>(base + l.b_scales), stream);
  gemm::GemmArgs dense = g.dense;  // BF16 operands already (validate.cpp's stand-ins)
  dense.a.data = base + l.a;
  dense.b.data = base + l.b;
  dense.workspace = base + l.gemm;
  dense.workspace_bytes =
      workspace_bytes - static_cast<size_t>(base + l.gemm - static_cast<char*>(workspace));
  gemm::cuda::gemm(dense, stream);
}
#endif

}  // namespace te::gemm_block::emulated
