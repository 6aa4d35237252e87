// The aliasing rule of the C API: an argument a call writes (an output, in-place
// state, a workspace) shares no byte with any other argument of that call,
// except the in-place forms a header documents (allow_alias). te::Arg records
// every descriptor it checks in the frame of the current call (guarded() opens
// one); TE_DISPATCH runs check_aliasing() before a backend touches memory.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace te {
namespace {

// A copy of each descriptor: a check may describe a stand-in that lives on
// the stack of a helper (gemm_block's placeholders), so only the copy is read
// later; the address serves as the argument's identity.
struct Checked {
  const te_tensor* id;
  te_tensor t;
  std::string name;
  bool written;
};

struct Frame {
  std::vector<Checked> args;
  std::vector<std::pair<const te_tensor*, const te_tensor*>> allowed;
};

thread_local Frame* current = nullptr;

bool same_device(const te_tensor& a, const te_tensor& b) {
  return a.device_type == b.device_type &&
         (a.device_type != TE_DEVICE_CUDA || a.device_index == b.device_index);
}

bool overlap(const te_tensor& a, const te_tensor& b) {
  const auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  const auto a1 = a0 + static_cast<uintptr_t>(size_bytes(a));
  const auto b1 = b0 + static_cast<uintptr_t>(size_bytes(b));
  return a0 < b1 && b0 < a1;
}

bool allowed(const Frame& f, const Checked& x, const Checked& y) {
  for (const auto& [w, r] : f.allowed)
    if ((w == x.id && r == y.id) || (w == y.id && r == x.id))
      return x.t.data == y.t.data && size_bytes(x.t) == size_bytes(y.t);
  return false;
}

}  // namespace

ArgFrame::ArgFrame() : saved_(current) { current = new Frame(); }

ArgFrame::~ArgFrame() {
  delete current;
  current = static_cast<Frame*>(saved_);
}

void record_arg(const te_tensor* t, const char* name) {
  if (current == nullptr) return;  // an internal check outside an entry point
  // The same descriptor under the same name is one argument checked twice; under
  // another name it is the caller passing one buffer as two arguments.
  for (const auto& c : current->args)
    if (c.id == t && c.name == name) return;
  current->args.push_back({t, *t, name, false});
}

void mark_written(const te_tensor* t) {
  if (current == nullptr) return;
  // The latest record of t: the one the Arg just made (a descriptor passed as
  // two arguments has two records, and only this one is written).
  for (auto it = current->args.rbegin(); it != current->args.rend(); ++it)
    if (it->id == t) {
      it->written = true;
      return;
    }
}

void forget_arg(const te_tensor* t) {
  if (current == nullptr) return;
  auto& args = current->args;
  for (size_t i = args.size(); i-- > 0;)
    if (args[i].id == t) args.erase(args.begin() + static_cast<std::ptrdiff_t>(i));
}

void allow_alias(const te_tensor* written, const te_tensor* read) {
  if (current != nullptr && written != nullptr && read != nullptr)
    current->allowed.emplace_back(written, read);
}

void check_aliasing() {
  if (current == nullptr) return;
  const auto& args = current->args;
  for (size_t i = 0; i < args.size(); ++i) {
    for (size_t j = i + 1; j < args.size(); ++j) {
      const Checked &a = args[i], &b = args[j];
      if (!(a.written || b.written) || !same_device(a.t, b.t)) continue;
      if (size_bytes(a.t) == 0 || size_bytes(b.t) == 0 || !overlap(a.t, b.t)) continue;
      if (allowed(*current, a, b)) continue;
      const Checked& w = a.written ? a : b;
      const Checked& other = a.written ? b : a;
      fail(TE_ERROR_INVALID_ARGUMENT, "argument '", w.name, "' is written by this call but shares ",
           "memory with argument '", other.name, "'; pass non-overlapping buffers");
    }
  }
}

}  // namespace te
