// Search over cuBLASLt configurations for the FP8 GEMMs of our Linear and
// LayerNormMLP training steps: is any configuration faster than the
// heuristic's first answer, which te-core runs?
//
// The question is about te-core's exact calls, so the driver builds them with
// te-core's own code: a GemmArgs as te_gemm's validation would pass it for the
// module's call, then the CUDA backend's choose() (plan, LtCall, heuristic #0,
// from core/src/gemm/cuda.cu), and every candidate runs through try_lt_matmul
// with the same Descriptors (core/src/gemm/cublaslt.cpp). Those helpers are
// file-local, so both sources are included into this translation unit rather
// than copied; te-core itself is unchanged.
//
// Candidates per call, in order (all validated with cublasLtMatmulAlgoCheck):
//   0. the heuristic's first 64 answers, te-core's tile variants of its first
//      answer (tile_variants, what TE_GEMM_AUTOTUNE=all times with its first
//      8 answers), then up to 16 answers per algorithm id with
//      CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID;
//   1. a grid per algorithm id: tile x stages x a few cluster shapes (split-K
//      1, no swizzle), largest tiles first;
//   2. around the fastest 8 found so far: swizzle, split-K {1..4} x reduction
//      scheme, more cluster shapes, custom options.
// Each candidate runs once into a second output buffer and is compared with
// heuristic #0's output (different algorithms sum in different orders, so
// not bit-equal: max |diff| <= 2^-6 max |ref|, no NaN/Inf); then one screening
// sample (3 calls); only candidates within 4% of the best so far get the full
// timing (events around 10 back-to-back calls, median of 5 samples), the
// method of bench/_timing.py time_ms. A shape's time share is the remaining budget
// over the remaining shapes; a phase stops when its part is spent.
//
// Usage: gemm_search [--budget SECONDS] [--only SUBSTRING]
#include <cuda_fp8.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// te-core sources, compiled into this driver to reach their file-local helpers:
#include "gemm/cublaslt.cpp"  // set_pref, kHeuristicResults (and what cublaslt.h declares)
#include "gemm/cuda.cu"       // choose(), make_call(), cuda::gemm()
#include "gemm_search_config.h"

namespace {

using te::gemm::LtCall;
using namespace gemm_search;  // NOLINT: this driver's own header

// Setup failures end the run: nothing after them would mean anything.
#define CHECK_CUDA(expr)                                                                          \
  do {                                                                                            \
    const cudaError_t e_ = (expr);                                                                \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

double now_s() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

// ----------------------------------------------------------------- kernels --

// Random FP8 bytes: uniform values in [-2, 2) rounded to the format, a
// realistic magnitude for scaled activations (no NaN or Inf codes).
__global__ void fill_fp8(uint8_t* out, size_t n, uint32_t seed, bool e5m2) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed ^ uint32_t(i >> 32) * 40503u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float x = (float(h >> 8) * (1.0f / 16777216.0f)) * 4.0f - 2.0f;
    out[i] = e5m2 ? __nv_fp8_e5m2(x).__x : __nv_fp8_e4m3(x).__x;
  }
}

// stats[0] = max |test - ref|, stats[1] = max |ref| (as float bits: both are
// >= 0, so their unsigned order is the float order), stats[2] = non-finite count.
__global__ void compare_bf16(const __nv_bfloat16* test, const __nv_bfloat16* ref, size_t n,
                             unsigned* stats) {
  float diff = 0.0f, mag = 0.0f;
  unsigned bad = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float t = __bfloat162float(test[i]), r = __bfloat162float(ref[i]);
    if (!isfinite(t)) ++bad;
    diff = fmaxf(diff, fabsf(t - r));
    mag = fmaxf(mag, fabsf(r));
  }
  atomicMax(&stats[0], __float_as_uint(diff));
  atomicMax(&stats[1], __float_as_uint(mag));
  if (bad) atomicAdd(&stats[2], bad);
}

// ------------------------------------------------------------------ cases --

// One GEMM of a module's step, in te's row-major terms: D[M, N] = op(A) op(B)
// with A stored [M, K] and B stored [N, K] (the TN layout Hopper FP8 needs;
// the modules pass columnwise copies so that no transpose runs).
struct Case {
  std::string name;
  int64_t m, n, k;
  te_dtype a_dtype, b_dtype;
  bool split_accumulator;
};

// DelayedScaling's default format is HYBRID: E4M3 forward tensors, E5M2
// gradients, so dgrad and wgrad take an E5M2 dY and an E4M3 W or X.
std::vector<Case> make_cases() {
  const int64_t t = 8192;  // tokens
  const te_dtype e4 = TE_DTYPE_FLOAT8E4M3, e5 = TE_DTYPE_FLOAT8E5M2;
  std::vector<Case> cases = {{"sanity 8192^3 fast", t, t, t, e4, e4, false}};
  const int64_t linears[][2] = {{4096, 4096}, {4096, 14336}, {14336, 4096}, {4096, 28672}};
  for (const auto& l : linears) {
    const int64_t in = l[0], out = l[1];
    const std::string base = "L" + std::to_string(in) + "->" + std::to_string(out) + " ";
    // Y = X W^T;  dX = dY W (B = W's columnwise copy W^T [in, out]);
    // dW = dY^T X (A = dY^T [out, t], B = X^T [in, t]: both columnwise copies).
    cases.push_back({base + "fprop", t, out, in, e4, e4, false});
    cases.push_back({base + "dgrad", t, in, out, e5, e4, true});
    cases.push_back({base + "wgrad", out, in, t, e5, e4, true});
  }
  return cases;
}

// Device buffers of one case, and te-core's choice for it.
struct Setup {
  Case cs;
  te::gemm::GemmArgs g;
  te::gemm::cuda::Choice choice;
  LtCall call;  // heuristic #0 writes ref
  LtCall test;  // the same call writing test
  uint8_t *a = nullptr, *b = nullptr;
  __nv_bfloat16 *ref = nullptr, *out = nullptr;
  float* scales = nullptr;  // [0]: A's scale_inv, [4]: B's (16-byte apart, as cuBLASLt wants)
  void* workspace = nullptr;
  unsigned* stats = nullptr;
  size_t d_elems() const { return size_t(cs.m) * cs.n; }
  double flops() const { return 2.0 * cs.m * cs.n * cs.k; }
};

void setup_case(Setup* s) {
  const Case& cs = s->cs;
  CHECK_CUDA(cudaMalloc(&s->a, size_t(cs.m) * cs.k));
  CHECK_CUDA(cudaMalloc(&s->b, size_t(cs.n) * cs.k));
  CHECK_CUDA(cudaMalloc(&s->ref, s->d_elems() * 2));
  CHECK_CUDA(cudaMalloc(&s->out, s->d_elems() * 2));
  CHECK_CUDA(cudaMalloc(&s->scales, 64));
  CHECK_CUDA(cudaMalloc(&s->stats, 4 * sizeof(unsigned)));
  fill_fp8<<<1024, 256>>>(s->a, size_t(cs.m) * cs.k, 0x1234u, cs.a_dtype == TE_DTYPE_FLOAT8E5M2);
  CHECK_CUDA(cudaGetLastError());
  fill_fp8<<<1024, 256>>>(s->b, size_t(cs.n) * cs.k, 0xabcdu, cs.b_dtype == TE_DTYPE_FLOAT8E5M2);
  CHECK_CUDA(cudaGetLastError());
  const float host_scales[16] = {0.5f, 0, 0, 0, 0.25f};  // not 1: a dropped scale shows
  CHECK_CUDA(cudaMemcpy(s->scales, host_scales, sizeof(host_scales), cudaMemcpyHostToDevice));

  // The GemmArgs te_gemm's validation hands the CUDA backend for this call.
  te::gemm::GemmArgs& g = s->g;
  g.m = cs.m;
  g.n = cs.n;
  g.k = cs.k;
  g.a = te::gemm::Operand{s->a, cs.a_dtype, s->scales, /*trans=*/false};
  g.b = te::gemm::Operand{s->b, cs.b_dtype, s->scales + 4, /*trans=*/true};
  g.d = s->ref;
  g.d_dtype = TE_DTYPE_BFLOAT16;
  g.use_split_accumulator = cs.split_accumulator;
  CHECK_CUDA(cudaGetDevice(&g.device_index));
  g.workspace_bytes = te::gemm::cuda_workspace_size(g);
  CHECK_CUDA(cudaMalloc(&s->workspace, g.workspace_bytes));
  g.workspace = s->workspace;

  // te-core's own plan, LtCall and heuristic #0 (no timing: FP8 is not
  // autotuned by default).
  char* ws = te::gemm::cuda::aligned_base(g.workspace);
  s->choice = te::gemm::cuda::choose(g, ws, g.workspace_bytes);
  if (!s->choice.ok())
    te::fail(TE_ERROR_CUBLAS,
             "te-core found no cuBLASLt algorithm: ", cublasLtGetStatusName(s->choice.status));
  if (s->choice.plan.transpose_a || s->choice.plan.transpose_b || s->choice.plan.epilogue_kernel)
    te::fail(TE_ERROR_INTERNAL, "plan is not a single TN cuBLASLt call");
  s->call = s->choice.call;
  s->test = s->call;
  s->test.d = s->out;
  s->test.c = s->out;  // make_call passes D as the (unread) C
}

void free_case(Setup* s) {
  void* ptrs[] = {s->a, s->b, s->ref, s->out, s->scales, s->workspace, s->stats};
  for (void* p : ptrs)
    if (p) CHECK_CUDA(cudaFree(p));
}

// Heuristic #0's output at a few random elements against a float64 sum on
// the host: checks the layouts and scales end to end, in te's terms.
double host_check(const Setup& s) {
  const Case& cs = s.cs;
  auto decode = [](uint8_t byte, te_dtype t) {
    __nv_fp8_e4m3 e4;
    __nv_fp8_e5m2 e5;
    e4.__x = e5.__x = byte;
    return double(t == TE_DTYPE_FLOAT8E5M2 ? float(e5) : float(e4));
  };
  std::vector<uint8_t> row_a(cs.k), row_b(cs.k);
  double worst = 0.0, largest = 0.0;
  std::vector<double> want, got;
  for (int sample = 0; sample < 48; ++sample) {
    const int64_t i = (int64_t(sample) * 7919 + 13) % cs.m,
                  j = (int64_t(sample) * 104729 + 7) % cs.n;
    CHECK_CUDA(cudaMemcpy(row_a.data(), s.a + i * cs.k, cs.k, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(row_b.data(), s.b + j * cs.k, cs.k, cudaMemcpyDeviceToHost));
    uint16_t bits = 0;
    CHECK_CUDA(cudaMemcpy(&bits, s.ref + i * cs.n + j, 2, cudaMemcpyDeviceToHost));
    uint32_t f32 = uint32_t(bits) << 16;
    float d = 0.0f;
    std::memcpy(&d, &f32, 4);
    double sum = 0.0;
    for (int64_t p = 0; p < cs.k; ++p)
      sum += decode(row_a[p], cs.a_dtype) * decode(row_b[p], cs.b_dtype);
    want.push_back(sum * 0.5 * 0.25);
    got.push_back(d);
    largest = std::max(largest, std::fabs(want.back()));
  }
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  return largest > 0 ? worst / largest : worst;
}

// ------------------------------------------------------------------ search --

struct Candidate {
  Config cfg;
  cublasLtMatmulAlgo_t algo{};
  std::string source;  // which phase proposed it
  size_t workspace = 0;
  float waves = 0.0f;
  double rel_err = 0.0;
  float screen_ms = -1.0f, ms = -1.0f;  // ms: full timing; < 0 when not fully timed
  double key() const { return ms > 0 ? ms : screen_ms; }
};

constexpr double kMaxRelErr = 1.0 / 64;     // of max |ref|; BF16 output is 2^-8
constexpr double kFullTimingWithin = 1.04;  // screen time over best so far
constexpr int kHeuristicAnswers = 64;
constexpr int kPerAlgoAnswers = 16;
constexpr int kMaxChecksPerShape = 60000;  // cublasLtMatmulAlgoCheck calls in the grid
constexpr int kRefineParents = 8;
// Cluster shapes (no capability lists them): AUTO, 1x1x1, 2x1x1, 1x2x1 in the
// grid; 4x1x1, 1x4x1, 2x2x1 also around the best.
const uint16_t kGridClusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1,
                                  CUBLASLT_CLUSTER_SHAPE_2x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1};
const uint16_t kRefineClusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO,  CUBLASLT_CLUSTER_SHAPE_1x1x1,
                                    CUBLASLT_CLUSTER_SHAPE_2x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1,
                                    CUBLASLT_CLUSTER_SHAPE_4x1x1, CUBLASLT_CLUSTER_SHAPE_1x4x1,
                                    CUBLASLT_CLUSTER_SHAPE_2x2x1};

struct ContextLost {};

// The cuBLASLt types of a call (A, B, C, D), as te-core's descriptors set them.
struct Types {
  cudaDataType_t a, b, c, d;
};

Types types_of(const LtCall& call) {
  using te::gemm::cuda_type;
  return {cuda_type(call.a.dtype), cuda_type(call.b.dtype), cuda_type(call.c_dtype),
          cuda_type(call.d_dtype)};
}

struct Searcher {
  Setup& s;
  cublasLtHandle_t handle;
  Types types;
  te::gemm::LtDescriptors desc;  // of the test call: what AlgoCheck validates
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  std::vector<Config> seen, heuristic;  // heuristic: its answers, by rank
  std::vector<Config> te_core;          // what TE_GEMM_AUTOTUNE=all times: 8 answers + variants
  std::vector<Candidate> passed;        // correct and at least screened
  double best_ms = 0.0;
  int n_checked = 0, n_invalid = 0, n_failed = 0, n_wrong = 0, n_screened_out = 0;
  double worst_accepted_err = 0.0;

  explicit Searcher(Setup& setup)
      : s(setup),
        handle(te::gemm::handle_for(setup.call.device)),
        types(types_of(setup.call)),
        desc(setup.test) {
    CHECK_CUDA(cudaStreamCreate(&stream));
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
  }
  ~Searcher() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaStreamDestroy(stream);
  }

  // After a failed launch: clear the (non-sticky) error; a lost context
  // (sticky error) ends the run, since every later call would fail too.
  void recover() {
    (void)cudaGetLastError();
    if (cudaStreamSynchronize(stream) != cudaSuccess) {
      (void)cudaGetLastError();
      if (cudaDeviceSynchronize() != cudaSuccess) throw ContextLost{};
    }
  }

  // Median per-call time over `samples` samples of `calls` back-to-back
  // launches; < 0 when a launch or an event fails.
  template <class Launch>
  float time_ms(Launch launch, int samples, int calls) {
    std::vector<float> per_call;
    for (int i = 0; i < samples; ++i) {
      if (cudaEventRecord(start, stream) != cudaSuccess) return -1.0f;
      for (int c = 0; c < calls; ++c)
        if (!launch()) return -1.0f;
      float ms = 0.0f;
      if (cudaEventRecord(stop, stream) != cudaSuccess ||
          cudaEventSynchronize(stop) != cudaSuccess ||
          cudaEventElapsedTime(&ms, start, stop) != cudaSuccess)
        return -1.0f;
      per_call.push_back(ms / calls);
    }
    std::sort(per_call.begin(), per_call.end());
    return per_call[per_call.size() / 2];
  }

  float time_algo(const LtCall& call, const cublasLtMatmulAlgo_t& algo, int samples, int calls) {
    auto launch = [&] {
      return te::gemm::try_lt_matmul(call, algo, stream) == CUBLAS_STATUS_SUCCESS;
    };
    const float ms = time_ms(launch, samples, calls);
    if (ms < 0) recover();
    return ms;
  }

  // max |test - ref| / max |ref|, or -1 with a non-finite test value.
  double compare() {
    CHECK_CUDA(cudaMemsetAsync(s.stats, 0, 4 * sizeof(unsigned), stream));
    compare_bf16<<<1024, 256, 0, stream>>>(s.out, s.ref, s.d_elems(), s.stats);
    CHECK_CUDA(cudaGetLastError());
    unsigned stats[3];
    CHECK_CUDA(cudaMemcpyAsync(stats, s.stats, sizeof(stats), cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    if (stats[2] != 0) return -1.0;
    float diff, mag;
    std::memcpy(&diff, &stats[0], 4);
    std::memcpy(&mag, &stats[1], 4);
    return mag > 0 ? diff / mag : diff;
  }

  // Heuristic #0 (te-core's algorithm) into ref, then its time: the bar.
  float baseline() {
    const float ms = time_algo(s.call, s.choice.algo, 1, 3);  // warm-up, and ref's values
    if (ms < 0) te::fail(TE_ERROR_CUBLAS, "heuristic #0 does not run");
    best_ms = time_algo(s.call, s.choice.algo, 5, 10);
    if (best_ms < 0) te::fail(TE_ERROR_CUBLAS, "heuristic #0 failed while being timed");
    return static_cast<float>(best_ms);
  }

  // te_gemm's CUDA backend itself (plan, cache look-up, scale staging, launch).
  float te_core_ms() {
    te::gemm::GemmArgs g = s.g;
    g.d = s.out;
    auto launch = [&] {
      try {
        te::gemm::cuda::gemm(g, static_cast<te_stream>(stream));
        return true;
      } catch (const te::Error&) {
        return false;
      }
    };
    const float ms = time_ms(launch, 5, 10);
    if (ms < 0) recover();  // (clear the error the failed call left, as for the candidates)
    return ms;
  }

  // Check, run, compare, screen and perhaps time one configuration.
  void evaluate(Candidate c) {
    c.cfg = read_algo_config(c.algo);
    for (const Config& x : seen)
      if (x == c.cfg) return;
    seen.push_back(c.cfg);
    ++n_checked;
    cublasLtMatmulHeuristicResult_t r{};
    if (cublasLtMatmulAlgoCheck(handle, &desc.op, &desc.a, &desc.b, &desc.c, &desc.d, &c.algo,
                                &r) != CUBLAS_STATUS_SUCCESS ||
        r.workspaceSize > s.test.workspace_bytes) {
      ++n_invalid;
      return;
    }
    c.workspace = r.workspaceSize;
    c.waves = r.wavesCount;
    if (te::gemm::try_lt_matmul(s.test, c.algo, stream) != CUBLAS_STATUS_SUCCESS ||
        cudaStreamSynchronize(stream) != cudaSuccess) {
      ++n_failed;
      recover();
      return;
    }
    c.rel_err = compare();
    if (c.rel_err < 0 || c.rel_err > kMaxRelErr) {
      if (++n_wrong <= 3)
        std::printf("  rejected (error %.3g): %s\n", c.rel_err, describe(c.cfg).c_str());
      return;
    }
    worst_accepted_err = std::max(worst_accepted_err, c.rel_err);
    c.screen_ms = time_algo(s.test, c.algo, 1, 3);
    if (c.screen_ms < 0) {
      ++n_failed;
      return;
    }
    if (c.screen_ms <= kFullTimingWithin * best_ms) {
      c.ms = time_algo(s.test, c.algo, 5, 10);
      if (c.ms > 0) best_ms = std::min(best_ms, double(c.ms));
    } else {
      ++n_screened_out;
    }
    passed.push_back(c);
  }

  // The heuristic's answers under te-core's preference (heuristic_candidates
  // in cublaslt.cpp), `count` of them; restricted to `only_id`'s algorithm
  // with CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID.
  std::vector<cublasLtMatmulAlgo_t> ask_heuristic(int count, const cublasLtMatmulAlgo_t* only_id) {
    const LtCall& call = s.call;
    cublasLtMatmulPreferenceOpaque_t pref;
    TE_GEMM_CHECK_CUBLAS(cublasLtMatmulPreferenceInit(&pref));
    te::gemm::set_pref(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                       static_cast<uint64_t>(call.workspace_bytes));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, const void*> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, call.a.data},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, call.b.data},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, call.c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, call.d}};
    for (const auto& [attr, ptr] : alignments)
      te::gemm::set_pref(&pref, attr, te::gemm::alignment_of(ptr));
    std::vector<cublasLtMatmulHeuristicResult_t> results(count);
    if (only_id) {
      te::gemm::set_pref(&pref, CUBLASLT_MATMUL_PREF_SEARCH_MODE,
                         static_cast<uint32_t>(CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID));
      for (auto& r : results) r.algo = *only_id;  // the mode reads the id from here
    }
    te::gemm::LtDescriptors d(call);
    int n = 0;
    std::vector<cublasLtMatmulAlgo_t> algos;
    if (cublasLtMatmulAlgoGetHeuristic(handle, &d.op, &d.a, &d.b, &d.c, &d.d, &pref, count,
                                       results.data(), &n) != CUBLAS_STATUS_SUCCESS)
      return algos;
    for (int i = 0; i < n; ++i)
      if (results[i].state == CUBLAS_STATUS_SUCCESS &&
          results[i].workspaceSize <= call.workspace_bytes)
        algos.push_back(results[i].algo);
    return algos;
  }

  std::vector<int> algo_ids() {
    std::vector<int> ids(256);
    int n = 0;
    if (cublasLtMatmulAlgoGetIds(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, types.a, types.b, types.c,
                                 types.d, static_cast<int>(ids.size()), ids.data(),
                                 &n) != CUBLAS_STATUS_SUCCESS)
      n = 0;
    ids.resize(n);
    return ids;
  }

  // cublasLtMatmulAlgoInit of algorithm `id` for the call's types.
  bool init_algo(int id, cublasLtMatmulAlgo_t* algo) {
    Config plain;
    plain.id = id;
    return te::gemm::build_algo(s.test, plain, algo);
  }

  Caps caps_of(int id) {
    cublasLtMatmulAlgo_t algo{};
    return init_algo(id, &algo) ? read_caps(algo) : Caps{};
  }

  // Phase 0: the heuristic's own answers, overall and per algorithm id.
  void phase_heuristic(double deadline) {
    const std::vector<cublasLtMatmulAlgo_t> answers = ask_heuristic(kHeuristicAnswers, nullptr);
    for (const cublasLtMatmulAlgo_t& a : answers) heuristic.push_back(read_algo_config(a));
    std::printf("  heuristic: %zu usable answers\n", answers.size());
    if (heuristic.empty() || !(heuristic[0] == read_algo_config(s.choice.algo)))
      std::printf("  NOTE: the 64-answer query's first answer differs from te-core's choice\n");
    for (size_t rank = 0; rank < answers.size(); ++rank) {
      if (now_s() > deadline) return;
      evaluate(Candidate{Config{}, answers[rank], "heuristic #" + std::to_string(rank)});
    }
    const std::vector<cublasLtMatmulAlgo_t> first(
        answers.begin(),
        answers.begin() + std::min<size_t>(answers.size(), te::gemm::kHeuristicResults));
    const std::vector<cublasLtMatmulAlgo_t> variants = te::gemm::tile_variants(s.test, first);
    std::printf("  te-core tile variants: %zu\n", variants.size());
    for (const cublasLtMatmulAlgo_t& a : first) te_core.push_back(read_algo_config(a));
    for (const cublasLtMatmulAlgo_t& a : variants) te_core.push_back(read_algo_config(a));
    for (const cublasLtMatmulAlgo_t& a : variants) {
      if (now_s() > deadline) return;
      evaluate(Candidate{Config{}, a, "te-core variant"});
    }
    for (int id : algo_ids()) {
      cublasLtMatmulAlgo_t init{};
      if (!init_algo(id, &init)) continue;
      for (const cublasLtMatmulAlgo_t& a : ask_heuristic(kPerAlgoAnswers, &init)) {
        if (now_s() > deadline) return;
        evaluate(Candidate{Config{}, a, "algo-limited heuristic"});
      }
    }
  }

  // Phase 1: tile x stages x cluster for every algorithm id (split-K 1, no
  // swizzle), the valid ones largest tile first, then fewest idle SMs in the
  // last wave (waves / ceil(waves)).
  void phase_grid(double deadline) {
    struct Valid {
      Candidate c;
      double area, fill;
    };
    std::vector<Valid> valid;
    int checks = 0;
    for (int id : algo_ids()) {
      const Caps caps = caps_of(id);
      for (uint32_t tile : caps.tiles)
        for (uint32_t stages : caps.stages)
          for (uint16_t cluster : kGridClusters) {
            if (checks >= kMaxChecksPerShape || now_s() > deadline) break;
            ++checks;
            Config cfg;
            cfg.id = id;
            cfg.tile = tile;
            cfg.stages = stages;
            cfg.cluster = cluster;
            Candidate c{cfg, {}, "grid"};
            cublasLtMatmulHeuristicResult_t r{};
            if (!te::gemm::build_algo(s.test, cfg, &c.algo) ||
                cublasLtMatmulAlgoCheck(handle, &desc.op, &desc.a, &desc.b, &desc.c, &desc.d,
                                        &c.algo, &r) != CUBLAS_STATUS_SUCCESS ||
                r.workspaceSize > s.test.workspace_bytes)
              continue;
            const double fill = r.wavesCount > 0 ? r.wavesCount / std::ceil(r.wavesCount) : 0.0;
            valid.push_back({c, tile_area(tile), fill});
          }
    }
    std::stable_sort(valid.begin(), valid.end(), [](const Valid& x, const Valid& y) {
      return x.area != y.area ? x.area > y.area : x.fill > y.fill;
    });
    std::printf("  grid: %d checks, %zu valid configurations\n", checks, valid.size());
    for (const Valid& v : valid) {
      if (now_s() > deadline) return;
      evaluate(v.c);
    }
  }

  // Phase 2: around the fastest few, the attributes the grid held fixed.
  void phase_refine(double deadline) {
    std::vector<Candidate> parents = passed;
    std::sort(parents.begin(), parents.end(),
              [](const Candidate& x, const Candidate& y) { return x.key() < y.key(); });
    if (parents.size() > kRefineParents) parents.resize(kRefineParents);
    for (const Candidate& p : parents) {
      const Caps caps = caps_of(p.cfg.id);
      std::vector<Config> variants;
      for (uint32_t swizzle = 0; swizzle <= (caps.swizzle ? 1u : 0u); ++swizzle)
        for (int32_t splitk = 1; splitk <= (caps.splitk ? 4 : 1); ++splitk)
          for (uint32_t red : {0u, 1u, 2u, 4u}) {
            // Split-K 1 takes no reduction; more splits need a supported one.
            if ((splitk == 1) != (red == 0) || (red != 0 && !(caps.reduction_mask & red))) continue;
            for (uint16_t cluster : kRefineClusters) {
              Config v = p.cfg;
              v.swizzle = swizzle;
              v.splitk = splitk;
              v.reduction = red;
              v.cluster = cluster;
              variants.push_back(v);
            }
          }
      for (int32_t custom = 1; custom <= std::min(caps.custom_max, 3); ++custom) {
        Config v = p.cfg;
        v.custom = static_cast<uint32_t>(custom);
        variants.push_back(v);
      }
      for (const Config& v : variants) {
        if (now_s() > deadline) return;
        Candidate c{v, {}, "refine"};
        if (te::gemm::build_algo(s.test, v, &c.algo)) evaluate(c);
      }
    }
  }
};

struct Summary {
  std::string name;
  double flops, h0_ms, best_ms;
  double tuned_ms;  // the best of what TE_GEMM_AUTOTUNE=all times (Searcher::te_core)
};

double tflops(double flops, double ms) { return flops / (ms * 1e-3) / 1e12; }

Summary search_case(Setup& s, double share_s) {
  const double t0 = now_s();
  Searcher x(s);
  const float h0 = x.baseline();
  const double host_err = host_check(s);
  const float te_ms = x.te_core_ms();
  std::printf("  heuristic #0: %.4f ms, %.0f TFLOP/s  (%s)\n", h0, tflops(s.flops(), h0),
              describe(read_algo_config(s.choice.algo)).c_str());
  std::printf(
      "  te-core cuda::gemm: %.4f ms; heuristic #0 vs float64 at 48 elements: %.2e of max\n", te_ms,
      host_err);
  if (host_err > kMaxRelErr) std::printf("  WARNING: heuristic #0 disagrees with the host sums\n");
  x.phase_heuristic(t0 + 0.35 * share_s);
  x.phase_grid(t0 + 0.70 * share_s);
  x.phase_refine(t0 + share_s);
  std::printf(
      "  %d configurations: %d invalid, %d failed, %d wrong, %d screened out, %zu timed;"
      " worst accepted error %.2e; %.0f s\n",
      x.n_checked, x.n_invalid, x.n_failed, x.n_wrong, x.n_screened_out,
      x.passed.size() - x.n_screened_out, x.worst_accepted_err, now_s() - t0);
  std::vector<Candidate> timed;
  for (const Candidate& c : x.passed)
    if (c.ms > 0) timed.push_back(c);
  std::sort(timed.begin(), timed.end(),
            [](const Candidate& a, const Candidate& b) { return a.ms < b.ms; });
  for (size_t i = 0; i < timed.size() && i < 5; ++i) {
    const Candidate& c = timed[i];
    std::printf("  %zu. %.4f ms %5.0f TFLOP/s %.3fx  %s; waves %.2f ws %.1f MiB [%s]\n", i + 1,
                c.ms, tflops(s.flops(), c.ms), h0 / c.ms, describe(c.cfg).c_str(), c.waves,
                c.workspace / 1048576.0, c.source.c_str());
  }
  Summary row{s.cs.name, s.flops(), h0, h0, h0};
  // (Screened-out candidates count with their screening time.)
  for (const Candidate& c : x.passed)
    if (std::find(x.te_core.begin(), x.te_core.end(), c.cfg) != x.te_core.end() && c.key() > 0)
      row.tuned_ms = std::min<double>(row.tuned_ms, c.key());
  std::printf("  best of te-core's %zu timed candidates: %.4f ms (%.1f%% over heuristic #0)\n",
              x.te_core.size(), row.tuned_ms, 100.0 * (h0 / row.tuned_ms - 1.0));
  if (!timed.empty()) {
    row.best_ms = std::min<double>(h0, timed[0].ms);
    int rank = -1;
    for (size_t i = 0; i < x.heuristic.size(); ++i)
      if (x.heuristic[i] == timed[0].cfg) rank = static_cast<int>(i);
    if (rank >= 0)
      std::printf("  best is the heuristic's answer #%d of %zu\n", rank, x.heuristic.size());
    else
      std::printf("  best is not among the heuristic's %zu answers\n", x.heuristic.size());
  }
  return row;
}

void print_summary(const std::vector<Summary>& rows) {
  // "tuned": the best of te-core's TE_GEMM_AUTOTUNE=all candidates.
  std::printf("\n%-26s %10s %8s %10s %8s %7s %10s %7s\n", "shape", "heur0 ms", "TFLOP/s", "best ms",
              "TFLOP/s", "gain", "tuned ms", "gain");
  for (const Summary& r : rows)
    std::printf("%-26s %10.4f %8.0f %10.4f %8.0f %6.1f%% %10.4f %6.1f%%\n", r.name.c_str(), r.h0_ms,
                tflops(r.flops, r.h0_ms), r.best_ms, tflops(r.flops, r.best_ms),
                100.0 * (r.h0_ms / r.best_ms - 1.0), r.tuned_ms,
                100.0 * (r.h0_ms / r.tuned_ms - 1.0));
  // The modules' steps: sums of their GEMMs (when all were searched).
  const struct {
    const char* step;
    std::vector<std::string> prefixes;
  } steps[] = {{"Linear 4096->14336 step (3 GEMMs)", {"L4096->14336 "}},
               {"LayerNormMLP step (6 GEMMs)", {"L4096->28672 ", "L14336->4096 "}}};
  for (const auto& st : steps) {
    double h0 = 0, best = 0, tuned = 0, flops = 0;
    int n = 0;
    for (const Summary& r : rows)
      for (const std::string& p : st.prefixes)
        if (r.name.rfind(p, 0) == 0) {
          h0 += r.h0_ms;
          best += r.best_ms;
          tuned += r.tuned_ms;
          flops += r.flops;
          ++n;
        }
    if (n == 3 * static_cast<int>(st.prefixes.size()))
      std::printf(
          "%s: heuristic #0 %.3f ms (%.0f TFLOP/s), best %.3f ms (%.0f TFLOP/s), tuned %.3f ms\n",
          st.step, h0, tflops(flops, h0), best, tflops(flops, best), tuned);
  }
}

int run_search(double budget_s, const std::string& only) {
  int device = 0;
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  std::printf("%s, cuBLASLt %zu, budget %.0f s\n", prop.name, cublasLtGetVersion(), budget_s);
  std::vector<Case> cases;
  for (const Case& c : make_cases())
    if (only.empty() || c.name.find(only) != std::string::npos) cases.push_back(c);
  std::vector<Summary> rows;
  const double t0 = now_s();
  for (size_t i = 0; i < cases.size(); ++i) {
    const double share = std::max(0.0, budget_s - (now_s() - t0)) / double(cases.size() - i);
    std::printf("\n== %s: M %lld N %lld K %lld, %s x %s, %s accumulation (%.0f s)\n",
                cases[i].name.c_str(), (long long)cases[i].m, (long long)cases[i].n,
                (long long)cases[i].k, te::dtype_name(cases[i].a_dtype),
                te::dtype_name(cases[i].b_dtype), cases[i].split_accumulator ? "split" : "fast",
                share);
    Setup s;
    s.cs = cases[i];
    try {
      setup_case(&s);
      CHECK_CUDA(cudaDeviceSynchronize());
      rows.push_back(search_case(s, share));
    } catch (const te::Error& e) {
      std::printf("  skipped: %s\n", e.what());
    } catch (const ContextLost&) {
      std::printf("FATAL: the CUDA context is lost after a failing configuration\n");
      print_summary(rows);
      return 3;
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    free_case(&s);
  }
  print_summary(rows);
  std::printf("(sanity row: bench_core measured 0.830 ms for FP8 8192^3 fast on 2026-11-30)\n");
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  double budget_s = 200.0;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--budget") && i + 1 < argc) {
      budget_s = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--budget SECONDS] [--only SUBSTRING]\n", argv[0]);
      return 2;
    }
  }
  return run_search(budget_s, only);
}
