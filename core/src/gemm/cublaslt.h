// One cublasLtMatmul call, in cuBLASLt's own (column-major) terms, plus the
// per-device handle and a cache of heuristic results. CUDA builds only.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gemm/cuda_plan.h"
#include "te/types.h"

namespace te::gemm {

// A column-major matrix operand: `rows x cols` as stored, leading dimension ld.
struct LtMatrix {
  const void* data = nullptr;
  te_dtype dtype = TE_DTYPE_FLOAT32;
  bool trans = false;  // op() of cuBLASLt: the stored matrix is op's input
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
};

// D = epilogue(alpha * op(A) op(B) + beta * C), D is m x n (column-major, ld m).
struct LtCall {
  int device = 0;
  uint64_t m = 0, n = 0, k = 0;
  LtMatrix a, b;
  const void* c = nullptr;  // read only when beta != 0
  te_dtype c_dtype = TE_DTYPE_FLOAT32;
  void* d = nullptr;
  te_dtype d_dtype = TE_DTYPE_FLOAT32;
  float alpha = 1.0f, beta = 0.0f;
  LtEpilogue epilogue = LtEpilogue::kDefault;
  const void* bias = nullptr;  // BIAS_POINTER
  te_dtype bias_dtype = TE_DTYPE_FLOAT32;
  bool set_bias_dtype = false;    // set BIAS_DATA_TYPE (FP8); else the default, D's type
  void* aux = nullptr;            // GELU input (pre_gelu_out), same layout as D
  const void* a_scale = nullptr;  // FP8/FP4 only: the FP32 scalar, or the block scales
  const void* b_scale = nullptr;
  ScaleMode a_scale_mode = ScaleMode::kScalar;  // A_/B_SCALE_MODE (block-scaled GEMMs)
  ScaleMode b_scale_mode = ScaleMode::kScalar;
  const float* d_scale = nullptr;  // FP8 D only
  float* d_amax = nullptr;         // FP8 D only: overwritten by cuBLASLt
  bool fp8 = false;
  bool fast_accum = false;
  // Device pointer mode (NVFP4): alpha and beta are read from these device floats.
  const float* device_alpha = nullptr;
  const float* device_beta = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// cublaslt.cpp's plumbing, shared with algo_variants.cpp and the bench driver.
// Everything cublasLtMatmul and its heuristic take, on the stack.
struct LtDescriptors {
  cublasLtMatmulDescOpaque_t op;
  cublasLtMatrixLayoutOpaque_t a, b, c, d;
  explicit LtDescriptors(const LtCall& call);
};
cublasLtHandle_t handle_for(int device);  // one per device, created on first use
cudaDataType_t cuda_type(te_dtype dtype);
uint32_t alignment_of(const void* p);  // largest power of two <= 256 dividing the address

// The algorithm for this call, cached per configuration: cuBLASLt's
// heuristic's first usable answer, or, when `tune_stream` is given and
// worth_timing() says yes, the fastest of its answers (FP8: and of
// tile_variants()) timed once on that stream. CUBLAS_STATUS_SUCCESS when found; otherwise the
// heuristic's status (NOT_SUPPORTED when it has no kernel; INVALID_VALUE for a type or epilogue
// combination cuBLASLt rejects), so the caller can fall back.
cublasStatus_t find_lt_algo(const LtCall& call, cublasLtMatmulAlgo_t* algo,
                            const cudaStream_t* tune_stream = nullptr);

void run_lt_matmul(const LtCall& call, const cublasLtMatmulAlgo_t& algo, cudaStream_t stream);
// run_lt_matmul without the error check: the launch's status.
cublasStatus_t try_lt_matmul(const LtCall& call, const cublasLtMatmulAlgo_t& algo,
                             cudaStream_t stream);

// algo_variants.cpp. One cuBLASLt algorithm configuration: every field of
// cublasLtMatmulAlgoConfigAttributes_t (cuBLASLt 13) with the storage type the
// header names; equal configurations are the same kernel.
struct LtAlgoConfig {
  int32_t id = 0;
  uint32_t tile = 0, stages = 0;  // 0: UNDEFINED
  int32_t splitk = 1;
  uint32_t reduction = 0, swizzle = 0, custom = 0;
  uint16_t inner = 0, cluster = 0;  // cluster 0: AUTO
  bool operator==(const LtAlgoConfig& o) const;
};
LtAlgoConfig read_algo_config(const cublasLtMatmulAlgo_t& algo);
// cublasLtMatmulAlgoInit for the call's types and `config.id`, then each
// field of `config` (inner only when not 0). False when cuBLASLt refuses one.
bool build_algo(const LtCall& call, const LtAlgoConfig& config, cublasLtMatmulAlgo_t* algo);
// An array capability (CUBLASLT_ALGO_CAP_TILE_IDS, _STAGES_IDS); {0} when the
// algorithm lists none (UNDEFINED: it picks).
std::vector<uint32_t> algo_cap_ids(const cublasLtMatmulAlgo_t& algo,
                                   cublasLtMatmulAlgoCapAttributes_t attr);
// Tile and cluster variants of the algorithm of `answers[0]` (the heuristic's
// first answer) that cuBLASLt accepts for `call` within its workspace and
// alignments, none equal to one of `answers`, in a fixed order: candidates
// for the timed choice of FP8 GEMMs (see algo_variants.cpp for why).
std::vector<cublasLtMatmulAlgo_t> tile_variants(const LtCall& call,
                                                const std::vector<cublasLtMatmulAlgo_t>& answers);

// autotune.cpp. Whether timing the candidates of `call` on `stream` is allowed
// and worth it: TE_GEMM_AUTOTUNE is not 0, the GEMM is large, has high-precision
// inputs (FP8 inputs too with TE_GEMM_AUTOTUNE=all), writes no FP8 output (no
// amax, no output scale), re-running it leaves the same result (D does not
// alias C under beta != 0) and the stream is not being captured.
bool worth_timing(const LtCall& call, cudaStream_t stream);
// Index of the fastest candidate (the first when timing fails), each run a
// few times on `stream` (this synchronizes with it). With two rounds the
// close contenders of the first are timed again and keep their best time.
size_t fastest_algo(const LtCall& call, const std::vector<cublasLtMatmulAlgo_t>& candidates,
                    cudaStream_t stream, int rounds = 1);

}  // namespace te::gemm
