// The C API's statuses and its thread's last message: every exception mapped to a status code.
// Part of c_impl.hpp, on its own so that a test can check the mapping without compiling the C
// API's definitions a second time.
#pragma once

#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>

#include "../c.h"
#include "../checkpoint.hpp"
#include "../optimizer.hpp"

namespace zenflow::c_api {

// The thread's last message. Storing one may itself run out of memory: the message then becomes
// a fixed text, and no exception leaves the C boundary (fail is noexcept, and guarded's catch
// handlers call nothing that throws).
struct error_message {
  std::string text;
  const char* fixed = nullptr;  // instead of text, when text could not be stored
  const char* c_str() const noexcept { return fixed ? fixed : text.c_str(); }
};
inline error_message& last_error() noexcept {
  thread_local error_message message;
  return message;
}

inline zf_status fail(zf_status s, const char* what) noexcept {
  error_message& m = last_error();
  try {
    m.text = what;
    m.fixed = nullptr;
  } catch (...) {
    m.fixed = "zenflow: out of memory (the error's own message could not be stored)";
  }
  return s;
}

// f() with every exception mapped to a status (the most specific type first).
template <class F>
zf_status guarded(F&& f) noexcept {
  try {
    f();
    return ZF_OK;
  } catch (const checkpoint_error& e) {
    return fail(ZF_CHECKPOINT_ERROR, e.what());
  } catch (const std::invalid_argument& e) {  // config_error and argument checks
    return fail(ZF_INVALID_ARGUMENT, e.what());
  } catch (const unusable_error& e) {  // refusing work after a call that failed midway
    return fail(ZF_UNUSABLE, e.what());
  } catch (const std::bad_alloc&) {
    return fail(ZF_OUT_OF_MEMORY, "zenflow: out of memory");
  } catch (const std::system_error& e) {  // a thread or lock the system could not give: no resources
    const std::error_code c = e.code();
    const bool exhausted = c == std::errc::resource_unavailable_try_again || c == std::errc::not_enough_memory;
    return fail(exhausted ? ZF_OUT_OF_MEMORY : ZF_IO_ERROR, e.what());
  } catch (const std::runtime_error& e) {  // I/O
    return fail(ZF_IO_ERROR, e.what());
  } catch (const std::exception& e) {
    return fail(ZF_INTERNAL_ERROR, e.what());
  } catch (...) {
    return fail(ZF_INTERNAL_ERROR, "zenflow: an unknown exception");
  }
}

}  // namespace zenflow::c_api
