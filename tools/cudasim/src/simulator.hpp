// gpumem CUDA simulator — the state the simulated libcuda.so.1 and libcudart.so.13 share.
//
// One process-wide `simulator` owns GPUMEM_SIM_DEVICES gpumem::simulated_device objects (each
// device's memory: segments and VMM, in its own address range, so the devices' addresses never
// overlap) and everything the CUDA APIs add around them: the segments handed out by
// cudaMalloc/cuMemAlloc (cudaFree passes no size), a mirror of each device's VMM mappings with
// the devices that may access them, peer access, streams and events as opaque handles, stream
// capture and graphs, work in flight, pinned and registered host memory (real memory), the
// simulated clock, counters, violations, the log. The driver library (driver.cpp) creates it on
// first use from the GPUMEM_SIM_* environment and hands it to the runtime library through
// gpumemSimInternalInstance(); both libraries compile this header, so nothing here may keep
// process-wide state outside the object (no function-local statics that are not constants), and
// per-thread state lives in the driver library (gpumemSimInternalThread()).
//
// Time (README.md, "Time"). One simulated host clock, host_now_, in seconds: it follows the wall
// clock (the seconds since the simulator started) and jumps ahead when the host waits
// (synchronisations do not sleep). Every stream has a timeline: work starts at the latest of the
// host clock when it is enqueued, the end of the stream's previous work and of the work it waits
// for (events, the legacy default stream), and ends its duration later (copies and fills:
// bytes / GPUMEM_SIM_BANDWIDTH; kernels: GPUMEM_SIM_KERNEL_TIME; gpumemSimLaunchWork: its
// seconds). An event completes when its stream's work before it has ended (and, with
// GPUMEM_SIM_EVENT_DELAY, no earlier than that long after it was recorded). A query reports
// completion when the host clock has reached it; a synchronisation moves the host clock there.
//
// Order (order.hpp). Besides time, the simulator tracks what the program may *know*: which work
// is ordered before which (stream order, events, waits, the legacy stream) and which work the host
// has seen complete. The rules (README.md, "What the simulator checks") use only that, never the
// timeline, so a violation does not depend on how fast anything ran.
//
// Errors: every member returns a `status` (the same value in cudaError_t and CUresult) or throws
// gpumem::cuda_error (misuse; code() is a status; the message is logged) or std::bad_alloc. The
// APIs turn both into return codes; nothing throws across the C boundary.
//
// Thread safety: every member may be called from any thread; one mutex guards the simulator's
// state (each device has its own, always taken after this one).
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
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpumem/detail/size_units.hpp"
#include "gpumem/device/simulated_device.hpp"
#include "gpumem/error.hpp"
#include "gpumem_cudasim.h"
#include "order.hpp"
#include "settings.hpp"
#include "status.hpp"

namespace gpumem::cudasim {

class simulator;

/// What the CUDA libraries keep per host thread: the driver's context stack (its top is the
/// current context), the device the runtime uses while no context is current (cudaSetDevice),
/// and the thread's stream capture interaction mode (cudaThreadExchangeStreamCaptureMode).
struct thread_state {
  std::vector<CUcontext> contexts;
  int runtime_device = 0;
  cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;

  CUcontext current() const noexcept { return contexts.empty() ? nullptr : contexts.back(); }
  /// cuCtxSetCurrent: replaces the top of the stack (pops it for nullptr).
  void set_current(CUcontext ctx) {
    if (ctx == nullptr) {
      if (!contexts.empty()) contexts.pop_back();
    } else if (contexts.empty()) {
      contexts.push_back(ctx);
    } else {
      contexts.back() = ctx;
    }
  }
};

}  // namespace gpumem::cudasim

extern "C" {
/// The process-wide simulator, created on first call from the environment; nullptr when a setting
/// is bad (reported once on stderr). Exported by the simulated libcuda.so.1 for libcudart.so.13.
/// Thread-safe; never throws.
gpumem::cudasim::simulator* gpumemSimInternalInstance(void);
/// The calling thread's state, kept by libcuda.so.1 for both libraries. Never throws.
gpumem::cudasim::thread_state* gpumemSimInternalThread(void);
}

namespace gpumem::cudasim {

// ---------------------------------------------------------------------------------------------
// Counters
// ---------------------------------------------------------------------------------------------

/// Counters of calls outside the device model (gpumemSimCounters' fields).
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
  kernel_launches,
  work_launches,
  memcpy_peer_calls,
  captures,
  captures_invalidated,
  graph_launches,
  count_
};

/// The kinds of violation of the GPU's rules (README.md, "What the simulator checks").
enum class violation : std::size_t {
  unmapped,      ///< work touched bytes that are not allocated or mapped
  inaccessible,  ///< work touched mapped bytes its device may not access
  in_flight,     ///< memory was unmapped while work the host has not seen complete touched it
  race,          ///< unordered works on two streams touched the same bytes, one of them writing
  count_
};

// ---------------------------------------------------------------------------------------------
// The simulator
// ---------------------------------------------------------------------------------------------

class simulator {
 public:
  /// The devices start from `s`. Throws std::invalid_argument (a setting the device rejects, a
  /// log file that cannot be opened), std::system_error (no address space), std::bad_alloc.
  explicit simulator(const settings& s) : settings_(s), start_(std::chrono::steady_clock::now()) {
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
    devices_.resize(static_cast<std::size_t>(s.devices));
    for (int d = 0; d < s.devices; ++d) {
      device_state& dev = devices_[static_cast<std::size_t>(d)];
      dev.mem = make_device(s, d);
      dev.legacy = next_stream_id_++;
      stream_state legacy;
      legacy.id = dev.legacy;
      legacy.device = d;
      legacy.legacy = true;
      legacy.sim = dev.mem->default_stream();
      streams_.emplace(dev.legacy, std::move(legacy));
    }
  }

  simulator(const simulator&) = delete;
  simulator& operator=(const simulator&) = delete;

  const settings& config() const noexcept { return settings_; }
  int device_count() const noexcept { return settings_.devices; }
  bool valid_device(int d) const noexcept { return d >= 0 && d < settings_.devices; }
  /// Device `d`'s memory (d must be valid).
  simulated_device& device(int d) noexcept { return *devices_[static_cast<std::size_t>(d)].mem; }

  /// The handle of device `d`'s primary context, and the device of a context handle (-1 when it
  /// is not one). Never throw.
  static CUcontext primary_context(int d) noexcept {
    return reinterpret_cast<CUcontext>(context_base + static_cast<std::uintptr_t>(d) * 16);
  }
  int context_device(CUcontext ctx) const noexcept {
    const auto h = reinterpret_cast<std::uintptr_t>(ctx);
    if (h < context_base || (h - context_base) % 16 != 0) return -1;
    const std::uintptr_t d = (h - context_base) / 16;
    return d < static_cast<std::uintptr_t>(settings_.devices) ? static_cast<int>(d) : -1;
  }

  /// cuDevicePrimaryCtxRetain / Release / GetState: the primary context's reference count.
  void retain_primary(int d) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++dev(d).primary_retains;
  }
  bool release_primary(int d) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (dev(d).primary_retains <= 0) return false;
    --dev(d).primary_retains;
    return true;
  }
  bool primary_active(int d) {
    std::lock_guard<std::mutex> lock(mutex_);
    return dev(d).primary_retains > 0;
  }
  /// The runtime retains each device's primary context once, when it first uses the device.
  void retain_primary_for_runtime(int d) {
    std::lock_guard<std::mutex> lock(mutex_);
    device_state& x = dev(d);
    if (!x.runtime_retained) {
      x.runtime_retained = true;
      ++x.primary_retains;
    }
  }

  // -------------------------------------------------------------------------------------------
  // Log, counters, violations
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

  /// Fills the public counters: the process's (device -1: every device's summed) or one
  /// device's. Never throws but std::bad_alloc.
  void read_counters(gpumemSimCounters& c, int device = -1) const {
    std::lock_guard<std::mutex> lock(mutex_);
    c = gpumemSimCounters{};
    for (int d = 0; d < settings_.devices; ++d) {
      if (device >= 0 && d != device) continue;
      const simulated_device& m = *devices_[static_cast<std::size_t>(d)].mem;
      const call_counters calls = m.counters();
      add_calls(c.calls, calls);
      c.total_memory += m.total_memory();
      c.bytes_in_use += m.bytes_in_use();
      c.peak_bytes_in_use += m.peak_bytes_in_use();
      c.live_segments += m.live_segments();
      c.live_reservations += m.live_reservations();
      c.live_physical += m.live_physical();
      c.live_mappings += m.live_mappings();
      c.live_events += m.live_events();
      c.injected_faults += m.injected_faults();
      c.out_of_memory += m.out_of_memory_failures();
      c.faulted_devices += devices_[static_cast<std::size_t>(d)].faulted ? 1 : 0;
    }
    for (const auto& [id, s] : streams_) {
      if (s.alive && !s.legacy && (device < 0 || s.device == device)) ++c.live_streams;
    }
    c.devices = device >= 0 ? 1 : static_cast<unsigned long long>(settings_.devices);
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
    c.kernel_launches = get(extra::kernel_launches);
    c.work_launches = get(extra::work_launches);
    c.memcpy_peer_calls = get(extra::memcpy_peer_calls);
    c.captures = get(extra::captures);
    c.captures_invalidated = get(extra::captures_invalidated);
    c.graph_launches = get(extra::graph_launches);
    c.host_bytes = host_bytes_;
    c.live_graphs = graphs_.size();
    c.live_graph_execs = execs_.size();
    c.pending_works = pending_.size();
    c.host_clock_ns = static_cast<unsigned long long>(std::llround(host_now_ * 1e9));
    for (std::size_t k = 0; k < violations_.size(); ++k) c.violations += violations_[k];
    c.violations_unmapped = violations_[static_cast<std::size_t>(violation::unmapped)];
    c.violations_inaccessible = violations_[static_cast<std::size_t>(violation::inaccessible)];
    c.violations_in_flight = violations_[static_cast<std::size_t>(violation::in_flight)];
    c.violations_race = violations_[static_cast<std::size_t>(violation::race)];
  }

  /// Zeroes the call counts and sets the peaks to the current use; violations stay. Never throws.
  void reset_counters() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (device_state& d : devices_) {
      d.mem->reset_counters();
      d.mem->reset_peak_bytes_in_use();
    }
    for (auto& c : extra_) c.store(0, std::memory_order_relaxed);
  }

  /// Zeroes the violation counts, forgets the last one and clears the devices' sticky faults.
  void reset_violations() {
    std::lock_guard<std::mutex> lock(mutex_);
    violations_.fill(0);
    last_violation_.clear();
    for (device_state& d : devices_) d.faulted = false;
  }

  /// The last violation's text ("" when none).
  std::string last_violation() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_violation_;
  }

  // -------------------------------------------------------------------------------------------
  // Device memory: segments
  // -------------------------------------------------------------------------------------------

  /// The device whose address range holds `p`, or -1 (host memory, or nothing). Never throws.
  int owner(const void* p) const noexcept {
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      if (devices_[d].mem->is_device_pointer(p)) return static_cast<int>(d);
    }
    return -1;
  }

  /// cudaMalloc / cuMemAlloc on `device`: *out = a new segment of `bytes` (nullptr for 0 bytes).
  status allocate(int device, void*& out, std::size_t bytes, const char* call) {
    std::lock_guard<std::mutex> lock(mutex_);
    out = nullptr;
    check_unsafe_locked(call);
    check_fault_locked(device, call);
    device_state& d = dev(device);
    void* p = d.mem->allocate(bytes);
    if (bytes == 0) return ok;
    if (p == nullptr) return out_of_memory;
    try {
      d.segments.emplace(reinterpret_cast<std::uintptr_t>(p), bytes);
    } catch (...) {
      d.mem->deallocate(p, bytes);
      throw;
    }
    out = p;
    return ok;
  }

  /// cudaFree / cuMemFree of a segment from allocate (nullptr: nothing). Synchronises every
  /// device first. Throws cuda_error (invalid_value) for anything else, naming what it is.
  status free(int current, void* ptr, const char* call) {
    std::lock_guard<std::mutex> lock(mutex_);
    check_unsafe_locked(call);
    check_fault_locked(current, call);
    if (ptr == nullptr) {
      dev(current).mem->deallocate(nullptr, 0);
      return ok;
    }
    const int o = owner(ptr);
    if (o < 0) {
      if (host_range_locked(ptr) != host_.end()) {
        throw cuda_error(
            invalid_value,
            fmt::format("{}({}): pinned host memory; free it with cudaFreeHost", call, ptr));
      }
      throw cuda_error(invalid_value,
                       fmt::format("{}({}): not memory of a simulated device", call, ptr));
    }
    device_state& d = dev(o);
    const auto it = d.segments.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == d.segments.end()) {
      d.mem->deallocate(ptr, 0);  // throws cuda_error naming what the pointer is
      throw cuda_error(invalid_value, fmt::format("{}({}): not a live segment", call, ptr));
    }
    check_fault_locked(o, call);
    synchronize_all_locked();
    d.mem->deallocate(ptr, it->second);
    d.segments.erase(it);
    return ok;
  }

  /// cudaMemGetInfo / cuMemGetInfo of `device`.
  status memory_info(int device, std::size_t& free_bytes, std::size_t& total_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    dev(device).mem->memory_info(free_bytes, total_bytes);
    return ok;
  }

  // -------------------------------------------------------------------------------------------
  // Device memory: virtual memory management
  // -------------------------------------------------------------------------------------------

  /// cuMemAddressReserve in `device`'s address range.
  std::uintptr_t reserve_address(int device, std::size_t size, std::size_t alignment) {
    std::lock_guard<std::mutex> lock(mutex_);
    return dev(device).mem->reserve_address(size, alignment);
  }

  /// cuMemAddressFree.
  status free_address(std::uintptr_t va, std::size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int o = owner(reinterpret_cast<const void*>(va));
    if (o < 0) {
      throw cuda_error(
          invalid_value,
          fmt::format("cuMemAddressFree({:#x}, {}): no reservation starts there", va, size));
    }
    dev(o).mem->free_address(va, size);
    return ok;
  }

  /// cuMemCreate on `device` with the shareable handle types `handle_types` requested
  /// (CUmemAllocationHandleType bits) and `gpu_direct_rdma` (allocFlags.gpuDirectRDMACapable):
  /// *out = a handle that names the device (0 when out of memory).
  status create_physical(int device, std::size_t size, unsigned handle_types, bool gpu_direct_rdma,
                         std::uint64_t& out) {
    std::lock_guard<std::mutex> lock(mutex_);
    const simulated_device::physical_handle h = dev(device).mem->create_physical(size);
    if (h == simulated_device::invalid_physical_handle) return out_of_memory;
    out = (static_cast<std::uint64_t>(device) << handle_device_shift) | h;
    handles_[out] = handle_state{handle_types, gpu_direct_rdma, 0};
    return ok;
  }

  /// cuMemGetAllocationPropertiesFromHandle: what a live handle was created with.
  status allocation_properties(std::uint64_t handle, int& device, unsigned& handle_types,
                               bool& gpu_direct_rdma) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = handles_.find(handle);
    if (it == handles_.end()) {
      throw cuda_error(invalid_value,
                       fmt::format("cuMemGetAllocationPropertiesFromHandle(handle={:#x}): not a "
                                   "live handle",
                                   handle));
    }
    device = handle_device(handle);
    handle_types = it->second.types;
    gpu_direct_rdma = it->second.gpu_direct_rdma;
    return ok;
  }

  /// cuMemRelease. A handle imported again (import_handle) counts once per import: the memory
  /// goes with the last release (and the last unmap).
  status release_physical(std::uint64_t handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int d = handle_device(handle);
    if (d < 0) {
      throw cuda_error(invalid_handle,
                       fmt::format("cuMemRelease(handle={:#x}): unknown handle", handle));
    }
    const auto it = handles_.find(handle);
    if (it != handles_.end() && it->second.imports > 0) {
      --it->second.imports;
      return ok;
    }
    dev(d).mem->release_physical(handle & handle_local_mask);
    if (it != handles_.end()) handles_.erase(it);
    for (auto e = exported_.begin(); e != exported_.end();) {
      e = e->second == handle ? exported_.erase(e) : std::next(e);
    }
    for (auto e = fabric_exported_.begin(); e != fabric_exported_.end();) {
      e = e->second == handle ? fabric_exported_.erase(e) : std::next(e);
    }
    return ok;
  }

  /// cuMemExportToShareableHandle(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR): a new file
  /// descriptor (a memfd standing for the allocation; the caller closes it) for a live handle
  /// created with that type requested. Fabric handles: export_fabric_handle.
  status export_handle(std::uint64_t handle, unsigned type, int& fd) {
    std::lock_guard<std::mutex> lock(mutex_);
    const handle_state& exported = exported_handle_locked(handle, "");
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
      throw cuda_error(not_supported,
                       fmt::format("cuMemExportToShareableHandle: handle type {} is not "
                                   "simulated (POSIX file descriptors only)",
                                   type));
    }
    check_export_type_locked(exported, handle, type, "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR");
    const int made = ::memfd_create("cudasim-vmm-handle", MFD_CLOEXEC);
    if (made < 0)
      throw cuda_error(out_of_memory, "cuMemExportToShareableHandle: memfd_create failed");
    struct stat st {};
    if (::fstat(made, &st) != 0) {
      ::close(made);
      throw cuda_error(unknown, "cuMemExportToShareableHandle: fstat failed");
    }
    exported_[{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)}] =
        handle;
    fd = made;
    return ok;
  }

  /// The bytes of a simulated fabric handle (CUmemFabricHandle: 64 opaque bytes).
  static constexpr std::size_t fabric_handle_size = 64;

  /// cuMemExportToShareableHandle(CU_MEM_HANDLE_TYPE_FABRIC): 64 bytes naming a live handle
  /// created with that type requested (only under GPUMEM_SIM_FABRIC=imex). The bytes are opaque
  /// to the caller: a tag, the exporting process and the handle, and a per-export secret, so that
  /// bytes made up elsewhere do not import. Exporting the same memory twice gives the same bytes,
  /// as the driver does.
  status export_fabric_handle(std::uint64_t handle, unsigned char* out) {
    std::lock_guard<std::mutex> lock(mutex_);
    const handle_state& exported = exported_handle_locked(handle, ", FABRIC");
    check_export_type_locked(exported, handle, CU_MEM_HANDLE_TYPE_FABRIC,
                             "CU_MEM_HANDLE_TYPE_FABRIC");
    for (const auto& [bytes, h] : fabric_exported_) {
      if (h == handle) {
        std::memcpy(out, bytes.data(), bytes.size());
        return ok;
      }
    }
    std::array<unsigned char, fabric_handle_size> bytes{};
    constexpr char tag[] = "cudasim-fabric";
    std::memcpy(bytes.data(), tag, sizeof tag - 1);
    const std::uint64_t pid = static_cast<std::uint64_t>(::getpid());
    const std::uint64_t secret = fabric_secret_ += 0x9e3779b97f4a7c15ULL;
    std::memcpy(bytes.data() + 16, &pid, sizeof pid);
    std::memcpy(bytes.data() + 24, &handle, sizeof handle);
    std::memcpy(bytes.data() + 32, &secret, sizeof secret);
    fabric_exported_.emplace(bytes, handle);
    std::memcpy(out, bytes.data(), bytes.size());
    return ok;
  }

  /// cuMemImportFromShareableHandle(CU_MEM_HANDLE_TYPE_FABRIC) of 64 bytes export_fabric_handle
  /// made in this process or in the process this one was forked from (whose simulated GPU this
  /// one copies): the same allocation, one more reference to release. CUDA_ERROR_NOT_PERMITTED
  /// without an IMEX channel, CUDA_ERROR_NOT_SUPPORTED on a GPU without fabric handles (as the
  /// driver), CUDA_ERROR_INVALID_VALUE for bytes that name no live exported memory.
  status import_fabric_handle(const unsigned char* in, std::uint64_t& out) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (settings_.fabric == fabric_support::unsupported) {
      throw cuda_error(not_supported,
                       "cuMemImportFromShareableHandle(FABRIC): the GPU has no "
                       "fabric handles (GPUMEM_SIM_FABRIC=unsupported)");
    }
    if (settings_.fabric == fabric_support::no_imex) {
      throw cuda_error(not_permitted,
                       "cuMemImportFromShareableHandle(FABRIC): no IMEX channel "
                       "(GPUMEM_SIM_FABRIC=no_imex)");
    }
    std::array<unsigned char, fabric_handle_size> bytes{};
    std::memcpy(bytes.data(), in, bytes.size());
    const auto e = fabric_exported_.find(bytes);
    if (e == fabric_exported_.end() || handles_.count(e->second) == 0) {
      throw cuda_error(invalid_value,
                       "cuMemImportFromShareableHandle(FABRIC): the handle names "
                       "no live exported allocation");
    }
    ++handles_.at(e->second).imports;
    out = e->second;
    return ok;
  }

  /// cuMemImportFromShareableHandle of a file descriptor export_handle made in this process (or a
  /// duplicate of it, as pidfd_getfd or SCM_RIGHTS give): the same allocation, one more reference
  /// to release. Descriptors from another process cannot be simulated (each process has its own
  /// simulated GPU): CUDA_ERROR_INVALID_VALUE.
  status import_handle(int fd, unsigned type, std::uint64_t& out) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
      throw cuda_error(not_supported,
                       fmt::format("cuMemImportFromShareableHandle: handle type {} is not "
                                   "simulated (POSIX file descriptors only)",
                                   type));
    }
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0) {
      throw cuda_error(invalid_value,
                       fmt::format("cuMemImportFromShareableHandle: {} is not an open file "
                                   "descriptor",
                                   fd));
    }
    const auto e = exported_.find(
        {static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)});
    if (e == exported_.end()) {
      throw cuda_error(invalid_value,
                       fmt::format("cuMemImportFromShareableHandle: file descriptor {} names no "
                                   "live allocation this process exported (the simulator cannot "
                                   "import another process's memory)",
                                   fd));
    }
    ++handles_.at(e->second).imports;
    out = e->second;
    return ok;
  }

  /// cuMemMap: the handle's memory at [va, va + size), which must lie in a reservation of the
  /// handle's device.
  status map(std::uintptr_t va, std::size_t size, std::size_t offset, std::uint64_t handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int d = handle_device(handle);
    if (d < 0) {
      throw cuda_error(invalid_handle,
                       fmt::format("cuMemMap({:#x}, {}, {}, handle={:#x}): unknown handle", va,
                                   size, offset, handle));
    }
    const int o = owner(reinterpret_cast<const void*>(va));
    if (o >= 0 && o != d) {
      throw cuda_error(not_supported,
                       fmt::format("cuMemMap({:#x}, {}, {}, handle={:#x}): memory of device {} in "
                                   "an address range reserved while device {} was current is not "
                                   "simulated",
                                   va, size, offset, handle, d, o));
    }
    device_state& x = dev(d);
    x.mem->map(va, size, offset, handle & handle_local_mask);
    x.mappings.emplace(va, vmm_mapping{size, handle, 0});
    return ok;
  }

  /// cuMemUnmap. Reports the work the host has not seen complete that touches the range.
  status unmap(std::uintptr_t va, std::size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    device_state& x = mapped_device_locked("cuMemUnmap", va, size);
    x.mem->unmap(va, size);
    auto it = x.mappings.lower_bound(va);
    while (it != x.mappings.end() && it->first < va + size) it = x.mappings.erase(it);
    check_released_locked(fmt::format("cuMemUnmap({:#x}, {})", va, size), va, va + size);
    return ok;
  }

  /// cuMemSetAccess: grants (or, with CU_MEM_ACCESS_FLAGS_PROT_NONE, takes away) each listed
  /// device's access to [va, va + size), which must consist of whole mappings.
  status set_access(std::uintptr_t va, std::size_t size, const CUmemAccessDesc* desc,
                    std::size_t count) {
    if (desc == nullptr || count == 0) return invalid_value;
    for (std::size_t i = 0; i < count; ++i) {
      if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return invalid_value;
      if (!valid_device(desc[i].location.id)) return invalid_device;
      if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
          desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
          desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        return invalid_value;
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    device_state& x = mapped_device_locked("cuMemSetAccess", va, size);
    x.mem->set_access(va, size);  // checks the range is whole mappings
    for (auto it = x.mappings.lower_bound(va); it != x.mappings.end() && it->first < va + size;
         ++it) {
      for (std::size_t i = 0; i < count; ++i) {
        const std::uint64_t bit = device_bit(desc[i].location.id);
        if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_NONE) {
          it->second.access &= ~bit;
        } else {
          it->second.access |= bit;
        }
      }
    }
    return ok;
  }

  // -------------------------------------------------------------------------------------------
  // Peer access
  // -------------------------------------------------------------------------------------------

  /// cudaDeviceEnablePeerAccess: `device` may access `peer`'s cudaMalloc memory.
  status enable_peer_access(int device, int peer, unsigned flags) {
    if (flags != 0) return invalid_value;
    if (!valid_device(peer) || peer == device) return invalid_device;
    std::lock_guard<std::mutex> lock(mutex_);
    device_state& d = dev(device);
    if ((d.peers & device_bit(peer)) != 0) return peer_access_already_enabled;
    d.peers |= device_bit(peer);
    return ok;
  }

  /// cudaDeviceDisablePeerAccess.
  status disable_peer_access(int device, int peer) {
    if (!valid_device(peer) || peer == device) return invalid_device;
    std::lock_guard<std::mutex> lock(mutex_);
    device_state& d = dev(device);
    if ((d.peers & device_bit(peer)) == 0) return peer_access_not_enabled;
    d.peers &= ~device_bit(peer);
    return ok;
  }

  // -------------------------------------------------------------------------------------------
  // Streams
  // -------------------------------------------------------------------------------------------

  /// cudaStreamCreateWithPriority on `device`: flags 0 or cudaStreamNonBlocking; the priority is
  /// clamped to [greatest_priority, least_priority] as CUDA does.
  status create_stream(int device, cudaStream_t& out, unsigned flags, int priority) {
    if ((flags & ~static_cast<unsigned>(cudaStreamNonBlocking)) != 0) return invalid_value;
    std::lock_guard<std::mutex> lock(mutex_);
    check_fault_locked(device, "cudaStreamCreate");
    device_state& d = dev(device);
    const simulated_stream sim = d.mem->create_stream();
    stream_state s;
    s.id = next_stream_id_++;
    s.device = device;
    s.flags = flags;
    s.priority = std::min(least_priority, std::max(greatest_priority, priority));
    s.sim = sim;
    const stream_id id = s.id;
    try {
      streams_.emplace(id, std::move(s));
    } catch (...) {
      d.mem->destroy_stream(sim);
      throw;
    }
    out = reinterpret_cast<cudaStream_t>(stream_handle(id));
    return ok;
  }

  /// cudaStreamDestroy. The default streams cannot be destroyed (invalid_handle). Work queued on
  /// the stream still completes, and the host can still see it do so (device synchronisation).
  status destroy_stream(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    stream_state* s = find_created_stream_locked(stream);
    if (s == nullptr) return invalid_handle;
    dev(s->device).mem->destroy_stream(s->sim);
    s->alive = false;
    return ok;
  }

  /// cudaStreamQuery: ok when the stream's work has ended, else not_ready.
  status query_stream(int current, cudaStream_t stream, const char* call) {
    return end_stream_work(current, stream, call, false);
  }

  /// cudaStreamSynchronize: waits for the stream's work (the host clock moves to its end).
  status synchronize_stream(int current, cudaStream_t stream, const char* call) {
    return end_stream_work(current, stream, call, true);
  }

  /// cudaStreamWaitEvent: later work on `stream` waits for the event's work (any device's). An
  /// event recorded in a capture makes a stream that is not capturing join that capture.
  status stream_wait_event(int current, cudaStream_t stream, cudaEvent_t event, unsigned flags) {
    std::lock_guard<std::mutex> lock(mutex_);
    stream_state* s = find_stream_locked(stream, current);
    event_state* e = find_event_locked(event);
    if (s == nullptr || e == nullptr) return invalid_handle;
    if (s->legacy) check_legacy_allowed_locked(s->device, "cudaStreamWaitEvent", true);
    if (e->capture != 0 && s->legacy) {
      throw cuda_error(capture_unsupported,
                       "cudaStreamWaitEvent: the legacy default stream cannot join a capture");
    }
    if (e->capture != 0) {
      const auto c = captures_.find(e->capture);
      if (c == captures_.end()) {
        if (s->capture != 0) return isolation_locked(*s, "an event recorded in an ended capture");
        throw cuda_error(captured_event,
                         fmt::format("cudaStreamWaitEvent({}, {}): the event was last recorded in "
                                     "a capture that has ended",
                                     describe(*s), static_cast<void*>(event)));
      }
      if (s->capture == 0) {
        // Cross-stream capture: the stream joins the event's capture sequence.
        if (c->second.invalidated) return capture_invalidated;
        s->capture = c->second.id;
        s->capture_deps = e->capture_nodes;
        c->second.streams.push_back(s->id);
      } else if (s->capture == e->capture) {
        if (c->second.invalidated) return capture_invalidated;
        for (std::uint32_t n : e->capture_nodes) add_dependency(s->capture_deps, n);
      } else {
        return isolation_locked(*s, "an event recorded in another capture");
      }
      count(extra::stream_wait_event);
      return ok;
    }
    if (s->capture != 0) {
      capture_state& c = captures_.at(s->capture);
      if (c.invalidated) return capture_invalidated;
      if (!e->recorded) {
        count(extra::stream_wait_event);
        return ok;
      }
      if ((flags & cudaEventWaitExternal) == 0) {
        return isolation_locked(*s, "an event recorded outside the capture");
      }
      add_event_node_locked(*s, node_kind::event_wait, "external event wait", event);
      count(extra::stream_wait_event);
      return ok;
    }
    check_fault_locked(s->device, "cudaStreamWaitEvent");
    if (e->recorded) {
      s->order.join(e->order);
      s->ready = std::max(s->ready, e->time);
    }
    count(extra::stream_wait_event);
    return ok;
  }

  /// cudaStreamGetFlags / GetPriority / GetId / GetDevice.
  status stream_info(int current, cudaStream_t stream, unsigned& flags, int& priority,
                     std::uint64_t& id, int& device) {
    std::lock_guard<std::mutex> lock(mutex_);
    const stream_state* s = find_stream_locked(stream, current);
    if (s == nullptr) return invalid_handle;
    flags = s->flags;
    priority = s->priority;
    id = s->id;
    device = s->device;
    return ok;
  }

  /// cudaDeviceSynchronize / cuCtxSynchronize: waits for every stream of `device`.
  status synchronize_device(int device, const char* call) {
    std::lock_guard<std::mutex> lock(mutex_);
    // Synchronising a device with a capturing stream conflicts with the capture.
    bool capturing = false;
    for (auto& [id, c] : captures_) {
      if (capture_on_device_locked(c, device, false)) {
        invalidate_locked(c, call);
        capturing = true;
      }
    }
    if (capturing) {
      throw cuda_error(capture_unsupported,
                       fmt::format("{}: device {} has a capturing stream", call, device));
    }
    check_fault_locked(device, call);
    dev(device).mem->synchronize();
    for (auto& [id, s] : streams_) {
      if (s.device != device) continue;
      wait_until_locked(s.ready);
      observe_locked(s.order);
    }
    return ok;
  }

  /// CUDA's stream priorities: lower numbers are higher priorities.
  static constexpr int least_priority = 0;
  static constexpr int greatest_priority = -5;

  // -------------------------------------------------------------------------------------------
  // Events
  // -------------------------------------------------------------------------------------------

  /// cudaEventCreateWithFlags on `device`: cudaEventBlockingSync, cudaEventDisableTiming,
  /// cudaEventInterprocess (only with cudaEventDisableTiming).
  status create_event(int device, cudaEvent_t& out, unsigned flags) {
    constexpr unsigned known =
        cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
    if ((flags & ~known) != 0) return invalid_value;
    if ((flags & cudaEventInterprocess) != 0 && (flags & cudaEventDisableTiming) == 0) {
      return invalid_value;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    check_fault_locked(device, "cudaEventCreate");
    device_state& d = dev(device);
    event_state e;
    e.sim = d.mem->create_event();
    e.device = device;
    e.flags = flags;
    const simulated_event sim = e.sim;
    const std::uintptr_t h = event_base + next_event_id_++ * 16;
    try {
      events_.emplace(h, std::move(e));
    } catch (...) {
      d.mem->destroy_event(sim);
      throw;
    }
    out = reinterpret_cast<cudaEvent_t>(h);
    return ok;
  }

  /// cudaEventDestroy.
  status destroy_event(cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = events_.find(reinterpret_cast<std::uintptr_t>(event));
    if (it == events_.end()) return invalid_handle;
    dev(it->second.device).mem->destroy_event(it->second.sim);
    events_.erase(it);
    return ok;
  }

  /// cudaEventRecord: the event stands for the work queued on `stream` so far; in a capturing
  /// stream, for the captured work so far. The event and the stream must be of one device.
  status record_event(int current, cudaEvent_t event, cudaStream_t stream, unsigned flags) {
    std::lock_guard<std::mutex> lock(mutex_);
    event_state* e = find_event_locked(event);
    stream_state* s = find_stream_locked(stream, current);
    if (e == nullptr || s == nullptr) return invalid_handle;
    if (e->device != s->device) {
      throw cuda_error(invalid_handle,
                       fmt::format("cudaEventRecord({}, {}): an event of device {} on a stream of "
                                   "device {}",
                                   static_cast<void*>(event), describe(*s), e->device, s->device));
    }
    if (s->capture != 0) {
      capture_state& c = captures_.at(s->capture);
      if (c.invalidated) return capture_invalidated;
      if ((flags & cudaEventRecordExternal) != 0) {
        add_event_node_locked(*s, node_kind::event_record, "external event record", event);
      }
      e->capture = c.id;
      e->capture_nodes = s->capture_deps;
      dev(s->device).mem->record_event(e->sim, s->sim);
      return ok;
    }
    if (s->legacy) check_legacy_allowed_locked(s->device, "cudaEventRecord", true);
    check_fault_locked(s->device, "cudaEventRecord");
    const double now = now_locked();
    order_locked(*s);
    const double delayed = now + settings_.event_delay;
    if (settings_.event_delay > 0) s->ready = std::max(s->ready, delayed);
    e->recorded = true;
    e->capture = 0;
    e->capture_nodes.clear();
    e->stream = s->id;
    e->order = s->order;
    e->time = s->ready;
    dev(s->device).mem->record_event(e->sim, s->sim);
    return ok;
  }

  /// cudaEventQuery: ok when complete (or never recorded), else not_ready.
  status query_event(cudaEvent_t event) { return end_event_work(event, "cudaEventQuery", false); }

  /// cudaEventSynchronize: waits for the event's work (the host clock moves to its end).
  status synchronize_event(cudaEvent_t event) {
    return end_event_work(event, "cudaEventSynchronize", true);
  }

  /// cudaEventElapsedTime: milliseconds between the two events' completions. invalid_handle when
  /// either has timing disabled, was never recorded, or the two are of different devices;
  /// not_ready when either is not complete.
  status elapsed_time(float& ms, cudaEvent_t start, cudaEvent_t end) {
    std::lock_guard<std::mutex> lock(mutex_);
    event_state* a = find_event_locked(start);
    event_state* b = find_event_locked(end);
    if (a == nullptr || b == nullptr) return invalid_handle;
    if (((a->flags | b->flags) & cudaEventDisableTiming) != 0) return invalid_handle;
    if (a->device != b->device) return invalid_handle;
    check_not_captured_locked(*a, "cudaEventElapsedTime", start);
    check_not_captured_locked(*b, "cudaEventElapsedTime", end);
    if (!a->recorded || !b->recorded) return invalid_handle;
    if (std::max(a->time, b->time) > now_locked()) return not_ready;
    ms = static_cast<float>((b->time - a->time) * 1000.0);
    return ok;
  }

  // -------------------------------------------------------------------------------------------
  // Host memory (real memory)
  // -------------------------------------------------------------------------------------------

  /// cudaHostAlloc: page-aligned real memory (nullptr for 0 bytes).
  status host_alloc(void*& out, std::size_t bytes, unsigned flags) {
    out = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      check_unsafe_locked("cudaHostAlloc");
    }
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

  /// cudaFreeHost of memory from host_alloc (nullptr: nothing). Synchronises every device.
  status host_free(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    check_unsafe_locked("cudaFreeHost");
    if (ptr == nullptr) return ok;
    const auto it = host_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == host_.end() || !it->second.allocated) {
      throw cuda_error(
          invalid_value,
          fmt::format("cudaFreeHost({}): not memory from cudaHostAlloc/cudaMallocHost", ptr));
    }
    synchronize_all_locked();
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
    if (bytes > UINTPTR_MAX - begin || owner(ptr) >= 0) return invalid_value;
    std::lock_guard<std::mutex> lock(mutex_);
    check_unsafe_locked("cudaHostRegister");
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

  /// cudaHostUnregister of a range registered at `ptr`. Synchronises every device.
  status host_unregister(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    check_unsafe_locked("cudaHostUnregister");
    const auto it = host_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == host_.end() || it->second.allocated) return not_registered;
    synchronize_all_locked();
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
  // Work: copies, fills, kernels, simulated work
  // -------------------------------------------------------------------------------------------

  /// cudaMemcpy (async = false: on the legacy default stream of `current`) and cudaMemcpyAsync,
  /// each synchronous to the host where CUDA documents it. Host-to-host copies really copy;
  /// device memory holds nothing, so a copy from it leaves the destination unchanged.
  status copy(int current, void* dst, const void* src, std::size_t bytes, bool async,
              cudaStream_t stream, const char* call) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!async) check_unsafe_locked(call);
    stream_state* s = async ? find_stream_locked(stream, current) : &legacy_locked(current);
    if (s == nullptr) return invalid_handle;
    if (bytes == 0) return ok;
    if (dst == nullptr || src == nullptr) return invalid_value;
    const int to = owner(dst);
    const int from = owner(src);
    work_spec w;
    w.what = call;
    w.device = s->device;
    w.seconds = transfer_seconds(bytes);
    if (to >= 0 || host_covers_locked(dst, bytes)) w.ranges.push_back(range(dst, bytes, true));
    if (from >= 0 || host_covers_locked(src, bytes)) w.ranges.push_back(range(src, bytes, false));
    const bool host_only = to < 0 && from < 0;
    const bool pinned_source = from < 0 && host_covers_locked(src, bytes);
    if (!async && to >= 0 && from < 0 && !pinned_source && s->capture == 0) {
      // From pageable memory: "a stream sync is performed before the copy is initiated".
      wait_until_locked(s->ready);
      observe_locked(s->order);
    }
    const enqueued r = enqueue_locked(*s, std::move(w));
    if (r.result != ok) return r.result;
    if (!r.captured && host_only) std::memmove(dst, src, bytes);
    // What returns only once the copy has completed (CUDA's "API synchronization behavior"):
    // cudaMemcpy to host memory or from pinned memory; cudaMemcpyAsync to pageable memory; any
    // copy between two host buffers.
    const bool pageable_destination = to < 0 && !host_covers_locked(dst, bytes);
    const bool waits =
        host_only || (async ? from >= 0 && pageable_destination : to < 0 || pinned_source);
    if (waits && !r.captured) {
      wait_until_locked(r.end);
      observe_locked(s->order);
    }
    count(extra::memcpy_calls);
    count(extra::memcpy_bytes, bytes);
    if (!host_only) count(extra::memcpy_device_calls);
    return ok;
  }

  /// cudaMemcpyPeer (async = false: synchronous, on the legacy stream of `current`) and
  /// cudaMemcpyPeerAsync: `bytes` from `src` on `src_device` to `dst` on `dst_device`, with or
  /// without peer access.
  status copy_peer(int current, void* dst, int dst_device, const void* src, int src_device,
                   std::size_t bytes, bool async, cudaStream_t stream, const char* call) {
    if (!valid_device(dst_device) || !valid_device(src_device)) return invalid_device;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!async) check_unsafe_locked(call);
    stream_state* s = async ? find_stream_locked(stream, current) : &legacy_locked(current);
    if (s == nullptr) return invalid_handle;
    if (bytes == 0) return ok;
    if (dst == nullptr || src == nullptr) return invalid_value;
    if (owner(dst) != dst_device || owner(src) != src_device) {
      throw cuda_error(invalid_value,
                       fmt::format("{}({}, {}, {}, {}, {}): a pointer is not memory of its device",
                                   call, dst, dst_device, src, src_device, bytes));
    }
    if (!async && s->capture == 0) {
      // Serialised with all work of the three devices: the simulator waits for it.
      for (auto& [id, t] : streams_) {
        if (t.device == current || t.device == dst_device || t.device == src_device) {
          wait_until_locked(t.ready);
          observe_locked(t.order);
        }
      }
    }
    work_spec w;
    w.what = call;
    w.device = s->device;
    w.seconds = transfer_seconds(bytes);
    w.ranges.push_back(range(dst, bytes, true));
    w.ranges.push_back(range(src, bytes, false));
    const enqueued r = enqueue_locked(*s, std::move(w));
    if (r.result != ok) return r.result;
    if (!async && !r.captured) {
      wait_until_locked(r.end);
      observe_locked(s->order);
    }
    count(extra::memcpy_peer_calls);
    return ok;
  }

  /// cudaMemset (async = false: on the legacy stream of `current`; asynchronous to the host
  /// except for pinned host memory, as CUDA documents) and cudaMemsetAsync. Device memory is not
  /// touched; pinned host memory is set; other host memory is an error, as in CUDA.
  status fill(int current, void* dst, int value, std::size_t bytes, bool async, cudaStream_t stream,
              const char* call) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!async) check_unsafe_locked(call);
    stream_state* s = async ? find_stream_locked(stream, current) : &legacy_locked(current);
    if (s == nullptr) return invalid_handle;
    if (bytes == 0) return ok;
    if (dst == nullptr) return invalid_value;
    const bool host = owner(dst) < 0;
    if (host && !host_covers_locked(dst, bytes)) return invalid_value;
    work_spec w;
    w.what = call;
    w.device = s->device;
    w.seconds = transfer_seconds(bytes);
    w.ranges.push_back(range(dst, bytes, true));
    const enqueued r = enqueue_locked(*s, std::move(w));
    if (r.result != ok) return r.result;
    if (host && !r.captured) std::memset(dst, value, bytes);
    if (host && !async && !r.captured) {
      wait_until_locked(r.end);
      observe_locked(s->order);
    }
    count(extra::memset_calls);
    count(extra::memset_bytes, bytes);
    return ok;
  }

  /// A kernel launch (cudaLaunchKernel and friends, cuLaunchKernel): work of
  /// GPUMEM_SIM_KERNEL_TIME on `stream`, which must be of the current device, touching nothing
  /// the simulator knows of.
  status launch_kernel(int current, cudaStream_t stream, const char* call) {
    std::lock_guard<std::mutex> lock(mutex_);
    stream_state* s = find_stream_locked(stream, current);
    if (s == nullptr) return invalid_handle;
    check_stream_of_device_locked(*s, current, call);
    work_spec w;
    w.what = call;
    w.device = s->device;
    w.seconds = settings_.kernel_time;
    const enqueued r = enqueue_locked(*s, std::move(w));
    if (r.result == ok) count(extra::kernel_launches);
    return r.result;
  }

  /// gpumemSimLaunchWork: a kernel that touches `ranges` for `seconds`.
  status launch_work(int current, cudaStream_t stream, const gpumemSimRange* ranges, std::size_t n,
                     double seconds) {
    if ((ranges == nullptr && n != 0) || !std::isfinite(seconds) || seconds < 0) {
      return invalid_value;
    }
    work_spec w;
    w.what = "gpumemSimLaunchWork";
    w.seconds = seconds;
    for (std::size_t i = 0; i < n; ++i) {
      const gpumemSimRange& r = ranges[i];
      if (r.access < GPUMEM_SIM_READ || r.access > GPUMEM_SIM_READ_WRITE) return invalid_value;
      const auto begin = reinterpret_cast<std::uintptr_t>(r.address);
      if (r.bytes > UINTPTR_MAX - begin) return invalid_value;
      if (r.bytes == 0) continue;
      touched_range t = range(r.address, r.bytes, (r.access & GPUMEM_SIM_WRITE) != 0);
      t.accessor = current;
      w.ranges.push_back(t);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    stream_state* s = find_stream_locked(stream, current);
    if (s == nullptr) return invalid_handle;
    check_stream_of_device_locked(*s, current, "gpumemSimLaunchWork");
    w.device = s->device;
    const enqueued r = enqueue_locked(*s, std::move(w));
    if (r.result == ok) count(extra::work_launches);
    return r.result;
  }

  // -------------------------------------------------------------------------------------------
  // Stream capture
  // -------------------------------------------------------------------------------------------

  /// cudaStreamBeginCapture.
  status begin_capture(int current, cudaStream_t stream, cudaStreamCaptureMode mode) {
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed) {
      return invalid_value;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    stream_state* s = find_stream_locked(stream, current);
    if (s == nullptr) return invalid_handle;
    if (s->legacy) {
      throw cuda_error(capture_unsupported,
                       "cudaStreamBeginCapture: the legacy default stream cannot capture (the "
                       "per-thread default stream is the legacy stream on the simulator)");
    }
    if (s->capture != 0) {
      throw cuda_error(illegal_state,
                       fmt::format("cudaStreamBeginCapture({}): already capturing", describe(*s)));
    }
    check_fault_locked(s->device, "cudaStreamBeginCapture");
    capture_state c;
    c.id = next_capture_id_++;
    c.mode = mode;
    c.thread = std::this_thread::get_id();
    c.origin = s->id;
    c.graph = new_graph_locked();
    graphs_.at(c.graph).capture = c.id;
    c.streams.push_back(s->id);
    s->capture = c.id;
    s->capture_deps.clear();
    const std::uint64_t id = c.id;
    captures_.emplace(id, std::move(c));
    count(extra::captures);
    return ok;
  }

  /// cudaStreamEndCapture: the captured graph, or nullptr and an error when the capture was
  /// invalidated or left a stream unjoined.
  status end_capture(int current, cudaStream_t stream, cudaGraph_t* graph) {
    if (graph == nullptr) return invalid_value;
    std::lock_guard<std::mutex> lock(mutex_);
    stream_state* s = find_stream_locked(stream, current);
    if (s == nullptr) return invalid_handle;
    if (s->capture == 0) {
      throw cuda_error(illegal_state,
                       fmt::format("cudaStreamEndCapture({}): not capturing", describe(*s)));
    }
    capture_state& c = captures_.at(s->capture);
    if (c.origin != s->id) {
      invalidate_locked(c, "cudaStreamEndCapture on a stream that joined the capture");
      throw cuda_error(capture_unmatched,
                       fmt::format("cudaStreamEndCapture({}): the capture began on another stream",
                                   describe(*s)));
    }
    if (c.mode != cudaStreamCaptureModeRelaxed && c.thread != std::this_thread::get_id()) {
      throw cuda_error(capture_wrong_thread,
                       "cudaStreamEndCapture: a capture not begun in relaxed mode must end on the "
                       "thread that began it");
    }
    *graph = nullptr;
    if (c.invalidated) {
      const std::string why = c.why;
      end_capture_locked(c, false);
      throw cuda_error(capture_invalidated,
                       fmt::format("cudaStreamEndCapture: the capture was invalidated by {}", why));
    }
    // Every stream that joined must have rejoined the origin stream.
    const std::vector<bool> joined = ancestors_locked(c.graph, s->capture_deps);
    for (stream_id t : c.streams) {
      const stream_state& other = streams_.at(t);
      if (t == s->id || other.capture != c.id) continue;
      const bool rejoined = std::all_of(other.capture_deps.begin(), other.capture_deps.end(),
                                        [&](std::uint32_t n) { return joined[n]; });
      if (!rejoined) {
        const std::string name = describe(other);
        end_capture_locked(c, false);
        throw cuda_error(capture_unjoined,
                         fmt::format("cudaStreamEndCapture: {} joined the capture and was not "
                                     "joined back into the origin stream",
                                     name));
      }
    }
    const std::uintptr_t g = c.graph;
    end_capture_locked(c, true);
    *graph = reinterpret_cast<cudaGraph_t>(g);
    return ok;
  }

  /// cudaStreamIsCapturing / cudaStreamGetCaptureInfo. `deps` (optional) receives the stream's
  /// current capture dependencies, valid until the next call for the stream.
  status capture_info(int current, cudaStream_t stream, cudaStreamCaptureStatus& status_out,
                      unsigned long long* id, cudaGraph_t* graph, const cudaGraphNode_t** deps,
                      std::size_t* n_deps) {
    std::lock_guard<std::mutex> lock(mutex_);
    stream_state* s = find_stream_locked(stream, current);
    if (s == nullptr) return invalid_handle;
    if (s->legacy) check_legacy_allowed_locked(s->device, "cudaStreamIsCapturing", false);
    status_out = cudaStreamCaptureStatusNone;
    if (id != nullptr) *id = 0;
    if (graph != nullptr) *graph = nullptr;
    if (deps != nullptr) *deps = nullptr;
    if (n_deps != nullptr) *n_deps = 0;
    if (s->capture == 0) return ok;
    const capture_state& c = captures_.at(s->capture);
    status_out = c.invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    if (c.invalidated) return ok;
    if (id != nullptr) *id = c.id;
    if (graph != nullptr) *graph = reinterpret_cast<cudaGraph_t>(c.graph);
    const graph_state& g = graphs_.at(c.graph);
    s->dep_handles.clear();
    for (std::uint32_t n : s->capture_deps) s->dep_handles.push_back(g.nodes[n].handle);
    if (deps != nullptr) *deps = s->dep_handles.empty() ? nullptr : s->dep_handles.data();
    if (n_deps != nullptr) *n_deps = s->dep_handles.size();
    return ok;
  }

  // -------------------------------------------------------------------------------------------
  // Graphs
  // -------------------------------------------------------------------------------------------

  /// cudaGraphCreate: an empty graph.
  status create_graph(cudaGraph_t& out, unsigned flags) {
    if (flags != 0) return invalid_value;
    std::lock_guard<std::mutex> lock(mutex_);
    out = reinterpret_cast<cudaGraph_t>(new_graph_locked());
    return ok;
  }

  /// cudaGraphDestroy (not of a graph being captured into).
  status destroy_graph(cudaGraph_t graph) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = graphs_.find(reinterpret_cast<std::uintptr_t>(graph));
    if (it == graphs_.end()) return invalid_value;
    if (it->second.capture != 0) {
      throw cuda_error(invalid_value, "cudaGraphDestroy: the graph is being captured into");
    }
    for (const graph_node& n : it->second.nodes) node_index_.erase(n.handle);
    graphs_.erase(it);
    return ok;
  }

  /// cudaGraphGetNodes: the node count, and the nodes when `nodes` is given.
  status graph_nodes(cudaGraph_t graph, cudaGraphNode_t* nodes, std::size_t& n) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = graphs_.find(reinterpret_cast<std::uintptr_t>(graph));
    if (it == graphs_.end()) return invalid_value;
    const std::vector<graph_node>& all = it->second.nodes;
    if (nodes != nullptr) {
      for (std::size_t i = 0; i < n; ++i) nodes[i] = i < all.size() ? all[i].handle : nullptr;
      n = std::min(n, all.size());
    } else {
      n = all.size();
    }
    return ok;
  }

  /// cudaGraphNodeGetDependencies: the node count, and the nodes when `deps` is given.
  status node_dependencies(cudaGraphNode_t node, cudaGraphNode_t* deps, std::size_t& n) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = node_index_.find(node);
    if (it == node_index_.end()) return invalid_value;
    const graph_state& g = graphs_.at(it->second.first);
    const graph_node& x = g.nodes[it->second.second];
    if (deps != nullptr) {
      for (std::size_t i = 0; i < n; ++i) {
        deps[i] = i < x.deps.size() ? g.nodes[x.deps[i]].handle : nullptr;
      }
      n = std::min(n, x.deps.size());
    } else {
      n = x.deps.size();
    }
    return ok;
  }

  /// cudaGraphDebugDotPrint: the graph in Graphviz DOT.
  status dot_print(cudaGraph_t graph, const char* path) {
    if (path == nullptr) return invalid_value;
    std::string text;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = graphs_.find(reinterpret_cast<std::uintptr_t>(graph));
      if (it == graphs_.end()) return invalid_value;
      text = "digraph cudasim {\n";
      const std::vector<graph_node>& all = it->second.nodes;
      for (std::size_t i = 0; i < all.size(); ++i) {
        text += fmt::format("  n{} [label=\"{} (device {})\"];\n", i, all[i].what, all[i].device);
        for (std::uint32_t d : all[i].deps) text += fmt::format("  n{} -> n{};\n", d, i);
      }
      text += "}\n";
    }
    std::FILE* f = std::fopen(path, "w");
    if (f == nullptr) return invalid_value;
    const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    return std::fclose(f) == 0 && written ? ok : invalid_value;
  }

  /// cudaGraphInstantiate / WithFlags: an executable copy of the graph's nodes.
  status instantiate(cudaGraphExec_t& out, cudaGraph_t graph, unsigned long long flags) {
    constexpr unsigned long long known =
        cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUpload |
        cudaGraphInstantiateFlagDeviceLaunch | cudaGraphInstantiateFlagUseNodePriority;
    if ((flags & ~known) != 0) return invalid_value;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = graphs_.find(reinterpret_cast<std::uintptr_t>(graph));
    if (it == graphs_.end() || it->second.capture != 0) return invalid_value;
    const std::uintptr_t h = exec_base + next_exec_id_++ * 16;
    execs_.emplace(h, exec_state{it->second.nodes});
    out = reinterpret_cast<cudaGraphExec_t>(h);
    return ok;
  }

  /// cudaGraphExecDestroy. Launches already queued still run.
  status destroy_exec(cudaGraphExec_t exec) {
    std::lock_guard<std::mutex> lock(mutex_);
    return execs_.erase(reinterpret_cast<std::uintptr_t>(exec)) == 1 ? ok : invalid_value;
  }

  /// cudaGraphLaunch: the graph's work, again, as one piece of work on `stream` that lasts the
  /// graph's critical path and touches every node's ranges (checked as any work is).
  status launch_graph(int current, cudaGraphExec_t exec, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto x = execs_.find(reinterpret_cast<std::uintptr_t>(exec));
    if (x == execs_.end()) return invalid_value;
    stream_state* s = find_stream_locked(stream, current);
    if (s == nullptr) return invalid_handle;
    if (s->capture != 0) {
      throw cuda_error(not_supported,
                       "cudaGraphLaunch into a capturing stream (a child graph) is not simulated");
    }
    const std::vector<graph_node>& nodes = x->second.nodes;
    work_spec w;
    w.what = fmt::format("cudaGraphLaunch of graph exec {:#x}", x->first);
    w.device = s->device;
    std::vector<double> ends(nodes.size(), 0.0);
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      const graph_node& n = nodes[i];
      double begin = 0;
      for (std::uint32_t d : n.deps) begin = std::max(begin, ends[d]);
      ends[i] = begin + n.seconds;
      w.seconds = std::max(w.seconds, ends[i]);
      w.ranges.insert(w.ranges.end(), n.ranges.begin(), n.ranges.end());
      if (n.kind == node_kind::event_wait) {
        // The launch waits for the event's work as it stands when the graph is launched.
        const event_state* e = find_event_locked(reinterpret_cast<cudaEvent_t>(n.event));
        if (e != nullptr && e->recorded) {
          s->order.join(e->order);
          s->ready = std::max(s->ready, e->time);
        }
      }
    }
    const enqueued r = enqueue_locked(*s, std::move(w));
    if (r.result != ok) return r.result;
    for (const graph_node& n : nodes) {
      if (n.kind != node_kind::event_record) continue;
      event_state* e = find_event_locked(reinterpret_cast<cudaEvent_t>(n.event));
      if (e == nullptr) continue;
      e->recorded = true;
      e->capture = 0;
      e->stream = s->id;
      e->order = s->order;
      e->time = r.end;
    }
    count(extra::graph_launches);
    return ok;
  }

  // -------------------------------------------------------------------------------------------
  // Misc
  // -------------------------------------------------------------------------------------------

  /// The devices' name.
  std::string device_name() const {
    return fmt::format("gpumem simulated GPU ({})", format_bytes(settings_.memory));
  }

  static constexpr std::size_t host_alignment = 4096;

 private:
  struct vmm_mapping {
    std::size_t size;
    std::uint64_t handle;
    std::uint64_t access;  // bit d: device d may access it (cuMemSetAccess)
  };
  struct device_state {
    std::unique_ptr<simulated_device> mem;
    std::map<std::uintptr_t, std::size_t> segments;  // cudaMalloc: start -> bytes
    std::map<std::uintptr_t, vmm_mapping> mappings;  // cuMemMap: start -> mapping
    std::uint64_t peers = 0;                         // bit p: may access device p's segments
    stream_id legacy = 0;
    bool faulted = false;  // a sticky cudaErrorIllegalAddress
    bool runtime_retained = false;
    long primary_retains = 0;
  };
  struct stream_state {
    stream_id id = 0;
    int device = 0;
    unsigned flags = 0;
    int priority = 0;
    bool legacy = false;
    bool alive = true;
    simulated_stream sim{};
    std::uint64_t seq = 0;                     // works enqueued
    vclock order;                              // what its next work comes after
    double ready = 0;                          // when its last work ends
    std::uint64_t capture = 0;                 // the capture it takes part in
    std::vector<std::uint32_t> capture_deps;   // the captured nodes its next node depends on
    std::vector<cudaGraphNode_t> dep_handles;  // cudaStreamGetCaptureInfo's answer
  };
  struct event_state {
    simulated_event sim{};
    int device = 0;
    unsigned flags = 0;
    bool recorded = false;  // recorded outside a capture
    stream_id stream = 0;
    vclock order;
    double time = 0;            // when it completes
    std::uint64_t capture = 0;  // last recorded in this capture (captures_ may have ended it)
    std::vector<std::uint32_t> capture_nodes;
  };
  struct host_state {
    std::size_t size;
    unsigned flags;
    bool allocated;  // cudaHostAlloc (true) or cudaHostRegister (false)
  };
  // Bytes of physical memory a work touches: a VMM handle and offsets in it, or (handle 0) the
  // addresses themselves for memory that is not a VMM mapping.
  struct physical_range {
    std::uint64_t handle;
    std::uintptr_t begin;
    std::uintptr_t end;
    bool write;
    std::size_t index;  // of the touched range it comes from
  };
  struct pending_work {
    stream_id stream;
    std::uint64_t seq;
    int device;
    double end;
    std::string what;
    std::vector<touched_range> ranges;
    std::vector<physical_range> physical;
  };
  enum class node_kind : std::uint8_t { work, event_record, event_wait };
  struct graph_node {
    node_kind kind = node_kind::work;
    int device = 0;
    std::string what;
    std::vector<touched_range> ranges;
    double seconds = 0;
    std::vector<std::uint32_t> deps;
    std::uintptr_t event = 0;
    cudaGraphNode_t handle = nullptr;
  };
  struct graph_state {
    std::vector<graph_node> nodes;
    std::uint64_t capture = 0;  // the capture that is building it
  };
  struct exec_state {
    std::vector<graph_node> nodes;
  };
  struct capture_state {
    std::uint64_t id = 0;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    std::thread::id thread;
    stream_id origin = 0;
    bool invalidated = false;
    std::string why;  // what invalidated it
    std::uintptr_t graph = 0;
    std::vector<stream_id> streams;  // origin first, then those that joined
  };
  struct work_spec {
    std::string what;
    int device = 0;
    double seconds = 0;
    std::vector<touched_range> ranges;
  };
  struct enqueued {
    status result;
    bool captured;
    double end;
  };

  // Opaque handles: never dereferenced, never reused.
  static constexpr std::uintptr_t stream_base = 0x5e0000000000;
  static constexpr std::uintptr_t event_base = 0x5e1000000000;
  static constexpr std::uintptr_t context_base = 0x5e2000000000;
  static constexpr std::uintptr_t graph_base = 0x5e3000000000;
  static constexpr std::uintptr_t exec_base = 0x5e4000000000;
  static constexpr std::uintptr_t node_base = 0x5e5000000000;
  // Physical handles carry their device in the top byte (device 0's are the device's own).
  static constexpr unsigned handle_device_shift = 56;
  static constexpr std::uint64_t handle_local_mask = (std::uint64_t{1} << 56) - 1;

  static std::uintptr_t stream_handle(stream_id id) noexcept { return stream_base + id * 16; }
  static std::uint64_t device_bit(int d) noexcept { return std::uint64_t{1} << d; }

  static void add_calls(gpumemSimCallCounts& c, const call_counters& k) noexcept {
    c.malloc += k.malloc;
    c.free += k.free;
    c.mem_get_info += k.mem_get_info;
    c.event_create += k.event_create;
    c.event_destroy += k.event_destroy;
    c.event_record += k.event_record;
    c.event_query += k.event_query;
    c.event_synchronize += k.event_synchronize;
    c.device_synchronize += k.device_synchronize;
    c.stream_create += k.stream_create;
    c.stream_destroy += k.stream_destroy;
    c.address_reserve += k.address_reserve;
    c.address_free += k.address_free;
    c.mem_create += k.mem_create;
    c.mem_release += k.mem_release;
    c.mem_map += k.mem_map;
    c.mem_unmap += k.mem_unmap;
    c.set_access += k.set_access;
  }

  // Each device's address space: GPUMEM_SIM_ADDRESS_SPACE, or as much as a GPU's (32 TiB, less
  // with many devices), halved while the system refuses it (sanitizers' smaller address spaces).
  static std::unique_ptr<simulated_device> make_device(const settings& s, int index) {
    simulated_device::options o;
    o.capacity = s.memory;
    o.index = index;
    o.faults = s.faults;
    if (s.address_space != 0) {
      o.address_space = s.address_space;
      return std::make_unique<simulated_device>(o);
    }
    constexpr std::size_t TiB = std::size_t{1} << 40;
    const std::size_t floor = std::max(8 * s.memory, std::size_t{64} << 30);
    std::size_t space = std::min(32 * TiB, 96 * TiB / static_cast<std::size_t>(s.devices));
    space = std::max(space, floor);
    for (;;) {
      o.address_space = space;
      try {
        return std::make_unique<simulated_device>(o);
      } catch (const std::system_error&) {
        if (space / 2 < floor) throw;
        space /= 2;
      }
    }
  }

  device_state& dev(int d) { return devices_.at(static_cast<std::size_t>(d)); }

  int handle_device(std::uint64_t handle) const noexcept {
    const auto d = static_cast<int>(handle >> handle_device_shift);
    return valid_device(d) ? d : -1;
  }

  double wall_seconds() const noexcept {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  // The host clock, caught up with the wall clock.
  double now_locked() noexcept {
    host_now_ = std::max(host_now_, wall_seconds());
    return host_now_;
  }

  void wait_until_locked(double t) noexcept {
    now_locked();
    host_now_ = std::max(host_now_, t);
  }

  double transfer_seconds(std::size_t bytes) const noexcept {
    return settings_.bandwidth > 0 ? static_cast<double>(bytes) / settings_.bandwidth : 0.0;
  }

  static touched_range range(const void* p, std::size_t bytes, bool write) noexcept {
    touched_range r;
    r.begin = reinterpret_cast<std::uintptr_t>(p);
    r.end = r.begin + bytes;
    r.write = write;
    return r;
  }

  // --- Streams and events ----------------------------------------------------------------------

  stream_state& legacy_locked(int device) { return streams_.at(dev(device).legacy); }

  // A default stream handle names the legacy stream of the current device.
  stream_state* find_stream_locked(cudaStream_t stream, int current) {
    if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
      return &legacy_locked(current);
    }
    return find_created_stream_locked(stream);
  }

  stream_state* find_created_stream_locked(cudaStream_t stream) {
    const auto h = reinterpret_cast<std::uintptr_t>(stream);
    if (h < stream_base || (h - stream_base) % 16 != 0) return nullptr;
    const auto it = streams_.find((h - stream_base) / 16);
    if (it == streams_.end() || !it->second.alive || it->second.legacy) return nullptr;
    return &it->second;
  }

  event_state* find_event_locked(cudaEvent_t event) {
    const auto it = events_.find(reinterpret_cast<std::uintptr_t>(event));
    return it == events_.end() ? nullptr : &it->second;
  }

  std::string describe(const stream_state& s) const {
    if (s.legacy) return fmt::format("the legacy default stream of device {}", s.device);
    return fmt::format("stream {:#x} (device {})", stream_handle(s.id), s.device);
  }

  // Kernels run on the current device: a stream of another device is rejected, as CUDA does.
  void check_stream_of_device_locked(const stream_state& s, int current, const char* call) const {
    if (s.device != current) {
      throw cuda_error(invalid_handle,
                       fmt::format("{}: {} is not a stream of the current device {}", call,
                                   describe(s), current));
    }
  }

  // A device with a sticky fault fails every call that touches it.
  void check_fault_locked(int device, const char* call) {
    if (dev(device).faulted) {
      throw cuda_error(illegal_address,
                       fmt::format("{}: device {} faulted earlier (an illegal address; see the "
                                   "'cudasim violation' lines)",
                                   call, device));
    }
  }

  // The legacy stream's semantics: work on it comes after the work queued so far on the device's
  // blocking streams, and work on a blocking stream after the legacy stream's.
  void order_locked(stream_state& s) {
    if (s.legacy) {
      for (auto& [id, t] : streams_) {
        if (t.device != s.device || t.legacy || (t.flags & cudaStreamNonBlocking) != 0 ||
            t.capture != 0) {
          continue;
        }
        s.order.join(t.order);
        s.ready = std::max(s.ready, t.ready);
      }
    } else if ((s.flags & cudaStreamNonBlocking) == 0) {
      const stream_state& l = legacy_locked(s.device);
      s.order.join(l.order);
      s.ready = std::max(s.ready, l.ready);
    }
  }

  // The host has seen the work of `order` complete.
  void observe_locked(const vclock& order) {
    host_order_.join(order);
    pending_.erase(
        std::remove_if(pending_.begin(), pending_.end(),
                       [&](const pending_work& p) { return host_order_.get(p.stream) >= p.seq; }),
        pending_.end());
  }

  // cudaFree and friends: every device's work completes and the host knows it.
  void synchronize_all_locked() {
    for (auto& [id, s] : streams_) {
      if (s.capture != 0) continue;
      wait_until_locked(s.ready);
      observe_locked(s.order);
    }
  }

  // Work on `s`: captured when it is capturing; otherwise placed on its timeline, checked, and
  // remembered until the host sees it complete.
  enqueued enqueue_locked(stream_state& s, work_spec w) {
    if (s.capture != 0) {
      capture_state& c = captures_.at(s.capture);
      if (c.invalidated) return {capture_invalidated, true, 0};
      graph_node n;
      n.device = w.device;
      n.what = std::move(w.what);
      n.ranges = std::move(w.ranges);
      n.seconds = w.seconds;
      add_node_locked(s, std::move(n));
      return {ok, true, 0};
    }
    if (s.legacy) check_legacy_allowed_locked(s.device, w.what.c_str(), true);
    check_fault_locked(s.device, w.what.c_str());
    const double now = now_locked();
    order_locked(s);
    ++s.seq;
    s.order.raise(s.id, s.seq);
    const double end = std::max(now, s.ready) + w.seconds;
    s.ready = end;
    check_work_locked(s, w, end);
    return {ok, false, end};
  }

  // --- The rules -------------------------------------------------------------------------------

  void report_locked(violation kind, int fault_device, const std::string& text) {
    ++violations_[static_cast<std::size_t>(kind)];
    std::string line = text;
    if (fault_device >= 0) {
      line += fmt::format("; device {} faults: its calls now return cudaErrorIllegalAddress",
                          fault_device);
      dev(fault_device).faulted = true;
    }
    last_violation_ = line;
    std::fprintf(stderr, "cudasim violation: %s\n", line.c_str());
    std::fflush(stderr);
    log(fmt::format("violation: {}", line));
    if (settings_.strict == strictness::abort) {
      std::fprintf(stderr, "cudasim violation: GPUMEM_SIM_STRICT=abort: aborting\n");
      std::abort();
    }
  }

  static std::string show(std::uintptr_t begin, std::uintptr_t end) {
    return fmt::format("[{:#x}, {:#x}) ({} bytes)", begin, end, end - begin);
  }

  template <class Map>
  static typename Map::const_iterator containing(
      const Map& m, std::uintptr_t x, std::size_t (*size_of)(const typename Map::mapped_type&)) {
    auto next = m.upper_bound(x);
    if (next == m.begin()) return m.end();
    const auto it = std::prev(next);
    return x - it->first < size_of(it->second) ? it : m.end();
  }
  static std::size_t segment_size(const std::size_t& bytes) { return bytes; }
  static std::size_t mapping_size(const vmm_mapping& m) { return m.size; }

  bool host_covers_locked(const void* p, std::size_t bytes) const {
    const auto it = host_range_locked(p);
    if (it == host_.end()) return false;
    const std::uintptr_t off = reinterpret_cast<std::uintptr_t>(p) - it->first;
    return bytes <= it->second.size - off;
  }

  // Every byte a work touches must be allocated or mapped, and accessible from the device that
  // touches it; the first problem of each range is reported, and faults the work's device.
  void check_access_locked(const stream_state& s, const std::string& what, const touched_range& r) {
    const char* verb = r.write ? "writes" : "reads";
    const int o = owner(reinterpret_cast<const void*>(r.begin));
    if (o < 0) {
      if (host_covers_locked(reinterpret_cast<const void*>(r.begin), r.end - r.begin)) return;
      report_locked(violation::unmapped, s.device,
                    fmt::format("unmapped memory: {} on {} {} {}, which is neither device memory "
                                "nor pinned host memory",
                                what, describe(s), verb, show(r.begin, r.end)));
      return;
    }
    const device_state& d = dev(o);
    std::uintptr_t x = r.begin;
    while (x < r.end) {
      if (!d.mem->is_device_pointer(reinterpret_cast<const void*>(x))) {
        report_locked(violation::unmapped, s.device,
                      fmt::format("unmapped memory: {} on {} {} {}, which runs past device {}'s "
                                  "memory",
                                  what, describe(s), verb, show(r.begin, r.end), o));
        return;
      }
      const auto seg = containing(d.segments, x, &segment_size);
      if (seg != d.segments.end()) {
        const std::uintptr_t stop = std::min(r.end, seg->first + seg->second);
        if (r.accessor >= 0 && r.accessor != o && (dev(r.accessor).peers & device_bit(o)) == 0) {
          report_locked(violation::inaccessible, s.device,
                        fmt::format("inaccessible memory: {} on {} {} {}: cudaMalloc memory of "
                                    "device {}, and device {} has no peer access to it "
                                    "(cudaDeviceEnablePeerAccess)",
                                    what, describe(s), verb, show(x, stop), o, r.accessor));
          return;
        }
        x = stop;
        continue;
      }
      const auto map = containing(d.mappings, x, &mapping_size);
      if (map != d.mappings.end()) {
        const std::uintptr_t stop = std::min(r.end, map->first + map->second.size);
        const int who = r.accessor >= 0 ? r.accessor : o;
        if ((map->second.access & device_bit(who)) == 0) {
          report_locked(violation::inaccessible, s.device,
                        fmt::format("inaccessible memory: {} on {} {} {}: memory of device {} "
                                    "mapped without cuMemSetAccess for device {}",
                                    what, describe(s), verb, show(x, stop), o, who));
          return;
        }
        x = stop;
        continue;
      }
      std::uintptr_t stop = r.end;
      const auto next_seg = d.segments.upper_bound(x);
      if (next_seg != d.segments.end()) stop = std::min(stop, next_seg->first);
      const auto next_map = d.mappings.upper_bound(x);
      if (next_map != d.mappings.end()) stop = std::min(stop, next_map->first);
      report_locked(violation::unmapped, s.device,
                    fmt::format("unmapped memory: {} on {} {} {}, not allocated or mapped on "
                                "device {} (freed, unmapped or never allocated)",
                                what, describe(s), verb, show(x, stop), o));
      return;
    }
  }

  // The physical memory under `ranges`, as the mappings are now. Two VMM ranges that map one
  // physical page (gpumem's stitch policy maps a free page at a second address) then name the
  // same bytes, as they are on the GPU.
  std::vector<physical_range> physical_locked(const std::vector<touched_range>& ranges) {
    std::vector<physical_range> out;
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      const touched_range& r = ranges[i];
      const int o = owner(reinterpret_cast<const void*>(r.begin));
      std::uintptr_t x = r.begin;
      while (x < r.end) {
        if (o >= 0) {
          const device_state& d = dev(o);
          const auto map = containing(d.mappings, x, &mapping_size);
          if (map != d.mappings.end()) {
            const std::uintptr_t stop = std::min(r.end, map->first + map->second.size);
            out.push_back({map->second.handle, x - map->first, stop - map->first, r.write, i});
            x = stop;
            continue;
          }
          // Up to the next mapping (or the end): memory that is what its address says.
          const auto next = d.mappings.upper_bound(x);
          const std::uintptr_t stop =
              next == d.mappings.end() ? r.end : std::min(r.end, next->first);
          out.push_back({0, x, stop, r.write, i});
          x = stop;
          continue;
        }
        out.push_back({0, x, r.end, r.write, i});
        x = r.end;
      }
    }
    return out;
  }

  // A new work: its ranges, its races with work of other streams it is not ordered after (on
  // the physical memory the ranges map to), and its place among the work the host has not seen
  // complete.
  void check_work_locked(const stream_state& s, const work_spec& w, double end) {
    for (const touched_range& r : w.ranges) check_access_locked(s, w.what, r);
    std::vector<physical_range> physical = physical_locked(w.ranges);
    // One report per new work: its first conflict with earlier work it is not ordered after.
    for (const pending_work& p : pending_) {
      if (p.stream == s.id || s.order.get(p.stream) >= p.seq) continue;
      for (const physical_range& a : physical) {
        for (const physical_range& b : p.physical) {
          if (a.handle != b.handle || !overlaps(a.begin, a.end, b.begin, b.end) ||
              (!a.write && !b.write)) {
            continue;
          }
          const stream_state& other = streams_.at(p.stream);
          const touched_range& ra = w.ranges[a.index];
          const touched_range& rb = p.ranges[b.index];
          report_locked(
              violation::race, -1,
              fmt::format("race: {} on {} {} {} while {} on {} {} {}{}, and no event, wait or "
                          "synchronisation orders the two",
                          w.what, describe(s), a.write ? "writes" : "reads", show(ra.begin, ra.end),
                          p.what, describe(other), b.write ? "writes" : "reads",
                          show(rb.begin, rb.end),
                          a.handle != 0 && !overlaps(ra.begin, ra.end, rb.begin, rb.end)
                              ? fmt::format(" (the same physical memory, handle {:#x}, mapped at "
                                            "both addresses)",
                                            a.handle)
                              : std::string()));
          remember_locked(s, w, end, std::move(physical));
          return;
        }
      }
    }
    remember_locked(s, w, end, std::move(physical));
  }

  void remember_locked(const stream_state& s, const work_spec& w, double end,
                       std::vector<physical_range> physical) {
    if (!w.ranges.empty()) {
      pending_.push_back(
          pending_work{s.id, s.seq, s.device, end, w.what, w.ranges, std::move(physical)});
    }
  }

  // Memory [begin, end) stops being mapped: work the host has not seen complete must not touch
  // it. Work still running on the timeline faults its device, as the GPU would.
  void check_released_locked(const std::string& call, std::uintptr_t begin, std::uintptr_t end) {
    const double now = now_locked();
    for (const pending_work& p : pending_) {
      for (const touched_range& r : p.ranges) {
        if (!overlaps(r.begin, r.end, begin, end)) continue;
        const stream_state& s = streams_.at(p.stream);
        report_locked(violation::in_flight, p.end > now ? p.device : -1,
                      fmt::format("in flight: {} while {} on {}, which the host has not seen "
                                  "complete (no synchronisation or successful query after it), "
                                  "{} {}",
                                  call, p.what, describe(s), r.write ? "writes" : "reads",
                                  show(r.begin, r.end)));
        break;
      }
    }
  }

  // --- Capture rules ---------------------------------------------------------------------------

  void invalidate_locked(capture_state& c, std::string_view why) {
    if (c.invalidated) return;
    c.invalidated = true;
    c.why = std::string(why);
    count(extra::captures_invalidated);
    log(fmt::format("capture {} invalidated by {}", c.id, why));
  }

  // True when capture `c` has a stream on `device` (only blocking ones with `blocking_only`).
  bool capture_on_device_locked(const capture_state& c, int device, bool blocking_only) const {
    for (stream_id id : c.streams) {
      const stream_state& t = streams_.at(id);
      if (t.capture != c.id || t.device != device) continue;
      if (!blocking_only || (t.flags & cudaStreamNonBlocking) == 0) return true;
    }
    return false;
  }

  // Using the legacy stream while a blocking stream of its device captures would make the
  // capture depend on it: cudaErrorStreamCaptureImplicit (and the capture is invalidated, except
  // for the queries that only ask).
  void check_legacy_allowed_locked(int device, const char* call, bool invalidate) {
    bool conflict = false;
    for (auto& [id, c] : captures_) {
      if (!capture_on_device_locked(c, device, true)) continue;
      conflict = true;
      if (invalidate) invalidate_locked(c, fmt::format("{} on the legacy default stream", call));
    }
    if (conflict) {
      throw cuda_error(capture_implicit,
                       fmt::format("{}: the legacy default stream of device {} while a blocking "
                                   "stream of it captures",
                                   call, device));
    }
  }

  // Synchronising or querying a capturing stream conflicts with its capture.
  void check_sync_allowed_locked(stream_state& s, const char* call) {
    if (s.capture != 0) {
      invalidate_locked(captures_.at(s.capture), call);
      throw cuda_error(capture_unsupported,
                       fmt::format("{}({}): the stream is capturing", call, describe(s)));
    }
    if (s.legacy) check_legacy_allowed_locked(s.device, call, true);
  }

  // An event last recorded in a capture stands for no work: querying or waiting for it is
  // cudaErrorCapturedEvent (and invalidates the capture if it is still under way).
  void check_not_captured_locked(const event_state& e, const char* call, cudaEvent_t event) {
    if (e.capture == 0) return;
    const auto c = captures_.find(e.capture);
    if (c != captures_.end()) invalidate_locked(c->second, call);
    throw cuda_error(captured_event,
                     fmt::format("{}({}): the event was last recorded in a capturing stream", call,
                                 static_cast<void*>(event)));
  }

  // The potentially unsafe calls (cudaMalloc and the like) are prohibited, per the calling
  // thread's capture interaction mode, while captures are under way: in global mode by the
  // thread's own captures not begun in relaxed mode and by any thread's global-mode captures; in
  // thread-local mode by its own such captures only; never in relaxed mode. The prohibiting
  // captures are invalidated.
  void check_unsafe_locked(const char* call) {
    if (captures_.empty()) return;
    const thread_state& t = *gpumemSimInternalThread();
    if (t.capture_mode == cudaStreamCaptureModeRelaxed) return;
    const std::thread::id me = std::this_thread::get_id();
    bool prohibited = false;
    for (auto& [id, c] : captures_) {
      const bool own = c.thread == me && c.mode != cudaStreamCaptureModeRelaxed;
      const bool other = t.capture_mode == cudaStreamCaptureModeGlobal && c.thread != me &&
                         c.mode == cudaStreamCaptureModeGlobal;
      if (own || other) {
        invalidate_locked(c, call);
        prohibited = true;
      }
    }
    if (prohibited) {
      throw cuda_error(capture_unsupported,
                       fmt::format("{}: a potentially unsafe call during a stream capture (see "
                                   "cudaThreadExchangeStreamCaptureMode)",
                                   call));
    }
  }

  // The device whose address range holds [va, va + size), for `call` (cuMemUnmap,
  // cuMemSetAccess); cuda_error(invalid_value) when no device's does.
  device_state& mapped_device_locked(const char* call, std::uintptr_t va, std::size_t size) {
    const int o = owner(reinterpret_cast<const void*>(va));
    if (o < 0) {
      throw cuda_error(invalid_value,
                       fmt::format("{}({:#x}, {}): not a mapped range", call, va, size));
    }
    return dev(o);
  }

  // Adds to the capture of `s` a node of `kind` (an external event record or wait) on `event`.
  void add_event_node_locked(stream_state& s, node_kind kind, const char* what, cudaEvent_t event) {
    graph_node n;
    n.kind = kind;
    n.device = s.device;
    n.what = what;
    n.event = reinterpret_cast<std::uintptr_t>(event);
    add_node_locked(s, std::move(n));
  }

  // Work that ends at `ready`, `order` in the order of work: wait true waits for it (the host
  // clock moves to `ready`); wait false answers not_ready until then. Once it has ended, the host
  // has seen it.
  status end_of_work_locked(double ready, const vclock& order, bool wait) {
    if (wait) {
      wait_until_locked(ready);
    } else if (ready > now_locked()) {
      return not_ready;
    }
    observe_locked(order);
    return ok;
  }

  // query_stream (wait false: not_ready while the stream's work runs) and synchronize_stream
  // (wait true: the host clock moves to the end of that work).
  status end_stream_work(int current, cudaStream_t stream, const char* call, bool wait) {
    std::lock_guard<std::mutex> lock(mutex_);
    stream_state* s = find_stream_locked(stream, current);
    if (s == nullptr) return invalid_handle;
    check_sync_allowed_locked(*s, call);
    check_fault_locked(s->device, call);
    count(wait ? extra::stream_synchronize : extra::stream_query);
    return end_of_work_locked(s->ready, s->order, wait);
  }

  // query_event (wait false: not_ready while the event's work runs) and synchronize_event (wait
  // true: the host clock moves to the end of that work).
  status end_event_work(cudaEvent_t event, const char* call, bool wait) {
    std::lock_guard<std::mutex> lock(mutex_);
    event_state* e = find_event_locked(event);
    if (e == nullptr) return invalid_handle;
    check_not_captured_locked(*e, call, event);
    check_fault_locked(e->device, call);
    if (wait) {
      dev(e->device).mem->synchronize_event(e->sim);
    } else {
      (void)dev(e->device).mem->query_event(e->sim);
    }
    if (!e->recorded) return ok;
    return end_of_work_locked(e->time, e->order, wait);
  }

  status isolation_locked(stream_state& s, const char* what) {
    invalidate_locked(captures_.at(s.capture), "cudaStreamWaitEvent across captures");
    throw cuda_error(capture_isolation,
                     fmt::format("cudaStreamWaitEvent({}): {} would cross the capture's boundary",
                                 describe(s), what));
  }

  static void add_dependency(std::vector<std::uint32_t>& deps, std::uint32_t n) {
    if (std::find(deps.begin(), deps.end(), n) == deps.end()) deps.push_back(n);
  }

  std::uintptr_t new_graph_locked() {
    const std::uintptr_t h = graph_base + next_graph_id_++ * 16;
    graphs_.emplace(h, graph_state{});
    return h;
  }

  // Appends `n` to the graph `s` captures into, after the stream's current dependencies.
  void add_node_locked(stream_state& s, graph_node n) {
    capture_state& c = captures_.at(s.capture);
    graph_state& g = graphs_.at(c.graph);
    const auto index = static_cast<std::uint32_t>(g.nodes.size());
    n.deps = s.capture_deps;
    n.handle = reinterpret_cast<cudaGraphNode_t>(node_base + next_node_id_++ * 16);
    node_index_.emplace(n.handle, std::make_pair(c.graph, index));
    g.nodes.push_back(std::move(n));
    s.capture_deps.assign(1, index);
  }

  // The nodes of graph `g` that `tips` depend on, and the tips themselves.
  std::vector<bool> ancestors_locked(std::uintptr_t g, const std::vector<std::uint32_t>& tips) {
    const graph_state& graph = graphs_.at(g);
    std::vector<bool> seen(graph.nodes.size(), false);
    std::vector<std::uint32_t> todo(tips.begin(), tips.end());
    while (!todo.empty()) {
      const std::uint32_t n = todo.back();
      todo.pop_back();
      if (seen[n]) continue;
      seen[n] = true;
      for (std::uint32_t d : graph.nodes[n].deps) todo.push_back(d);
    }
    return seen;
  }

  // Every stream leaves the capture; its graph is kept (ended well) or destroyed.
  void end_capture_locked(capture_state& c, bool keep_graph) {
    for (stream_id id : c.streams) {
      stream_state& t = streams_.at(id);
      if (t.capture != c.id) continue;
      t.capture = 0;
      t.capture_deps.clear();
      t.dep_handles.clear();
    }
    const auto g = graphs_.find(c.graph);
    if (g != graphs_.end()) {
      if (keep_graph) {
        g->second.capture = 0;
      } else {
        for (const graph_node& n : g->second.nodes) node_index_.erase(n.handle);
        graphs_.erase(g);
      }
    }
    captures_.erase(c.id);
  }

  // --- Host memory -----------------------------------------------------------------------------

  std::map<std::uintptr_t, host_state>::const_iterator host_range_locked(const void* ptr) const {
    const auto p = reinterpret_cast<std::uintptr_t>(ptr);
    auto next = host_.upper_bound(p);
    if (next == host_.begin()) return host_.end();
    const auto it = std::prev(next);
    return p - it->first < it->second.size ? it : host_.end();
  }

  const settings settings_;
  const std::chrono::steady_clock::time_point start_;
  std::FILE* log_ = nullptr;
  std::mutex log_mutex_;

  mutable std::mutex mutex_;
  std::vector<device_state> devices_;
  std::unordered_map<stream_id, stream_state> streams_;
  std::unordered_map<std::uintptr_t, event_state> events_;
  std::map<std::uintptr_t, host_state> host_;
  std::size_t host_bytes_ = 0;
  stream_id next_stream_id_ = 1;
  std::uint64_t next_event_id_ = 1;

  double host_now_ = 0;                // the host clock
  vclock host_order_;                  // the work the host has seen complete
  std::vector<pending_work> pending_;  // work with ranges the host has not seen complete

  // VMM handles: the shareable types requested at creation, and imports still to be released.
  struct handle_state {
    unsigned types = 0;
    bool gpu_direct_rdma = false;
    std::uint32_t imports = 0;
  };
  std::unordered_map<std::uint64_t, handle_state> handles_;

  // The live handle cuMemExportToShareableHandle names; cuda_error(invalid_handle) for an unknown
  // or released one (`what` follows the handle in the message: "" or ", FABRIC").
  const handle_state& exported_handle_locked(std::uint64_t handle, const char* what) const {
    const auto it = handles_.find(handle);
    if (it == handles_.end()) {
      throw cuda_error(invalid_handle, fmt::format("cuMemExportToShareableHandle(handle={:#x}{}): "
                                                   "unknown or released handle",
                                                   handle, what));
    }
    return it->second;
  }

  // cuda_error(invalid_value) when `h` was created without `type` (named `type_name`) requested.
  static void check_export_type_locked(const handle_state& h, std::uint64_t handle, unsigned type,
                                       const char* type_name) {
    if ((h.types & type) == 0) {
      throw cuda_error(invalid_value,
                       fmt::format("cuMemExportToShareableHandle(handle={:#x}): the memory was "
                                   "created without {} in requestedHandleTypes",
                                   handle, type_name));
    }
  }

  std::map<std::pair<std::uint64_t, std::uint64_t>, std::uint64_t> exported_;  // (dev, inode)
  std::map<std::array<unsigned char, fabric_handle_size>, std::uint64_t> fabric_exported_;
  std::uint64_t fabric_secret_ = 0x5bd1e9955bd1e995ULL;

  std::unordered_map<std::uint64_t, capture_state> captures_;  // under way (incl. invalidated)
  std::unordered_map<std::uintptr_t, graph_state> graphs_;
  std::unordered_map<std::uintptr_t, exec_state> execs_;
  std::unordered_map<cudaGraphNode_t, std::pair<std::uintptr_t, std::uint32_t>> node_index_;
  std::uint64_t next_capture_id_ = 1;
  std::uint64_t next_graph_id_ = 1;
  std::uint64_t next_exec_id_ = 1;
  std::uint64_t next_node_id_ = 1;

  std::array<std::uint64_t, static_cast<std::size_t>(violation::count_)> violations_{};
  std::string last_violation_;
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

/// What an exported function the simulator does not implement does before it returns `result`
/// (cudaErrorNotSupported or CUDA_ERROR_NOT_SUPPORTED, by name): reports `name` on stderr the
/// first time (`reported`), then counts the call and logs it on `sim` (nullptr: none). Never
/// throws.
inline void report_unimplemented(simulator* sim, const char* name, const char* result,
                                 std::atomic<bool>& reported) noexcept {
  if (!reported.exchange(true)) {
    std::fprintf(stderr,
                 "gpumem cudasim: %s is not implemented by the CUDA simulator; it returns "
                 "%s (reported once)\n",
                 name, result);
  }
  if (sim != nullptr) {
    sim->count(extra::unimplemented);
    if (sim->logging()) {
      try {
        sim->log(fmt::format("{}(...) = {}: not implemented", name, result));
      } catch (...) {
      }
    }
  }
}

}  // namespace gpumem::cudasim
