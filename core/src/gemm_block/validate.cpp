// Validation of te_gemm_block_params: every rule of te/gemm_block.h, each
// message naming the argument ('a', 'a_scale_inv', 'a_amax', ...) and the
// rule. The epilogue (C, D, bias, alpha, beta) and the shapes' agreement go
// through te_gemm's own check_params, so both families say the same things.
#include <string>

#include "fp8_block/layout.h"
#include "gemm_block/backend.h"
#include "mxfp8/numerics.h"
#include "nvfp4/formulas.h"
#include "runtime/status.h"
#include "runtime/tensor.h"

namespace te::gemm_block {
namespace {

const char* scaling_name(te_scaling_mode s) {
  switch (s) {
    case TE_SCALING_NONE: return "high precision";
    case TE_SCALING_TENSOR: return "per-tensor FP8";
    case TE_SCALING_FP8_BLOCK_1D: return "FP8 block (1x128)";
    case TE_SCALING_FP8_BLOCK_2D: return "FP8 block (128x128)";
    case TE_SCALING_MXFP8: return "MXFP8";
    case TE_SCALING_NVFP4: return "NVFP4";
  }
  return "unknown";
}

// Operands of one GEMM must come from one family (1-D and 2-D FP8 blocks mix).
int family(te_scaling_mode s) { return is_fp8_block(s) ? TE_SCALING_FP8_BLOCK_1D : s; }

// The names an operand's fields have in messages: 'a', 'a_scale_inv', 'a_amax'.
struct Names {
  std::string data, scale, amax;
  explicit Names(char which) : data(1, which), scale(data + "_scale_inv"), amax(data + "_amax") {}
};

void check_scaling_value(te_scaling_mode s, const Names& n) {
  if (s < TE_SCALING_NONE || s > TE_SCALING_NVFP4)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", n.data,
         ".scaling' must be a te_scaling_mode "
         "(0 to 5), got ",
         static_cast<int>(s));
}

// The stored layout rule: FP8 block and NVFP4 operands come in the TN form;
// an MXFP8 operand's trans flag says which copy it is.
void check_layout(te_scaling_mode s, const Names& n, bool is_a, bool trans, BlockOperand& op) {
  if (s == TE_SCALING_MXFP8) {
    op.columnwise = is_a ? trans : !trans;
    return;
  }
  const bool tn = is_a ? !trans : trans;
  if (!tn)
    fail(TE_ERROR_INVALID_ARGUMENT, scaling_name(s),
         " GEMMs take the TN form only (transa = 0, "
         "transb = 1: blocks run along K in the stored rows), got ",
         is_a ? "transa" : "transb", " = ", trans ? 1 : 0, "; pass the columnwise copy of '",
         n.data, "', which this format stores transposed");
}

void check_shape(te_scaling_mode s, const te_tensor& data, const Names& n, BlockOperand& op) {
  if (data.ndim < 2)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", n.data,
         "' must have at least 2 dims (leading "
         "dims are folded into rows), got shape ",
         shape_string(data));
  op.rows = leading_rows(data);
  op.cols = last_dim(data);
  const int64_t block = s == TE_SCALING_MXFP8 ? mxfp8::kBlock : 16;
  if (op.cols % block != 0)
    fail(TE_ERROR_INVALID_ARGUMENT, scaling_name(s), " needs the last dimension of '", n.data,
         "' divisible by ", block, ", got ", op.cols);
  if (op.columnwise && op.rows % mxfp8::kBlock != 0)
    fail(TE_ERROR_INVALID_ARGUMENT, "MXFP8 columnwise (32x1) blocks need the rows of '", n.data,
         "' (the product of its leading dims) divisible by 32, got ", op.rows);
}

// The scale array's expected matrix shape and element type.
void expected_scales(te_scaling_mode s, BlockOperand& op, te_dtype* dtype, const char** what) {
  switch (s) {
    case TE_SCALING_FP8_BLOCK_1D:
    case TE_SCALING_FP8_BLOCK_2D: {
      const te_fp8_block_dim dim = s == TE_SCALING_FP8_BLOCK_1D ? TE_FP8_BLOCK_1D : TE_FP8_BLOCK_2D;
      const fp8_block::ScaleMap map =
          fp8_block::scale_map(op.rows, op.cols, dim, TE_FP8_BLOCK_GEMM_READY, false);
      op.scale_rows = map.shape0;
      op.scale_cols = map.shape1;
      *dtype = TE_DTYPE_FLOAT32;
      *what = dim == TE_FP8_BLOCK_1D ? "FP32 GEMM-ready 1-D" : "FP32 GEMM-ready 2-D";
      return;
    }
    case TE_SCALING_MXFP8:
      if (op.columnwise) {
        mxfp8::columnwise_scale_shape(op.rows, op.cols, &op.scale_rows, &op.scale_cols);
      } else {
        mxfp8::rowwise_scale_shape(op.rows, op.cols, &op.scale_rows, &op.scale_cols);
      }
      *dtype = TE_DTYPE_FLOAT8E8M0;
      *what = op.columnwise ? "E8M0 columnwise" : "E8M0 rowwise";
      return;
    default: {
      const nvfp4::ScaleShape shape = nvfp4::scale_shape(op.rows, op.cols);
      op.scale_rows = shape.rows;
      op.scale_cols = shape.cols;
      *dtype = TE_DTYPE_FLOAT8E4M3;
      *what = "E4M3";
    }
  }
}

void check_scales(te_scaling_mode s, const te_gemm_operand& in, const Names& n, BlockOperand& op) {
  if (in.scale_inv == nullptr)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", n.scale, "' is required for ", scaling_name(s),
         " operands (their block scales)");
  te_dtype dtype = TE_DTYPE_FLOAT32;
  const char* what = "";
  expected_scales(s, op, &dtype, &what);
  Arg(in.scale_inv, n.scale.c_str()).dtype(dtype).same_device(*in.data, n.data.c_str());
  const te_tensor& t = *in.scale_inv;
  // FP32 block scales accept any rank with that matrix view (as te/fp8_block.h).
  const bool ok =
      is_fp8_block(s)
          ? t.ndim > 0 && leading_rows(t) == op.scale_rows && last_dim(t) == op.scale_cols
          : t.ndim == 2 && t.shape[0] == op.scale_rows && t.shape[1] == op.scale_cols;
  if (!ok)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", n.scale, "' must have shape [", op.scale_rows,
         ", ", op.scale_cols, "] (", what, " scales of '", n.data, "' stored as [", op.rows, ", ",
         op.cols, "]), got ", shape_string(t));
  op.scales = t.data;
}

BlockOperand check_block_operand(const te_gemm_operand& in, char which, int trans) {
  const Names n(which);
  const te_scaling_mode s = in.scaling;
  BlockOperand op;
  op.scaling = s;
  Arg data(in.data, n.data.c_str());
  if (s == TE_SCALING_NVFP4) {
    data.dtype(TE_DTYPE_FLOAT4E2M1);
  } else {
    data.dtype_in({TE_DTYPE_FLOAT8E4M3, TE_DTYPE_FLOAT8E5M2}, "float8_e4m3 or float8_e5m2");
  }
  op.data = in.data->data;
  op.dtype = in.data->dtype;
  check_layout(s, n, which == 'a', trans != 0, op);
  check_shape(s, *in.data, n, op);
  check_scales(s, in, n, op);
  if (s == TE_SCALING_NVFP4) {
    if (in.amax == nullptr)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument '", n.amax,
           "' is required for NVFP4 operands "
           "(the FP32 global amax the copy was quantized with)");
    Arg(in.amax, n.amax.c_str()).scalar_fp32().same_device(*in.data, n.data.c_str());
    op.amax = static_cast<const float*>(in.amax->data);
  }
  op.swizzled = in.swizzled_scales != 0;
  return op;
}

// Fields that only some formats take must be absent elsewhere.
void check_unused_fields(const te_gemm_operand& in, char which) {
  const Names n(which);
  const te_scaling_mode s = in.scaling;
  if (in.amax != nullptr && s != TE_SCALING_NVFP4)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", n.amax, "' is only for NVFP4 operands, got a ",
         scaling_name(s), " '", n.data, "'; pass NULL");
  if (in.swizzled_scales != 0 && s != TE_SCALING_MXFP8 && s != TE_SCALING_NVFP4)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", n.data,
         ".swizzled_scales' is only for MXFP8 "
         "and NVFP4 operands, got a ",
         scaling_name(s), " '", n.data, "'");
  if (s == TE_SCALING_NONE && in.scale_inv != nullptr)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", n.scale,
         "' is only for scaled operands, got a "
         "high-precision '",
         n.data, "'; pass NULL");
}

// NONE / TENSOR: the operand's data type must match its declared scaling
// (te_gemm would otherwise take FP8 data as per-tensor FP8 whatever was said).
void check_dense_operand(const te_gemm_operand& in, char which) {
  const Names n(which);
  Arg data(in.data, n.data.c_str());
  if (in.scaling == TE_SCALING_NONE)
    data.dtype_in({TE_DTYPE_FLOAT32, TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT16},
                  "float32, bfloat16 or float16 (TE_SCALING_NONE)");
  else
    data.dtype_in({TE_DTYPE_FLOAT8E4M3, TE_DTYPE_FLOAT8E5M2},
                  "float8_e4m3 or float8_e5m2 (TE_SCALING_TENSOR)");
}

// A BF16 stand-in for a block operand with its stored shape: te_gemm checks
// the shapes and the epilogue against it (its data is never read there).
te_tensor placeholder(const te_tensor& data) {
  te_tensor t = data;
  t.dtype = TE_DTYPE_BFLOAT16;
  return t;
}

// The size queries read no data pointer: they validate copies of the
// descriptors whose pointers are replaced by distinct dummies, 16-byte aligned
// and no more (so that the cuBLASLt heuristic answers for the least alignment
// its FP8 kernels accept; a call with better-aligned buffers can only gain).
// Equal pointers get equal dummies, so aliasing rules still apply.
class Dummies {
 public:
  const te_tensor* view(const te_tensor* t) {
    if (t == nullptr) return nullptr;
    te_tensor& copy = storage_[used_];
    copy = *t;
    const void* key = t->data;
    void* dummy = nullptr;
    for (int i = 0; i < used_ && key != nullptr; ++i)
      if (originals_[i] == key) dummy = storage_[i].data;
    if (dummy == nullptr) dummy = reinterpret_cast<void*>(uintptr_t(used_ + 1) * 0x10000 + 16);
    originals_[used_++] = key;
    copy.data = dummy;
    return &copy;
  }
  te_tensor* view(te_tensor* t) {
    return const_cast<te_tensor*>(view(static_cast<const te_tensor*>(t)));
  }

 private:
  te_tensor storage_[12] = {};
  const void* originals_[12] = {};
  int used_ = 0;
};

te_gemm_block_params with_dummies(const te_gemm_block_params& p, Dummies& d) {
  te_gemm_block_params q = p;
  for (te_gemm_operand* op : {&q.a, &q.b}) {
    op->data = d.view(op->data);
    op->scale_inv = d.view(op->scale_inv);
    op->amax = d.view(op->amax);
  }
  q.d = d.view(q.d);
  q.c = d.view(q.c);
  q.bias = d.view(q.bias);
  return q;
}

}  // namespace

BlockGemm validate(const te_gemm_block_params* params, bool size_only) {
  if (params == nullptr)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'params' is required (got NULL)");
  Dummies dummies;
  const te_gemm_block_params p = size_only ? with_dummies(*params, dummies) : *params;
  check_scaling_value(p.a.scaling, Names('a'));
  check_scaling_value(p.b.scaling, Names('b'));
  if (family(p.a.scaling) != family(p.b.scaling))
    fail(TE_ERROR_INVALID_ARGUMENT, "operands 'a' and 'b' must use one family of scaling, got ",
         scaling_name(p.a.scaling), " and ", scaling_name(p.b.scaling));
  check_unused_fields(p.a, 'a');
  check_unused_fields(p.b, 'b');
  Arg(p.d, "d").dtype_in({TE_DTYPE_FLOAT32, TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT16},
                         "float32, bfloat16 or float16 (te_gemm_block writes high precision)");

  te_gemm_params dense{};
  dense.transa = p.transa;
  dense.transb = p.transb;
  dense.c = p.c;
  dense.d = p.d;
  dense.bias = p.bias;
  dense.alpha = p.alpha;
  dense.beta = p.beta;
  dense.use_split_accumulator = p.use_split_accumulator;

  BlockGemm g;
  g.force_emulation = p.force_emulation != 0;
  g.block = p.a.scaling != TE_SCALING_NONE && p.a.scaling != TE_SCALING_TENSOR;
  if (!g.block) {
    check_dense_operand(p.a, 'a');
    check_dense_operand(p.b, 'b');
    dense.a = p.a.data;
    dense.a_scale_inv = p.a.scale_inv;
    dense.b = p.b.data;
    dense.b_scale_inv = p.b.scale_inv;
    g.dense = gemm::check_params(&dense, size_only);
    g.on_cuda = on_cuda(*p.a.data);
    return g;
  }
  g.a = check_block_operand(p.a, 'a', p.transa);
  g.b = check_block_operand(p.b, 'b', p.transb);
  Arg(p.b.data, "b").same_device(*p.a.data, "a");
  const te_tensor a_stand_in = placeholder(*p.a.data);
  const te_tensor b_stand_in = placeholder(*p.b.data);
  dense.a = &a_stand_in;
  dense.b = &b_stand_in;
  g.dense = gemm::check_params(&dense, size_only);
  // The stand-ins are no arguments (BF16-sized, they reach past the operands'
  // bytes); the operands themselves were recorded above.
  forget_arg(&a_stand_in);
  forget_arg(&b_stand_in);
  g.on_cuda = on_cuda(*p.a.data);
  return g;
}

}  // namespace te::gemm_block
