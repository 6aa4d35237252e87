// cuDNN and NVRTC, opened with dlopen at run time, so that libte_core.so has
// no link-time dependency on them: a machine without cuDNN still loads the
// core, and attention falls back to the core's own kernel.
//
// Why not cudnn-frontend's own NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING: in that
// mode the frontend also routes every CUDA runtime call through a dlopen'ed
// shared libcudart.so.12/13 — a second CUDA runtime next to the core's static
// one, and a library a pip install of te-core does not otherwise need. Built
// without that flag, the frontend calls the CUDA runtime directly (our static
// cudart) and calls cuDNN / NVRTC by their C names; this file defines those
// names (hidden in libte_core.so, so a cuDNN that torch loaded is untouched)
// as forwards to the library opened here. The set is what the frontend's
// inline code references; a missing one fails our link (-Wl,--no-undefined).
//
// Where libcudnn.so.9 is looked for, in order: $TE_CUDNN_LIBRARY (a path); the
// name "libcudnn.so.9" (already loaded, e.g. by torch, or on the loader's
// path); the nvidia-cudnn-cu13/-cu12 wheel next to this te-core install
// (<site-packages>/nvidia/cudnn/lib, found from this library's own location).
#ifdef TE_WITH_CUDNN

#include "attention/cudnn_loader.h"

#include <cudnn.h>
#include <dlfcn.h>
#include <nvrtc.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace te::attention::cudnn {
namespace {

// Folder of libte_core.so (found from the address of a function in it).
std::string own_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_folder), &info) == 0 || info.dli_fname == nullptr)
    return "";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// dlopen of the first candidate that opens; the errors of all in *tried.
void* open_first(const std::vector<std::string>& candidates, std::string* tried) {
  for (const std::string& name : candidates) {
    if (name.empty()) continue;
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) return handle;
    const char* err = dlerror();
    *tried += "\n  " + name + ": " + (err ? err : "not found");
  }
  return nullptr;
}

// <site-packages>/nvidia/<sub> seen from <site-packages>/transformer_engine/core.
std::string wheel_path(const std::string& sub) {
  const std::string folder = own_folder();
  return folder.empty() ? "" : folder + "/../../nvidia/" + sub;
}

struct Library {
  void* handle = nullptr;
  std::string why;
  long version = 0;
};

const Library& cudnn_library() {
  static Library lib;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("TE_CUDNN_LIBRARY");
    std::string tried;
    lib.handle = open_first(
        {env ? env : "", "libcudnn.so.9", wheel_path("cudnn/lib/libcudnn.so.9")}, &tried);
    if (lib.handle == nullptr) {
      lib.why = "cuDNN not found (pip install nvidia-cudnn-cu13, or set TE_CUDNN_LIBRARY); tried:" +
                tried;
      return;
    }
    using GetVersion = size_t (*)();
    auto get_version = reinterpret_cast<GetVersion>(dlsym(lib.handle, "cudnnGetVersion"));
    lib.version = get_version ? static_cast<long>(get_version()) : 0;
    if (lib.version < 90000) {
      lib.why =
          "cuDNN 9 is needed for fused attention; found version " + std::to_string(lib.version);
      lib.handle = nullptr;  // left open: harmless, and closing races other users
    }
  });
  return lib;
}

void* nvrtc_handle() {
  static void* handle = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string tried;
    handle = open_first({"libnvrtc.so.13", "libnvrtc.so.12", wheel_path("cu13/lib/libnvrtc.so.13"),
                         wheel_path("cuda_nvrtc/lib/libnvrtc.so.12")},
                        &tried);
  });
  return handle;
}

template <class Fn>
Fn cudnn_symbol(const char* name) {
  void* handle = cudnn_library().handle;
  return handle ? reinterpret_cast<Fn>(dlsym(handle, name)) : nullptr;
}

template <class Fn>
Fn nvrtc_symbol(const char* name) {
  void* handle = nvrtc_handle();
  return handle ? reinterpret_cast<Fn>(dlsym(handle, name)) : nullptr;
}

}  // namespace

bool library_available(std::string* why) {
  const Library& lib = cudnn_library();
  if (lib.handle == nullptr && why != nullptr) *why = lib.why;
  return lib.handle != nullptr;
}

long library_version() { return cudnn_library().version; }

}  // namespace te::attention::cudnn

// ---- The C names the frontend calls. Each resolves its symbol once.
using te::attention::cudnn::cudnn_symbol;
using te::attention::cudnn::nvrtc_symbol;

#define TE_CUDNN_FORWARD(name, params, args)                                        \
  extern "C" cudnnStatus_t CUDNNWINAPI name params {                                \
    static const auto fn = cudnn_symbol<cudnnStatus_t(CUDNNWINAPI*) params>(#name); \
    return fn ? fn args : CUDNN_STATUS_NOT_INITIALIZED;                             \
  }

#define TE_NVRTC_FORWARD(name, params, args)                           \
  extern "C" nvrtcResult name params {                                 \
    static const auto fn = nvrtc_symbol<nvrtcResult(*) params>(#name); \
    return fn ? fn args : NVRTC_ERROR_INTERNAL_ERROR;                  \
  }

TE_CUDNN_FORWARD(cudnnCreate, (cudnnHandle_t * handle), (handle))
TE_CUDNN_FORWARD(cudnnSetStream, (cudnnHandle_t handle, cudaStream_t stream), (handle, stream))
TE_CUDNN_FORWARD(cudnnGetStream, (cudnnHandle_t handle, cudaStream_t* stream), (handle, stream))
TE_CUDNN_FORWARD(cudnnBackendCreateDescriptor,
                 (cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t* descriptor),
                 (type, descriptor))
TE_CUDNN_FORWARD(cudnnBackendDestroyDescriptor, (cudnnBackendDescriptor_t descriptor), (descriptor))
TE_CUDNN_FORWARD(cudnnBackendFinalize, (cudnnBackendDescriptor_t descriptor), (descriptor))
TE_CUDNN_FORWARD(cudnnBackendSetAttribute,
                 (cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t name,
                  cudnnBackendAttributeType_t type, int64_t count, const void* elements),
                 (descriptor, name, type, count, elements))
TE_CUDNN_FORWARD(cudnnBackendGetAttribute,
                 (cudnnBackendDescriptor_t const descriptor, cudnnBackendAttributeName_t name,
                  cudnnBackendAttributeType_t type, int64_t requested, int64_t* count,
                  void* elements),
                 (descriptor, name, type, requested, count, elements))
TE_CUDNN_FORWARD(cudnnBackendExecute,
                 (cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                  cudnnBackendDescriptor_t variant_pack),
                 (handle, plan, variant_pack))
TE_CUDNN_FORWARD(cudnnGetExecutionPlanWorkspaceSize,
                 (cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                  cudnnBackendDescriptor_t variant_pack, size_t* bytes),
                 (handle, plan, variant_pack, bytes))

extern "C" size_t CUDNNWINAPI cudnnGetVersion(void) {
  return static_cast<size_t>(te::attention::cudnn::library_version());
}

extern "C" const char* CUDNNWINAPI cudnnGetErrorString(cudnnStatus_t status) {
  static const auto fn =
      cudnn_symbol<const char*(CUDNNWINAPI*)(cudnnStatus_t)>("cudnnGetErrorString");
  return fn ? fn(status) : "cuDNN not loaded";
}

extern "C" void CUDNNWINAPI cudnnGetLastErrorString(char* message, size_t max_size) {
  static const auto fn = cudnn_symbol<void(CUDNNWINAPI*)(char*, size_t)>("cudnnGetLastErrorString");
  if (fn) return fn(message, max_size);
  if (message != nullptr && max_size > 0) message[0] = '\0';
}

TE_NVRTC_FORWARD(nvrtcCreateProgram,
                 (nvrtcProgram * prog, const char* src, const char* name, int num_headers,
                  const char* const* headers, const char* const* include_names),
                 (prog, src, name, num_headers, headers, include_names))
TE_NVRTC_FORWARD(nvrtcDestroyProgram, (nvrtcProgram * prog), (prog))
TE_NVRTC_FORWARD(nvrtcCompileProgram,
                 (nvrtcProgram prog, int num_options, const char* const* options),
                 (prog, num_options, options))
TE_NVRTC_FORWARD(nvrtcGetCUBINSize, (nvrtcProgram prog, size_t* size), (prog, size))
TE_NVRTC_FORWARD(nvrtcGetCUBIN, (nvrtcProgram prog, char* cubin), (prog, cubin))
TE_NVRTC_FORWARD(nvrtcGetProgramLogSize, (nvrtcProgram prog, size_t* size), (prog, size))
TE_NVRTC_FORWARD(nvrtcGetProgramLog, (nvrtcProgram prog, char* log), (prog, log))

#endif  // TE_WITH_CUDNN
