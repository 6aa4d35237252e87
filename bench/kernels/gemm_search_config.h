// cuBLASLt algorithm configurations for bench/kernels/gemm_search.cu: what
// one configuration is (every cublasLtMatmulAlgoConfigAttributes_t field),
// how to read it from an algorithm, build an algorithm from it, describe it,
// and what an algorithm id supports. Only cublasLt.h; no te-core code.
#pragma once

#include <cublasLt.h>

#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

// Tile, stages and cluster names, generated from cublasLt.h by
// run_gemm_search.sh; without them the ids are printed as numbers.
struct IdName {
  unsigned id;
  const char* name;
};
#if __has_include("gemm_search_names.inc")
#include "gemm_search_names.inc"
#else
static const IdName kTileNames[] = {{0, "undef"}};
static const IdName kStagesNames[] = {{0, "undef"}};
static const IdName kClusterNames[] = {{0, "auto"}};
#endif

namespace gemm_search {

template <size_t N>
std::string id_name(const IdName (&table)[N], unsigned id) {
  for (const IdName& e : table)
    if (e.id == id) return e.name;
  return "#" + std::to_string(id);
}

// Every attribute of cublasLtMatmulAlgoConfigAttributes_t (cuBLASLt 13), with
// the storage types the header names; equal configs are the same kernel.
struct Config {
  int32_t id = 0;
  uint32_t tile = 0, stages = 0;
  int32_t splitk = 1;
  uint32_t reduction = 0, swizzle = 0, custom = 0;
  uint16_t inner = 0, cluster = 0;
  auto fields() const {
    return std::tie(id, tile, stages, splitk, reduction, swizzle, custom, inner, cluster);
  }
  bool operator==(const Config& o) const { return fields() == o.fields(); }
};

inline std::string describe(const Config& c) {
  static const char* kReductions[] = {"none", "inplace", "compute", "?", "output"};
  char buf[200];
  std::snprintf(buf, sizeof(buf), "algo %d tile %s stages %s splitK %d red %s swz %u clu %s%s",
                c.id, id_name(kTileNames, c.tile).c_str(), id_name(kStagesNames, c.stages).c_str(),
                c.splitk, c.reduction <= 4 ? kReductions[c.reduction] : "?", c.swizzle,
                id_name(kClusterNames, c.cluster).c_str(),
                c.custom ? (" custom " + std::to_string(c.custom)).c_str() : "");
  return buf;
}

template <class T>
void get_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr,
                T* value) {
  size_t written = 0;  // unknown attributes keep the default
  (void)cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, value, sizeof(T), &written);
}

inline Config read_config(const cublasLtMatmulAlgo_t& algo) {
  Config c;
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

// The cuBLASLt types of a call (A, B, C, D), as te-core's Descriptors set them.
struct Types {
  cudaDataType_t a, b, c, d;
};

template <class T>
bool set_config(cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, T value) {
  return cublasLtMatmulAlgoConfigSetAttribute(algo, attr, &value, sizeof(value)) ==
         CUBLAS_STATUS_SUCCESS;
}

inline bool build_algo(cublasLtHandle_t handle, const Types& t, const Config& c,
                       cublasLtMatmulAlgo_t* algo) {
  if (cublasLtMatmulAlgoInit(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, t.a, t.b, t.c, t.d, c.id,
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

// What one algorithm id supports (cublasLtMatmulAlgoCapGetAttribute).
struct Caps {
  std::vector<uint32_t> tiles, stages;
  bool splitk = false, swizzle = false;
  uint32_t reduction_mask = 0;
  int32_t custom_max = 0;
};

inline std::vector<uint32_t> cap_ids(const cublasLtMatmulAlgo_t& algo,
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

template <class T>
T cap_value(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  T value{};
  size_t written = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, &value, sizeof(T), &written) !=
      CUBLAS_STATUS_SUCCESS)
    value = T{};
  return value;
}

inline Caps read_caps(const cublasLtMatmulAlgo_t& algo) {
  Caps caps;
  caps.tiles = cap_ids(algo, CUBLASLT_ALGO_CAP_TILE_IDS);
  caps.stages = cap_ids(algo, CUBLASLT_ALGO_CAP_STAGES_IDS);
  caps.splitk = cap_value<int32_t>(algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT) != 0;
  caps.reduction_mask = cap_value<uint32_t>(algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK);
  caps.swizzle = cap_value<uint32_t>(algo, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT) != 0;
  caps.custom_max = cap_value<int32_t>(algo, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX);
  return caps;
}

// Tile area from its name ("128x256" -> 32768); 0 when unknown.
inline double tile_area(uint32_t tile) {
  unsigned r = 0, c = 0;
  return std::sscanf(id_name(kTileNames, tile).c_str(), "%ux%u", &r, &c) == 2 ? double(r) * c : 0.0;
}

}  // namespace gemm_search
