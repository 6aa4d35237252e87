"""One small attention call (forward + backward) through the core's cuDNN backend.

The smoke test that ci/gpu.sh (stage cudnn) and ci/cudnn_debug.sh run before any
cuDNN test: a crash here stops the cuDNN cases, not the whole GPU run.
"""

import faulthandler
import os
import sys

faulthandler.enable()
os.environ["NVTE_FLASH_ATTN"] = "0"  # the core's fused path, not torch SDPA

import torch  # noqa: E402

import transformer_engine.core as tc  # noqa: E402
import transformer_engine.pytorch as te  # noqa: E402
from transformer_engine.core.attention import BACKENDS  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
from torch_desc import desc  # noqa: E402

print("te-core from", tc.__file__, flush=True)
q = torch.randn(2, 128, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
dpa = te.DotProductAttention(4, 64, qkv_format="bshd", attn_mask_type="causal")
core = BACKENDS[tc.lib.attention_backend(desc(q), desc(q), desc(q), qkv_format=0, mask_type=2, scale=64**-0.5)]
print("the core's backend for this call:", core, flush=True)
print("calling forward", flush=True)
o = dpa(q, q, q)
torch.cuda.synchronize()
print("forward ok, backend", dpa.last_backend, flush=True)
o.sum().backward()
torch.cuda.synchronize()
print("backward ok", flush=True)
assert core == "cudnn", f"expected the cuDNN backend, got {core}"
