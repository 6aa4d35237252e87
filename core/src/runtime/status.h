// Errors inside the core are C++ exceptions of type te::Error; every C entry
// point runs its body through te::guarded(), which turns them into a status
// and a thread-local message. No exception crosses the C boundary.
#pragma once

#include <cstdio>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>

#include "te/types.h"

namespace te {

class Error : public std::exception {
 public:
  Error(te_status status, std::string message) : status_(status), message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }
  te_status status() const { return status_; }

 private:
  te_status status_;
  std::string message_;
};

// Appends one piece of a message. Plain string/number formatting, no
// iostreams: messages must be safe to build in any host process.
inline void append_piece(std::string& out, const char* s) { out += s; }
inline void append_piece(std::string& out, const std::string& s) { out += s; }
inline void append_piece(std::string& out, char c) { out += c; }
template <class T>
void append_piece(std::string& out, T value) {
  if constexpr (std::is_floating_point_v<T>) {
    char buffer[32];
    std::snprintf(buffer, sizeof(buffer), "%g", static_cast<double>(value));
    out += buffer;
  } else {
    static_assert(std::is_integral_v<T> || std::is_enum_v<T>, "unsupported message piece");
    out += std::to_string(static_cast<long long>(value));
  }
}

// Builds a message from pieces: te::concat("got ", 3, " dims").
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::string out;
  (append_piece(out, parts), ...);
  return out;
}

template <class... Parts>
[[noreturn]] void fail(te_status status, const Parts&... parts) {
  throw Error(status, concat(parts...));
}

void set_last_error(const std::string& message);
void clear_last_error();

// The descriptors one entry point has checked (te::Arg registers them), for
// the aliasing check of TE_DISPATCH (runtime/tensor.h). guarded() opens one
// frame per call and restores the caller's on return, so nested calls keep
// their own lists.
class ArgFrame {
 public:
  ArgFrame();
  ~ArgFrame();
  ArgFrame(const ArgFrame&) = delete;
  ArgFrame& operator=(const ArgFrame&) = delete;

 private:
  void* saved_;
};

// Runs body(); returns TE_SUCCESS, or the status of the error it threw with
// "<api_name>: <message>" stored as the thread's last error.
template <class Body>
te_status guarded(const char* api_name, Body&& body) noexcept {
  try {
    ArgFrame frame;
    body();
    clear_last_error();
    return TE_SUCCESS;
  } catch (const Error& e) {
    set_last_error(concat(api_name, ": ", e.what()));
    return e.status();
  } catch (const std::exception& e) {
    set_last_error(concat(api_name, ": internal error: ", e.what()));
    return TE_ERROR_INTERNAL;
  } catch (...) {
    set_last_error(concat(api_name, ": internal error"));
    return TE_ERROR_INTERNAL;
  }
}

}  // namespace te
