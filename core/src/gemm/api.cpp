// Placeholder until the GEMM family lands: reports that the op is missing.
#include "runtime/status.h"
#include "te/gemm.h"

using namespace te;

extern "C" te_status te_gemm_workspace_size(const te_gemm_params*, size_t*) {
  return guarded("te_gemm_workspace_size", [] { fail(TE_ERROR_UNSUPPORTED, "not implemented yet"); });
}

extern "C" te_status te_gemm(const te_gemm_params*, te_stream) {
  return guarded("te_gemm", [] { fail(TE_ERROR_UNSUPPORTED, "not implemented yet"); });
}
