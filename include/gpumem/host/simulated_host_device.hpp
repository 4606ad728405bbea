// gpumem — simulated_host_device: pinned host memory simulated on ordinary memory, for tests.
//
// A model of the host-device concept (host/host_device.hpp): REAL host memory (users write into
// the buffers) with a simulated pinning limit, call counters, fault injection
// (gpumem::fault_injection, device/fault_injection.hpp, the simulated device's rules) and the
// streams and events of a gpumem::simulated_device passed by reference (so deferred reuse is
// tested with manual event completion).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "gpumem/detail/bits.hpp"
#include "gpumem/device/fault_injection.hpp"
#include "gpumem/device/simulated_device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/host/detail/page_memory.hpp"
#include "gpumem/host/host_device.hpp"

namespace gpumem {

// ---------------------------------------------------------------------------------------------
// simulated_host_device
// ---------------------------------------------------------------------------------------------

/// Everything a simulated host device is made from besides its event device.
struct simulated_host_device_options {
  /// Most bytes that may be pinned at once (host_alloc'ed plus registered, each counted in whole
  /// pages of page_size); a call that would exceed it fails as out of memory. Default: no limit.
  std::size_t capacity = std::numeric_limits<std::size_t>::max();
  /// Pinned bytes are counted in whole pages of this size (a power of two; 1 = exact).
  std::size_t page_size = 4096;
  /// Faults injected into the *fallible* calls, host_alloc and host_register: an injected fault
  /// looks like running out of pinned memory (nullptr / false). Same rules as
  /// simulated_device's: fail the N-th fallible call, every call above a size, or at random.
  fault_injection faults{};
  /// Real time every accepted host_alloc/host_free/host_register/host_unregister call sleeps
  /// (outside the device's lock), so that the pool's time statistics can be tested. 0 = none.
  std::chrono::microseconds call_latency{0};
};

/// Pinned host memory simulated on ordinary memory, for tests. Memory is real: host_alloc returns
/// page-aligned memory from std::aligned_alloc that callers may read and write. What is simulated
/// is the page-locking: a capacity of pinnable bytes, the bookkeeping of cudaHostAlloc'ed and
/// registered ranges (misuse is reported as CUDA reports it), call counters, fault injection and
/// an optional call latency. Streams and events are those of the simulated_device given at
/// construction (it must outlive this object), so their completion is controlled there
/// (event_completion::manual, complete_stream, ...).
///
/// Errors: misuse — freeing or unregistering what was never allocated or registered here (or
/// already released), a size other than the one given, registering a null or empty range or one
/// that overlaps a registered or host_alloc'ed range — throws cuda_error whose code() is the CUDA
/// status (error_invalid_value, error_host_memory_already_registered,
/// error_host_memory_not_registered) and leaves the device, its counters included, unchanged.
/// Running out of pinnable memory is not misuse: host_alloc returns nullptr, host_register false,
/// and the call is counted.
///
/// Thread safety: every member function may be called from any thread; one mutex serialises them
/// (the event device has its own). Not copyable or movable.
///
/// Fault injection (faults(), set_faults(), fallible_calls(), injected_faults() and
/// out_of_memory_failures(), from detail::simulated_fault_state): the fallible calls are
/// host_alloc of > 0 bytes and host_register.
class simulated_host_device : public detail::simulated_fault_state {
 public:
  using options = simulated_host_device_options;
  using stream_type = simulated_device::stream_type;
  using event_type = simulated_device::event_type;

  static constexpr int error_invalid_value = 1;                     ///< cudaErrorInvalidValue
  static constexpr int error_out_of_memory = 2;                     ///< cudaErrorMemoryAllocation
  static constexpr int error_host_memory_already_registered = 712;  ///< cudaErrorHostMemory...
  static constexpr int error_host_memory_not_registered = 713;      ///< cudaErrorHostMemory...
  /// Alignment of host_alloc's memory (cudaHostAlloc returns page-aligned memory).
  static constexpr std::size_t allocation_alignment = 4096;

  /// A host device whose events and streams are those of `events`. Throws std::invalid_argument
  /// for a page_size that is not a power of two, a fault probability outside [0, 1] or a
  /// negative latency.
  explicit simulated_host_device(simulated_device& events, const options& opts = options{})
      : simulated_fault_state(opts.faults, "simulated_host_device"),
        events_(events),
        options_(opts) {
    const std::size_t p = options_.page_size;
    if (p == 0 || (p & (p - 1)) != 0) {
      throw std::invalid_argument(
          fmt::format("simulated_host_device: page_size {} is not a power of two", p));
    }
    if (options_.call_latency.count() < 0) {
      throw std::invalid_argument("simulated_host_device: call_latency must be >= 0");
    }
  }

  simulated_host_device(const simulated_host_device&) = delete;
  simulated_host_device& operator=(const simulated_host_device&) = delete;

  /// Frees the memory of host_alloc'ed ranges still live (registrations are simply forgotten:
  /// that memory belongs to whoever allocated it). Check pinned_bytes() first to find leaks.
  /// Never throws.
  ~simulated_host_device() {
    for (const auto& [address, r] : ranges_) {
      if (!r.registered) detail::page_aligned_free(reinterpret_cast<void*>(address));
    }
  }

  // -------------------------------------------------------------------------------------------
  // The host-device concept
  // -------------------------------------------------------------------------------------------

  /// cudaHostAlloc: `bytes` of page-aligned, writable memory, pinning `bytes` rounded up to
  /// page_size. A fallible call. Returns nullptr when the capacity would be exceeded, when a
  /// fault is injected, or when the system has no memory for it; returns nullptr without pinning
  /// anything for 0 bytes (not a fallible call). Thread-safe; throws std::bad_alloc only.
  void* host_alloc(std::size_t bytes) {
    sleep_latency();
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.host_alloc;
    if (bytes == 0) return nullptr;
    if (faults_.should_fail(bytes)) return nullptr;
    std::size_t pinned = 0;
    std::size_t real = 0;
    if (!detail::checked_round_up(bytes, options_.page_size, pinned) ||
        pinned > options_.capacity - pinned_ ||
        !detail::checked_round_up(bytes, allocation_alignment, real)) {
      ++out_of_memory_failures_;
      return nullptr;
    }
    void* ptr = detail::page_aligned_alloc(real, allocation_alignment);
    if (ptr == nullptr) {
      ++out_of_memory_failures_;
      return nullptr;
    }
    try {
      ranges_.emplace(reinterpret_cast<std::uintptr_t>(ptr), range{bytes, pinned, false});
    } catch (...) {
      detail::page_aligned_free(ptr);
      throw;
    }
    add_pinned_locked(pinned);
    return ptr;
  }

  /// cudaFreeHost of memory from host_alloc(bytes). Thread-safe. Throws cuda_error
  /// (error_invalid_value), device unchanged, for a null pointer, a pointer that is not a live
  /// host_alloc (never allocated here, already freed, inside an allocation, or a registered
  /// range), or a size other than the one allocated.
  void host_free(void* ptr, std::size_t bytes) {
    sleep_latency();
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = unpin_range_locked(ptr, bytes, false, error_invalid_value, "cudaFreeHost");
    detail::page_aligned_free(ptr);
    ranges_.erase(it);
    ++counters_.host_free;
  }

  /// cudaHostRegister of [ptr, ptr + bytes), ordinary memory the caller owns: pins the pages the
  /// range covers (counted in page_size pages). A fallible call. Returns false when the capacity
  /// would be exceeded or a fault is injected. Thread-safe. Throws cuda_error, device unchanged:
  /// error_invalid_value for a null pointer, 0 bytes or a range that wraps around;
  /// error_host_memory_already_registered when the range overlaps one registered or
  /// host_alloc'ed here.
  bool host_register(void* ptr, std::size_t bytes) {
    sleep_latency();
    std::lock_guard<std::mutex> lock(mutex_);
    const auto call = [&] { return fmt::format("cudaHostRegister({}, {})", ptr, bytes); };
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    if (ptr == nullptr || bytes == 0 || bytes > UINTPTR_MAX - address) {
      fail(error_invalid_value, fmt::format("{}: null pointer, empty or wrapping range", call()));
    }
    if (const auto* other = overlapping_locked(address, bytes)) {
      fail(error_host_memory_already_registered,
           fmt::format("{}: overlaps the {} range at {:#x} of {} bytes", call(),
                       other->second.registered ? "registered" : "cudaHostAlloc'ed", other->first,
                       other->second.bytes));
    }
    ++counters_.host_register;
    if (faults_.should_fail(bytes)) return false;
    const std::size_t page = options_.page_size;
    const std::uintptr_t first = address & ~(static_cast<std::uintptr_t>(page) - 1);
    std::size_t last = 0;
    const std::size_t pinned =
        detail::checked_round_up(address + bytes - first, page, last) ? last : SIZE_MAX;
    if (pinned > options_.capacity - pinned_) {
      ++out_of_memory_failures_;
      return false;
    }
    ranges_.emplace(address, range{bytes, pinned, true});
    add_pinned_locked(pinned);
    return true;
  }

  /// cudaHostUnregister of a range registered with host_register(ptr, bytes). Thread-safe.
  /// Throws cuda_error (error_host_memory_not_registered), device unchanged, when no registered
  /// range starts at `ptr`; (error_invalid_value) for a size other than the one registered.
  void host_unregister(void* ptr, std::size_t bytes) {
    sleep_latency();
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = unpin_range_locked(ptr, bytes, true, error_host_memory_not_registered,
                                       "cudaHostUnregister");
    ranges_.erase(it);
    ++counters_.host_unregister;
  }

  /// The event device's default stream. Thread-safe; never throws.
  stream_type default_stream() const noexcept { return events_.default_stream(); }
  /// The event device's create_event (see simulated_device). Thread-safe.
  event_type create_event() { return events_.create_event(); }
  /// The event device's destroy_event. Thread-safe; throws as simulated_device does.
  void destroy_event(event_type event) { events_.destroy_event(event); }
  /// The event device's record_event. Thread-safe; throws as simulated_device does.
  void record_event(event_type event, stream_type stream) { events_.record_event(event, stream); }
  /// The event device's query_event. Thread-safe; throws as simulated_device does.
  bool query_event(event_type event) { return events_.query_event(event); }
  /// The event device's synchronize_event. Thread-safe; throws as simulated_device does.
  void synchronize_event(event_type event) { events_.synchronize_event(event); }

  // -------------------------------------------------------------------------------------------
  // Inspection and control (not part of the concept)
  // -------------------------------------------------------------------------------------------

  /// The simulated device that provides streams and events. Thread-safe; never throws.
  simulated_device& event_device() const noexcept { return events_; }

  /// Bytes pinned now (host_alloc'ed plus registered, in whole pages). 0 when everything was
  /// released (the tests' leak check). Thread-safe; never throws.
  std::size_t pinned_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pinned_;
  }

  /// Highest pinned_bytes() since construction or reset_peak_pinned_bytes(). Thread-safe; never
  /// throws.
  std::size_t peak_pinned_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_;
  }

  /// Sets the peak to the current pinned_bytes(). Thread-safe; never throws.
  void reset_peak_pinned_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = pinned_;
  }

  /// Number of live host_alloc ranges. Thread-safe; never throws.
  std::size_t live_host_allocations() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<std::size_t>(std::count_if(
        ranges_.begin(), ranges_.end(), [](const auto& r) { return !r.second.registered; }));
  }

  /// Number of live registrations. Thread-safe; never throws.
  std::size_t live_registrations() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<std::size_t>(std::count_if(
        ranges_.begin(), ranges_.end(), [](const auto& r) { return r.second.registered; }));
  }

  /// True when `ptr` lies in a live host_alloc'ed or registered range. Thread-safe; never throws.
  bool is_pinned(const void* ptr) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    auto next = ranges_.upper_bound(address);
    if (next == ranges_.begin()) return false;
    const auto r = std::prev(next);
    return address - r->first < r->second.bytes;
  }

  /// Calls accepted since construction or reset_counters(): successful, out of memory or failed
  /// by injection; calls rejected as misuse are not counted. Thread-safe; never throws.
  host_call_counters counters() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return counters_;
  }

  /// Zeroes the call counters and the injected-fault and out-of-memory counts. Thread-safe; never
  /// throws.
  void reset_counters() {
    std::lock_guard<std::mutex> lock(mutex_);
    counters_ = host_call_counters{};
    reset_fault_counts_locked();
  }

  /// The capacity in bytes. Thread-safe; never throws.
  std::size_t capacity() const noexcept { return options_.capacity; }

  /// The options the device was built with. Thread-safe; never throws.
  const options& config() const noexcept { return options_; }

 private:
  struct range {
    std::size_t bytes;   // as given to host_alloc / host_register
    std::size_t pinned;  // capacity consumed
    bool registered;     // host_register (true) or host_alloc (false)
  };
  using range_map = std::map<std::uintptr_t, range>;

  [[noreturn]] static void fail(int code, const std::string& what) {
    throw cuda_error(code, "gpumem simulated host device: " + what);
  }

  void sleep_latency() const {
    if (options_.call_latency.count() > 0) std::this_thread::sleep_for(options_.call_latency);
  }

  template <class Call>
  range_map::iterator find_range_locked(void* ptr, bool registered, int code, const Call& call) {
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    auto it = ranges_.find(address);
    if (it != ranges_.end() && it->second.registered == registered) return it;
    const char* wanted = registered ? "registered range" : "cudaHostAlloc'ed range";
    if (it != ranges_.end()) {
      fail(code, fmt::format("{}: {:#x} is a {}, not a {}", call(), address,
                             it->second.registered ? "registered range" : "cudaHostAlloc'ed range",
                             wanted));
    }
    if (ptr != nullptr) {
      auto next = ranges_.upper_bound(address);
      if (next != ranges_.begin()) {
        const auto prev = std::prev(next);
        if (address - prev->first < prev->second.bytes) {
          fail(code, fmt::format("{}: pointer is {} bytes inside the range at {:#x} of {} bytes; "
                                 "pass the range's start",
                                 call(), address - prev->first, prev->first, prev->second.bytes));
        }
      }
    }
    fail(code, fmt::format("{}: not a live {} of this device (never made here, or already "
                           "released)",
                           call(), wanted));
  }

  // The range host_free (registered false) or host_unregister (true) releases, its pages
  // unpinned; the caller erases it. Throws as find_range_locked does, `code` for a missing range,
  // and error_invalid_value for a size other than `bytes`, device unchanged.
  range_map::iterator unpin_range_locked(void* ptr, std::size_t bytes, bool registered, int code,
                                         const char* api) {
    const auto call = [&] { return fmt::format("{}({}) of {} bytes", api, ptr, bytes); };
    auto it = find_range_locked(ptr, registered, code, call);
    if (it->second.bytes != bytes) {
      fail(error_invalid_value,
           fmt::format("{}: it was {} with {} bytes", call(),
                       registered ? "registered" : "allocated", it->second.bytes));
    }
    pinned_ -= it->second.pinned;
    return it;
  }

  const range_map::value_type* overlapping_locked(std::uintptr_t address, std::size_t bytes) const {
    auto next = ranges_.lower_bound(address);
    if (next != ranges_.end() && next->first < address + bytes) return &*next;
    if (next != ranges_.begin()) {
      const auto prev = std::prev(next);
      if (address - prev->first < prev->second.bytes) return &*prev;
    }
    return nullptr;
  }

  void add_pinned_locked(std::size_t bytes) noexcept {
    pinned_ += bytes;
    peak_ = std::max(peak_, pinned_);
  }

  simulated_device& events_;
  const options options_;
  range_map ranges_;
  std::size_t pinned_ = 0;
  std::size_t peak_ = 0;
  host_call_counters counters_;
};

static_assert(is_host_device_v<simulated_host_device>,
              "simulated_host_device must model the host-device concept");

}  // namespace gpumem
