// cuBLASLt algorithm configurations for bench/kernels/gemm_search.cu: how to
// describe one and what an algorithm id supports. What a configuration is,
// and reading, building and listing them, come from te-core
// (core/src/gemm/algo_variants.cpp, through cublaslt.h), whose timed FP8
// choice uses the same code.
#pragma once

#include <cublasLt.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gemm/cublaslt.h"

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

using Config = te::gemm::LtAlgoConfig;  // every cublasLtMatmulAlgoConfigAttributes_t field
using te::gemm::read_algo_config;

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

// What one algorithm id supports (cublasLtMatmulAlgoCapGetAttribute).
struct Caps {
  std::vector<uint32_t> tiles, stages;
  bool splitk = false, swizzle = false;
  uint32_t reduction_mask = 0;
  int32_t custom_max = 0;
};

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
  caps.tiles = te::gemm::algo_cap_ids(algo, CUBLASLT_ALGO_CAP_TILE_IDS);
  caps.stages = te::gemm::algo_cap_ids(algo, CUBLASLT_ALGO_CAP_STAGES_IDS);
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
