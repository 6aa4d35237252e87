#include "bindings.h"

namespace te_py {

// Filled by the GEMM work (te_gemm, te_gemm_workspace_size).
void bind_gemm(nb::module_& m) { (void)m; }

}  // namespace te_py
