// gpumem — simulated_device: a GPU memory system as a plain C++ object, for tests and replay.
//
// It behaves like one GPU's memory as CUDA allocators see it, on a machine without a GPU:
//  * a capacity in bytes, and CUDA's alignment rules: cudaMalloc segments are 512-byte aligned
//    (2 MiB aligned from 2 MiB up, as real drivers do) and consume their size rounded up to
//    segment_granularity of physical memory; VMM works in vmm_granularity (2 MiB) pages;
//  * fake addresses inside one large PROT_NONE range reserved from the OS and never touched, so
//    an 80 GiB or 141 GiB device costs no memory; freed ranges are reused lowest address first;
//  * both styles of device memory: segments (cudaMalloc/cudaFree) and VMM (cuMemAddressReserve,
//    cuMemCreate, cuMemMap, cuMemUnmap, cuMemSetAccess, cuMemRelease, cuMemAddressFree), checked
//    as strictly as the driver checks them — misuse throws cuda_error and changes nothing;
//  * streams and events whose completion the caller controls (event_completion);
//  * a counter per device call, an optional cost model, and fault injection.
//
// Time. One simulated clock, now(), drives timed event completion. It advances by advance_time(),
// by the cost model's charge for every call (the host is busy in the driver while the GPU keeps
// working, so polling query_event with costs on eventually sees the event complete), and by the
// waits of synchronize(), synchronize_event() and deallocate() for timed work still pending.
// simulated_seconds() sums only the cost model's charges ("time spent in the driver");
// sync_wait_seconds() sums only the waits.
//
// Thread safety: every member function may be called from any thread; one mutex serialises them.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "gpumem/detail/bits.hpp"
#include "gpumem/detail/size_units.hpp"
#include "gpumem/device/detail/free_ranges.hpp"
#include "gpumem/device/device.hpp"
#include "gpumem/device/fault_injection.hpp"
#include "gpumem/error.hpp"

namespace gpumem {

/// When a recorded event of the simulated device completes.
enum class event_completion : std::uint8_t {
  immediate,  ///< as soon as it is recorded
  manual,     ///< when the caller completes its stream (complete_stream / complete_all), waits for
              ///< it (synchronize_event), or synchronises the device (synchronize, deallocate)
  timed,      ///< once now() >= record time + event_delay_seconds (or as for manual)
};

/// Everything a simulated device is made from.
struct simulated_device_options {
  std::size_t capacity = 0;  ///< device memory in bytes (gpumem::parse_size("80GiB"))
  int index = 0;             ///< device ordinal reported by index()
  /// Physical memory one cudaMalloc consumes is its size rounded up to this (0 or 1 = exact).
  std::size_t segment_granularity = std::size_t{2} << 20;
  /// VMM page size: cuMemGetAllocationGranularity. A power of two.
  std::size_t vmm_granularity = std::size_t{2} << 20;
  event_completion completion = event_completion::immediate;
  double event_delay_seconds = 0.0;  ///< timed mode: record-to-completion delay
  cost_model costs{};                ///< seconds charged per call (all zero = off)
  fault_injection faults{};          ///< off by default
  /// Bytes of fake address space for segments and VMM reservations; 0 = as much as a GPU has:
  /// 16 TiB (or 8 × capacity if more), halved while the system refuses, down to 8 × capacity.
  /// Reserved PROT_NONE / MAP_NORESERVE, so it costs no memory. PyTorch's expandable segments
  /// reserve 9/8 of the device per stream and pool: a replay with ten streams needs terabytes.
  std::size_t address_space = 0;
};

/// A stream of the simulated device; id 0 is the default stream.
struct simulated_stream {
  std::uint64_t id = 0;
  friend bool operator==(simulated_stream a, simulated_stream b) noexcept { return a.id == b.id; }
  friend bool operator!=(simulated_stream a, simulated_stream b) noexcept { return a.id != b.id; }
};

/// An event of the simulated device; id 0 is never a live event.
struct simulated_event {
  std::uint64_t id = 0;
  friend bool operator==(simulated_event a, simulated_event b) noexcept { return a.id == b.id; }
  friend bool operator!=(simulated_event a, simulated_event b) noexcept { return a.id != b.id; }
};

}  // namespace gpumem

namespace std {
template <>
struct hash<gpumem::simulated_stream> {
  std::size_t operator()(gpumem::simulated_stream s) const noexcept {
    return std::hash<std::uint64_t>{}(s.id);
  }
};
template <>
struct hash<gpumem::simulated_event> {
  std::size_t operator()(gpumem::simulated_event e) const noexcept {
    return std::hash<std::uint64_t>{}(e.id);
  }
};
}  // namespace std

namespace gpumem {

/// A simulated GPU (see the top of this file). Models the device concept and its VMM extension
/// (device/device.hpp). Not copyable or movable: handed-out addresses belong to this object.
///
/// Errors: misuse — an unknown or already freed pointer/handle/event/stream, a wrong size, a size
/// or address that is not a multiple of the granularity, mapping onto mapped pages or outside a
/// reservation, ... — throws cuda_error whose code() is the CUDA status the driver would return
/// (error_invalid_value, error_invalid_handle) and leaves the device, its counters included,
/// unchanged. Running out of memory is not misuse: allocate/create_physical return nullptr/0, and
/// the call is counted and charged. Every function may also throw std::bad_alloc.
///
/// Fault injection (faults(), set_faults(), fallible_calls(), injected_faults() and
/// out_of_memory_failures(), from detail::simulated_fault_state): the fallible calls are
/// allocate, create_physical, reserve_address and map.
class simulated_device : public detail::simulated_fault_state {
 public:
  using options = simulated_device_options;
  using stream_type = simulated_stream;
  using event_type = simulated_event;
  using physical_handle = std::uint64_t;  ///< like CUmemGenericAllocationHandle

  static constexpr bool supports_vmm = true;
  static constexpr physical_handle invalid_physical_handle = 0;
  /// cuda_error codes, the values CUDA uses for the same condition in both the runtime
  /// (cudaError_t) and the driver (CUresult) API.
  static constexpr int error_invalid_value = 1;     ///< cudaErrorInvalidValue
  static constexpr int error_out_of_memory = 2;     ///< cudaErrorMemoryAllocation
  static constexpr int error_invalid_handle = 400;  ///< cudaErrorInvalidResourceHandle
  /// Alignment of every cudaMalloc segment, and of segments of at least 2 MiB.
  static constexpr std::size_t segment_alignment = 512;
  static constexpr std::size_t large_segment_alignment = std::size_t{2} << 20;

  /// Builds a device from `opts`. Throws std::invalid_argument for a vmm_granularity that is not
  /// a power of two, a negative or non-finite delay or cost, a fault probability outside [0, 1];
  /// std::system_error when the address range cannot be reserved; std::bad_alloc.
  explicit simulated_device(const options& opts)
      : simulated_fault_state(opts.faults, "simulated_device"), options_(opts), costs_(opts.costs) {
    const std::size_t g = options_.vmm_granularity;
    if (g == 0 || (g & (g - 1)) != 0) {
      throw std::invalid_argument(
          fmt::format("simulated_device: vmm_granularity {} is not a power of two", g));
    }
    if (!std::isfinite(options_.event_delay_seconds) || options_.event_delay_seconds < 0) {
      throw std::invalid_argument(
          fmt::format("simulated_device: event_delay_seconds {} must be finite and >= 0",
                      options_.event_delay_seconds));
    }
    validate_costs(costs_);
    reserve_arena();
    streams_.emplace(0, stream_state{});  // the default stream lives as long as the device
  }

  /// A device of `capacity` bytes with every other option at its default. Throws as above.
  explicit simulated_device(std::size_t capacity) : simulated_device(make_options(capacity)) {}

  simulated_device(const simulated_device&) = delete;
  simulated_device& operator=(const simulated_device&) = delete;

  /// Returns the address range to the OS. Live segments, mappings and handles are simply dropped
  /// (check bytes_in_use() first to find leaks). Never throws.
  ~simulated_device() {
    if (arena_ != nullptr) ::munmap(arena_, arena_size_);
  }

  // -------------------------------------------------------------------------------------------
  // The device concept
  // -------------------------------------------------------------------------------------------

  /// The device ordinal from the options. Thread-safe; never throws.
  int index() const noexcept { return options_.index; }

  /// The capacity in bytes. Thread-safe; never throws.
  std::size_t total_memory() const noexcept { return options_.capacity; }

  /// cudaMemGetInfo: free = capacity − bytes_in_use(), total = capacity. Counted and charged.
  /// Thread-safe; never throws.
  void memory_info(std::size_t& free_bytes, std::size_t& total_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_bytes = options_.capacity - in_use_;
    total_bytes = options_.capacity;
    charge_locked(call_kind::mem_get_info);
  }

  /// cudaMalloc: one segment of `bytes`. Consumes bytes rounded up to segment_granularity of
  /// capacity. Returns nullptr when that would exceed the capacity, when the fake address space is
  /// exhausted, or when a fault is injected (a fallible call); returns nullptr without consuming
  /// anything for 0 bytes (as cudaMalloc(0) does; not a fallible call). Thread-safe; throws
  /// std::bad_alloc only.
  void* allocate(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes == 0) {
      charge_locked(call_kind::malloc);
      return nullptr;
    }
    if (faults_.should_fail(bytes)) {
      charge_locked(call_kind::malloc);
      return nullptr;
    }
    std::size_t physical = 0;
    std::size_t footprint = 0;
    const bool large = bytes >= large_segment_alignment;
    const std::size_t alignment = large ? large_segment_alignment : segment_alignment;
    const std::size_t g = options_.segment_granularity;
    if (!detail::checked_round_up(bytes, g <= 1 ? 1 : g, physical) ||
        physical > options_.capacity - in_use_ ||
        !detail::checked_round_up(bytes, alignment, footprint)) {
      return out_of_memory_locked(call_kind::malloc);
    }
    const std::uintptr_t address = free_.take(footprint, alignment);
    if (address == 0) return out_of_memory_locked(call_kind::malloc);
    try {
      segments_.emplace(address, segment_record{bytes, footprint, physical});
    } catch (...) {
      free_.give_back(address, footprint);
      throw;
    }
    add_in_use_locked(physical);
    charge_locked(call_kind::malloc, bytes);
    return reinterpret_cast<void*>(address);
  }

  /// cudaFree of a segment from allocate(bytes). Like cudaFree it synchronises the device: all
  /// work on all streams completes (timed work is waited for, advancing now()). deallocate(nullptr,
  /// 0) is a counted no-op. Thread-safe. Throws cuda_error (error_invalid_value) for a pointer that
  /// is not the start of a live segment (never allocated, already freed, or inside a segment) or a
  /// size other than the one allocated, leaving the device unchanged.
  void deallocate(void* ptr, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    if (ptr == nullptr) {
      if (bytes != 0) {
        fail(error_invalid_value,
             fmt::format("cudaFree(nullptr, {}): a null pointer has no size", bytes));
      }
      charge_locked(call_kind::free);
      return;
    }
    auto it = segments_.find(address);
    if (it == segments_.end()) {
      auto next = segments_.upper_bound(address);
      if (next != segments_.begin()) {
        const auto prev = std::prev(next);
        if (address < prev->first + prev->second.bytes) {
          fail(error_invalid_value,
               fmt::format("cudaFree({:#x}, {}): pointer is {} bytes inside the segment at {:#x} "
                           "of {} bytes; free the segment's start",
                           address, bytes, address - prev->first, prev->first, prev->second.bytes));
        }
      }
      fail(error_invalid_value,
           fmt::format("cudaFree({:#x}, {}): not a live segment of this device (never allocated "
                       "here, or already freed)",
                       address, bytes));
    }
    if (it->second.bytes != bytes) {
      fail(error_invalid_value,
           fmt::format("cudaFree({:#x}, {}): the segment was allocated with {} bytes", address,
                       bytes, it->second.bytes));
    }
    free_.give_back(address, it->second.footprint);
    in_use_ -= it->second.physical;
    segments_.erase(it);
    synchronize_locked();
    charge_locked(call_kind::free, bytes);
  }

  /// The default stream (id 0). Thread-safe; never throws.
  stream_type default_stream() const noexcept { return stream_type{0}; }

  /// cudaEventCreateWithFlags(cudaEventDisableTiming): a new, never-recorded (complete) event.
  /// Thread-safe; throws std::bad_alloc only.
  event_type create_event() {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::uint64_t id = next_event_id_++;
    events_.emplace(id, event_state{});
    charge_locked(call_kind::event_create);
    return event_type{id};
  }

  /// cudaEventDestroy. Thread-safe. Throws cuda_error (error_invalid_handle) for an unknown or
  /// already destroyed event.
  void destroy_event(event_type event) {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.erase(find_event_locked(event, "cudaEventDestroy"));
    charge_locked(call_kind::event_destroy);
  }

  /// cudaEventRecord: the event now stands for the work queued on `stream` so far (recording again
  /// replaces what it stood for). Thread-safe. Throws cuda_error (error_invalid_handle) for an
  /// unknown event or a stream that is unknown or destroyed.
  void record_event(event_type event, stream_type stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto e = find_event_locked(event, "cudaEventRecord");
    auto s = find_stream_locked(stream, "cudaEventRecord");
    stream_state& st = s->second;
    ++st.submitted;
    if (options_.completion == event_completion::immediate) st.completed = st.submitted;
    const double ready =
        now_ + (options_.completion == event_completion::timed ? options_.event_delay_seconds : 0);
    st.last_ready = std::max(st.last_ready, ready);
    latest_ready_ = std::max(latest_ready_, ready);
    e->second = event_state{true, stream.id, st.submitted, ready};
    charge_locked(call_kind::event_record);
  }

  /// cudaStreamWaitEvent: work queued on `stream` from now on waits for the event's work on the
  /// GPU; the host does not wait. The simulated device runs no work, so this is counted and
  /// charged only (what a GPU would order, the strict CUDA simulator checks). Thread-safe. Throws
  /// cuda_error (error_invalid_handle) for an unknown event or an unknown or destroyed stream.
  void stream_wait_event(stream_type stream, event_type event) {
    std::lock_guard<std::mutex> lock(mutex_);
    find_event_locked(event, "cudaStreamWaitEvent");
    find_stream_locked(stream, "cudaStreamWaitEvent");
    charge_locked(call_kind::stream_wait_event);
  }

  /// cudaEventQuery: true when the recorded work has completed (see event_completion); true for
  /// an event never recorded. Thread-safe. Throws cuda_error (error_invalid_handle) for an unknown
  /// event.
  bool query_event(event_type event) {
    std::lock_guard<std::mutex> lock(mutex_);
    const bool done = complete_locked(find_event_locked(event, "cudaEventQuery")->second);
    charge_locked(call_kind::event_query);
    return done;
  }

  /// cudaEventSynchronize: completes the event's stream up to the event (manual), or waits until
  /// it is ready (timed: advances now()). Thread-safe. Throws cuda_error (error_invalid_handle)
  /// for an unknown event.
  void synchronize_event(event_type event) {
    std::lock_guard<std::mutex> lock(mutex_);
    const event_state& e = find_event_locked(event, "cudaEventSynchronize")->second;
    if (!complete_locked(e)) {
      if (options_.completion == event_completion::timed) wait_until_locked(e.ready);
      auto s = streams_.find(e.stream);
      if (s != streams_.end()) s->second.completed = std::max(s->second.completed, e.sequence);
    }
    charge_locked(call_kind::event_synchronize);
  }

  /// cudaDeviceSynchronize: all work on all streams completes (timed: now() advances to the last
  /// pending completion). Thread-safe; never throws.
  void synchronize() {
    std::lock_guard<std::mutex> lock(mutex_);
    synchronize_locked();
    charge_locked(call_kind::device_synchronize);
  }

  // -------------------------------------------------------------------------------------------
  // Streams and simulated time
  // -------------------------------------------------------------------------------------------

  /// cudaStreamCreateWithFlags: a new stream (ids are never reused). Thread-safe; throws
  /// std::bad_alloc only.
  stream_type create_stream() {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::uint64_t id = next_stream_id_++;
    streams_.emplace(id, stream_state{});
    charge_locked(call_kind::stream_create);
    return stream_type{id};
  }

  /// cudaStreamDestroy. As in CUDA, work already queued on the stream still completes later
  /// (manual mode: by complete_all / synchronize; events recorded on it keep working). Thread-safe.
  /// Throws cuda_error (error_invalid_handle) for the default stream or an unknown or destroyed
  /// stream.
  void destroy_stream(stream_type stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stream.id == 0) {
      fail(error_invalid_handle,
           "cudaStreamDestroy(stream 0): the default stream cannot be "
           "destroyed");
    }
    auto s = find_stream_locked(stream, "cudaStreamDestroy");
    s->second.alive = false;
    if (stream_done_locked(s->second)) streams_.erase(s);
    charge_locked(call_kind::stream_destroy);
  }

  /// Manual completion: all work queued so far on `stream` completes (in any mode). Not a device
  /// call: neither counted nor charged. Thread-safe. Throws cuda_error (error_invalid_handle) for
  /// an unknown or destroyed stream.
  void complete_stream(stream_type stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    stream_state& st = find_stream_locked(stream, "complete_stream")->second;
    st.completed = st.submitted;
  }

  /// Manual completion of every stream's work, destroyed streams included, without moving the
  /// clock. Not a device call. Thread-safe; never throws.
  void complete_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    complete_all_locked();
  }

  /// Moves the simulated clock forward by `seconds`. Not a device call. Thread-safe. Throws
  /// std::invalid_argument for a negative or non-finite value.
  void advance_time(double seconds) {
    if (!std::isfinite(seconds) || seconds < 0) {
      throw std::invalid_argument(
          fmt::format("simulated_device::advance_time({}): must be finite and >= 0", seconds));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    now_ += seconds;
  }

  /// The simulated clock in seconds (see "Time" at the top). Thread-safe; never throws.
  double now() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return now_;
  }

  // -------------------------------------------------------------------------------------------
  // VMM (CUDA driver virtual memory management)
  // -------------------------------------------------------------------------------------------

  /// cuMemGetAllocationGranularity: the VMM page size. Thread-safe; never throws.
  std::size_t granularity() const noexcept { return options_.vmm_granularity; }

  /// cuMemAddressReserve: `size` bytes of virtual addresses, aligned to max(alignment,
  /// granularity()), consuming no capacity. A fallible call. Thread-safe. Throws cuda_error:
  /// error_invalid_value when size is 0 or not a multiple of granularity() or alignment is not 0
  /// or a power of two (device unchanged); error_out_of_memory when the fake address space is
  /// exhausted or a fault is injected (counted and charged).
  std::uintptr_t reserve_address(std::size_t size, std::size_t alignment = 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto call = [&] {
      return fmt::format("cuMemAddressReserve(size={}, alignment={})", size, alignment);
    };
    check_granular_locked(size, "size", call);
    if (alignment != 0 && (alignment & (alignment - 1)) != 0) {
      fail(error_invalid_value, fmt::format("{}: alignment is not a power of two", call()));
    }
    if (faults_.should_fail(size)) {
      charge_locked(call_kind::address_reserve);
      fail(error_out_of_memory, fmt::format("{}: injected fault", call()));
    }
    const std::uintptr_t va = free_.take(size, std::max(alignment, options_.vmm_granularity));
    if (va == 0) {
      charge_locked(call_kind::address_reserve);
      ++out_of_memory_failures_;
      fail(error_out_of_memory, fmt::format("{}: the simulated address space ({}) is exhausted",
                                            call(), format_bytes(arena_usable_)));
    }
    try {
      reservations_.emplace(va, size);
    } catch (...) {
      free_.give_back(va, size);
      throw;
    }
    charge_locked(call_kind::address_reserve);
    return va;
  }

  /// cuMemAddressFree of a whole reservation (same start and size as reserved). Thread-safe.
  /// Throws cuda_error (error_invalid_value), device unchanged, for an unknown reservation, a
  /// different size, or a reservation that still has mappings (unmap first; stricter than CUDA
  /// documents, to catch leaks).
  void free_address(std::uintptr_t va, std::size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto r = reservations_.find(va);
    if (r == reservations_.end()) {
      fail(error_invalid_value,
           fmt::format("cuMemAddressFree({:#x}, {}): no reservation starts there", va, size));
    }
    if (r->second != size) {
      fail(error_invalid_value,
           fmt::format("cuMemAddressFree({:#x}, {}): the reservation has {} bytes", va, size,
                       r->second));
    }
    auto m = mappings_.lower_bound(va);
    if (m != mappings_.end() && m->first < va + size) {
      fail(error_invalid_value,
           fmt::format("cuMemAddressFree({:#x}, {}): {:#x} is still mapped; unmap first", va, size,
                       m->first));
    }
    free_.give_back(va, size);
    reservations_.erase(r);
    charge_locked(call_kind::address_free);
  }

  /// cuMemCreate: `size` bytes of physical memory, consuming capacity. A fallible call. Returns
  /// invalid_physical_handle (0) when the capacity would be exceeded or a fault is injected.
  /// Thread-safe. Throws cuda_error (error_invalid_value) when size is 0 or not a multiple of
  /// granularity(), device unchanged.
  physical_handle create_physical(std::size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    check_granular_locked(size, "size", [&] { return fmt::format("cuMemCreate(size={})", size); });
    if (faults_.should_fail(size)) {
      charge_locked(call_kind::mem_create);
      return invalid_physical_handle;
    }
    if (size > options_.capacity - in_use_) {
      out_of_memory_locked(call_kind::mem_create);
      return invalid_physical_handle;
    }
    const physical_handle h = next_handle_++;
    physical_.emplace(h, physical_record{size, 0, false});
    add_in_use_locked(size);
    charge_locked(call_kind::mem_create, size);
    return h;
  }

  /// cuMemRelease. As in CUDA, releasing a handle that is still mapped is allowed: its memory is
  /// freed when the last mapping of it is unmapped. Thread-safe. Throws cuda_error
  /// (error_invalid_handle), device unchanged, for an unknown or already released handle.
  void release_physical(physical_handle handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto p = find_live_handle_locked(
        handle, [&] { return fmt::format("cuMemRelease(handle={})", handle); });
    if (p->second.mappings == 0) {
      in_use_ -= p->second.size;
      physical_.erase(p);
    } else {
      p->second.released = true;
    }
    charge_locked(call_kind::mem_release);
  }

  /// cuMemMap: maps bytes [offset, offset + size) of `handle` at [va, va + size). A fallible call.
  /// The same handle may be mapped at several places. Thread-safe. Throws cuda_error, device
  /// unchanged: error_invalid_value when va, size or offset is not a multiple of granularity(),
  /// size is 0, offset + size exceeds the handle, the range is not inside one reservation, or any
  /// page of it is already mapped; error_invalid_handle for an unknown or released handle;
  /// error_out_of_memory for an injected fault (counted and charged).
  void map(std::uintptr_t va, std::size_t size, std::size_t offset, physical_handle handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto call = [&] {
      return fmt::format("cuMemMap(va={:#x}, size={}, offset={}, handle={})", va, size, offset,
                         handle);
    };
    check_granular_locked(size, "size", call);
    check_aligned_locked(va, "va", call);
    check_aligned_locked(offset, "offset", call);
    auto p = find_live_handle_locked(handle, call);
    if (offset > p->second.size || size > p->second.size - offset) {
      fail(error_invalid_value,
           fmt::format("{}: offset + size exceeds the handle's {} bytes", call(), p->second.size));
    }
    if (!inside_reservation_locked(va, size)) {
      fail(error_invalid_value, fmt::format("{}: the range is not inside one reservation", call()));
    }
    auto next = mappings_.lower_bound(va);
    if (next != mappings_.end() && next->first < va + size) {
      fail(error_invalid_value, fmt::format("{}: {:#x} is already mapped", call(), next->first));
    }
    if (next != mappings_.begin()) {
      const auto prev = std::prev(next);
      if (prev->first + prev->second.size > va) {
        fail(error_invalid_value, fmt::format("{}: {:#x} is already mapped (by the mapping at "
                                              "{:#x})",
                                              call(), va, prev->first));
      }
    }
    if (faults_.should_fail(size)) {
      charge_locked(call_kind::mem_map);
      fail(error_out_of_memory, fmt::format("{}: injected fault", call()));
    }
    mappings_.emplace_hint(next, va, mapping_record{size, offset, handle, false});
    ++p->second.mappings;
    charge_locked(call_kind::mem_map, size);
  }

  /// cuMemUnmap of [va, va + size), which must consist of whole mappings, back to back (one call
  /// may unmap several mappings, as PyTorch's expandable segments do, but never part of one).
  /// Frees the memory of released handles whose last mapping this was. Thread-safe. Throws
  /// cuda_error (error_invalid_value), device unchanged, when the range is empty, starts where no
  /// mapping starts, has an unmapped gap, or would split a mapping.
  void unmap(std::uintptr_t va, std::size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto call = [&] { return fmt::format("cuMemUnmap(va={:#x}, size={})", va, size); };
    const auto first = whole_mappings_locked(va, size, call);
    auto it = first;
    while (it != mappings_.end() && it->first < va + size) {
      auto p = physical_.find(it->second.handle);
      if (--p->second.mappings == 0 && p->second.released) {
        in_use_ -= p->second.size;
        physical_.erase(p);
      }
      it = mappings_.erase(it);
    }
    charge_locked(call_kind::mem_unmap, size);
  }

  /// cuMemSetAccess (read/write for this device) on [va, va + size), which must consist of whole
  /// mappings, back to back. Thread-safe. Throws cuda_error (error_invalid_value), device
  /// unchanged, when it does not.
  void set_access(std::uintptr_t va, std::size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto call = [&] { return fmt::format("cuMemSetAccess(va={:#x}, size={})", va, size); };
    auto it = whole_mappings_locked(va, size, call);
    for (; it != mappings_.end() && it->first < va + size; ++it) it->second.accessible = true;
    charge_locked(call_kind::set_access, size);
  }

  /// True when `va` lies in a mapped range. Not a device call. Thread-safe; never throws.
  bool is_mapped(std::uintptr_t va) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return mapping_at_locked(va) != mappings_.end();
  }

  /// True when `va` lies in a mapped range whose access was set. Not a device call. Thread-safe;
  /// never throws.
  bool is_accessible(std::uintptr_t va) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto m = mapping_at_locked(va);
    return m != mappings_.end() && m->second.accessible;
  }

  // -------------------------------------------------------------------------------------------
  // Observation, costs, faults
  // -------------------------------------------------------------------------------------------

  /// Calls made since construction or reset_counters(), one count per kind. Every accepted call
  /// counts (successful, out of memory, or failed by injection); calls rejected as misuse do not.
  /// Thread-safe; never throws.
  call_counters counters() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return counters_;
  }

  /// Zeroes the call counters, the injected-fault and out-of-memory counts. Thread-safe; never
  /// throws.
  void reset_counters() {
    std::lock_guard<std::mutex> lock(mutex_);
    counters_ = call_counters{};
    reset_fault_counts_locked();
  }

  /// Physical bytes in use: live segments (rounded to segment_granularity) plus physical VMM
  /// memory not yet freed. 0 when everything was returned (the tests' leak check). Thread-safe;
  /// never throws.
  std::size_t bytes_in_use() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return in_use_;
  }

  /// Highest bytes_in_use() since construction or reset_peak_bytes_in_use(). Thread-safe; never
  /// throws.
  std::size_t peak_bytes_in_use() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_;
  }

  /// Sets the peak to the current bytes_in_use(). Thread-safe; never throws.
  void reset_peak_bytes_in_use() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = in_use_;
  }

  /// Number of live cudaMalloc segments. Thread-safe; never throws.
  std::size_t live_segments() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return segments_.size();
  }

  /// Number of live address reservations. Thread-safe; never throws.
  std::size_t live_reservations() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return reservations_.size();
  }

  /// Number of physical allocations whose memory is not yet freed (released but still mapped
  /// ones included). Thread-safe; never throws.
  std::size_t live_physical() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return physical_.size();
  }

  /// Number of live mappings (one per successful map call). Thread-safe; never throws.
  std::size_t live_mappings() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return mappings_.size();
  }

  /// Number of live events. Thread-safe; never throws.
  std::size_t live_events() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return events_.size();
  }

  /// Number of streams created and not destroyed, the default stream excluded. Thread-safe; never
  /// throws.
  std::size_t live_streams() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t n = 0;
    for (const auto& s : streams_) n += (s.first != 0 && s.second.alive) ? 1 : 0;
    return n;
  }

  /// Seconds charged by the cost model so far (time spent in driver calls). Thread-safe; never
  /// throws.
  double simulated_seconds() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return driver_seconds_;
  }

  /// Seconds synchronize / synchronize_event / deallocate waited for timed work. Thread-safe; never
  /// throws.
  double sync_wait_seconds() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return wait_seconds_;
  }

  /// The cost model in force. Thread-safe; never throws.
  cost_model costs() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return costs_;
  }

  /// Replaces the cost model for later calls. Thread-safe. Throws std::invalid_argument for a
  /// negative or non-finite figure (model unchanged).
  void set_costs(const cost_model& costs) {
    validate_costs(costs);
    std::lock_guard<std::mutex> lock(mutex_);
    costs_ = costs;
  }

  /// The options the device was built with (costs and faults as given then). Thread-safe; never
  /// throws.
  const options& config() const noexcept { return options_; }

  /// True when `ptr` lies in this device's fake address range (a segment or a reservation may or
  /// may not be live there). Thread-safe; never throws.
  bool is_device_pointer(const void* ptr) const noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(ptr);
    return a >= arena_base_ && a - arena_base_ < arena_usable_;
  }

 private:
  struct segment_record {
    std::size_t bytes;      // as allocated
    std::size_t footprint;  // address range taken
    std::size_t physical;   // capacity consumed
  };
  struct physical_record {
    std::size_t size;
    std::size_t mappings;  // live mappings of this handle
    bool released;         // cuMemRelease called; freed with the last mapping
  };
  struct mapping_record {
    std::size_t size;
    std::size_t offset;
    physical_handle handle;
    bool accessible;
  };
  struct stream_state {
    std::uint64_t submitted = 0;  // events recorded on the stream
    std::uint64_t completed = 0;  // events recorded and completed (manual completion)
    double last_ready = 0;        // latest ready time of its work (timed mode)
    bool alive = true;            // false once destroyed (kept while work is pending)
  };
  struct event_state {
    bool recorded = false;
    std::uint64_t stream = 0;
    std::uint64_t sequence = 0;  // position of the record on its stream
    double ready = 0;            // completion time (timed mode)
  };
  using mapping_iterator = std::map<std::uintptr_t, mapping_record>::iterator;

  static options make_options(std::size_t capacity) {
    options o;
    o.capacity = capacity;
    return o;
  }

  static void validate_costs(const cost_model& c) {
    for (call_kind k : all_call_kinds) {
      const double per_call = c.seconds(k, 0);
      const double per_byte = c.seconds(k, 1) - per_call;
      if (!std::isfinite(per_call) || per_call < 0 || !std::isfinite(per_byte) || per_byte < 0) {
        throw std::invalid_argument(
            fmt::format("simulated_device: cost of {} must be finite and >= 0", call_kind_name(k)));
      }
    }
  }

  void reserve_arena() {
    constexpr std::size_t min_space = std::size_t{64} << 30;
    constexpr std::size_t gpu_like = std::size_t{16} << 40;
    constexpr std::size_t max_auto = std::size_t{64} << 40;
    std::size_t space = options_.address_space;
    std::size_t floor = space;  // the least an automatic choice may fall back to
    if (space == 0) {
      floor =
          options_.capacity > max_auto / 8 ? max_auto : std::max(8 * options_.capacity, min_space);
      space = std::max(floor, gpu_like);
    }
    std::size_t usable = 0;
    if (!detail::checked_round_up(space, large_segment_alignment, usable) ||
        usable > SIZE_MAX - large_segment_alignment) {
      throw std::invalid_argument(
          fmt::format("simulated_device: address_space {} is too large", space));
    }
    // One extra 2 MiB so the usable part can start 2 MiB aligned.
    arena_size_ = usable + large_segment_alignment;
    void* p =
        ::mmap(nullptr, arena_size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    while (p == MAP_FAILED && usable / 2 >= floor && usable / 2 >= large_segment_alignment) {
      usable /= 2;  // a smaller process address space (several devices at once, ulimit -v)
      arena_size_ = usable + large_segment_alignment;
      p = ::mmap(nullptr, arena_size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                 0);
    }
    if (p == MAP_FAILED) {
      throw std::system_error(errno, std::generic_category(),
                              fmt::format("simulated_device: cannot reserve {} of address space",
                                          format_bytes(arena_size_)));
    }
    arena_ = p;
    const auto raw = reinterpret_cast<std::uintptr_t>(p);
    arena_base_ = (raw + large_segment_alignment - 1) & ~(large_segment_alignment - 1);
    arena_usable_ = usable;
    try {
      free_.reset(arena_base_, arena_usable_);
    } catch (...) {
      ::munmap(arena_, arena_size_);
      arena_ = nullptr;
      throw;
    }
  }

  [[noreturn]] void fail(int code, const std::string& what) const {
    throw cuda_error(code, fmt::format("gpumem simulated device {}: {}", options_.index, what));
  }

  void charge_locked(call_kind kind, std::size_t bytes = 0) noexcept {
    ++counters_[kind];
    const double s = costs_.seconds(kind, bytes);
    driver_seconds_ += s;
    now_ += s;
  }

  std::nullptr_t out_of_memory_locked(call_kind kind) noexcept {
    ++out_of_memory_failures_;
    charge_locked(kind);
    return nullptr;
  }

  void add_in_use_locked(std::size_t bytes) noexcept {
    in_use_ += bytes;
    peak_ = std::max(peak_, in_use_);
  }

  template <class Call>
  void check_granular_locked(std::size_t size, const char* name, const Call& call) const {
    if (size == 0 || size % options_.vmm_granularity != 0) {
      fail(error_invalid_value, fmt::format("{}: {} must be a non-zero multiple of the granularity "
                                            "({} bytes)",
                                            call(), name, options_.vmm_granularity));
    }
  }

  template <class Call>
  void check_aligned_locked(std::size_t value, const char* name, const Call& call) const {
    if (value % options_.vmm_granularity != 0) {
      fail(error_invalid_value, fmt::format("{}: {} must be a multiple of the granularity ({} "
                                            "bytes)",
                                            call(), name, options_.vmm_granularity));
    }
  }

  // `call` names the call in error messages; it is only evaluated on an error (a replay makes
  // millions of these calls).
  template <class Call>
  std::unordered_map<physical_handle, physical_record>::iterator find_live_handle_locked(
      physical_handle handle, const Call& call) {
    auto p = physical_.find(handle);
    if (p == physical_.end()) {
      fail(error_invalid_handle,
           fmt::format("{}: unknown physical handle (never created, or released and freed)",
                       call()));
    }
    if (p->second.released) {
      fail(error_invalid_handle,
           fmt::format("{}: the handle was already released (its memory is freed when its last "
                       "mapping is unmapped)",
                       call()));
    }
    return p;
  }

  bool inside_reservation_locked(std::uintptr_t va, std::size_t size) const noexcept {
    auto next = reservations_.upper_bound(va);
    if (next == reservations_.begin()) return false;
    const auto r = std::prev(next);
    const std::size_t into = va - r->first;
    return into < r->second && size <= r->second - into;
  }

  // The mappings that make up [va, va + size) exactly, back to back; throws if they do not.
  template <class Call>
  mapping_iterator whole_mappings_locked(std::uintptr_t va, std::size_t size, const Call& call) {
    if (size == 0 || size > UINTPTR_MAX - va) {
      fail(error_invalid_value, fmt::format("{}: the range is empty or wraps around", call()));
    }
    auto first = mappings_.find(va);
    if (first == mappings_.end()) {
      const auto inside = mapping_at_locked(va);
      if (inside != mappings_.end()) {
        fail(error_invalid_value, fmt::format("{}: would split the mapping at {:#x} of {} bytes",
                                              call(), inside->first, inside->second.size));
      }
      fail(error_invalid_value, fmt::format("{}: {:#x} is not mapped", call(), va));
    }
    std::uintptr_t cursor = va;
    const std::uintptr_t end = va + size;
    for (auto it = first; cursor < end; ++it) {
      if (it == mappings_.end() || it->first != cursor) {
        fail(error_invalid_value, fmt::format("{}: {:#x} is not mapped", call(), cursor));
      }
      cursor += it->second.size;
      if (cursor > end) {
        fail(error_invalid_value, fmt::format("{}: would split the mapping at {:#x} of {} bytes",
                                              call(), it->first, it->second.size));
      }
    }
    return first;
  }

  std::map<std::uintptr_t, mapping_record>::const_iterator mapping_at_locked(
      std::uintptr_t va) const {
    auto next = mappings_.upper_bound(va);
    if (next == mappings_.begin()) return mappings_.end();
    const auto m = std::prev(next);
    return va - m->first < m->second.size ? m : mappings_.end();
  }

  std::unordered_map<std::uint64_t, event_state>::iterator find_event_locked(event_type event,
                                                                             const char* call) {
    auto e = events_.find(event.id);
    if (e == events_.end()) {
      fail(
          error_invalid_handle,
          fmt::format("{}(event {}): unknown event (never created, or destroyed)", call, event.id));
    }
    return e;
  }

  std::unordered_map<std::uint64_t, stream_state>::iterator find_stream_locked(stream_type stream,
                                                                               const char* call) {
    auto s = streams_.find(stream.id);
    if (s == streams_.end() || !s->second.alive) {
      fail(error_invalid_handle,
           fmt::format("{}(stream {}): unknown stream (never created, or destroyed)", call,
                       stream.id));
    }
    return s;
  }

  bool complete_locked(const event_state& e) const noexcept {
    if (!e.recorded || options_.completion == event_completion::immediate) return true;
    const auto s = streams_.find(e.stream);
    if (s == streams_.end() || e.sequence <= s->second.completed) return true;
    return options_.completion == event_completion::timed && now_ >= e.ready;
  }

  bool stream_done_locked(const stream_state& s) const noexcept {
    return s.completed == s.submitted ||
           (options_.completion == event_completion::timed && now_ >= s.last_ready);
  }

  void wait_until_locked(double t) noexcept {
    if (t > now_) {
      wait_seconds_ += t - now_;
      now_ = t;
    }
  }

  void complete_all_locked() noexcept {
    for (auto it = streams_.begin(); it != streams_.end();) {
      it->second.completed = it->second.submitted;
      if (!it->second.alive) {
        it = streams_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void synchronize_locked() noexcept {
    if (options_.completion == event_completion::timed) wait_until_locked(latest_ready_);
    complete_all_locked();
  }

  const options options_;
  cost_model costs_;

  void* arena_ = nullptr;
  std::size_t arena_size_ = 0;
  std::uintptr_t arena_base_ = 0;
  std::size_t arena_usable_ = 0;
  detail::free_ranges free_;

  std::map<std::uintptr_t, segment_record> segments_;
  std::map<std::uintptr_t, std::size_t> reservations_;
  std::unordered_map<physical_handle, physical_record> physical_;
  std::map<std::uintptr_t, mapping_record> mappings_;
  std::unordered_map<std::uint64_t, stream_state> streams_;
  std::unordered_map<std::uint64_t, event_state> events_;
  std::uint64_t next_stream_id_ = 1;
  std::uint64_t next_event_id_ = 1;
  physical_handle next_handle_ = 1;

  std::size_t in_use_ = 0;
  std::size_t peak_ = 0;
  call_counters counters_;
  double now_ = 0;
  double latest_ready_ = 0;
  double driver_seconds_ = 0;
  double wait_seconds_ = 0;
};

static_assert(is_device_v<simulated_device>, "simulated_device must model the device concept");
static_assert(is_vmm_device_v<simulated_device>, "simulated_device must model the VMM extension");

}  // namespace gpumem
