// The GEMM family's own CUDA kernels (see kernels.h for what each computes).
// They are small, memory-bound helpers around cuBLASLt: element types are
// dispatched per element on warp-uniform values, which costs nothing next to
// the memory traffic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "gemm/cublas_check.h"
#include "gemm/kernels.h"

namespace te::gemm::kernels {
namespace {

constexpr int kTile = 32;       // transpose tile (bytes per side)
constexpr int kTileRows = 8;    // threads per tile column
constexpr int kMaxGridY = 65535;

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
__device__ __forceinline__ float fp8_value(uint8_t q, te_dtype t) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(q), fp8_kind(t));
  return __half2float(__half(h));
}

// Element i of an operand as FP32 (FP8: float(q) * scale_inv).
__device__ __forceinline__ float load_operand(const void* p, te_dtype t, int64_t i,
                                              float scale_inv) {
  if (is_fp8_dtype(t)) return fp8_value(static_cast<const uint8_t*>(p)[i], t) * scale_inv;
  return load_high(p, t, i);
}

__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

// *addr = fmaxf(*addr, v) atomically (fmaxf semantics: NaN never wins).
__device__ void atomic_fmax(float* addr, float v) {
  unsigned int* bits = reinterpret_cast<unsigned int*>(addr);
  unsigned int old = *bits, assumed;
  do {
    assumed = old;
    const float next = fmaxf(__uint_as_float(assumed), v);
    if (__float_as_uint(next) == assumed) return;
    old = atomicCAS(bits, assumed, __float_as_uint(next));
  } while (old != assumed);
}

__device__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xFFFFFFFFu, v, offset);
  return v;
}

__device__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_down_sync(0xFFFFFFFFu, v, offset));
  return v;
}

// ---------------------------------------------------------------------------

// One kTile x kTile tile per block through shared memory, so that both the
// reads and the writes walk contiguous bytes.
__global__ void transpose_bytes_kernel(const uint8_t* in, uint8_t* out, int64_t rows,
                                       int64_t cols) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile; r0 < rows;
       r0 += static_cast<int64_t>(gridDim.y) * kTile) {
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {
      const int64_t row = r0 + r, col = c0 + threadIdx.x;
      if (row < rows && col < cols) tile[r][threadIdx.x] = in[row * cols + col];
    }
    __syncthreads();
    for (int c = threadIdx.y; c < kTile; c += kTileRows) {
      const int64_t col = c0 + c, row = r0 + threadIdx.x;
      if (row < rows && col < cols) out[col * rows + row] = tile[threadIdx.x][c];
    }
    __syncthreads();
  }
}

// Block (32, 8): a warp covers 32 consecutive columns of one row.
__global__ void epilogue_kernel(EpilogueArgs p) {
  const float d_scale = p.d_scale ? *p.d_scale : 1.0f;
  const bool fp8_out = is_fp8_dtype(p.d_dtype);
  float amax = 0.0f;
  for (int64_t row = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; row < p.m;
       row += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    for (int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; col < p.n;
         col += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t i = row * p.n + col;
      float v = p.acc ? p.acc[i] : 0.0f;
      if (p.c) v += p.beta * load_high(p.c, p.c_dtype, i);
      if (p.bias) v += load_high(p.bias, p.bias_dtype, col);
      if (p.pre_gelu_out) {
        store_high(p.pre_gelu_out, p.pre_gelu_dtype, i, v);
        v = gelu_tanh(v);
      }
      if (fp8_out) {
        amax = fmaxf(amax, fabsf(v));
        static_cast<uint8_t*>(p.d)[i] = to_fp8(v * d_scale, p.d_dtype);
      } else {
        store_high(p.d, p.d_dtype, i, v);
      }
    }
  }
  if (p.d_amax == nullptr) return;
  __shared__ float warp_amax[32];
  const int lane = (threadIdx.y * blockDim.x + threadIdx.x) % 32;
  const int warp = (threadIdx.y * blockDim.x + threadIdx.x) / 32;
  const int warps = blockDim.x * blockDim.y / 32;
  amax = warp_max(amax);
  if (lane == 0) warp_amax[warp] = amax;
  __syncthreads();
  if (warp == 0) {
    amax = lane < warps ? warp_amax[lane] : 0.0f;
    amax = warp_max(amax);
    if (lane == 0) atomic_fmax(p.d_amax, amax);
  }
}

// A stored [m, k]: one warp per row of contiguous elements.
__global__ void bias_grad_rows_kernel(BiasGradArgs p) {
  const float scale = p.scale_inv ? *p.scale_inv : 1.0f;
  const int lane = threadIdx.x % 32;
  const int64_t warps_per_block = blockDim.x / 32;
  for (int64_t row = blockIdx.x * warps_per_block + threadIdx.x / 32; row < p.m;
       row += static_cast<int64_t>(gridDim.x) * warps_per_block) {
    float s = 0.0f;
    for (int64_t k = lane; k < p.k; k += 32) s += load_operand(p.a, p.a_dtype, row * p.k + k, scale);
    s = warp_sum(s);
    if (lane == 0) store_high(p.out, p.out_dtype, row, s);
  }
}

// A stored [k, m]: block (32, ty) owns 32 consecutive outputs; its ty thread
// rows split K, then add up through shared memory.
constexpr int kColsThreadsY = 16;
__global__ void bias_grad_cols_kernel(BiasGradArgs p) {
  __shared__ float partial[kColsThreadsY][33];
  const float scale = p.scale_inv ? *p.scale_inv : 1.0f;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.0f;
  if (col < p.m)
    for (int64_t k = threadIdx.y; k < p.k; k += kColsThreadsY)
      s += load_operand(p.a, p.a_dtype, k * p.m + col, scale);
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < p.m) {
    float total = 0.0f;
    for (int y = 0; y < kColsThreadsY; ++y) total += partial[y][threadIdx.x];
    store_high(p.out, p.out_dtype, col, total);
  }
}

__global__ void amax_combine_kernel(float* d_amax, const float* partial) {
  *d_amax = fmaxf(*d_amax, *partial);
}

unsigned int grid_dim(int64_t blocks, int64_t cap) {
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min(blocks, cap)));
}

}  // namespace

void transpose_bytes(const uint8_t* in, uint8_t* out, int64_t rows, int64_t cols,
                     cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const dim3 block(kTile, kTileRows);
  const dim3 grid(grid_dim((cols + kTile - 1) / kTile, INT32_MAX),
                  grid_dim((rows + kTile - 1) / kTile, kMaxGridY));
  transpose_bytes_kernel<<<grid, block, 0, stream>>>(in, out, rows, cols);
  TE_GEMM_CHECK_LAUNCH();
}

void epilogue(const EpilogueArgs& args, cudaStream_t stream) {
  if (args.m == 0 || args.n == 0) return;
  const dim3 block(32, 8);
  const dim3 grid(grid_dim((args.n + 31) / 32, 4096), grid_dim((args.m + 7) / 8, kMaxGridY));
  epilogue_kernel<<<grid, block, 0, stream>>>(args);
  TE_GEMM_CHECK_LAUNCH();
}

void bias_grad(const BiasGradArgs& args, cudaStream_t stream) {
  if (args.m == 0) return;
  if (!args.trans) {
    constexpr int kThreads = 256;  // 8 rows per block
    bias_grad_rows_kernel<<<grid_dim((args.m + 7) / 8, INT32_MAX), kThreads, 0, stream>>>(args);
  } else {
    const dim3 block(32, kColsThreadsY);
    bias_grad_cols_kernel<<<grid_dim((args.m + 31) / 32, INT32_MAX), block, 0, stream>>>(args);
  }
  TE_GEMM_CHECK_LAUNCH();
}

void amax_combine(float* d_amax, const float* partial, cudaStream_t stream) {
  amax_combine_kernel<<<1, 1, 0, stream>>>(d_amax, partial);
  TE_GEMM_CHECK_LAUNCH();
}

}  // namespace te::gemm::kernels
