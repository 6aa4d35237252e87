// The activation kinds as data, generated from TE_ACTIVATION_KINDS (the one
// table, in te/activation.h): names for messages, the gated flag, whether a
// kind reads te_activation_params. The functors and the compile-time traits
// (Kind<K>) are in functions.h, from the same table.
#pragma once

#include "te/activation.h"

namespace te::activation {

struct KindInfo {
  te_activation kind;
  const char* name;
  bool gated;
  bool params;  // reads te_activation_params (clamped_swiglu)
};

inline constexpr KindInfo kKinds[] = {
#define TE_ACTIVATION_INFO_(ID, name_, code_, gated_, functor_, params_) \
  {TE_ACTIVATION_##ID, #name_, (gated_) != 0, (params_) != 0},
    TE_ACTIVATION_KINDS(TE_ACTIVATION_INFO_)
#undef TE_ACTIVATION_INFO_
};

inline constexpr int kKindCount = static_cast<int>(sizeof(kKinds) / sizeof(kKinds[0]));

// The codes are 0 .. kKindCount - 1 in table order, so a code indexes kKinds.
constexpr bool codes_follow_table_order() {
  for (int i = 0; i < kKindCount; ++i)
    if (static_cast<int>(kKinds[i].kind) != i) return false;
  return true;
}
static_assert(codes_follow_table_order(),
              "TE_ACTIVATION_KINDS: the codes must be 0, 1, 2, ... in line order");

constexpr bool is_valid_kind(te_activation kind) {
  return static_cast<int>(kind) >= 0 && static_cast<int>(kind) < kKindCount;
}

// For a valid kind only (api.cpp checks first).
constexpr const KindInfo& kind_info(te_activation kind) { return kKinds[static_cast<int>(kind)]; }
constexpr bool is_gated(te_activation kind) { return kind_info(kind).gated; }
constexpr const char* kind_name(te_activation kind) { return kind_info(kind).name; }

}  // namespace te::activation
