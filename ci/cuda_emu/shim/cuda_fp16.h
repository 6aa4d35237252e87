#pragma once
#include "emu.h"
#include "runtime/numerics.h"
struct __half_raw {
  unsigned short x;
};
struct __half {
  unsigned short __x;
  __half() = default;
  __half(__half_raw r) : __x(r.x) {}
};
struct __half2_raw {
  unsigned short x, y;
};
struct __half2 {
  __half x, y;
  __half2(__half2_raw r) : x(__half_raw{r.x}), y(__half_raw{r.y}) {}
};
inline float __half2float(__half h) { return te::fp16_to_float(h.__x); }
inline __half __float2half_rn(float f) { return __half_raw{te::float_to_fp16(f)}; }
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
