#pragma once
#include "cuda_fp16.h"
struct __nv_bfloat16_raw {
  unsigned short x;
};
struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(__nv_bfloat16_raw r) : __x(r.x) {}
};
inline float __bfloat162float(__nv_bfloat16 h) { return te::bf16_to_float(h.__x); }
