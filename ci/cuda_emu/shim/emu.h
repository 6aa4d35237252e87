// A CPU emulation of the CUDA execution model for the attention fallback kernels (run.sh):
// one std::thread per CUDA thread, blocks one after another, __syncthreads and warp
// operations through std::barrier. Numerics: host float ops (-ffp-contract=off), glibc expf.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3 {
  unsigned x, y, z;
};
struct float4 {
  float x, y, z, w;
};
struct float2 {
  float x, y;
};
inline float2 make_float2(float a, float b) { return {a, b}; }

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline dim3 blockDim, gridDim;

struct EmuBlock {
  std::unique_ptr<std::barrier<>> block;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  float xchg[1024];
};
inline thread_local EmuBlock* emu_block;
inline float4 emu_shared_storage[16384];  // 256 KiB
inline float4* emu_shared() { return emu_shared_storage; }

inline void __syncthreads() { emu_block->block->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xFFFFFFFFu) {
  emu_block->warps[threadIdx.x / 32]->arrive_and_wait();
}
inline float __shfl_xor_sync(unsigned, float v, int o) {
  emu_block->xchg[threadIdx.x] = v;
  __syncwarp();
  const float r = emu_block->xchg[threadIdx.x ^ o];
  __syncwarp();
  return r;
}
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline float __int_as_float(unsigned i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline float __uint_as_float(unsigned i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned i;
  std::memcpy(&i, &f, 4);
  return i;
}
unsigned __byte_perm(unsigned, unsigned, unsigned);

struct Launch {
  dim3 g, b;
  Launch(dim3 g_, dim3 b_, size_t = 0, void* = nullptr) : g(g_), b(b_) {}
  template <class K, class... A>
  void operator()(K kernel, const A&... args) {
    gridDim = g;
    blockDim = b;
    for (unsigned bx = 0; bx < g.x; ++bx) {
      EmuBlock eb;
      eb.block = std::make_unique<std::barrier<>>(b.x);
      for (unsigned w = 0; w < (b.x + 31) / 32; ++w)
        eb.warps.push_back(std::make_unique<std::barrier<>>(32));
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < b.x; ++t)
        ts.emplace_back([&, t] {
          threadIdx = {t, 0, 0};
          blockIdx = {bx, 0, 0};
          emu_block = &eb;
          kernel(args...);
          eb.warps[t / 32]->arrive_and_drop();
          eb.block->arrive_and_drop();
        });
      for (auto& t : ts) t.join();
    }
  }
};
