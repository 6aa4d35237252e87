// C entry points of te/gemm_block.h: validate (validate.cpp), choose the path,
// run it. The plan functions and the calls share one decision:
//   NONE / TENSOR                 te_gemm's backend ("native" everywhere);
//   block formats on the CPU      emulated (FP32);
//   block formats on CUDA         native when eligible and cuBLASLt has a kernel
//                                 that fits the workspace, else emulated (BF16).
#include <string>
#include <vector>

#include "gemm_block/backend.h"
#include "runtime/device.h"
#include "runtime/tensor.h"

namespace te::gemm_block {
namespace {

// The path a call with unlimited workspace takes, and the bytes it needs.
te_gemm_path plan_path(const BlockGemm& g, size_t* bytes) {
  if (!g.block) {
    *bytes = g.on_cuda ? gemm::cuda_workspace_size(g.dense) : 0;
    return TE_GEMM_PATH_NATIVE;
  }
  if (!g.on_cuda) {
    *bytes = 0;
    return TE_GEMM_PATH_EMULATED;
  }
#ifdef TE_WITH_CUDA
  if (native::eligible(g) && native::supported(g, bytes)) return TE_GEMM_PATH_NATIVE;
#endif
  *bytes = emulated::cuda_workspace_size(g);
  return TE_GEMM_PATH_EMULATED;
}

void check_workspace(size_t available, size_t needed, const char* what) {
  if (available < needed)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'workspace' must hold at least ", needed,
         " bytes for ", what, ", got ", available,
         " (query te_gemm_block_plan with the same "
         "parameters)");
}

// NVFP4's CUDA dequantize moves 16-byte vectors.
[[maybe_unused]] void check_nvfp4_alignment(const BlockOperand& op, const char* name) {
  if (op.scaling == TE_SCALING_NVFP4 && reinterpret_cast<uintptr_t>(op.data) % 16 != 0)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name,
         "' must be 16-byte aligned for the CUDA "
         "NVFP4 kernels");
}

// Runs one validated GEMM with the caller's workspace; returns the path taken.
te_gemm_path run(const BlockGemm& g, void* workspace, size_t available, te_stream stream) {
  check_aliasing();  // (the block paths below do not go through TE_DISPATCH)
  // The device is current first: the native path's support and workspace
  // queries below depend on it.
  if (g.on_cuda) use_cuda_device(g.dense.device_index);
  if (!g.block) {
    gemm::GemmArgs dense = g.dense;
    if (g.on_cuda) check_workspace(available, gemm::cuda_workspace_size(dense), "this GEMM");
    dense.workspace = workspace;
    dense.workspace_bytes = available;
    TE_DISPATCH_DEVICE(g.on_cuda, g.dense.device_index, gemm::cpu::gemm(dense),
                       gemm::cuda::gemm(dense, stream));
    return TE_GEMM_PATH_NATIVE;
  }
  if (!g.on_cuda) {
    emulated::run_cpu(g);
    return TE_GEMM_PATH_EMULATED;
  }
#ifdef TE_WITH_CUDA
  size_t native_bytes = 0;
  if (native::eligible(g) && native::supported(g, &native_bytes) && native_bytes <= available) {
    native::run(g, workspace, available, stream);
    return TE_GEMM_PATH_NATIVE;
  }
  check_nvfp4_alignment(g.a, "a");
  check_nvfp4_alignment(g.b, "b");
  check_workspace(available, emulated::cuda_workspace_size(g), "the emulated path");
  emulated::run_cuda(g, workspace, available, stream);
  return TE_GEMM_PATH_EMULATED;
#else
  fail_no_cuda();
#endif
}

// The caller's workspace tensor: bytes on the operands' device.
void* workspace_of(te_tensor* workspace, const te_gemm_block_params& p, size_t* available) {
  *available = 0;
  if (workspace == nullptr) return nullptr;
  Arg(workspace, "workspace").output().dtype(TE_DTYPE_BYTE).same_device(*p.a.data, "a");
  *available = static_cast<size_t>(size_bytes(*workspace));
  return workspace->data;
}

void check_plan_device(const BlockGemm& g) {
#ifndef TE_WITH_CUDA
  if (g.on_cuda) fail_no_cuda();
#else
  if (g.on_cuda) use_cuda_device(g.dense.device_index);
#endif
}

// ---------------------------------------------------------------------------
// Groups: each validated with its index in the message, then the shared
// properties checked against group 0.

void check_group_list(const te_gemm_block_params* groups, int num_groups) {
  if (num_groups < 0)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'num_groups' must be >= 0, got ", num_groups);
  if (num_groups > 0 && groups == nullptr)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'groups' is required when num_groups > 0 (got NULL)");
}

template <class T>
void check_shared(int i, const char* what, const T& mine, const T& first) {
  if (!(mine == first))
    fail(TE_ERROR_INVALID_ARGUMENT, "group ", i, ": ", what,
         " differs from group 0's; the groups "
         "of a grouped GEMM share the operands' scaling modes and types, transa, transb, D's type "
         "and the device");
}

void check_same_as_first(const te_gemm_block_params& p, const te_gemm_block_params& first, int i) {
  check_shared(i, "a.scaling", p.a.scaling, first.a.scaling);
  check_shared(i, "b.scaling", p.b.scaling, first.b.scaling);
  check_shared(i, "the type of 'a'", p.a.data->dtype, first.a.data->dtype);
  check_shared(i, "the type of 'b'", p.b.data->dtype, first.b.data->dtype);
  check_shared(i, "transa", p.transa != 0, first.transa != 0);
  check_shared(i, "transb", p.transb != 0, first.transb != 0);
  check_shared(i, "the type of 'd'", p.d->dtype, first.d->dtype);
  check_shared(i, "the device type", p.a.data->device_type, first.a.data->device_type);
  check_shared(i, "the device index", p.a.data->device_index, first.a.data->device_index);
}

std::vector<BlockGemm> validate_groups(const te_gemm_block_params* groups, int num_groups,
                                       bool size_only) {
  check_group_list(groups, num_groups);
  std::vector<BlockGemm> out;
  out.reserve(static_cast<size_t>(num_groups));
  for (int i = 0; i < num_groups; ++i) {
    try {
      out.push_back(validate(&groups[i], size_only));
    } catch (const Error& e) {
      fail(e.status(), "group ", i, ": ", e.what());
    }
    if (i > 0) check_same_as_first(groups[i], groups[0], i);
  }
  return out;
}

}  // namespace
}  // namespace te::gemm_block

using namespace te;
using namespace te::gemm_block;

extern "C" {

te_status te_gemm_block_plan(const te_gemm_block_params* params, te_gemm_path* path,
                             size_t* workspace_bytes) {
  return guarded("te_gemm_block_plan", [&] {
    const BlockGemm g = validate(params, /*size_only=*/true);
    check_plan_device(g);
    size_t bytes = 0;
    const te_gemm_path chosen = plan_path(g, &bytes);
    if (path) *path = chosen;
    if (workspace_bytes) *workspace_bytes = bytes;
  });
}

te_status te_gemm_block(const te_gemm_block_params* params, te_tensor* workspace,
                        te_gemm_path* path_taken, te_stream stream) {
  return guarded("te_gemm_block", [&] {
    const BlockGemm g = validate(params, /*size_only=*/false);
    size_t available = 0;
    void* ws = workspace_of(workspace, *params, &available);
    const te_gemm_path taken = run(g, ws, available, stream);
    if (path_taken) *path_taken = taken;
  });
}

te_status te_gemm_block_grouped_plan(const te_gemm_block_params* groups, int num_groups,
                                     te_gemm_path* paths, size_t* workspace_bytes) {
  return guarded("te_gemm_block_grouped_plan", [&] {
    const std::vector<BlockGemm> gs = validate_groups(groups, num_groups, /*size_only=*/true);
    size_t most = 0;
    for (int i = 0; i < num_groups; ++i) {
      check_plan_device(gs[i]);
      size_t bytes = 0;
      const te_gemm_path chosen = plan_path(gs[i], &bytes);
      if (paths) paths[i] = chosen;
      most = bytes > most ? bytes : most;
    }
    if (workspace_bytes) *workspace_bytes = most;
  });
}

te_status te_gemm_block_grouped(const te_gemm_block_params* groups, int num_groups,
                                te_tensor* workspace, te_gemm_path* paths, te_stream stream) {
  return guarded("te_gemm_block_grouped", [&] {
    const std::vector<BlockGemm> gs = validate_groups(groups, num_groups, /*size_only=*/false);
    if (num_groups == 0) return;
    size_t available = 0;
    void* ws = workspace_of(workspace, groups[0], &available);
    // Back to back on one stream: each group's use of the shared workspace
    // ends before the next group's kernels start.
    for (int i = 0; i < num_groups; ++i) {
      te_gemm_path taken;
      try {
        taken = run(gs[i], ws, available, stream);
      } catch (const Error& e) {
        fail(e.status(), "group ", i, ": ", e.what());
      }
      if (paths) paths[i] = taken;
    }
  });
}

}  // extern "C"
