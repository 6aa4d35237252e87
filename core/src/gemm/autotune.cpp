// Timed choice among cuBLASLt's heuristic answers for large high-precision
// GEMMs (see cublaslt.h). The heuristic ranks its answers by a model; on the
// H200 its first answer for BF16 8192^3 ran at 0.93x-1.01x of torch.matmul
// across runs, while cuBLAS's own selection sometimes found a faster kernel.
// Timing each answer once per configuration costs a few milliseconds and one
// synchronization, the first time a shape is seen (like
// torch.backends.cudnn.benchmark); it is skipped under graph capture, so a
// captured graph uses the heuristic's answer unless the shape was run before.
#ifdef TE_WITH_CUDA

#include <cstdlib>
#include <cstring>
#include <limits>

#include "gemm/cublaslt.h"

namespace te::gemm {
namespace {

// Below this many multiply-adds a GEMM is launch-bound and its timing noisy.
constexpr double kMinTimedVolume = 4294967296.0;  // 2^32, e.g. 2048 x 2048 x 1024
constexpr int kTimedRuns = 3;                     // after one warm-up run

// TE_GEMM_AUTOTUNE: "0" off; unset or anything else: high-precision inputs;
// "all": FP8 inputs too (per-tensor or block scales; not with an FP8 output,
// whose amax and scale would be written by every timed run). Read once.
enum class Mode { kOff, kHighPrecision, kAll };

Mode autotune_mode() {
  static const Mode mode = [] {
    const char* value = std::getenv("TE_GEMM_AUTOTUNE");
    if (value == nullptr) return Mode::kHighPrecision;
    if (value[0] == '0') return Mode::kOff;
    return std::strcmp(value, "all") == 0 ? Mode::kAll : Mode::kHighPrecision;
  }();
  return mode;
}

bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();  // (not sticky; do not leave it for the next check)
    return true;               // unknown: do not risk synchronizing
  }
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace

bool worth_timing(const LtCall& call, cudaStream_t stream) {
  const Mode mode = autotune_mode();
  if (mode == Mode::kOff || (call.fp8 && mode != Mode::kAll)) return false;
  if (call.d_scale != nullptr || call.d_amax != nullptr) return false;
  if (call.device_alpha != nullptr) return false;
  if (call.beta != 0.0f && call.c == call.d) return false;  // each run would add C again
  const double volume = static_cast<double>(call.m) * call.n * call.k;
  if (volume < kMinTimedVolume) return false;
  return !stream_is_capturing(stream);
}

size_t fastest_algo(const LtCall& call, const std::vector<cublasLtMatmulAlgo_t>& candidates,
                    cudaStream_t stream) {
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    if (start != nullptr) cudaEventDestroy(start);
    (void)cudaGetLastError();
    return 0;
  }
  size_t best = 0;
  float best_ms = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < candidates.size(); ++i) {
    bool ok = try_lt_matmul(call, candidates[i], stream) == CUBLAS_STATUS_SUCCESS;  // warm-up
    ok = ok && cudaEventRecord(start, stream) == cudaSuccess;
    for (int r = 0; ok && r < kTimedRuns; ++r)
      ok = try_lt_matmul(call, candidates[i], stream) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cudaEventRecord(stop, stream) == cudaSuccess &&
         cudaEventSynchronize(stop) == cudaSuccess;
    float ms = 0.0f;
    if (ok && cudaEventElapsedTime(&ms, start, stop) == cudaSuccess && ms < best_ms) {
      best_ms = ms;
      best = i;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  (void)cudaGetLastError();
  return best;
}

}  // namespace te::gemm

#endif  // TE_WITH_CUDA
