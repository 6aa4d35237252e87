// Tile and cluster variants of the heuristic's algorithm: extra candidates for
// the timed choice of FP8 GEMMs (TE_GEMM_AUTOTUNE=all, autotune.cpp).
//
// Why: on the H200 (cuBLASLt 13.1; docs/benchmarks.md, "cuBLASLt configuration
// search for the FP8 Linear/MLP GEMMs") bench/kernels/gemm_search.cu found
// configurations up to 14% faster than the heuristic's first answer for the
// FP8 GEMMs of our Linear and LayerNormMLP layers. Every one was the
// heuristic's own algorithm (id 66) with another tile and/or cluster shape,
// the same stages, split-K 1, no swizzle, custom option 0; in 10 of 13 shapes
// it was none of the heuristic's 8 answers, so timing those answers alone
// could not find it. The variants are that short list: the winning tiles (and
// the heuristic's own tiles, which won with another cluster shape) times the
// cluster shapes 1x1x1, 2x1x1 and 1x2x1, each kept when the algorithm lists
// the tile and cublasLtMatmulAlgoCheck accepts the configuration.
#ifdef TE_WITH_CUDA

#include <algorithm>
#include <tuple>
#include <utility>

#include "gemm/cublaslt.h"

namespace te::gemm {
namespace {

// In this order (the timing keeps the first of equal times).
const uint32_t kTiles[] = {
    CUBLASLT_MATMUL_TILE_64x256,  CUBLASLT_MATMUL_TILE_176x128, CUBLASLT_MATMUL_TILE_128x128,
    CUBLASLT_MATMUL_TILE_88x128,  CUBLASLT_MATMUL_TILE_80x128,  CUBLASLT_MATMUL_TILE_112x128,
    CUBLASLT_MATMUL_TILE_72x128,  CUBLASLT_MATMUL_TILE_128x160, CUBLASLT_MATMUL_TILE_256x128,
    CUBLASLT_MATMUL_TILE_192x192, CUBLASLT_MATMUL_TILE_320x128, CUBLASLT_MATMUL_TILE_144x128};
const uint16_t kClusters[] = {CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                              CUBLASLT_CLUSTER_SHAPE_1x2x1};

template <class T>
void get_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr,
                T* value) {
  size_t written = 0;  // an attribute this cuBLASLt does not know keeps its default
  (void)cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, value, sizeof(T), &written);
}

template <class T>
bool set_config(cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, T value) {
  return cublasLtMatmulAlgoConfigSetAttribute(algo, attr, &value, sizeof(value)) ==
         CUBLAS_STATUS_SUCCESS;
}

// Whether the call's buffers have the alignment `algo` needs: AlgoCheck sees
// no pointers, and the heuristic was told the actual alignments. (A need that
// cannot be read passes: a launch on misaligned buffers fails with a status,
// which the timing treats as a failed candidate.)
bool alignments_fit(const LtCall& call, const cublasLtMatmulAlgo_t& algo) {
  const std::pair<cublasLtMatmulAlgoCapAttributes_t, const void*> needs[] = {
      {CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES, call.a.data},
      {CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_B_BYTES, call.b.data},
      {CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_C_BYTES, call.c},
      {CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_D_BYTES, call.d}};
  for (const auto& [attr, ptr] : needs) {
    uint32_t need = 0;
    size_t written = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, &need, sizeof(need), &written) ==
            CUBLAS_STATUS_SUCCESS &&
        need > alignment_of(ptr))
      return false;
  }
  return true;
}

}  // namespace

bool LtAlgoConfig::operator==(const LtAlgoConfig& o) const {
  return std::tie(id, tile, stages, splitk, reduction, swizzle, custom, inner, cluster) ==
         std::tie(o.id, o.tile, o.stages, o.splitk, o.reduction, o.swizzle, o.custom, o.inner,
                  o.cluster);
}

LtAlgoConfig read_algo_config(const cublasLtMatmulAlgo_t& algo) {
  LtAlgoConfig c;
  get_config(algo, CUBLASLT_ALGO_CONFIG_ID, &c.id);
  get_config(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile);
  get_config(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c.stages);
  get_config(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &c.splitk);
  get_config(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &c.reduction);
  get_config(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &c.swizzle);
  get_config(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &c.custom);
  get_config(algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &c.inner);
  get_config(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c.cluster);
  return c;
}

bool build_algo(const LtCall& call, const LtAlgoConfig& c, cublasLtMatmulAlgo_t* algo) {
  if (cublasLtMatmulAlgoInit(handle_for(call.device), CUBLAS_COMPUTE_32F, CUDA_R_32F,
                             cuda_type(call.a.dtype), cuda_type(call.b.dtype),
                             cuda_type(call.c_dtype), cuda_type(call.d_dtype), c.id,
                             algo) != CUBLAS_STATUS_SUCCESS)
    return false;
  return set_config(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, c.tile) &&
         set_config(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, c.stages) &&
         set_config(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, c.splitk) &&
         set_config(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, c.reduction) &&
         set_config(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, c.swizzle) &&
         set_config(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, c.custom) &&
         set_config(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, c.cluster) &&
         (c.inner == 0 || set_config(algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, c.inner));
}

std::vector<uint32_t> algo_cap_ids(const cublasLtMatmulAlgo_t& algo,
                                   cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t bytes = 0;  // a size of 0 asks for the size
  std::vector<uint32_t> ids;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes) == CUBLAS_STATUS_SUCCESS) {
    ids.resize(bytes / sizeof(uint32_t));
    if (!ids.empty() && cublasLtMatmulAlgoCapGetAttribute(&algo, attr, ids.data(), bytes, &bytes) !=
                            CUBLAS_STATUS_SUCCESS)
      ids.clear();
  }
  if (ids.empty()) ids.push_back(0);  // UNDEFINED: the algorithm picks
  return ids;
}

std::vector<cublasLtMatmulAlgo_t> tile_variants(const LtCall& call,
                                                const std::vector<cublasLtMatmulAlgo_t>& answers) {
  std::vector<cublasLtMatmulAlgo_t> variants;
  if (answers.empty()) return variants;
  std::vector<LtAlgoConfig> seen;  // the answers', then each variant's
  for (const cublasLtMatmulAlgo_t& a : answers) seen.push_back(read_algo_config(a));
  LtAlgoConfig plain;
  plain.id = seen.front().id;
  cublasLtMatmulAlgo_t plain_algo{};
  if (!build_algo(call, plain, &plain_algo)) return variants;
  const std::vector<uint32_t> listed = algo_cap_ids(plain_algo, CUBLASLT_ALGO_CAP_TILE_IDS);
  // The first answer's stages (the search's winners kept them); where a tile
  // rejects those, UNDEFINED lets the algorithm pick.
  std::vector<uint32_t> stage_choices = {seen.front().stages};
  if (seen.front().stages != 0) stage_choices.push_back(0);

  LtDescriptors desc(call);
  const cublasLtHandle_t handle = handle_for(call.device);
  for (uint32_t tile : kTiles) {
    if (std::find(listed.begin(), listed.end(), tile) == listed.end()) continue;
    for (uint16_t cluster : kClusters) {
      for (uint32_t stages : stage_choices) {
        LtAlgoConfig want = plain;  // split-K 1, no reduction, no swizzle, custom option 0
        want.tile = tile;
        want.stages = stages;
        want.cluster = cluster;
        cublasLtMatmulAlgo_t algo{};
        cublasLtMatmulHeuristicResult_t check{};
        if (!build_algo(call, want, &algo) ||
            cublasLtMatmulAlgoCheck(handle, &desc.op, &desc.a, &desc.b, &desc.c, &desc.d, &algo,
                                    &check) != CUBLAS_STATUS_SUCCESS ||
            check.workspaceSize > call.workspace_bytes || !alignments_fit(call, algo))
          continue;
        const LtAlgoConfig got = read_algo_config(algo);  // as cuBLASLt stores it
        if (std::find(seen.begin(), seen.end(), got) == seen.end()) {
          seen.push_back(got);
          variants.push_back(algo);
        }
        break;  // accepted (perhaps as a duplicate): no other stages
      }
    }
  }
  return variants;
}

}  // namespace te::gemm

#endif  // TE_WITH_CUDA
