// Timed choice among cuBLASLt's heuristic answers for large high-precision
// GEMMs (see cublaslt.h). The heuristic ranks its answers by a model; on the
// H200 its first answer for BF16 8192^3 ran at 0.93x-1.01x of torch.matmul
// across runs, while cuBLAS's own selection sometimes found a faster kernel.
// Timing each answer once per configuration costs a few milliseconds and one
// synchronization, the first time a shape is seen (like
// torch.backends.cudnn.benchmark); it is skipped under graph capture, so a
// captured graph uses the heuristic's answer unless the shape was run before.
//
// FP8 inputs are timed only with TE_GEMM_AUTOTUNE=all, and then with more
// candidates: the heuristic's answers plus tile and cluster variants of its
// first answer's algorithm (algo_variants.cpp), since the H200 search found
// the faster FP8 configurations among those and rarely among the answers.
// With up to 44 candidates (4 runs each, then the close ones again) that is
// about 0.3 s, once, for a 1.5 ms GEMM such as 8192x28672x4096. Opt-in until
// the gain is measured in the modules (docs/envvars.md).
#ifdef TE_WITH_CUDA

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "gemm/cublaslt.h"

namespace te::gemm {
namespace {

// Below this many multiply-adds a GEMM is launch-bound and its timing noisy.
constexpr double kMinTimedVolume = 4294967296.0;  // 2^32, e.g. 2048 x 2048 x 1024
constexpr int kTimedRuns = 3;                     // after one warm-up run
// Second round (FP8 with variants): candidates within this factor of the
// first round's best are timed again.
constexpr float kRetimeWithin = 1.05f;

// TE_GEMM_AUTOTUNE: "0" off; unset or anything else: high-precision inputs;
// "all": FP8 inputs too, with the tile variants (per-tensor or block scales;
// not with an FP8 output, whose amax and scale would be written by every
// timed run). Read once.
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
                    cudaStream_t stream, int rounds) {
  if (candidates.empty()) return 0;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    if (start != nullptr) cudaEventDestroy(start);
    (void)cudaGetLastError();
    return 0;
  }
  const float kNever = std::numeric_limits<float>::infinity();  // failed or not timed
  // Milliseconds of kTimedRuns runs after one warm-up run; kNever when one fails.
  auto time_one = [&](const cublasLtMatmulAlgo_t& algo) {
    bool ok = try_lt_matmul(call, algo, stream) == CUBLAS_STATUS_SUCCESS;  // warm-up
    ok = ok && cudaEventRecord(start, stream) == cudaSuccess;
    for (int r = 0; ok && r < kTimedRuns; ++r)
      ok = try_lt_matmul(call, algo, stream) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cudaEventRecord(stop, stream) == cudaSuccess &&
         cudaEventSynchronize(stop) == cudaSuccess;
    float ms = 0.0f;
    return ok && cudaEventElapsedTime(&ms, start, stop) == cudaSuccess ? ms : kNever;
  };
  // Each candidate keeps its best time over the rounds. Why a second round:
  // several of the H200 search's FP8 winners beat the first answer by only
  // 1-3%, within what clock drift moves one timing (under its power cap the
  // H200's SM clock ranged 1485-1965 MHz in a module benchmark), and
  // candidates timed early in a round run at other clocks than late ones.
  // Re-timing the close contenders and keeping each one's minimum damps that
  // at little cost.
  std::vector<float> ms(candidates.size(), kNever);
  float best_ms = kNever;
  for (int round = 0; round < rounds && (round == 0 || best_ms < kNever); ++round) {
    const float bar = round == 0 ? kNever : kRetimeWithin * best_ms;
    for (size_t i = 0; i < candidates.size(); ++i)
      if (ms[i] <= bar) ms[i] = std::min(ms[i], time_one(candidates[i]));
    best_ms = *std::min_element(ms.begin(), ms.end());
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  (void)cudaGetLastError();
  // The first of the fastest (the first candidate when every timing failed).
  size_t best = 0;
  for (size_t i = 1; i < ms.size(); ++i)
    if (ms[i] < ms[best]) best = i;
  return best;
}

}  // namespace te::gemm

#endif  // TE_WITH_CUDA
