// extern "C" shim over libtorch's c10d::TCPStore, used by src/trainer/dist/store.rs.
//
// Contract: no C++ exception ever crosses this boundary. Every entry point that can fail returns
// 0 on success and -1 on failure, with *err set to a malloc'd, NUL-terminated message that the
// caller releases with ups_store_free_string. Buffers handed out are malloc'd and released with
// ups_store_free_buf.

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <c10/util/Logging.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "shim_error.h"

namespace {

using ups_shim::dup_message;
using ups_shim::guarded;

} // namespace

extern "C" {

int ups_store_new(const char* host, uint16_t port, int is_server, uint64_t world_size,
                  int64_t timeout_ms, int use_libuv, int listen_fd, void** out, uint16_t* out_port,
                  char** err) {
  return guarded(err, [&] {
    // libtorch leaves logging set-up to its host; Python's torch calls this at import. Without
    // it TORCH_CPP_LOG_LEVEL is ignored and users cannot quiet c10d's retry warnings as they can
    // under torchrun.
    static std::once_flag logging_once;
    std::call_once(logging_once, [] { c10::initLogging(); });
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = is_server != 0;
    opts.numWorkers = static_cast<std::size_t>(world_size);
    // Rank 0 must not block in the constructor until every rank joined: rendezvous is the
    // trainer's business (it reports the wait as a phase), not the store's.
    opts.waitWorkers = false;
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    opts.useLibUV = use_libuv != 0;
    // The server would listen on every interface; a socket the caller bound (to MASTER_ADDR)
    // keeps it where the caller chose, as torchrun's `master_listen_fd` does.
    if (listen_fd >= 0) {
      opts.masterListenFd = listen_fd;
    }
    auto* store = new c10d::TCPStore(std::string(host), opts);
    *out_port = store->getPort();
    *out = store;
  });
}

void ups_store_free(void* store) {
  // The destructor joins the server thread; it is noexcept, but be defensive all the same.
  try {
    delete static_cast<c10d::TCPStore*>(store);
  } catch (...) {
  }
}

int ups_store_set(void* store, const char* key, size_t key_len, const uint8_t* value,
                  size_t value_len, char** err) {
  return guarded(err, [&] {
    std::vector<uint8_t> v(value, value + value_len);
    static_cast<c10d::TCPStore*>(store)->set(std::string(key, key_len), v);
  });
}

int ups_store_get(void* store, const char* key, size_t key_len, uint8_t** out, size_t* out_len,
                  char** err) {
  return guarded(err, [&] {
    std::vector<uint8_t> v = static_cast<c10d::TCPStore*>(store)->get(std::string(key, key_len));
    uint8_t* buf = static_cast<uint8_t*>(std::malloc(v.empty() ? 1 : v.size()));
    if (buf == nullptr) {
      throw std::bad_alloc();
    }
    if (!v.empty()) {
      std::memcpy(buf, v.data(), v.size());
    }
    *out = buf;
    *out_len = v.size();
  });
}

int ups_store_add(void* store, const char* key, size_t key_len, int64_t delta, int64_t* out,
                  char** err) {
  return guarded(err, [&] {
    *out = static_cast<c10d::TCPStore*>(store)->add(std::string(key, key_len), delta);
  });
}

int ups_store_is_libuv(void* store) {
  return static_cast<c10d::TCPStore*>(store)->isLibUvBackend() ? 1 : 0;
}

void ups_store_free_buf(uint8_t* buf) { std::free(buf); }

void ups_store_free_string(char* s) { std::free(s); }

} // extern "C"
