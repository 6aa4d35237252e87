#include "runtime/status.h"

#include <string>

namespace {
thread_local std::string last_error;
}

namespace te {

void set_last_error(const std::string& message) { last_error = message; }
void clear_last_error() { last_error.clear(); }

}  // namespace te

extern "C" {

const char* te_last_error_message(void) { return last_error.c_str(); }

const char* te_version(void) { return TE_VERSION_STRING; }

}  // extern "C"
