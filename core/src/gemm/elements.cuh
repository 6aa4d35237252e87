// Device-side element access of the GEMM family's kernels (kernels.cu,
// bias_grad.cu): FP32/BF16/FP16 loads and stores by te_dtype, exact FP8
// values and the saturating FP8 conversion of the CPU spec.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "te/types.h"

namespace te::gemm::kernels {

__device__ __forceinline__ float load_high(const void* p, te_dtype t, int64_t i) {
  if (t == TE_DTYPE_FLOAT32) return static_cast<const float*>(p)[i];
  if (t == TE_DTYPE_BFLOAT16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return __half2float(static_cast<const __half*>(p)[i]);
}

__device__ __forceinline__ void store_high(void* p, te_dtype t, int64_t i, float v) {
  if (t == TE_DTYPE_FLOAT32) {
    static_cast<float*>(p)[i] = v;
  } else if (t == TE_DTYPE_BFLOAT16) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  }
}

__device__ __forceinline__ bool is_fp8_dtype(te_dtype t) {
  return t == TE_DTYPE_FLOAT8E4M3 || t == TE_DTYPE_FLOAT8E5M2;
}

__device__ __forceinline__ __nv_fp8_interpretation_t fp8_kind(te_dtype t) {
  return t == TE_DTYPE_FLOAT8E4M3 ? __NV_E4M3 : __NV_E5M2;
}

// RNE with saturation to the largest finite value (inf too); NaN -> 0x7F, the
// canonical NaN byte of the CPU spec (te::float_to_fp8).
__device__ __forceinline__ uint8_t to_fp8(float v, te_dtype t) {
  if (isnan(v)) return 0x7F;
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, fp8_kind(t)));
}

// Every E4M3/E5M2 value is exact in FP16, so this is the exact FP8 value.
__device__ __forceinline__ float fp8_value(uint8_t q, __nv_fp8_interpretation_t kind) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(q), kind);
  return __half2float(__half(h));
}

}  // namespace te::gemm::kernels
