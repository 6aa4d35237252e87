// C entry points of the RoPE family: validate once, then run the backend of
// t's device. A CPU call also checks the host-resident cu_seqlens and
// start_positions (every position inside freqs, the thd/cp rules).
#include <algorithm>
#include <cstdint>

#include "rope/backend.h"
#include "runtime/device.h"
#include "runtime/tensor.h"
#include "te/rope.h"

namespace te::rope {
namespace {

const char* format_name(int f) { return f == kBshd ? "bshd" : f == kSbhd ? "sbhd" : "thd"; }

void check_element_aligned(const te_tensor* t, const char* name) {
  const uintptr_t bytes = static_cast<uintptr_t>(dtype_bits(t->dtype) / 8);
  if (bytes > 1 && reinterpret_cast<uintptr_t>(t->data) % bytes != 0)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must be aligned to its element size (",
         bytes, " bytes)");
}

bool overlap(const te_tensor& a, const te_tensor& b) {
  const auto* a0 = static_cast<const char*>(a.data);
  const auto* b0 = static_cast<const char*>(b.data);
  return a0 < b0 + size_bytes(b) && b0 < a0 + size_bytes(a) && size_bytes(a) && size_bytes(b);
}

// The shape of t for its format: b, s (or packed tokens), h, d.
void check_t(const te_tensor* t, const char* name, int format, Args* a) {
  Arg(t, name).dtype_in(kHighPrecision, kHighPrecisionText);
  check_element_aligned(t, name);
  const int rank = format == kThd ? 3 : 4;
  if (t->ndim != rank)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must have ", rank, " dimensions (",
         format == kThd    ? "[t, h, d]"
         : format == kBshd ? "[b, s, h, d]"
                           : "[s, b, h, d]",
         " for tensor_format ", format_name(format), "), got shape ", shape_string(*t));
  const int64_t* sh = t->shape;
  if (format == kThd) {
    a->tokens = sh[0];
  } else {
    a->b = format == kBshd ? sh[0] : sh[1];
    a->s = format == kBshd ? sh[1] : sh[0];
    a->tokens = a->b * a->s;
  }
  a->h = sh[rank - 2];
  a->d = sh[rank - 1];
}

void check_freqs(const te_tensor* freqs, const te_tensor& t, Args* a) {
  Arg(freqs, "freqs").dtype(TE_DTYPE_FLOAT32).same_device(t, "t");
  check_element_aligned(freqs, "freqs");
  if (freqs->ndim < 2)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'freqs' must be [S, 1, 1, d2], got shape ",
         shape_string(*freqs));
  for (int i = 1; i + 1 < freqs->ndim; ++i)
    if (freqs->shape[i] != 1)
      fail(TE_ERROR_INVALID_ARGUMENT,
           "argument 'freqs' must be [S, 1, 1, d2] (middle dimensions 1), got shape ",
           shape_string(*freqs));
  a->freq_rows = freqs->shape[0];
  a->d2 = freqs->shape[freqs->ndim - 1];
  if (a->d2 < 2 || a->d2 % 2 != 0 || a->d2 > a->d)
    fail(TE_ERROR_INVALID_ARGUMENT,
         "the rotary dimension (the last dimension of 'freqs') must be even and in [2, d = ", a->d,
         "], got ", a->d2);
  a->freqs = static_cast<const float*>(freqs->data);
}

const int32_t* check_int_vector(const te_tensor* v, const char* name, int64_t n,
                                const te_tensor& t) {
  Arg(v, name).dtype(TE_DTYPE_INT32).same_device(t, "t");
  check_element_aligned(v, name);
  if (v->ndim != 1 || v->shape[0] != n)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must be INT32 [", n, "], got shape ",
         shape_string(*v));
  return static_cast<const int32_t*>(v->data);
}

void check_sequences(const te_tensor* cu_seqlens, const te_tensor* start_positions,
                     const te_tensor& t, Args* a) {
  if (a->format == kThd) {
    if (cu_seqlens == nullptr)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'cu_seqlens' is required with tensor_format thd");
    Arg(cu_seqlens, "cu_seqlens");
    if (cu_seqlens->ndim != 1 || cu_seqlens->shape[0] < 1)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'cu_seqlens' must be INT32 [b + 1], got shape ",
           shape_string(*cu_seqlens));
    a->b = cu_seqlens->shape[0] - 1;
    a->cu_seqlens = check_int_vector(cu_seqlens, "cu_seqlens", a->b + 1, t);
  } else if (cu_seqlens != nullptr) {
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'cu_seqlens' is only for tensor_format thd, got ",
         format_name(a->format), " (pass NULL)");
  }
  if (start_positions != nullptr) {
    if (a->cp_size > 1)
      fail(TE_ERROR_INVALID_ARGUMENT,
           "argument 'start_positions' is not supported with cp_size > 1 (got cp_size ", a->cp_size,
           ")");
    a->start_positions = check_int_vector(start_positions, "start_positions", a->b, t);
  }
}

// First and last freqs rows a local sequence of L tokens starting at `start` reads.
void check_rows(int64_t L, int64_t start, int64_t seq, const Args& a) {
  if (L == 0) return;
  if (a.cp_size > 1 && L % 2 != 0)
    fail(TE_ERROR_INVALID_ARGUMENT, "with cp_size > 1 every local sequence length must be even",
         a.format == kThd ? " (each global length a multiple of 2 * cp_size)" : "", "; sequence ",
         seq, " has ", L, " local tokens");
  const int64_t lo = position(0, L, start, a.cp_size, a.cp_rank);
  const int64_t hi =
      a.cp_size > 1 ? a.cp_size * L - a.cp_rank * (L / 2) - 1 : position(L - 1, L, start, 1, 0);
  if (lo < 0 || hi >= a.freq_rows)
    fail(TE_ERROR_INVALID_ARGUMENT, "sequence ", seq, " reads positions ", lo, "..", hi,
         " but 'freqs' has ", a.freq_rows, " rows");
}

// Everything the shapes tell (any device); on the CPU also the host-resident
// sequence bounds and start positions.
void check_positions(const Args& a, bool host_data) {
  if (a.format != kThd) {
    if (a.start_positions == nullptr) return check_rows(a.s, 0, 0, a);
    if (!host_data) return;
    for (int64_t k = 0; k < a.b; ++k) check_rows(a.s, a.start_positions[k], k, a);
    return;
  }
  if (!host_data) return;
  const int32_t* cu = a.cu_seqlens;
  if (cu[0] < 0 || cu[0] % a.cp_size != 0)
    fail(TE_ERROR_INVALID_ARGUMENT, "cu_seqlens[0] must be >= 0 and a multiple of cp_size, got ",
         cu[0]);
  for (int64_t k = 0; k < a.b; ++k) {
    const int64_t len = int64_t{cu[k + 1]} - cu[k];
    if (len < 0)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'cu_seqlens' must be non-decreasing, got ", cu[k],
           " then ", cu[k + 1], " at index ", k);
    if (a.cp_size > 1 && len % (2 * a.cp_size) != 0)
      fail(TE_ERROR_INVALID_ARGUMENT, "with cp_size ", a.cp_size,
           " every sequence length must be a multiple of 2 * cp_size; sequence ", k, " has ", len);
    check_rows(cu[k + 1] / a.cp_size - cu[k] / a.cp_size,
               a.start_positions ? a.start_positions[k] : 0, k, a);
  }
  if (cu[a.b] / a.cp_size > a.tokens)
    fail(TE_ERROR_INVALID_ARGUMENT, "cu_seqlens[b] / cp_size = ", cu[a.b] / a.cp_size,
         " is past the ", a.tokens, " tokens of the packed tensor");
}

Args check(bool backward, const te_tensor* in, const char* in_name, const te_tensor* freqs,
           const te_tensor* cu_seqlens, const te_tensor* start_positions, int tensor_format,
           int interleaved, int cp_size, int cp_rank, te_tensor* out, const char* out_name) {
  Args a{};
  a.backward = backward;
  if (tensor_format != kBshd && tensor_format != kSbhd && tensor_format != kThd)
    fail(TE_ERROR_INVALID_ARGUMENT,
         "argument 'tensor_format' must be 0 (bshd), 1 (sbhd) or 2 (thd), got ", tensor_format);
  a.format = tensor_format;
  if (cp_size < 1 || cp_rank < 0 || cp_rank >= cp_size)
    fail(TE_ERROR_INVALID_ARGUMENT, "arguments 'cp_size' and 'cp_rank' need cp_size >= 1 and ",
         "0 <= cp_rank < cp_size, got cp_size ", cp_size, ", cp_rank ", cp_rank);
  a.cp_size = cp_size;
  a.cp_rank = cp_rank;
  a.interleaved = interleaved != 0;
  check_t(in, in_name, tensor_format, &a);
  a.in = in->data;
  a.dtype = in->dtype;
  check_freqs(freqs, *in, &a);
  check_sequences(cu_seqlens, start_positions, *in, &a);
  Arg(out, out_name).output().same_shape(*in, in_name).same_device(*in, in_name);
  if (out->dtype != in->dtype)
    fail(TE_ERROR_INVALID_DTYPE, "argument '", out_name, "' must have the type of '", in_name,
         "' (", dtype_name(in->dtype), "), got ", dtype_name(out->dtype));
  check_element_aligned(out, out_name);
  if (overlap(*in, *out))
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", out_name, "' must not overlap '", in_name, "'");
  a.out = out->data;
  check_positions(a, !on_cuda(*in));
  return a;
}

}  // namespace
}  // namespace te::rope

using namespace te;
using namespace te::rope;

extern "C" {

te_status te_rope_fwd(const te_tensor* t, const te_tensor* freqs, const te_tensor* cu_seqlens,
                      const te_tensor* start_positions, int tensor_format, int interleaved,
                      int cp_size, int cp_rank, te_tensor* out, te_stream stream) {
  return guarded("te_rope_fwd", [&] {
    const Args a = check(false, t, "t", freqs, cu_seqlens, start_positions, tensor_format,
                         interleaved, cp_size, cp_rank, out, "out");
    if (a.tokens * a.h * a.d == 0) return;
    TE_DISPATCH(*t, cpu::run(a), cuda::run(a, stream));
  });
}

te_status te_rope_bwd(const te_tensor* d_out, const te_tensor* freqs, const te_tensor* cu_seqlens,
                      const te_tensor* start_positions, int tensor_format, int interleaved,
                      int cp_size, int cp_rank, te_tensor* d_t, te_stream stream) {
  return guarded("te_rope_bwd", [&] {
    const Args a = check(true, d_out, "d_out", freqs, cu_seqlens, start_positions, tensor_format,
                         interleaved, cp_size, cp_rank, d_t, "d_t");
    if (a.tokens * a.h * a.d == 0) return;
    TE_DISPATCH(*d_out, cpu::run(a), cuda::run(a, stream));
  });
}

}  // extern "C"
