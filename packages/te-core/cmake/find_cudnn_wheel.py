"""Prints the header folders cuDNN attention builds against, as a CMake list:
cudnn_frontend.h (nvidia-cudnn-frontend), cudnn.h (nvidia-cudnn-cu13 / -cu12)
and nvrtc.h (nvidia-cuda-nvrtc; the CUDA toolkit's is used when this is empty).
Prints nothing when the frontend or cudnn.h is missing."""

import glob
import importlib.metadata
import importlib.util
import os


def frontend_include() -> str:
    # The wheel installs its headers as <site-packages>/include/cudnn_frontend.h.
    try:
        files = importlib.metadata.distribution("nvidia-cudnn-frontend").files or []
    except importlib.metadata.PackageNotFoundError:
        return ""
    for f in files:
        if str(f).replace("\\", "/").endswith("include/cudnn_frontend.h"):
            return os.path.dirname(str(f.locate()))
    return ""


def nvidia_include(header: str) -> str:
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for path in sorted(glob.glob(os.path.join(root, "*", "include", header))):
            return os.path.dirname(path)
    return ""


frontend, cudnn = frontend_include(), nvidia_include("cudnn.h")
if frontend and cudnn:
    print(";".join([frontend, cudnn, nvidia_include("nvrtc.h")]))
