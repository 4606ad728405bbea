// gpumem CUDA simulator — the state the simulated libcuda.so.1 and libcudart.so.13 share.
//
// One process-wide `simulator` owns a gpumem::simulated_device and everything the CUDA APIs add
// around it: the segments handed out by cudaMalloc/cuMemAlloc (cudaFree passes no size), streams
// and events as opaque handles, pinned and registered host memory (real memory), the simulated
// clock, counters, the log. The driver library (driver.cpp) creates it on first use from the
// GPUMEM_SIM_* environment and hands it to the runtime library through
// gpumemSimInternalInstance(); both libraries compile this header, so nothing here may keep
// process-wide state outside the object (no function-local statics that are not constants).
//
// Time: with GPUMEM_SIM_EVENT_DELAY > 0 the device runs in timed mode and its clock follows the
// wall clock (sync_clock_locked moves it forward to the seconds elapsed since start), so an event
// completes that many seconds after it was recorded. Waits (cudaEventSynchronize,
// cudaStreamSynchronize, cudaDeviceSynchronize, cudaFree) do not sleep: they move the clock to the
// completion time, which then runs ahead of the wall clock.
//
// Errors: every member returns a `status` (the same value in cudaError_t and CUresult) or throws
// gpumem::cuda_error (misuse the device rejects; code() is a status) or std::bad_alloc. The APIs
// turn both into return codes; nothing throws across the C boundary.
//
// Thread safety: every member may be called from any thread; one mutex guards the handle tables
// (the device has its own, always taken after this one).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "gpumem/detail/size_units.hpp"
#include "gpumem/device/simulated_device.hpp"
#include "gpumem/error.hpp"
#include "gpumem_cudasim.h"

namespace gpumem::cudasim {

class simulator;

}  // namespace gpumem::cudasim

extern "C" {
/// The process-wide simulator, created on first call from the environment; nullptr when a setting
/// is bad (reported once on stderr). Exported by the simulated libcuda.so.1 for libcudart.so.13.
/// Thread-safe; never throws.
gpumem::cudasim::simulator* gpumemSimInternalInstance(void);
}

namespace gpumem::cudasim {

// ---------------------------------------------------------------------------------------------
// Status codes
// ---------------------------------------------------------------------------------------------

/// The results the simulator returns. Each has the same value as cudaError_t and CUresult.
enum status : int {
  ok = 0,
  invalid_value = 1,         ///< cudaErrorInvalidValue, CUDA_ERROR_INVALID_VALUE
  out_of_memory = 2,         ///< cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY
  not_initialized = 3,       ///< cudaErrorInitializationError, CUDA_ERROR_NOT_INITIALIZED
  invalid_device = 101,      ///< cudaErrorInvalidDevice, CUDA_ERROR_INVALID_DEVICE
  invalid_context = 201,     ///< cudaErrorDeviceUninitialized, CUDA_ERROR_INVALID_CONTEXT
  invalid_handle = 400,      ///< cudaErrorInvalidResourceHandle, CUDA_ERROR_INVALID_HANDLE
  not_found = 500,           ///< cudaErrorSymbolNotFound, CUDA_ERROR_NOT_FOUND
  not_ready = 600,           ///< cudaErrorNotReady, CUDA_ERROR_NOT_READY
  already_registered = 712,  ///< cudaErrorHostMemoryAlreadyRegistered, CUDA_ERROR_HOST_MEMORY_...
  not_registered = 713,      ///< cudaErrorHostMemoryNotRegistered, CUDA_ERROR_HOST_MEMORY_...
  not_supported = 801,       ///< cudaErrorNotSupported, CUDA_ERROR_NOT_SUPPORTED
  unknown = 999,             ///< cudaErrorUnknown, CUDA_ERROR_UNKNOWN
};

constexpr bool same_value(status s, cudaError_t runtime, CUresult driver) noexcept {
  return static_cast<int>(s) == static_cast<int>(runtime) &&
         static_cast<int>(s) == static_cast<int>(driver);
}
static_assert(same_value(invalid_value, cudaErrorInvalidValue, CUDA_ERROR_INVALID_VALUE));
static_assert(same_value(out_of_memory, cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY));
static_assert(same_value(not_initialized, cudaErrorInitializationError,
                         CUDA_ERROR_NOT_INITIALIZED));
static_assert(same_value(invalid_device, cudaErrorInvalidDevice, CUDA_ERROR_INVALID_DEVICE));
static_assert(same_value(invalid_context, cudaErrorDeviceUninitialized,
                         CUDA_ERROR_INVALID_CONTEXT));
static_assert(same_value(invalid_handle, cudaErrorInvalidResourceHandle,
                         CUDA_ERROR_INVALID_HANDLE));
static_assert(same_value(not_found, cudaErrorSymbolNotFound, CUDA_ERROR_NOT_FOUND));
static_assert(same_value(not_ready, cudaErrorNotReady, CUDA_ERROR_NOT_READY));
static_assert(same_value(already_registered, cudaErrorHostMemoryAlreadyRegistered,
                         CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED));
static_assert(same_value(not_registered, cudaErrorHostMemoryNotRegistered,
                         CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED));
static_assert(same_value(not_supported, cudaErrorNotSupported, CUDA_ERROR_NOT_SUPPORTED));
static_assert(same_value(unknown, cudaErrorUnknown, CUDA_ERROR_UNKNOWN));
static_assert(simulated_device::error_invalid_value == static_cast<int>(invalid_value) &&
              simulated_device::error_out_of_memory == static_cast<int>(out_of_memory) &&
              simulated_device::error_invalid_handle == static_cast<int>(invalid_handle));

// ---------------------------------------------------------------------------------------------
// Error names and descriptions
// ---------------------------------------------------------------------------------------------

struct error_text {
  int code;
  const char* name;
  const char* text;
};

/// cudaGetErrorName / cudaGetErrorString of `code`; nullptr when it is not a cudaError_t value.
/// Thread-safe; never throws.
inline const error_text* runtime_error_text(int code) noexcept {
#define GPUMEM_SIM_RUNTIME_ERROR(name, text) {static_cast<int>(name), #name, text},
  static constexpr error_text table[] = {
#include "error_tables.inc"
  };
#undef GPUMEM_SIM_RUNTIME_ERROR
  for (const error_text& e : table) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

/// The CUresult name of `code`; nullptr when it is not a CUresult value. Thread-safe; never
/// throws.
inline const char* driver_error_name(int code) noexcept {
  struct entry {
    int code;
    const char* name;
  };
#define GPUMEM_SIM_DRIVER_ERROR(name) {static_cast<int>(name), #name},
  static constexpr entry table[] = {
#include "error_tables.inc"
  };
#undef GPUMEM_SIM_DRIVER_ERROR
  for (const entry& e : table) {
    if (e.code == code) return e.name;
  }
  return nullptr;
}

/// cuGetErrorString of `code`: the runtime's description of the same value (the driver's texts
/// are the same), or nullptr when `code` is not a CUresult value. Thread-safe; never throws.
inline const char* driver_error_string(int code) noexcept {
  if (driver_error_name(code) == nullptr) return nullptr;
  if (code == CUDA_ERROR_CONTEXT_ALREADY_CURRENT) return "context already current";
  if (code == CUDA_ERROR_KEY_ROTATION) return "error during the key rotation sequence";
  const error_text* e = runtime_error_text(code);
  return e != nullptr ? e->text : "unknown error";
}

// ---------------------------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------------------------

/// What the environment says, read once when the simulator starts.
struct settings {
  std::size_t memory = std::size_t{80} << 30;  ///< GPUMEM_SIM_MEMORY
  double event_delay = 0;                      ///< GPUMEM_SIM_EVENT_DELAY, seconds
  fault_injection faults{};  ///< GPUMEM_SIM_FAIL_NTH / _ABOVE / _PROBABILITY, _SEED
  std::string log;           ///< GPUMEM_SIM_LOG: "", "stderr" or a path
};

namespace detail {

/// The value of variable `name`, or nullptr when it is unset or empty.
inline const char* env(const char* name) noexcept {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

[[noreturn]] inline void bad_setting(const char* name, const char* value, std::string_view why) {
  throw std::invalid_argument(fmt::format("{}=\"{}\": {}", name, value, why));
}

inline double parse_number(const char* name, const char* value) {
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(value, &end);
  while (end != nullptr && *end == ' ') ++end;
  if (end == value || end == nullptr || *end != '\0' || errno == ERANGE || !std::isfinite(d)) {
    bad_setting(name, value, "not a finite number");
  }
  return d;
}

inline std::uint64_t parse_count(const char* name, const char* value) {
  const char* p = value;
  while (*p == ' ') ++p;
  if (*p < '0' || *p > '9') bad_setting(name, value, "not a non-negative whole number");
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(p, &end, 10);
  while (*end == ' ') ++end;
  if (*end != '\0' || errno == ERANGE) bad_setting(name, value, "not a non-negative whole number");
  return n;
}

inline std::size_t parse_bytes(const char* name, const char* value) {
  try {
    return parse_size(value);
  } catch (const std::invalid_argument& e) {
    bad_setting(name, value, e.what());
  }
}

}  // namespace detail

/// Reads the GPUMEM_SIM_* variables. Throws std::invalid_argument naming the variable, its value
/// and the problem.
inline settings read_settings() {
  settings s;
  if (const char* v = detail::env("GPUMEM_SIM_MEMORY")) {
    s.memory = detail::parse_bytes("GPUMEM_SIM_MEMORY", v);
    if (s.memory == 0) detail::bad_setting("GPUMEM_SIM_MEMORY", v, "the device needs some memory");
  }
  if (const char* v = detail::env("GPUMEM_SIM_EVENT_DELAY")) {
    s.event_delay = detail::parse_number("GPUMEM_SIM_EVENT_DELAY", v);
    if (s.event_delay < 0) {
      detail::bad_setting("GPUMEM_SIM_EVENT_DELAY", v, "seconds must be >= 0");
    }
  }
  if (const char* v = detail::env("GPUMEM_SIM_FAIL_NTH")) {
    s.faults.fail_nth_call =
        static_cast<std::size_t>(detail::parse_count("GPUMEM_SIM_FAIL_NTH", v));
  }
  if (const char* v = detail::env("GPUMEM_SIM_FAIL_ABOVE")) {
    s.faults.fail_above_bytes = detail::parse_bytes("GPUMEM_SIM_FAIL_ABOVE", v);
  }
  if (const char* v = detail::env("GPUMEM_SIM_FAIL_PROBABILITY")) {
    s.faults.fail_probability = detail::parse_number("GPUMEM_SIM_FAIL_PROBABILITY", v);
    if (!(s.faults.fail_probability >= 0.0 && s.faults.fail_probability <= 1.0)) {
      detail::bad_setting("GPUMEM_SIM_FAIL_PROBABILITY", v, "a probability is between 0 and 1");
    }
  }
  if (const char* v = detail::env("GPUMEM_SIM_SEED")) {
    s.faults.seed = detail::parse_count("GPUMEM_SIM_SEED", v);
  }
  if (const char* v = detail::env("GPUMEM_SIM_LOG")) s.log = v;
  return s;
}

// ---------------------------------------------------------------------------------------------
// The simulated GPU's properties
// ---------------------------------------------------------------------------------------------

/// One attribute of the simulated GPU (cudaDeviceAttr and CUdevice_attribute share values).
struct attribute_value {
  int attr;
  int value;
};

/// The simulated GPU: an H200-class device (compute capability 9.0) with virtual memory
/// management, without memory pools or IPC. Attributes not listed are 0.
inline constexpr attribute_value device_attributes[] = {
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49152},
    {CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 65536},
    {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
    {CU_DEVICE_ATTRIBUTE_MAX_PITCH, 2147483647},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536},
    {CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1980000},  // kHz
    {CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512},
    {CU_DEVICE_ATTRIBUTE_GPU_OVERLAP, 1},
    {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
    {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, CU_COMPUTEMODE_DEFAULT},
    {CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT, 512},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1},
    {CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 1},
    {CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0x5e},
    {CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2619000},  // kHz
    {CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120},
    {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 50 << 20},
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048},
    {CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 2},
    {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
    {CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, 32},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
    {CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 233472},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 65536},
    {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO, 2},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 1},
    {CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 232448},
    {CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
     1},  // cuMemCreate accepts the request (PyTorch makes it); exporting handles is not
          // implemented.
    // cuMemCreate accepts the request (PyTorch makes it); exporting handles is not implemented.
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32},
    {CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE, 0},
    {CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, 1024},
    {CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 1},
    {CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT, 4},
    {CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS, 1},
    {CU_DEVICE_ATTRIBUTE_NUMA_ID, -1},
    {CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, -1},
};

/// The device's value of attribute `attr` (0 for one the simulator does not have). Returns false
/// for a value outside the enumeration. Thread-safe; never throws.
inline bool device_attribute(int attr, int& value) noexcept {
  static_assert(static_cast<int>(cudaDevAttrMax) == static_cast<int>(CU_DEVICE_ATTRIBUTE_MAX));
  if (attr <= 0 || attr >= CU_DEVICE_ATTRIBUTE_MAX) return false;
  value = 0;
  for (const attribute_value& a : device_attributes) {
    if (a.attr == attr) value = a.value;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// The simulator
// ---------------------------------------------------------------------------------------------

/// Counters of runtime calls outside the device model (gpumemSimCounters' fields).
enum class extra : std::size_t {
  memcpy_calls,
  memcpy_bytes,
  memcpy_device_calls,
  memset_calls,
  memset_bytes,
  host_alloc,
  host_free,
  host_register,
  host_unregister,
  stream_synchronize,
  stream_query,
  stream_wait_event,
  unimplemented,
  count_
};

class simulator {
 public:
  /// The device starts from `s`. Throws std::invalid_argument (a setting the device rejects, a
  /// log file that cannot be opened), std::system_error (no address space), std::bad_alloc.
  explicit simulator(const settings& s)
      : settings_(s),
        device_(make_options(s)),
        start_(std::chrono::steady_clock::now()),
        default_stream_{simulated_stream{0}, 0, 0, 0, 0.0} {
    if (s.log == "stderr") {
      log_ = stderr;
    } else if (!s.log.empty()) {
      log_ = std::fopen(s.log.c_str(), "a");
      if (log_ == nullptr) {
        throw std::invalid_argument(
            fmt::format("GPUMEM_SIM_LOG=\"{}\": cannot open it: {}", s.log, std::strerror(errno)));
      }
      std::setvbuf(log_, nullptr, _IOLBF, 0);
    }
    for (auto& c : extra_) c.store(0, std::memory_order_relaxed);
  }

  simulator(const simulator&) = delete;
  simulator& operator=(const simulator&) = delete;

  const settings& config() const noexcept { return settings_; }
  simulated_device& device() noexcept { return device_; }

  // -------------------------------------------------------------------------------------------
  // Log and counters
  // -------------------------------------------------------------------------------------------

  /// True when GPUMEM_SIM_LOG is set. Never throws.
  bool logging() const noexcept { return log_ != nullptr; }

  /// Writes one line to the log, if any. Never throws.
  void log(std::string_view line) noexcept {
    if (log_ == nullptr) return;
    std::lock_guard<std::mutex> lock(log_mutex_);
    std::fprintf(log_, "[gpumem cudasim] %.*s\n", static_cast<int>(line.size()), line.data());
  }

  /// Adds `n` to a counter. Never throws.
  void count(extra kind, std::uint64_t n = 1) noexcept {
    extra_[static_cast<std::size_t>(kind)].fetch_add(n, std::memory_order_relaxed);
  }

  /// Fills the public counters. Never throws.
  void read_counters(gpumemSimCounters& c) const {
    const call_counters calls = device_.counters();
    c.calls = gpumemSimCallCounts{calls.malloc,
                                  calls.free,
                                  calls.mem_get_info,
                                  calls.event_create,
                                  calls.event_destroy,
                                  calls.event_record,
                                  calls.event_query,
                                  calls.event_synchronize,
                                  calls.device_synchronize,
                                  calls.stream_create,
                                  calls.stream_destroy,
                                  calls.address_reserve,
                                  calls.address_free,
                                  calls.mem_create,
                                  calls.mem_release,
                                  calls.mem_map,
                                  calls.mem_unmap,
                                  calls.set_access};
    const auto get = [&](extra k) {
      return extra_[static_cast<std::size_t>(k)].load(std::memory_order_relaxed);
    };
    c.memcpy_calls = get(extra::memcpy_calls);
    c.memcpy_bytes = get(extra::memcpy_bytes);
    c.memcpy_device_calls = get(extra::memcpy_device_calls);
    c.memset_calls = get(extra::memset_calls);
    c.memset_bytes = get(extra::memset_bytes);
    c.host_alloc = get(extra::host_alloc);
    c.host_free = get(extra::host_free);
    c.host_register = get(extra::host_register);
    c.host_unregister = get(extra::host_unregister);
    c.stream_synchronize = get(extra::stream_synchronize);
    c.stream_query = get(extra::stream_query);
    c.stream_wait_event = get(extra::stream_wait_event);
    c.unimplemented = get(extra::unimplemented);
    c.total_memory = device_.total_memory();
    c.bytes_in_use = device_.bytes_in_use();
    c.peak_bytes_in_use = device_.peak_bytes_in_use();
    c.live_segments = device_.live_segments();
    c.live_reservations = device_.live_reservations();
    c.live_physical = device_.live_physical();
    c.live_mappings = device_.live_mappings();
    c.live_streams = device_.live_streams();
    c.live_events = device_.live_events();
    c.injected_faults = device_.injected_faults();
    c.out_of_memory = device_.out_of_memory_failures();
    std::lock_guard<std::mutex> lock(mutex_);
    c.host_bytes = host_bytes_;
  }

  /// Zeroes the call counts and sets the peak to the current use. Never throws.
  void reset_counters() {
    device_.reset_counters();
    device_.reset_peak_bytes_in_use();
    for (auto& c : extra_) c.store(0, std::memory_order_relaxed);
  }

  // -------------------------------------------------------------------------------------------
  // Device memory: segments
  // -------------------------------------------------------------------------------------------

  /// cudaMalloc / cuMemAlloc: *out = a new segment of `bytes` (nullptr for 0 bytes).
  status allocate(void*& out, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    out = device_.allocate(bytes);
    if (bytes == 0) return ok;
    if (out == nullptr) return out_of_memory;
    try {
      segments_.emplace(reinterpret_cast<std::uintptr_t>(out), bytes);
    } catch (...) {
      device_.deallocate(out, bytes);
      out = nullptr;
      throw;
    }
    return ok;
  }

  /// cudaFree / cuMemFree of a segment from allocate (nullptr: nothing). Synchronises the device.
  /// Throws cuda_error (invalid_value) for anything else, naming what the pointer is.
  status free(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    sync_clock_locked();
    if (ptr == nullptr) {
      device_.deallocate(nullptr, 0);
      return ok;
    }
    const auto it = segments_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == segments_.end()) {
      if (host_range_locked(ptr) != host_.end()) {
        throw cuda_error(invalid_value, fmt::format("cudaFree({}): pinned host memory; free it "
                                                    "with cudaFreeHost",
                                                    ptr));
      }
      device_.deallocate(ptr, 0);  // throws cuda_error naming what the pointer is
      throw cuda_error(invalid_value, fmt::format("cudaFree({}): not a live segment", ptr));
    }
    device_.deallocate(ptr, it->second);
    segments_.erase(it);
    return ok;
  }

  /// cudaMemGetInfo / cuMemGetInfo.
  status memory_info(std::size_t& free_bytes, std::size_t& total_bytes) {
    device_.memory_info(free_bytes, total_bytes);
    return ok;
  }

  // -------------------------------------------------------------------------------------------
  // Streams
  // -------------------------------------------------------------------------------------------

  /// cudaStreamCreateWithPriority: flags 0 or cudaStreamNonBlocking; the priority is clamped to
  /// [greatest_priority, least_priority] as CUDA does.
  status create_stream(cudaStream_t& out, unsigned flags, int priority) {
    if ((flags & ~static_cast<unsigned>(cudaStreamNonBlocking)) != 0) return invalid_value;
    std::lock_guard<std::mutex> lock(mutex_);
    const simulated_stream s = device_.create_stream();
    const std::uint64_t id = s.id;
    const int clamped = std::min(least_priority, std::max(greatest_priority, priority));
    try {
      streams_.emplace(stream_handle(id), stream_state{s, flags, clamped, id, 0.0});
    } catch (...) {
      device_.destroy_stream(s);
      throw;
    }
    out = reinterpret_cast<cudaStream_t>(stream_handle(id));
    return ok;
  }

  /// cudaStreamDestroy. The default streams cannot be destroyed (invalid_handle).
  status destroy_stream(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = streams_.find(reinterpret_cast<std::uintptr_t>(stream));
    if (it == streams_.end()) return invalid_handle;
    device_.destroy_stream(it->second.sim);
    streams_.erase(it);
    return ok;
  }

  /// cudaStreamQuery: ok when the stream's recorded work has completed, else not_ready.
  status query_stream(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    stream_state* s = find_stream_locked(stream);
    if (s == nullptr) return invalid_handle;
    sync_clock_locked();
    count(extra::stream_query);
    return timed() && device_.now() < s->last_ready ? not_ready : ok;
  }

  /// cudaStreamSynchronize: the stream's work completes (the clock moves to its completion).
  status synchronize_stream(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    stream_state* s = find_stream_locked(stream);
    if (s == nullptr) return invalid_handle;
    sync_clock_locked();
    const double now = device_.now();
    if (timed() && now < s->last_ready) device_.advance_time(s->last_ready - now);
    device_.complete_stream(s->sim);
    count(extra::stream_synchronize);
    return ok;
  }

  /// cudaStreamWaitEvent: later work on `stream` waits for the event's recorded work.
  status stream_wait_event(cudaStream_t stream, cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(mutex_);
    stream_state* s = find_stream_locked(stream);
    event_state* e = find_event_locked(event);
    if (s == nullptr || e == nullptr) return invalid_handle;
    if (e->recorded) s->last_ready = std::max(s->last_ready, e->ready);
    count(extra::stream_wait_event);
    return ok;
  }

  /// cudaStreamGetFlags / GetPriority / GetId: what the stream was created with.
  status stream_info(cudaStream_t stream, unsigned& flags, int& priority, std::uint64_t& id) {
    std::lock_guard<std::mutex> lock(mutex_);
    const stream_state* s = find_stream_locked(stream);
    if (s == nullptr) return invalid_handle;
    flags = s->flags;
    priority = s->priority;
    id = s->id;
    return ok;
  }

  /// cudaDeviceSynchronize: all work completes (the clock moves to the last completion).
  status synchronize_device() {
    std::lock_guard<std::mutex> lock(mutex_);
    sync_clock_locked();
    device_.synchronize();
    return ok;
  }

  /// CUDA's stream priorities: lower numbers are higher priorities.
  static constexpr int least_priority = 0;
  static constexpr int greatest_priority = -5;

  // -------------------------------------------------------------------------------------------
  // Events
  // -------------------------------------------------------------------------------------------

  /// cudaEventCreateWithFlags: cudaEventBlockingSync, cudaEventDisableTiming,
  /// cudaEventInterprocess (only with cudaEventDisableTiming).
  status create_event(cudaEvent_t& out, unsigned flags) {
    constexpr unsigned known =
        cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
    if ((flags & ~known) != 0) return invalid_value;
    if ((flags & cudaEventInterprocess) != 0 && (flags & cudaEventDisableTiming) == 0) {
      return invalid_value;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    const simulated_event e = device_.create_event();
    try {
      events_.emplace(event_handle(e.id), event_state{e, flags, false, 0.0, 0.0});
    } catch (...) {
      device_.destroy_event(e);
      throw;
    }
    out = reinterpret_cast<cudaEvent_t>(event_handle(e.id));
    return ok;
  }

  /// cudaEventDestroy.
  status destroy_event(cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = events_.find(reinterpret_cast<std::uintptr_t>(event));
    if (it == events_.end()) return invalid_handle;
    device_.destroy_event(it->second.sim);
    events_.erase(it);
    return ok;
  }

  /// cudaEventRecord: the event stands for the work queued on `stream` so far.
  status record_event(cudaEvent_t event, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    event_state* e = find_event_locked(event);
    stream_state* s = find_stream_locked(stream);
    if (e == nullptr || s == nullptr) return invalid_handle;
    sync_clock_locked();
    device_.record_event(e->sim, s->sim);
    e->recorded = true;
    e->recorded_at = timestamp_locked();
    e->ready = timed() ? device_.now() + settings_.event_delay : e->recorded_at;
    s->last_ready = std::max(s->last_ready, e->ready);
    return ok;
  }

  /// cudaEventQuery: ok when complete (or never recorded), else not_ready.
  status query_event(cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(mutex_);
    event_state* e = find_event_locked(event);
    if (e == nullptr) return invalid_handle;
    sync_clock_locked();
    return device_.query_event(e->sim) ? ok : not_ready;
  }

  /// cudaEventSynchronize: the event's work completes (the clock moves to its completion).
  status synchronize_event(cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(mutex_);
    event_state* e = find_event_locked(event);
    if (e == nullptr) return invalid_handle;
    sync_clock_locked();
    device_.synchronize_event(e->sim);
    return ok;
  }

  /// cudaEventElapsedTime: milliseconds between the two records. invalid_handle when either
  /// event has timing disabled or was never recorded; not_ready when either is not complete.
  status elapsed_time(float& ms, cudaEvent_t start, cudaEvent_t end) {
    std::lock_guard<std::mutex> lock(mutex_);
    const event_state* a = find_event_locked(start);
    const event_state* b = find_event_locked(end);
    if (a == nullptr || b == nullptr) return invalid_handle;
    if (((a->flags | b->flags) & cudaEventDisableTiming) != 0) return invalid_handle;
    if (!a->recorded || !b->recorded) return invalid_handle;
    sync_clock_locked();
    if (timed() && device_.now() < std::max(a->ready, b->ready)) return not_ready;
    ms = static_cast<float>((b->recorded_at - a->recorded_at) * 1000.0);
    return ok;
  }

  // -------------------------------------------------------------------------------------------
  // Host memory (real memory)
  // -------------------------------------------------------------------------------------------

  /// cudaHostAlloc: page-aligned real memory (nullptr for 0 bytes).
  status host_alloc(void*& out, std::size_t bytes, unsigned flags) {
    out = nullptr;
    if (bytes == 0) return ok;
    void* p = nullptr;
    if (::posix_memalign(&p, host_alignment, bytes) != 0 || p == nullptr) return out_of_memory;
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      host_.emplace(reinterpret_cast<std::uintptr_t>(p), host_state{bytes, flags, true});
    } catch (...) {
      std::free(p);
      throw;
    }
    host_bytes_ += bytes;
    count(extra::host_alloc);
    out = p;
    return ok;
  }

  /// cudaFreeHost of memory from host_alloc (nullptr: nothing).
  status host_free(void* ptr) {
    if (ptr == nullptr) return ok;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = host_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == host_.end() || !it->second.allocated) {
      throw cuda_error(
          invalid_value,
          fmt::format("cudaFreeHost({}): not memory from cudaHostAlloc/cudaMallocHost", ptr));
    }
    host_bytes_ -= it->second.size;
    host_.erase(it);
    std::free(ptr);
    count(extra::host_free);
    return ok;
  }

  /// cudaHostRegister of [ptr, ptr + bytes), which must not overlap pinned memory.
  status host_register(void* ptr, std::size_t bytes, unsigned flags) {
    if (ptr == nullptr || bytes == 0) return invalid_value;
    const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
    if (bytes > UINTPTR_MAX - begin || device_.is_device_pointer(ptr)) return invalid_value;
    std::lock_guard<std::mutex> lock(mutex_);
    auto next = host_.lower_bound(begin);
    if (next != host_.end() && next->first < begin + bytes) return already_registered;
    if (next != host_.begin() && std::prev(next)->first + std::prev(next)->second.size > begin) {
      return already_registered;
    }
    host_.emplace_hint(next, begin, host_state{bytes, flags, false});
    host_bytes_ += bytes;
    count(extra::host_register);
    return ok;
  }

  /// cudaHostUnregister of a range registered at `ptr`.
  status host_unregister(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = host_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == host_.end() || it->second.allocated) return not_registered;
    host_bytes_ -= it->second.size;
    host_.erase(it);
    count(extra::host_unregister);
    return ok;
  }

  /// The pinned (allocated or registered) range holding `ptr`: true and its start, size and
  /// flags, or false.
  bool find_host(const void* ptr, void*& base, std::size_t& size, unsigned& flags) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = host_range_locked(ptr);
    if (it == host_.end()) return false;
    base = reinterpret_cast<void*>(it->first);
    size = it->second.size;
    flags = it->second.flags;
    return true;
  }

  // -------------------------------------------------------------------------------------------
  // Copies and fills
  // -------------------------------------------------------------------------------------------

  /// cudaMemcpy: copies when both sides are host memory; with a device side nothing is touched
  /// (the call is only counted). The device side must lie in the device's address range.
  status copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return ok;
    if (dst == nullptr || src == nullptr) return invalid_value;
    const bool device_side = device_.is_device_pointer(dst) || device_.is_device_pointer(src);
    if (!device_side) std::memmove(dst, src, bytes);
    count(extra::memcpy_calls);
    count(extra::memcpy_bytes, bytes);
    if (device_side) count(extra::memcpy_device_calls);
    return ok;
  }

  /// cudaMemset: device memory is not touched (counted only); pinned host memory is set; other
  /// host memory is an error, as in CUDA.
  status fill(void* dst, int value, std::size_t bytes) {
    if (bytes == 0) return ok;
    if (dst == nullptr) return invalid_value;
    if (!device_.is_device_pointer(dst)) {
      void* base = nullptr;
      std::size_t size = 0;
      unsigned flags = 0;
      if (!find_host(dst, base, size, flags) ||
          bytes > size - (static_cast<char*>(dst) - static_cast<char*>(base))) {
        return invalid_value;
      }
      std::memset(dst, value, bytes);
    }
    count(extra::memset_calls);
    count(extra::memset_bytes, bytes);
    return ok;
  }

  /// True when `stream` is a live stream or a default stream.
  bool valid_stream(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    return find_stream_locked(stream) != nullptr;
  }

  /// The device's name.
  std::string device_name() const {
    return fmt::format("gpumem simulated GPU ({})", format_bytes(device_.total_memory()));
  }

  static constexpr std::size_t host_alignment = 4096;

 private:
  struct stream_state {
    simulated_stream sim;
    unsigned flags;
    int priority;
    std::uint64_t id;
    double last_ready;  // latest completion time of work recorded on it (timed mode)
  };
  struct event_state {
    simulated_event sim;
    unsigned flags;
    bool recorded;
    double recorded_at;  // timestamp of the last record (cudaEventElapsedTime)
    double ready;        // completion time of the last record
  };
  struct host_state {
    std::size_t size;
    unsigned flags;
    bool allocated;  // cudaHostAlloc (true) or cudaHostRegister (false)
  };

  // Opaque handles: never dereferenced, never reused, apart from the default streams 0, 1, 2.
  static constexpr std::uintptr_t stream_base = 0x5e0000000000;
  static constexpr std::uintptr_t event_base = 0x5e1000000000;
  static std::uintptr_t stream_handle(std::uint64_t id) noexcept { return stream_base + id * 16; }
  static std::uintptr_t event_handle(std::uint64_t id) noexcept { return event_base + id * 16; }

  static simulated_device::options make_options(const settings& s) {
    simulated_device::options o;
    o.capacity = s.memory;
    o.completion = s.event_delay > 0 ? event_completion::timed : event_completion::immediate;
    o.event_delay_seconds = s.event_delay;
    o.faults = s.faults;
    return o;
  }

  bool timed() const noexcept { return settings_.event_delay > 0; }

  double wall_seconds() const noexcept {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  // Timed mode: the device's clock catches up with the wall clock.
  void sync_clock_locked() {
    if (!timed()) return;
    const double wall = wall_seconds();
    const double now = device_.now();
    if (wall > now) device_.advance_time(wall - now);
  }

  // When an event is recorded: the simulated clock (timed mode) or the wall clock.
  double timestamp_locked() const { return timed() ? device_.now() : wall_seconds(); }

  stream_state* find_stream_locked(cudaStream_t stream) noexcept {
    if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
      return &default_stream_;
    }
    const auto it = streams_.find(reinterpret_cast<std::uintptr_t>(stream));
    return it == streams_.end() ? nullptr : &it->second;
  }

  event_state* find_event_locked(cudaEvent_t event) noexcept {
    const auto it = events_.find(reinterpret_cast<std::uintptr_t>(event));
    return it == events_.end() ? nullptr : &it->second;
  }

  std::map<std::uintptr_t, host_state>::const_iterator host_range_locked(const void* ptr) const {
    const auto p = reinterpret_cast<std::uintptr_t>(ptr);
    auto next = host_.upper_bound(p);
    if (next == host_.begin()) return host_.end();
    const auto it = std::prev(next);
    return p - it->first < it->second.size ? it : host_.end();
  }

  const settings settings_;
  simulated_device device_;
  const std::chrono::steady_clock::time_point start_;
  std::FILE* log_ = nullptr;
  std::mutex log_mutex_;

  mutable std::mutex mutex_;
  std::unordered_map<std::uintptr_t, std::size_t> segments_;
  stream_state default_stream_;
  std::unordered_map<std::uintptr_t, stream_state> streams_;
  std::unordered_map<std::uintptr_t, event_state> events_;
  std::map<std::uintptr_t, host_state> host_;
  std::size_t host_bytes_ = 0;
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(extra::count_)> extra_;
};

// ---------------------------------------------------------------------------------------------
// Calling convention of every exported function
// ---------------------------------------------------------------------------------------------

/// Which API a call belongs to (how its results are named in the log).
enum class api { runtime, driver };

/// The name of result `code` of `which` API ("cudaErrorInvalidValue", "CUDA_ERROR_NOT_FOUND").
/// Never throws.
inline const char* result_name(api which, int code) noexcept {
  if (which == api::driver) {
    const char* name = driver_error_name(code);
    return name != nullptr ? name : "unrecognized CUresult";
  }
  const error_text* e = runtime_error_text(code);
  return e != nullptr ? e->name : "unrecognized error code";
}

/// Runs `body` (returning a status) and turns whatever it throws into a status: cuda_error into
/// its code, std::bad_alloc into out_of_memory, anything else into unknown. When logging, logs
/// the call (`args()` gives its arguments as text), its result and, for a failure, the reason.
/// Never throws.
template <class Args, class Body>
int call(simulator& sim, api which, const char* name, const Args& args, const Body& body) noexcept {
  int result = unknown;
  std::string reason;
  try {
    result = static_cast<int>(body());
  } catch (const cuda_error& e) {
    result = e.code();
    reason = e.what();
  } catch (const std::bad_alloc&) {
    result = out_of_memory;
    reason = "host memory exhausted";
  } catch (const std::exception& e) {
    result = unknown;
    reason = e.what();
  } catch (...) {
    result = unknown;
    reason = "unknown exception";
  }
  if (sim.logging()) {
    try {
      sim.log(fmt::format("{}({}) = {}{}{}", name, args(), result_name(which, result),
                          reason.empty() ? "" : ": ", reason));
    } catch (...) {
    }
  }
  return result;
}

}  // namespace gpumem::cudasim
