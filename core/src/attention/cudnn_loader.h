// cuDNN, opened at run time (cudnn_loader.cpp). TE_WITH_CUDNN builds only.
#pragma once

#include <string>

namespace te::attention::cudnn {

// True once libcudnn.so.9 (cuDNN 9) is open; else false with the reason in
// *why (e.g. "cuDNN not found: ..."). Opens the library on the first call;
// thread-safe.
bool library_available(std::string* why);

// cudnnGetVersion() of the opened library (e.g. 92800), 0 when not open.
long library_version();

}  // namespace te::attention::cudnn
