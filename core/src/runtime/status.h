// Errors inside the core are C++ exceptions of type te::Error; every C entry
// point runs its body through te::guarded(), which turns them into a status
// and a thread-local message. No exception crosses the C boundary.
#pragma once

#include <exception>
#include <sstream>
#include <string>
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

// Builds a message from any streamable pieces: te::concat("got ", 3, " dims").
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

template <class... Parts>
[[noreturn]] void fail(te_status status, const Parts&... parts) {
  throw Error(status, concat(parts...));
}

void set_last_error(const std::string& message);
void clear_last_error();

// Runs body(); returns TE_SUCCESS, or the status of the error it threw with
// "<api_name>: <message>" stored as the thread's last error.
template <class Body>
te_status guarded(const char* api_name, Body&& body) noexcept {
  try {
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
