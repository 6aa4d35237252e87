// Device-side building blocks of the CUDA backends: aligned vectors for
// 16-byte global accesses, a block-wide max and atomic float max.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace te {

// N elements of T moved as one access of up to 16 bytes (two or more 16-byte
// accesses when sizeof(T) * N > 16). Pointers must be aligned to alignof(Vec).
template <class T, int N>
struct alignas(sizeof(T) * N >= 16 ? 16 : sizeof(T) * N) Vec {
  T v[N];
};

// Loads through the read-only path (LDG.E.128.CONSTANT): inputs are never
// written by the kernel that reads them.
template <class T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  constexpr int kBytes = static_cast<int>(sizeof(T)) * N;
  static_assert(kBytes == 4 || kBytes == 8 || kBytes % 16 == 0, "unsupported vector size");
  Vec<T, N> r;
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i)
      reinterpret_cast<uint4*>(&r)[i] = __ldg(reinterpret_cast<const uint4*>(p) + i);
  } else if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(&r) = __ldg(reinterpret_cast<const uint2*>(p));
  } else {
    *reinterpret_cast<uint32_t*>(&r) = __ldg(reinterpret_cast<const unsigned int*>(p));
  }
  return r;
}

template <class T, int N>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
  constexpr int kBytes = static_cast<int>(sizeof(T)) * N;
  static_assert(kBytes == 4 || kBytes == 8 || kBytes % 16 == 0, "unsupported vector size");
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i)
      reinterpret_cast<uint4*>(p)[i] = reinterpret_cast<const uint4*>(&v)[i];
  } else if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(&v);
  } else {
    *reinterpret_cast<uint32_t*>(p) = *reinterpret_cast<const uint32_t*>(&v);
  }
}

inline bool is_aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// Max over the block (blockDim.x a multiple of 32, at most 1024); NaN-free
// inputs. Every thread must call it; the result is valid in thread 0.
__device__ __forceinline__ float block_max(float v) {
  __shared__ float warp_max[32];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? warp_max[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
      v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  }
  return v;
}

// *addr = max(*addr, v) for v >= 0 (not NaN) when *addr holds a value >= 0:
// non-negative floats order like their bit patterns as signed integers.
__device__ __forceinline__ void atomic_max_nonnegative(float* addr, float v) {
  atomicMax(reinterpret_cast<int*>(addr), __float_as_int(v));
}

// *addr = fmaxf(*addr, v) for any previous value (negative, NaN): what the CPU
// backend does when it accumulates into a caller's amax. Returns without an
// atomic when the stored value already wins, which is the common case.
__device__ __forceinline__ void atomic_fmax(float* addr, float v) {
  int* word = reinterpret_cast<int*>(addr);
  int old = *reinterpret_cast<volatile int*>(word);
  while (true) {
    const int wanted = __float_as_int(fmaxf(__int_as_float(old), v));
    if (wanted == old) return;
    const int seen = atomicCAS(word, old, wanted);
    if (seen == old) return;
    old = seen;
  }
}

}  // namespace te
