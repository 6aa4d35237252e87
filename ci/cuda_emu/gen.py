"""Makes host C++ of CUDA sources for the CPU emulation in this folder (the attention fallback,
core/src/attention/cuda_fallback*.cu; rope/cuda.cu; softmax/cuda.cu): kernel launches
`k<<<g, b, smem, s>>>(args)` become `Launch(g, b, smem, s)(k, args)` and the dynamic shared
memory declaration a pointer to the emulator's buffer. Usage: gen.py <core/src> <output folder>."""

import pathlib
import re
import sys

src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
for name in ["attention/cuda_fallback.cu", "attention/cuda_fallback_bwd.cu", "rope/cuda.cu", "softmax/cuda.cu"]:
    s = (src / name).read_text()
    s = s.replace("extern __shared__ float4 shared_raw[];", "float4* shared_raw = emu_shared();")
    s, n = re.subn(r"([\w:]+(?:<\w+>)?)\s*<<<(.*?)>>>\s*\(", r"Launch(\2)(\1, ", s, flags=re.S)
    if n == 0:
        sys.exit(f"{name}: no kernel launch found")
    (out / name.replace("/", "_").replace(".cu", ".cpp")).write_text(s)
