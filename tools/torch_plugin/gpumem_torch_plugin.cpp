// libgpumem_torch.so: installs gpumem as PyTorch's CUDA allocator when loaded, and exports the C
// interface of gpumem_torch.h (CUDAPluggableAllocator entry points, statistics, summary).
#include "gpumem_torch.h"

#include <c10/cuda/CUDAGuard.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "gpumem/stats_io.hpp"
#include "gpumem/torch/cuda_allocator.hpp"

namespace {

std::string& last_error() {
  thread_local std::string message;
  return message;
}

// Runs f, turning every exception into -1 and gpumem_last_error(): nothing crosses the C boundary.
template <class F>
int guarded(F&& f) noexcept {
  try {
    last_error().clear();
    f();
    return 0;
  } catch (const std::exception& e) {
    last_error() = e.what();
  } catch (...) {
    last_error() = "gpumem: unknown error";
  }
  return -1;
}

gpumem::torch::cuda_allocator& require_installed() {
  gpumem::torch::cuda_allocator* a = gpumem::torch::installed();
  if (a == nullptr) {
    throw gpumem::usage_error(
        "gpumem is not PyTorch's CUDA allocator in this process (see the message printed when "
        "libgpumem_torch.so was loaded)");
  }
  return *a;
}

size_t copy_out(const std::string& text, char* buf, size_t len) noexcept {
  if (buf != nullptr && len > 0) {
    const size_t n = std::min(text.size(), len - 1);
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
  }
  return text.size();
}

c10::DeviceIndex device_index(int device) {
  if (device < 0 || device > 127) {
    throw gpumem::usage_error("gpumem: invalid CUDA device index " + std::to_string(device));
  }
  return static_cast<c10::DeviceIndex>(device);
}

// The CUDAPluggableAllocator route replaces gpumem's full adapter as PyTorch's allocator: say
// once what it loses (record_stream, unless gpumem_record_stream is registered).
void warn_pluggable_route_once(gpumem::torch::cuda_allocator& a) {
  static std::atomic<bool> warned{false};
  if (c10::cuda::CUDACachingAllocator::get() == &a || warned.exchange(true)) return;
  std::fprintf(stderr,
               "gpumem: used through CUDAPluggableAllocator, which replaces gpumem's adapter: "
               "tensor.record_stream() is ignored unless gpumem_record_stream is registered "
               "(set_record_stream_fn, from C++), and memory stats, snapshots and CUDA-graph "
               "pools are PyTorch's pluggable allocator's; load libgpumem_torch.so without "
               "change_current_allocator to keep them\n");
}

// Installs at load, unless GPUMEM_TORCH_INSTALL_AT_LOAD=0 (then gpumem_install does). Reported
// once, on stderr, when it cannot.
struct install_at_load {
  install_at_load() noexcept {
    const char* at_load = std::getenv("GPUMEM_TORCH_INSTALL_AT_LOAD");
    if (at_load != nullptr && std::strcmp(at_load, "0") == 0) return;
    try {
      gpumem::torch::install(gpumem::allocator_config::from_environment());
    } catch (const std::exception& e) {
      std::fprintf(stderr,
                   "gpumem: libgpumem_torch.so did not install gpumem; PyTorch's own CUDA "
                   "allocator stays in use: %s\n",
                   e.what());
    }
  }
} const installer;

// torch.cuda.memory_stats()'s keys for the torch this plugin was built against: it has
// num_oom_rejections from 2.12 only.
std::string memory_stats_json(const gpumem::device_stats& stats) {
#if GPUMEM_TORCH_AT_LEAST(2, 12)
  return gpumem::to_json(stats);
#else
  // The writer of gpumem::to_json, so that both spell the object as json.dumps does.
  gpumem::detail::json_writer w(-1);
  w.open();
  for (const auto& [key, value] : gpumem::flatten(stats)) {
    if (key == "num_oom_rejections") continue;
    w.key(key);
    w.value(value);
  }
  w.close();
  return w.take();
#endif
}

}  // namespace

extern "C" {

int gpumem_installed(void) {
  return gpumem::torch::installed() != nullptr ? 1 : 0;
}

const char* gpumem_last_error(void) {
  return last_error().c_str();
}

int gpumem_install(const char* settings) {
  bool bad_settings = false;
  const int rc = guarded([&] {
    gpumem::allocator_config config;
    try {
      config = gpumem::allocator_config::resolve(settings != nullptr ? settings : "");
    } catch (const gpumem::config_error&) {
      bad_settings = true;
      throw;
    }
    gpumem::torch::install(config);
  });
  return rc == 0 ? 0 : (bad_settings ? -2 : -1);
}

const char* gpumem_torch_version(void) {
  return GPUMEM_TORCH_BUILD_VERSION;
}

void* gpumem_malloc(ssize_t size, int device, gpumem_stream_t stream) {
  void* ptr = nullptr;
  const int rc = guarded([&] {
    if (size < 0) throw gpumem::usage_error("gpumem_malloc: negative size " + std::to_string(size));
    gpumem::torch::cuda_allocator& a = require_installed();
    warn_pluggable_route_once(a);
    c10::cuda::CUDAGuard guard(device_index(device));
    ptr = a.raw_alloc_with_stream(static_cast<size_t>(size), stream);
  });
  if (rc != 0) std::fprintf(stderr, "gpumem_malloc: %s\n", last_error().c_str());
  return ptr;
}

void gpumem_free(void* ptr, ssize_t, int, gpumem_stream_t) {
  const int rc = guarded([&] { require_installed().raw_delete(ptr); });
  if (rc != 0) std::fprintf(stderr, "gpumem_free: %s\n", last_error().c_str());
}

void gpumem_record_stream(void* ptr, gpumem_stream_t stream) {
  const int rc = guarded([&] {
    gpumem::torch::cuda_allocator& a = require_installed();
    a.default_pool(0);  // the devices are set up
    a.record_stream_raw(ptr, stream);
  });
  if (rc != 0) std::fprintf(stderr, "gpumem_record_stream: %s\n", last_error().c_str());
}

size_t gpumem_memory_summary(int device, char* buf, size_t len) {
  std::string text;
  if (guarded([&] { text = require_installed().memory_summary(device_index(device)); }) != 0) {
    return static_cast<size_t>(-1);
  }
  return copy_out(text, buf, len);
}

size_t gpumem_memory_stats_json(int device, char* buf, size_t len) {
  std::string text;
  const int rc = guarded([&] {
    text = memory_stats_json(require_installed().default_pool(device_index(device)).stats());
  });
  if (rc != 0) return static_cast<size_t>(-1);
  return copy_out(text, buf, len);
}

int gpumem_empty_cache(void) {
  return guarded([] { require_installed().emptyCache(); });
}

int gpumem_reset_peak_stats(int device) {
  return guarded([&] { require_installed().resetPeakStats(device_index(device)); });
}

int gpumem_set_legacy_segments(int on) {
  int before = -1;
  guarded([&] {
    gpumem::torch::cuda_allocator& a = require_installed();
    before = a.legacy_segments() ? 1 : 0;
    a.set_legacy_segments(on != 0);
  });
  return before;
}

}  // extern "C"
