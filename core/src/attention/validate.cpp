// Validation of the attention family's arguments (rules in te/attention.h).
#include "attention/validate.h"

#include <cmath>
#include <cstdint>

#include "runtime/status.h"
#include "runtime/tensor.h"

namespace te::attention {
namespace {

const char* format_name(te_qkv_format f) {
  return f == TE_QKV_FORMAT_BSHD ? "bshd" : f == TE_QKV_FORMAT_SBHD ? "sbhd" : "thd";
}

// Kernels access elements directly: a misaligned buffer is rejected (a CUDA
// element access at such an address is a sticky fault).
void check_aligned(const te_tensor& t, const char* name) {
  const uintptr_t bytes = static_cast<uintptr_t>(dtype_bits(t.dtype) / 8);
  if (bytes > 1 && reinterpret_cast<uintptr_t>(t.data) % bytes != 0)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must be aligned to its element size (",
         bytes, " bytes for ", dtype_name(t.dtype), ")");
}

void check_config(const te_attention_config& c) {
  if (c.qkv_format < 0 || c.qkv_format > 2)
    fail(TE_ERROR_INVALID_ARGUMENT,
         "argument 'config.qkv_format' must be 0 (bshd), 1 (sbhd) or 2 (thd), got ", c.qkv_format);
  if (c.mask_type < 0 || c.mask_type > 6)
    fail(TE_ERROR_INVALID_ARGUMENT,
         "argument 'config.mask_type' must be a te_attn_mask_type (0 to 6), got ", c.mask_type);
  if (c.bias_type < 0 || c.bias_type > 3)
    fail(TE_ERROR_INVALID_ARGUMENT,
         "argument 'config.bias_type' must be a te_attn_bias_type (0 to 3), got ", c.bias_type);
  if (c.softmax_type < 0 || c.softmax_type > 2)
    fail(
        TE_ERROR_INVALID_ARGUMENT,
        "argument 'config.softmax_type' must be 0 (vanilla), 1 (off_by_one) or 2 (learnable), got ",
        c.softmax_type);
  if (!std::isfinite(c.scale))
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'config.scale' must be finite, got ", c.scale);
  if (!(c.dropout >= 0.0f && c.dropout < 1.0f))
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'config.dropout' must be in [0, 1), got ", c.dropout);
  if (c.window_left < -1 || c.window_right < -1)
    fail(TE_ERROR_INVALID_ARGUMENT,
         "arguments 'config.window_left' and 'config.window_right' must be >= 0 or -1 "
         "(unbounded), got (",
         c.window_left, ", ", c.window_right, ")");
  if (is_causal_mask(static_cast<te_attn_mask_type>(c.mask_type)) && c.window_right > 0)
    fail(TE_ERROR_INVALID_ARGUMENT,
         "argument 'config.window_right' must be 0 or -1 with a causal mask type (a causal mask "
         "sees no key right of the diagonal), got ",
         c.window_right);
}

// [B, S, H, D] of one of q, k, v in the layout (thd: B = -1, S = tokens).
struct Bshd {
  int64_t b, s, h, d;
};

Bshd read_layout(const te_tensor& t, const char* name, te_qkv_format f) {
  const int want = f == TE_QKV_FORMAT_THD ? 3 : 4;
  if (t.ndim != want)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must have ", want, " dimensions (",
         f == TE_QKV_FORMAT_BSHD   ? "[B, S, H, D]"
         : f == TE_QKV_FORMAT_SBHD ? "[S, B, H, D]"
                                   : "[T, H, D]",
         " for ", format_name(f), "), got shape ", shape_string(t));
  const int64_t* s = t.shape;
  Bshd r = f == TE_QKV_FORMAT_BSHD   ? Bshd{s[0], s[1], s[2], s[3]}
           : f == TE_QKV_FORMAT_SBHD ? Bshd{s[1], s[0], s[2], s[3]}
                                     : Bshd{-1, s[0], s[1], s[2]};
  if (r.h < 1 || r.d < 1 || (f != TE_QKV_FORMAT_THD && (r.b < 1 || r.s < 1)))
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name,
         "' must have non-empty batch, sequence, head and head-size dimensions, got shape ",
         shape_string(t));
  return r;
}

void check_qkv_types(const InputTensors& t) {
  Arg(t.q, "q");
  Arg(t.k, "k");
  Arg(t.v, "v");
  for (const te_tensor* x : {t.q, t.k, t.v})
    if (is_fp8(x->dtype))
      fail(TE_ERROR_UNSUPPORTED, "FP8 attention is not yet supported (argument '",
           x == t.q   ? "q"
           : x == t.k ? "k"
                      : "v",
           "' is ", dtype_name(x->dtype), ")");
  Arg(t.q, "q").dtype_in(kHighPrecision, kHighPrecisionText);
  for (const te_tensor* x : {t.k, t.v}) {
    const char* name = x == t.k ? "k" : "v";
    if (x->dtype != t.q->dtype)
      fail(TE_ERROR_INVALID_DTYPE, "argument '", name, "' must have the type of 'q' (",
           dtype_name(t.q->dtype), "), got ", dtype_name(x->dtype));
    Arg(x, name).same_device(*t.q, "q");
  }
  for (const te_tensor* x : {t.q_scale_inv, t.k_scale_inv, t.v_scale_inv})
    if (x != nullptr)
      fail(TE_ERROR_INVALID_ARGUMENT,
           "arguments 'q_scale_inv', 'k_scale_inv' and 'v_scale_inv' are only for FP8 q/k/v; q is ",
           dtype_name(t.q->dtype), " (pass NULL)");
  check_aligned(*t.q, "q");
  check_aligned(*t.k, "k");
  check_aligned(*t.v, "v");
}

// Sizes from q, k, v (thd: B, Sq, Skv come from cu_seqlens and max_seqlen).
Dims read_dims(const te_attention_config& c, const InputTensors& t) {
  const auto f = static_cast<te_qkv_format>(c.qkv_format);
  const Bshd q = read_layout(*t.q, "q", f), k = read_layout(*t.k, "k", f);
  const Bshd v = read_layout(*t.v, "v", f);
  if (k.b != q.b)
    fail(TE_ERROR_INVALID_ARGUMENT, "arguments 'q' and 'k' must have the same batch size, got ",
         q.b, " and ", k.b, " (", format_name(f), ")");
  if (k.d != q.d)
    fail(TE_ERROR_INVALID_ARGUMENT, "arguments 'q' and 'k' must have the same head size D, got ",
         q.d, " and ", k.d);
  if (v.b != k.b || v.s != k.s || v.h != k.h)
    fail(TE_ERROR_INVALID_ARGUMENT,
         "argument 'v' must match 'k' in batch, sequence and head dimensions (", format_name(f),
         "), got shapes ", shape_string(*t.v), " and ", shape_string(*t.k));
  if (q.h % k.h != 0)
    fail(TE_ERROR_INVALID_ARGUMENT, "the query heads H (", q.h,
         ", argument 'q') must be a multiple of the key/value heads Hk (", k.h,
         ", argument 'k') for GQA/MQA");
  Dims d{q.b, q.s, k.s, q.h, k.h, q.d, v.d, 0, 0};
  if (f == TE_QKV_FORMAT_THD) {
    if (c.max_seqlen_q < 1 || c.max_seqlen_kv < 1)
      fail(TE_ERROR_INVALID_ARGUMENT,
           "arguments 'config.max_seqlen_q' and 'config.max_seqlen_kv' must be >= 1 for thd, got ",
           c.max_seqlen_q, " and ", c.max_seqlen_kv);
    d.tq = q.s;
    d.tkv = k.s;
    d.sq = c.max_seqlen_q;
    d.skv = c.max_seqlen_kv;
    d.b = -1;  // from cu_seqlens
  }
  return d;
}

// An INT32 [B + 1] vector; B from the first one when b < 0. On the host, its
// values are checked: they start at 0 (offsets: >= 0) and never decrease.
const int32_t* check_cu(const te_tensor* t, const char* name, int64_t* b, const te_tensor& q,
                        bool offsets) {
  Arg(t, name).dtype(TE_DTYPE_INT32).same_device(q, "q");
  if (t->ndim != 1 || t->shape[0] < 2 || (*b >= 0 && t->shape[0] != *b + 1))
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must be a vector of ",
         *b >= 0 ? concat(*b + 1) : std::string("B + 1 >= 2"), " INT32 (B + 1) values, got shape ",
         shape_string(*t));
  check_aligned(*t, name);
  *b = t->shape[0] - 1;
  const auto* v = static_cast<const int32_t*>(t->data);
  if (!on_cuda(*t)) {
    if (offsets ? v[0] < 0 : v[0] != 0)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must start at ",
           offsets ? ">= 0" : "0", ", got ", v[0]);
    for (int64_t i = 0; i < *b; ++i)
      if (v[i + 1] < v[i])
        fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must be non-decreasing, got ", v[i],
             " then ", v[i + 1], " at index ", i);
  }
  return v;
}

// Lengths against the tensor sizes (host values only): every sequence fits in
// its maximum length and in the packed tensor at its offset.
void check_lengths(const int32_t* cu, const int32_t* padded, int64_t b, int64_t max_len,
                   int64_t rows, const char* name, const char* padded_name, bool thd) {
  for (int64_t i = 0; i < b; ++i) {
    const int64_t len = cu[i + 1] - cu[i];
    if (len > max_len)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' gives sequence ", i, " length ", len,
           ", more than ", thd ? "the config's max_seqlen " : "the tensor's sequence size ",
           max_len);
    if (thd && padded[i] + len > padded[i + 1])
      fail(TE_ERROR_INVALID_ARGUMENT, "sequence ", i, " (length ", len, ", argument '", name,
           "') overlaps the next one at its offset ", padded[i], " (argument '", padded_name, "')");
  }
  if (thd && padded[b] > rows)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", padded_name, "' ends at row ", padded[b],
         ", past the ", rows, " rows of the packed tensor");
}

void check_seqlens(const te_attention_config& c, const InputTensors& t, Inputs* in) {
  Dims& d = in->dims;
  const bool thd = in->qkv_format == TE_QKV_FORMAT_THD;
  const bool needed = thd || is_padding_mask(in->mask_type);
  if (!needed) {
    if (t.cu_seqlens_q || t.cu_seqlens_kv || t.cu_seqlens_q_padded || t.cu_seqlens_kv_padded)
      fail(TE_ERROR_INVALID_ARGUMENT,
           "arguments 'cu_seqlens_*' are only for thd and padding mask types (pass NULL)");
    return;
  }
  if (t.cu_seqlens_q == nullptr || t.cu_seqlens_kv == nullptr)
    fail(TE_ERROR_INVALID_ARGUMENT, "arguments 'cu_seqlens_q' and 'cu_seqlens_kv' are required ",
         thd ? "for thd" : "with a padding mask type");
  if (!thd && (t.cu_seqlens_q_padded || t.cu_seqlens_kv_padded))
    fail(TE_ERROR_INVALID_ARGUMENT,
         "arguments 'cu_seqlens_q_padded' and 'cu_seqlens_kv_padded' are only for thd (pass NULL)");
  int64_t b = d.b;
  in->cu_q = check_cu(t.cu_seqlens_q, "cu_seqlens_q", &b, *t.q, false);
  in->cu_kv = check_cu(t.cu_seqlens_kv, "cu_seqlens_kv", &b, *t.q, false);
  in->cu_q_padded = t.cu_seqlens_q_padded
                        ? check_cu(t.cu_seqlens_q_padded, "cu_seqlens_q_padded", &b, *t.q, true)
                        : (thd ? in->cu_q : nullptr);
  in->cu_kv_padded = t.cu_seqlens_kv_padded
                         ? check_cu(t.cu_seqlens_kv_padded, "cu_seqlens_kv_padded", &b, *t.q, true)
                         : (thd ? in->cu_kv : nullptr);
  d.b = b;
  if (on_cuda(*t.q)) return;  // the values live on the device: not read here
  check_lengths(in->cu_q, in->cu_q_padded, b, d.sq, d.tq, "cu_seqlens_q",
                t.cu_seqlens_q_padded ? "cu_seqlens_q_padded" : "cu_seqlens_q", thd);
  check_lengths(in->cu_kv, in->cu_kv_padded, b, d.skv, d.tkv, "cu_seqlens_kv",
                t.cu_seqlens_kv_padded ? "cu_seqlens_kv_padded" : "cu_seqlens_kv", thd);
}

// A [Bx, Hx, Sq, Skv] tensor broadcast over batch and heads (bias, attn_mask).
void check_broadcast4(const te_tensor& t, const char* name, const Dims& d, int64_t* bx,
                      int64_t* hx) {
  const int64_t* s = t.shape;
  if (t.ndim != 4 || (s[0] != 1 && s[0] != d.b) || (s[1] != 1 && s[1] != d.h) || s[2] != d.sq ||
      s[3] != d.skv)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must be [1 or ", d.b, ", 1 or ", d.h,
         ", ", d.sq, ", ", d.skv, "] ([B, H, Sq, Skv], broadcast over B and H), got shape ",
         shape_string(t));
  *bx = s[0];
  *hx = s[1];
  check_aligned(t, name);
}

void check_bias(const InputTensors& t, Inputs* in) {
  const bool with_bias =
      in->bias_type == TE_ATTN_BIAS_PRE_SCALE_BIAS || in->bias_type == TE_ATTN_BIAS_POST_SCALE_BIAS;
  if (with_bias != (t.bias != nullptr))
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'bias' is ", with_bias ? "required with" : "only for",
         " bias_type pre_scale_bias or post_scale_bias", with_bias ? "" : " (pass NULL)");
  if (t.bias) {
    Arg(t.bias, "bias").same_device(*t.q, "q");
    if (t.bias->dtype != t.q->dtype)
      fail(TE_ERROR_INVALID_DTYPE, "argument 'bias' must have the type of 'q' (",
           dtype_name(t.q->dtype), "), got ", dtype_name(t.bias->dtype));
    check_broadcast4(*t.bias, "bias", in->dims, &in->bias_b, &in->bias_h);
    in->bias = t.bias->data;
  }
  if (t.alibi_slopes && in->bias_type != TE_ATTN_BIAS_ALIBI)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'alibi_slopes' is only for bias_type alibi");
  if (t.alibi_slopes) {
    const Dims& d = in->dims;
    Arg(t.alibi_slopes, "alibi_slopes").dtype(TE_DTYPE_FLOAT32).same_device(*t.q, "q");
    const te_tensor& a = *t.alibi_slopes;
    const bool per_head = a.ndim == 1 && a.shape[0] == d.h;
    const bool per_batch = a.ndim == 2 && a.shape[0] == d.b && a.shape[1] == d.h;
    if (!per_head && !per_batch)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'alibi_slopes' must be [", d.h, "] or [", d.b, ", ",
           d.h, "] ([H] or [B, H]), got shape ", shape_string(a));
    check_aligned(a, "alibi_slopes");
    in->alibi_slopes = static_cast<const float*>(a.data);
    in->alibi_per_batch = per_batch;
  }
}

void check_mask(const InputTensors& t, Inputs* in) {
  const bool arbitrary = in->mask_type == TE_ATTN_MASK_ARBITRARY;
  if (arbitrary && in->qkv_format == TE_QKV_FORMAT_THD)
    fail(TE_ERROR_UNSUPPORTED,
         "mask type 'arbitrary' is not supported with qkv_format thd (use bshd or sbhd)");
  if (arbitrary != (t.attn_mask != nullptr))
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'attn_mask' is ",
         arbitrary ? "required with" : "only for", " mask type 'arbitrary'",
         arbitrary ? "" : " (pass NULL)");
  if (!t.attn_mask) return;
  Arg(t.attn_mask, "attn_mask").dtype(TE_DTYPE_BYTE).same_device(*t.q, "q");
  check_broadcast4(*t.attn_mask, "attn_mask", in->dims, &in->mask_b, &in->mask_h);
  in->mask = static_cast<const uint8_t*>(t.attn_mask->data);
}

void check_softmax_and_dropout(const te_attention_config& c, const InputTensors& t, Inputs* in) {
  const bool learnable = in->softmax_type == TE_SOFTMAX_LEARNABLE;
  if (learnable != (t.softmax_offset != nullptr))
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'softmax_offset' is ",
         learnable ? "required with" : "only for", " softmax_type learnable",
         learnable ? "" : " (pass NULL)");
  if (t.softmax_offset)
    in->softmax_offset = check_per_head(t.softmax_offset, "softmax_offset", *in, *t.q);
  if (c.dropout == 0.0f) return;  // rng_state is not read
  if (t.rng_state == nullptr)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'rng_state' (INT64 [2]: seed, offset) is required ",
         "with dropout > 0");
  Arg(t.rng_state, "rng_state").dtype(TE_DTYPE_INT64).numel(2);
  check_aligned(*t.rng_state, "rng_state");
  const auto* rng = static_cast<const int64_t*>(t.rng_state->data);
  if (!on_cuda(*t.rng_state)) {
    in->seed = static_cast<uint64_t>(rng[0]);
    in->offset = static_cast<uint64_t>(rng[1]);
  } else if (!on_cuda(*t.q) || t.rng_state->device_index != t.q->device_index) {
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'rng_state' must be in host memory or on the ",
         "device of 'q' (", device_string(*t.q), "), got ", device_string(*t.rng_state));
  } else {
    in->rng_state_device = rng;
  }
}

}  // namespace

float* check_per_head(const te_tensor* t, const char* name, const Inputs& in, const te_tensor& q) {
  Arg(t, name).dtype(TE_DTYPE_FLOAT32).same_device(q, "q");
  if (numel(*t) != in.dims.h)  // any shape: the reference keeps softmax_offset [1, H, 1, 1]
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must hold one FP32 value per query ",
         "head ([", in.dims.h, "]), got shape ", shape_string(*t));
  check_aligned(*t, name);
  return static_cast<float*>(t->data);
}

Inputs check_inputs(const te_attention_config& c, const InputTensors& t) {
  check_config(c);
  check_qkv_types(t);
  Inputs in{};
  in.qkv_format = static_cast<te_qkv_format>(c.qkv_format);
  in.mask_type = static_cast<te_attn_mask_type>(c.mask_type);
  in.bias_type = static_cast<te_attn_bias_type>(c.bias_type);
  in.softmax_type = static_cast<te_softmax_type>(c.softmax_type);
  in.scale = c.scale;
  in.dropout = c.dropout;
  in.window_left = c.window_left;
  in.window_right = is_causal_mask(in.mask_type) ? 0 : c.window_right;
  in.deterministic = c.deterministic != 0;
  in.dtype = t.q->dtype;
  in.dims = read_dims(c, t);
  if (in.qkv_format == TE_QKV_FORMAT_THD) {  // thd sequences always come from cu_seqlens
    if (in.mask_type == TE_ATTN_MASK_NO_MASK) in.mask_type = TE_ATTN_MASK_PADDING;
    if (in.mask_type == TE_ATTN_MASK_CAUSAL) in.mask_type = TE_ATTN_MASK_PADDING_CAUSAL;
    if (in.mask_type == TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT)
      in.mask_type = TE_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  }
  check_mask(t, &in);  // before the sequence lengths: arbitrary + thd is refused first
  check_seqlens(c, t, &in);
  check_bias(t, &in);
  check_softmax_and_dropout(c, t, &in);
  in.q = t.q->data;
  in.k = t.k->data;
  in.v = t.v->data;
  return in;
}

void check_like(const te_tensor* t, const char* name, const te_tensor& like, const char* like_name,
                te_dtype dtype) {
  Arg(t, name).same_shape(like, like_name).same_device(like, like_name);
  if (t->dtype != dtype)
    fail(TE_ERROR_INVALID_DTYPE, "argument '", name, "' must be ", dtype_name(dtype), ", got ",
         dtype_name(t->dtype));
  check_aligned(*t, name);
}

void check_output(const te_tensor* t, const char* name, const Inputs& in, const te_tensor& q) {
  Arg(t, name).same_device(q, "q");
  if (t->dtype != in.dtype)
    fail(TE_ERROR_INVALID_DTYPE, "argument '", name, "' must have the type of 'q' (",
         dtype_name(in.dtype), "), got ", dtype_name(t->dtype));
  bool ok = t->ndim == q.ndim;
  for (int i = 0; ok && i + 1 < q.ndim; ++i) ok = t->shape[i] == q.shape[i];
  if (!ok || t->shape[q.ndim - 1] != in.dims.dv)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must have the shape of 'q' with head ",
         "size Dv = ", in.dims.dv, " (of 'v'), got shape ", shape_string(*t), " for q ",
         shape_string(q));
  check_aligned(*t, name);
}

float* check_lse(const te_tensor* t, const char* name, const Inputs& in, const te_tensor& q) {
  Arg(t, name).dtype(TE_DTYPE_FLOAT32).same_device(q, "q");
  const Dims& d = in.dims;
  const bool thd = in.qkv_format == TE_QKV_FORMAT_THD;
  const bool ok =
      thd ? t->ndim == 2 && t->shape[0] == d.tq && t->shape[1] == d.h
          : t->ndim == 3 && t->shape[0] == d.b && t->shape[1] == d.h && t->shape[2] == d.sq;
  if (!ok)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must be FP32 ",
         thd ? concat("[", d.tq, ", ", d.h, "] ([Tq, H] for thd)")
             : concat("[", d.b, ", ", d.h, ", ", d.sq, "] ([B, H, Sq])"),
         ", got shape ", shape_string(*t));
  check_aligned(*t, name);
  return static_cast<float*>(t->data);
}

void* check_workspace(const te_tensor* t, size_t needed, const te_tensor& q) {
  if (needed == 0 && t == nullptr) return nullptr;
  Arg(t, "workspace").output().dtype(TE_DTYPE_BYTE).same_device(q, "q");
  if (static_cast<size_t>(numel(*t)) < needed)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'workspace' must hold at least ", needed,
         " bytes (the workspace-size query), got ", numel(*t));
  if (reinterpret_cast<uintptr_t>(t->data) % 16 != 0)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'workspace' must be 16-byte aligned");
  return t->data;
}

}  // namespace te::attention
