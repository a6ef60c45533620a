// The shims' one way of handing a C++ failure to Rust: a return status and a malloc'd message
// (released by the shim's own `*_free_string`), so no C++ exception crosses into Rust.
#pragma once

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <exception>

namespace ups_shim {

inline char* dup_message(const char* text) {
  size_t n = std::strlen(text);
  char* out = static_cast<char*>(std::malloc(n + 1));
  if (out != nullptr) {
    std::memcpy(out, text, n + 1);
  }
  return out;
}

// Runs f, turning any exception into *err. c10::Error's what() carries a C++ backtrace in some
// builds; what_without_backtrace() is the message users know from Python.
template <typename F>
int guarded(char** err, F&& f) {
  try {
    f();
    return 0;
  } catch (const c10::Error& e) {
    *err = dup_message(e.what_without_backtrace());
  } catch (const std::exception& e) {
    *err = dup_message(e.what());
  } catch (...) {
    *err = dup_message("unknown C++ exception");
  }
  return -1;
}

}  // namespace ups_shim
