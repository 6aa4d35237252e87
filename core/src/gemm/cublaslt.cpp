// cuBLASLt plumbing of the GEMM family: descriptors, handle and heuristic cache.
//
// Descriptors live on the stack (the *Init functions; no heap work per call).
// Host overhead is what limits small layers, so the expensive part, the
// heuristic query, runs once per configuration: its result is cached under a
// key of everything the heuristic sees (types, shapes, layouts, epilogue,
// pointer alignments, workspace size, device).
//
// Algorithm choice: cuBLASLt's heuristic answers (up to 8), the first by
// default. Large high-precision GEMMs (with TE_GEMM_AUTOTUNE=all FP8 ones too,
// together with tile variants of the first answer, algo_variants.cpp) are
// timed once instead (autotune.cpp):
// the heuristic's first answer is not always its fastest, and torch.matmul's
// cuBLAS path sometimes finds a faster kernel than that first answer. The
// preference carries the 32 MiB workspace (cuda_plan.h) and the operands'
// actual pointer alignments (up to 256 bytes), so kernels that need more
// alignment than a buffer has are excluded and none that it has is lost.
// torch.matmul on BF16 goes through cuBLAS by default (cublasGemmEx, 32 MiB
// workspace on sm90; torch.backends.cuda.preferred_blas_library() "cublas"),
// whose own selection can differ from this heuristic's first answer; torch's
// cuBLASLt paths (addmm with a bias, _scaled_mm) take the first answer as we
// do. bench/bench_gemm.py measures both baselines.
#ifdef TE_WITH_CUDA

#include "gemm/cublaslt.h"

#include <array>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gemm/cublas_check.h"

namespace te::gemm {

cudaDataType_t cuda_type(te_dtype dtype) {
  switch (dtype) {
    case TE_DTYPE_FLOAT32: return CUDA_R_32F;
    case TE_DTYPE_BFLOAT16: return CUDA_R_16BF;
    case TE_DTYPE_FLOAT16: return CUDA_R_16F;
    case TE_DTYPE_FLOAT8E4M3: return CUDA_R_8F_E4M3;
    case TE_DTYPE_FLOAT8E5M2: return CUDA_R_8F_E5M2;
    case TE_DTYPE_FLOAT4E2M1: return CUDA_R_4F_E2M1;
    default: fail(TE_ERROR_INTERNAL, "no cuBLASLt type for dtype ", static_cast<int>(dtype));
  }
}

// Kernels that need more alignment than a buffer has are excluded from the
// heuristic's choice (and from the tile variants).
uint32_t alignment_of(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

cublasLtHandle_t handle_for(int device) {
  static std::mutex mutex;
  static std::unordered_map<int, cublasLtHandle_t> handles;  // never destroyed: no
  std::lock_guard<std::mutex> lock(mutex);                   // teardown-order issues at exit
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasLtHandle_t handle = nullptr;
  TE_GEMM_CHECK_CUBLAS(cublasLtCreate(&handle));  // api.cpp made `device` current
  handles.emplace(device, handle);
  return handle;
}

namespace {

// Block scale modes of te/gemm_block.h (cuBLASLt 12.8: VEC32/VEC16; 12.9: VEC128/BLK128).
int32_t lt_scale_mode(ScaleMode mode) {
  switch (mode) {
    case ScaleMode::kVec128Fp32: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case ScaleMode::kBlock128Fp32: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    case ScaleMode::kVec32Ue8m0: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
    case ScaleMode::kVec16Ue4m3: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
    default: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  }
}

cublasLtEpilogue_t lt_epilogue(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::kBias: return CUBLASLT_EPILOGUE_BIAS;
    case LtEpilogue::kGeluAux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case LtEpilogue::kGeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

template <class T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  TE_GEMM_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

template <class T>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
              const T& value) {
  TE_GEMM_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
}

void init_layout(cublasLtMatrixLayoutOpaque_t* layout, te_dtype dtype, uint64_t rows, uint64_t cols,
                 int64_t ld) {
  TE_GEMM_CHECK_CUBLAS(cublasLtMatrixLayoutInit(layout, cuda_type(dtype), rows, cols, ld));
}

}  // namespace

LtDescriptors::LtDescriptors(const LtCall& call) {
  TE_GEMM_CHECK_CUBLAS(cublasLtMatmulDescInit(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t transa = call.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t transb = call.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_attr(&op, CUBLASLT_MATMUL_DESC_TRANSA, transa);
  set_attr(&op, CUBLASLT_MATMUL_DESC_TRANSB, transb);
  const uint32_t epilogue = lt_epilogue(call.epilogue);
  set_attr(&op, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (call.epilogue != LtEpilogue::kDefault && call.epilogue != LtEpilogue::kGeluAux)
    set_attr(&op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, call.bias);
  if (call.set_bias_dtype) {
    const int32_t bias_type = cuda_type(call.bias_dtype);
    set_attr(&op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
  }
  if (call.epilogue == LtEpilogue::kGeluAux || call.epilogue == LtEpilogue::kGeluAuxBias) {
    set_attr(&op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, call.aux);
    const int64_t aux_ld = static_cast<int64_t>(call.m);  // D's leading dimension
    set_attr(&op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld);
  }
  if (call.fp8) {
    set_attr(&op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, call.a_scale);
    set_attr(&op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, call.b_scale);
    const int8_t fast_accum = call.fast_accum ? 1 : 0;
    set_attr(&op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accum);
    if (call.a_scale_mode != ScaleMode::kScalar || call.b_scale_mode != ScaleMode::kScalar) {
      set_attr(&op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, lt_scale_mode(call.a_scale_mode));
      set_attr(&op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, lt_scale_mode(call.b_scale_mode));
    }
  }
  if (call.device_alpha) {
    const int32_t mode = CUBLASLT_POINTER_MODE_DEVICE;
    set_attr(&op, CUBLASLT_MATMUL_DESC_POINTER_MODE, mode);
  }
  if (call.d_scale)
    set_attr(&op, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, static_cast<const void*>(call.d_scale));
  if (call.d_amax)
    set_attr(&op, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, static_cast<void*>(call.d_amax));
  init_layout(&a, call.a.dtype, call.a.rows, call.a.cols, call.a.ld);
  init_layout(&b, call.b.dtype, call.b.rows, call.b.cols, call.b.ld);
  init_layout(&c, call.c_dtype, call.m, call.n, static_cast<int64_t>(call.m));
  init_layout(&d, call.d_dtype, call.m, call.n, static_cast<int64_t>(call.m));
}

namespace {

// The heuristic's inputs, flattened.
struct AlgoKey {
  std::array<int64_t, 32> v{};
  bool operator==(const AlgoKey& o) const { return v == o.v; }
};

struct AlgoKeyHash {
  size_t operator()(const AlgoKey& key) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (int64_t x : key.v) {
      h ^= static_cast<uint64_t>(x);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

AlgoKey make_key(const LtCall& c) {
  const int64_t fields[] = {c.device,
                            static_cast<int64_t>(c.m),
                            static_cast<int64_t>(c.n),
                            static_cast<int64_t>(c.k),
                            c.a.dtype,
                            c.a.trans,
                            c.a.ld,
                            c.b.dtype,
                            c.b.trans,
                            c.b.ld,
                            c.c_dtype,
                            c.d_dtype,
                            static_cast<int64_t>(c.epilogue),
                            c.bias_dtype,
                            c.set_bias_dtype,
                            c.fp8,
                            c.fast_accum,
                            c.d_scale != nullptr,
                            c.d_amax != nullptr,
                            alignment_of(c.a.data),
                            alignment_of(c.b.data),
                            alignment_of(c.c),
                            alignment_of(c.d),
                            alignment_of(c.bias),
                            alignment_of(c.aux),
                            static_cast<int64_t>(c.workspace_bytes),
                            c.beta != 0.0f,
                            static_cast<int64_t>(c.a_scale_mode),
                            static_cast<int64_t>(c.b_scale_mode),
                            c.device_alpha != nullptr};
  static_assert(sizeof(fields) / sizeof(fields[0]) <= 32, "AlgoKey too small");
  AlgoKey key;
  for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); ++i) key.v[i] = fields[i];
  return key;
}

struct CachedAlgo {
  cublasStatus_t status;  // SUCCESS when an algorithm was found
  cublasLtMatmulAlgo_t algo;
  // The heuristic's usable answers, best first (once timed, FP8 tile variants follow them).
  std::vector<cublasLtMatmulAlgo_t> candidates;
  bool settled = false;  // timed, or not worth timing
};

constexpr size_t kMaxCachedAlgos = 4096;  // then start over: shapes are few in practice
// Heuristic answers asked for (see find_lt_algo).
constexpr int kHeuristicResults = 8;

cublasStatus_t heuristic_candidates(const LtCall& call,
                                    std::vector<cublasLtMatmulAlgo_t>* candidates) {
  LtDescriptors desc(call);
  cublasLtMatmulPreferenceOpaque_t pref;
  TE_GEMM_CHECK_CUBLAS(cublasLtMatmulPreferenceInit(&pref));
  set_pref(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
           static_cast<uint64_t>(call.workspace_bytes));
  set_pref(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(call.a.data));
  set_pref(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(call.b.data));
  set_pref(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(call.c));
  set_pref(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(call.d));
  std::array<cublasLtMatmulHeuristicResult_t, kHeuristicResults> results{};
  int count = 0;
  cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle_for(call.device), &desc.op, &desc.a, &desc.b, &desc.c, &desc.d, &pref,
      static_cast<int>(results.size()), results.data(), &count);
  // Results come best-estimated first, each for exactly this descriptor
  // (epilogue, types, alignments) and within the workspace; the checks below
  // only guard that promise.
  candidates->clear();
  for (int i = 0; status == CUBLAS_STATUS_SUCCESS && i < count; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS &&
        results[i].workspaceSize <= call.workspace_bytes)
      candidates->push_back(results[i].algo);
  if (status == CUBLAS_STATUS_SUCCESS && candidates->empty()) status = CUBLAS_STATUS_NOT_SUPPORTED;
  return status;
}

}  // namespace

cublasStatus_t find_lt_algo(const LtCall& call, cublasLtMatmulAlgo_t* algo,
                            const cudaStream_t* tune_stream) {
  static std::mutex mutex;
  static std::unordered_map<AlgoKey, CachedAlgo, AlgoKeyHash> cache;
  const AlgoKey key = make_key(call);
  // (Asked only when the answer is not settled: worth_timing may query the
  // stream's capture state, a driver call, and most calls hit settled entries.)
  auto worth = [&] { return tune_stream != nullptr && worth_timing(call, *tune_stream); };
  bool tune = false;
  std::vector<cublasLtMatmulAlgo_t> candidates;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) {
      // Something to choose from: two answers, or one FP8 answer (and its variants).
      const size_t needed = call.fp8 ? 1 : 2;
      tune = !it->second.settled && it->second.candidates.size() >= needed && worth();
      if (!tune) {
        *algo = it->second.algo;
        return it->second.status;
      }
      candidates = it->second.candidates;
    }
  }
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  if (candidates.empty()) {  // first sight of this configuration
    tune = worth();
    status = heuristic_candidates(call, &candidates);
    // Cache answers about the configuration, not passing failures.
    if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED &&
        status != CUBLAS_STATUS_INVALID_VALUE)
      return status;
  }
  // Timed FP8 GEMMs (TE_GEMM_AUTOTUNE=all) also try tile and cluster variants
  // of the first answer's algorithm, in two rounds (both: see autotune.cpp);
  // high-precision ones time the heuristic's answers in one round.
  int rounds = 1;
  if (tune && call.fp8) {
    const std::vector<cublasLtMatmulAlgo_t> variants = tile_variants(call, candidates);
    candidates.insert(candidates.end(), variants.begin(), variants.end());
    rounds = 2;
  }
  size_t chosen = 0;
  if (tune && candidates.size() > 1) chosen = fastest_algo(call, candidates, *tune_stream, rounds);
  *algo = candidates.empty() ? cublasLtMatmulAlgo_t{} : candidates[chosen];
  std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() >= kMaxCachedAlgos) cache.clear();
  cache[key] = CachedAlgo{status, *algo, std::move(candidates), tune};
  return status;
}

cublasStatus_t try_lt_matmul(const LtCall& call, const cublasLtMatmulAlgo_t& algo,
                             cudaStream_t stream) {
  LtDescriptors desc(call);
  const void* alpha = call.device_alpha ? static_cast<const void*>(call.device_alpha) : &call.alpha;
  const void* beta = call.device_alpha ? static_cast<const void*>(call.device_beta) : &call.beta;
  return cublasLtMatmul(handle_for(call.device), &desc.op, alpha, call.a.data, &desc.a, call.b.data,
                        &desc.b, beta, call.c, &desc.c, call.d, &desc.d, &algo, call.workspace,
                        call.workspace_bytes, stream);
}

void run_lt_matmul(const LtCall& call, const cublasLtMatmulAlgo_t& algo, cudaStream_t stream) {
  TE_GEMM_CHECK_CUBLAS(try_lt_matmul(call, algo, stream));
}

}  // namespace te::gemm

#endif  // TE_WITH_CUDA
