// gpumem — pinned_pool<HostDevice>: a caching pool of page-locked (pinned) host memory, with the
// semantics of PyTorch's CachingHostAllocator (ATen/core/CachingHostAllocator.h,
// ATen/cuda/CachingHostAllocator.cpp), for the host side of the copies a training loop makes.
//
// Vocabulary (docs/architecture.md has the device allocator's; here it differs): a *block* is
// one pinned allocation obtained from the host device (one cudaHostAlloc, or one malloc +
// cudaHostRegister) and handed out whole — blocks are never split, so here a block is also a
// *segment*. A block is in one of three states:
//   allocated — handed out by allocate(), not yet given back;
//   pending   — given back, but an async copy recorded with record_event may still read it: it is
//               reused only once every event recorded at deallocate() has completed;
//   cached    — free, on the free list of its size, reused by the next request of that size.
//
// Rules (PyTorch's):
//  * a request of n > 0 bytes is rounded up to the next power of two (1 -> 1, 3 -> 4, 5000 ->
//    8192); there is one free list per power of two, and a request is served only by a cached
//    block of exactly its rounded size (the most recently freed one), else by a new block;
//  * record_event(ptr, stream) adds `stream` to the block's stream set; deallocate() records one
//    event per stream in the set and the block stays pending until they have all completed.
//    Events are queried, per stream in recording order, at every allocate(), at empty_cache() and
//    before an out-of-memory retry; completed events are kept and reused;
//  * empty_cache() releases every cached block to the host device; allocated and pending blocks
//    stay;
//  * when the host device is out of pinned memory, the pool processes completed events, releases
//    every cached block and retries once, then throws gpumem::out_of_memory.
//
// Configuration (allocator_config, PyTorch's keys): pinned_use_cuda_host_register:True obtains
// blocks with page-aligned malloc, touching every page first — in pinned_num_register_threads
// parallel chunks when that is above 1 and the block has at least that many pages, as PyTorch
// does — then one cudaHostRegister; otherwise blocks come from cudaHostAlloc(cudaHostAllocDefault).
// pinned_use_background_threads and pinned_reserve_segment_size_mb are not honoured (notes()).
//
// Statistics are those of torch.cuda.host_memory_stats() (PyTorch's HostStats): allocation and
// allocated_bytes count allocated and pending blocks (PyTorch decreases them only when a block
// becomes reusable), segment and reserved_bytes count every block the pool holds, num_host_alloc /
// num_host_free are segment.allocated / segment.freed, and host_alloc_time / host_free_time time
// the host-device calls in microseconds. Sizes are the rounded block sizes.
//
// Differences from PyTorch, on purpose: a pointer that is not a live allocation of the pool is a
// gpumem::usage_error instead of undefined behaviour (PyTorch trusts the pointer it is given) or a
// silent false (PyTorch's record_event); one mutex guards the pool and is held across host-device
// calls (PyTorch uses several locks and calls CUDA outside them); out of pinned memory is retried
// once after releasing the cache (PyTorch fails at once); the destructor waits for pending events
// and returns every block (PyTorch's allocator lives until the process exits).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpumem/config.hpp"
#include "gpumem/detail/bits.hpp"
#include "gpumem/detail/format.hpp"
#include "gpumem/device/detail/stream_event_queue.hpp"
#include "gpumem/error.hpp"
#include "gpumem/host/detail/page_memory.hpp"
#include "gpumem/host/host_device.hpp"
#include "gpumem/stats.hpp"

namespace gpumem {

/// A duration statistic in microseconds: PyTorch's c10 DurationStat. increase() adds one sample
/// to total and count and updates max and min; min follows PyTorch's rule that 0 means "unset",
/// so a sample of 0 us is replaced as the minimum by the next sample. A plain value type.
struct duration_stat {
  std::int64_t total = 0;  ///< sum of samples since the last reset_accumulated()
  std::int64_t max = 0;    ///< largest sample since the last reset_peak()
  std::int64_t min = 0;    ///< smallest sample since the last reset_peak() (see above)
  std::int64_t count = 0;  ///< samples since the last reset_accumulated()

  void increase(std::int64_t amount) noexcept {
    total += amount;
    count += 1;
    max = std::max(max, amount);
    min = min == 0 ? amount : std::min(min, amount);
  }
  /// total / count, integer division; 0 when there is no sample (host_memory_stats' "avg").
  std::int64_t average() const noexcept { return count == 0 ? 0 : total / count; }
  void reset_accumulated() noexcept { total = count = 0; }
  void reset_peak() noexcept { min = max = 0; }
  friend bool operator==(const duration_stat& a, const duration_stat& b) noexcept {
    return a.total == b.total && a.max == b.max && a.min == b.min && a.count == b.count;
  }
  friend bool operator!=(const duration_stat& a, const duration_stat& b) noexcept {
    return !(a == b);
  }
};

/// The pinned pool's statistics: the fields of PyTorch's HostStats (torch.cuda.host_memory_stats)
/// and two counters of gpumem's own.
struct host_stats {
  stat allocation;                  ///< blocks allocated or pending (not yet reusable)
  stat segment;                     ///< blocks obtained from the host device (cached ones included)
  stat allocated_bytes;             ///< bytes of allocated and pending blocks (rounded sizes)
  stat reserved_bytes;              ///< bytes of every block the pool holds (rounded sizes)
  duration_stat host_alloc_time;    ///< successful cudaHostAlloc / malloc+cudaHostRegister, in us
  duration_stat host_free_time;     ///< cudaFreeHost / cudaHostUnregister+free, in us
  std::int64_t num_host_alloc = 0;  ///< successful host allocations (= segment.allocated)
  std::int64_t num_host_free = 0;   ///< host releases (= segment.freed)
  // gpumem's own (not in PyTorch's HostStats):
  std::int64_t num_alloc_retries = 0;  ///< host allocations retried after releasing the cache
  std::int64_t num_ooms = 0;           ///< out_of_memory errors thrown
};

/// A caching pool of pinned host memory over `HostDevice` (host/host_device.hpp); see the top of
/// this file for its rules.
///
/// Thread safety: every public member function may be called concurrently; one mutex serialises
/// them (and is held across host-device calls). The host device must outlive the pool.
/// Exceptions: a function that throws leaves the pool as it was, except allocate() after an
/// out-of-memory retry (the cache it released stays released) and empty_cache() (blocks released
/// before a failure stay released).
template <class HostDevice>
class pinned_pool {
  static_assert(is_host_device_v<HostDevice>,
                "HostDevice does not model gpumem's host-device concept");

 public:
  using host_device_type = HostDevice;
  using stream_type = typename HostDevice::stream_type;
  using event_type = typename HostDevice::event_type;

  /// Uses `config` as given (see allocator_config::resolve to combine code settings with the
  /// environment). Reads pinned_use_cuda_host_register and pinned_num_register_threads. Makes no
  /// host-device call. Throws config_error when a setting is out of range
  /// (allocator_config::validate), std::bad_alloc.
  explicit pinned_pool(HostDevice& device,
                       allocator_config config = allocator_config::from_environment())
      : device_(device),
        config_((config.validate(), std::move(config))),
        use_register_(config_.pinned_use_cuda_host_register),
        register_threads_(config_.pinned_num_register_threads),
        page_size_(detail::host_page_size()) {}

  pinned_pool(const pinned_pool&) = delete;
  pinned_pool& operator=(const pinned_pool&) = delete;

  /// Waits for every pending event (an async copy may still read a pending block), destroys the
  /// pool's events and returns every block to the host device, allocated ones included (pointers
  /// handed out become invalid). Never throws: failures are swallowed, and the host device
  /// reports whatever could not be returned.
  ~pinned_pool() {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.destroy_all(/*wait=*/true);
    for (auto& [address, b] : blocks_) {
      try {
        release_memory(*b);
      } catch (...) {
      }
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Allocation

  /// `bytes` of pinned host memory (a block of round_size(bytes) bytes, aligned at least as
  /// cudaHostAlloc / the page size align), writable at once. Returns nullptr for 0 bytes (no
  /// statistic changes). Processes completed events first. Thread-safe.
  /// Throws out_of_memory when the host device has no pinned memory for the block even after the
  /// cache was released (or when no power of two holds `bytes`); cuda_error when the host device
  /// fails otherwise; std::bad_alloc.
  void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t rounded = round_size(bytes);
    if (rounded == 0) {
      ++num_ooms_;
      throw_oom(bytes, 0, 0, 0);
    }
    process_events();
    const std::size_t index = detail::floor_log2(rounded);
    if (block* b = free_lists_[index]) {
      free_lists_[index] = b->next_free;
      b->next_free = nullptr;
      b->state = block_state::allocated;
      stats_.allocation.increase(1);
      stats_.allocated_bytes.increase(static_cast<std::int64_t>(b->size));
      return b->ptr;
    }
    std::unique_ptr<block> fresh = obtain_block(rounded);
    std::size_t released = 0;
    if (!fresh) {
      ++num_alloc_retries_;
      process_events();
      released = release_cached_blocks();
      fresh = obtain_block(rounded);
    }
    if (!fresh) {
      ++num_ooms_;
      throw_oom(bytes, rounded, length_for(rounded), released);
    }
    block* b = fresh.get();
    try {
      // The node first, so that `fresh` keeps the block until the map can take it.
      blocks_.emplace(address_of(b->ptr), nullptr).first->second = std::move(fresh);
    } catch (...) {
      try {
        release_memory(*fresh);
      } catch (...) {
      }
      throw;
    }
    // The host allocation counts once the block is the pool's.
    stats_.host_alloc_time.increase(b->alloc_microseconds);
    stats_.segment.increase(1);
    stats_.reserved_bytes.increase(static_cast<std::int64_t>(b->size));
    stats_.allocation.increase(1);
    stats_.allocated_bytes.increase(static_cast<std::int64_t>(b->size));
    return b->ptr;
  }

  /// Gives back memory returned by allocate. With no stream recorded (record_event) the block is
  /// cached at once; otherwise one event is recorded on each recorded stream and the block is
  /// pending until they have all completed. nullptr is ignored. Thread-safe.
  /// Throws usage_error (pool unchanged) when `ptr` is not the start of an allocated block of this
  /// pool — a foreign pointer, a pointer inside a block, a second free; cuda_error when creating or
  /// recording an event fails (pool unchanged: the block stays allocated); std::bad_alloc.
  void deallocate(void* ptr) {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    block& b = allocated_block_locked(ptr, "deallocate", true);
    if (b.streams.empty()) {
      make_cached(b);
      return;
    }
    insert_events(b);
  }

  /// Marks the allocated block that holds `ptr` (its start or any byte inside it) as used by work
  /// queued on `stream`, typically an async copy: once deallocated, the block is reused only after
  /// the work queued on `stream` up to the deallocate() has completed. Recording a stream twice
  /// is the same as once. nullptr (what allocate(0) returns) is ignored. Thread-safe.
  /// Throws usage_error (pool unchanged) when `ptr` lies in no allocated block of this pool;
  /// std::bad_alloc.
  void record_event(void* ptr, stream_type stream) {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    block& b = allocated_block_locked(ptr, "record_event", false);
    if (std::find(b.streams.begin(), b.streams.end(), stream) == b.streams.end()) {
      b.streams.push_back(stream);
    }
  }

  /// Processes completed events, then returns every cached block to the host device. Allocated
  /// and pending blocks stay. Thread-safe. Throws cuda_error when the host device fails (the
  /// blocks released before the failure stay released; the others stay cached).
  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    process_events();
    release_cached_blocks();
  }

  // ---------------------------------------------------------------------------------------------
  // Statistics and reports

  /// A copy of the statistics. Does not process events (like PyTorch's getStats). Thread-safe;
  /// never throws.
  host_stats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_locked();
  }

  /// Resets the peaks of the four stats to their current values and the min/max of the two time
  /// stats, as torch.cuda.reset_peak_host_memory_stats does. Thread-safe; never throws.
  void reset_peak_stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (stat* s :
         {&stats_.allocation, &stats_.segment, &stats_.allocated_bytes, &stats_.reserved_bytes}) {
      s->reset_peak();
    }
    stats_.host_alloc_time.reset_peak();
    stats_.host_free_time.reset_peak();
  }

  /// Resets the allocated/freed totals of the four stats (so num_host_alloc/num_host_free), the
  /// total/count of the two time stats, and gpumem's retry and OOM counters, as
  /// torch.cuda.reset_accumulated_host_memory_stats does. Thread-safe; never throws.
  void reset_accumulated_stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (stat* s :
         {&stats_.allocation, &stats_.segment, &stats_.allocated_bytes, &stats_.reserved_bytes}) {
      s->reset_accumulated();
    }
    stats_.host_alloc_time.reset_accumulated();
    stats_.host_free_time.reset_accumulated();
    num_alloc_retries_ = 0;
    num_ooms_ = 0;
  }

  /// A 75-column table in the spirit of memory_summary(): the host calls, OOMs and retries; the
  /// four stats (current, peak, total allocated, total freed) in PyTorch's units; the two time
  /// stats (total, average, min, max); then the cached and pending blocks, the pinning method and
  /// the pinned settings that are not honoured. Every line is "|" + 75 characters + "|" (longer
  /// only where a number outgrows its field) and ends with a newline. Thread-safe; throws
  /// std::bad_alloc only.
  std::string summary() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return summary_locked();
  }

  /// One line for each pinned setting in the configuration that this pool does not honour
  /// (pinned_use_background_threads, pinned_reserve_segment_size_mb), saying why; empty when
  /// everything set takes effect. Thread-safe; throws std::bad_alloc only.
  std::vector<std::string> notes() const {
    std::vector<std::string> lines;
    if (config_.pinned_use_background_threads) {
      lines.emplace_back(
          "pinned_use_background_threads:True is not honoured: the pinned pool processes events "
          "in allocate(), empty_cache() and before an out-of-memory retry");
    }
    if (config_.pinned_reserve_segment_size != 0) {
      lines.push_back("pinned_reserve_segment_size_mb:" +
                      std::to_string(config_.pinned_reserve_segment_size / (std::size_t{1} << 20)) +
                      " is not honoured: the pinned pool obtains every block from the host device");
    }
    return lines;
  }

  // ---------------------------------------------------------------------------------------------
  // Inspection

  /// The block size a request of `bytes` gets: the smallest power of two >= bytes; 0 for 0 and
  /// for requests above 2^63 (no power of two holds them). Thread-safe; never throws.
  static constexpr std::size_t round_size(std::size_t bytes) noexcept {
    if (bytes <= 1) return bytes;
    const std::size_t half = std::size_t{1} << (sizeof(std::size_t) * 8 - 1);
    if (bytes > half) return 0;
    std::size_t p = 1;
    while (p < bytes) p <<= 1;
    return p;
  }

  /// The size of the allocated block that holds `ptr`. Thread-safe. Throws usage_error when
  /// `ptr` lies in no allocated block of this pool.
  std::size_t block_size(const void* ptr) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return allocated_block_locked(ptr, "block_size", false).size;
  }

  /// Cached (free, reusable) blocks. Thread-safe; never throws.
  std::size_t cached_blocks() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return count_blocks_locked(block_state::cached);
  }

  /// Blocks deallocated but awaiting events. Thread-safe; never throws.
  std::size_t pending_blocks() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return count_blocks_locked(block_state::pending);
  }

  /// True when blocks come from malloc + cudaHostRegister, false for cudaHostAlloc.
  /// Thread-safe; never throws.
  bool uses_host_register() const noexcept { return use_register_; }

  /// The threads that touch a registered block's pages (pinned_num_register_threads, >= 1).
  /// Thread-safe; never throws.
  std::size_t register_threads() const noexcept { return register_threads_; }

  /// The configuration the pool was built with. Thread-safe; never throws.
  const allocator_config& config() const noexcept { return config_; }

  /// The host device. Thread-safe; never throws.
  HostDevice& host_device() const noexcept { return device_; }

  /// Checks every structural invariant (free lists hold exactly the cached blocks, in the right
  /// list; pending events match the blocks' event counts) and that every statistic's current value
  /// equals a recount from the blocks. Throws std::logic_error naming the first violation.
  /// O(blocks + events); for tests and debugging. Thread-safe.
  void check_invariants() const {
    std::lock_guard<std::mutex> lock(mutex_);
    check_invariants_locked();
  }

 private:
  enum class block_state : std::uint8_t { allocated, pending, cached };

  struct block {
    void* ptr = nullptr;
    std::size_t size = 0;    // power of two: the size class
    std::size_t length = 0;  // bytes given to host_alloc / host_register
    bool registered = false;
    block_state state = block_state::allocated;
    std::size_t event_count = 0;       // pending: events not yet completed
    std::vector<stream_type> streams;  // allocated: streams recorded with record_event
    block* next_free = nullptr;        // cached: the next block of its free list
    std::int64_t alloc_microseconds = 0;
  };

  static constexpr std::size_t num_size_classes = sizeof(std::size_t) * 8;

  static std::uintptr_t address_of(const void* p) noexcept {
    return reinterpret_cast<std::uintptr_t>(p);
  }

  // Whole microseconds since `start`, truncated as PyTorch's duration_cast does.
  static std::int64_t microseconds_since(std::chrono::steady_clock::time_point start) noexcept {
    return static_cast<std::int64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                         std::chrono::steady_clock::now() - start)
                                         .count());
  }

  // Bytes asked of the host device for a block of `rounded` bytes: the block itself from
  // cudaHostAlloc, or whole pages for cudaHostRegister (two registered ranges never share a page).
  std::size_t length_for(std::size_t rounded) const noexcept {
    if (!use_register_) return rounded;
    std::size_t length = 0;
    return detail::checked_round_up(rounded, page_size_, length) ? length : 0;
  }

  // A new block of `rounded` bytes from the host device, or null when it is out of memory.
  // Throws cuda_error / std::bad_alloc with nothing obtained.
  std::unique_ptr<block> obtain_block(std::size_t rounded) {
    auto b = std::make_unique<block>();
    b->size = rounded;
    b->length = length_for(rounded);
    b->registered = use_register_;
    if (b->length == 0) return nullptr;
    const auto start = std::chrono::steady_clock::now();
    if (!use_register_) {
      b->ptr = device_.host_alloc(b->length);
      if (b->ptr == nullptr) return nullptr;
    } else {
      b->ptr = detail::page_aligned_alloc(b->length, page_size_);
      if (b->ptr == nullptr) return nullptr;
      detail::prefault_pages(b->ptr, b->length, register_threads_, page_size_);
      bool registered = false;
      try {
        registered = device_.host_register(b->ptr, b->length);
      } catch (...) {
        detail::page_aligned_free(b->ptr);
        throw;
      }
      if (!registered) {
        detail::page_aligned_free(b->ptr);
        return nullptr;
      }
    }
    b->alloc_microseconds = microseconds_since(start);
    return b;
  }

  // Returns a block's memory to the host device (no bookkeeping). Throws cuda_error with the
  // memory still held (for the register path: still registered).
  void release_memory(block& b) {
    if (b.registered) {
      device_.host_unregister(b.ptr, b.length);
      detail::page_aligned_free(b.ptr);
    } else {
      device_.host_free(b.ptr, b.length);
    }
  }

  // Releases every cached block; returns the bytes released. On a host-device failure the
  // blocks not yet released stay cached (consistent) and the error propagates.
  std::size_t release_cached_blocks() {
    std::size_t released = 0;
    for (block*& head : free_lists_) {
      while (head != nullptr) {
        block* b = head;
        const auto start = std::chrono::steady_clock::now();
        release_memory(*b);
        stats_.host_free_time.increase(microseconds_since(start));
        head = b->next_free;
        stats_.segment.decrease(1);
        stats_.reserved_bytes.decrease(static_cast<std::int64_t>(b->size));
        released += b->size;
        blocks_.erase(address_of(b->ptr));  // destroys *b
      }
    }
    return released;
  }

  void make_cached(block& b) noexcept {
    b.state = block_state::cached;
    b.streams.clear();
    block*& head = free_lists_[detail::floor_log2(b.size)];
    b.next_free = head;
    head = &b;
    stats_.allocation.decrease(1);
    stats_.allocated_bytes.decrease(static_cast<std::int64_t>(b.size));
  }

  // The allocated block at `ptr` (exactly its start when `exact`, else anywhere inside it), or a
  // usage_error saying why there is none.
  block& allocated_block_locked(const void* ptr, std::string_view call, bool exact) const {
    const std::uintptr_t address = address_of(ptr);
    auto next = blocks_.upper_bound(address);
    if (next != blocks_.begin()) {
      block& b = *std::prev(next)->second;
      const std::uintptr_t start = address_of(b.ptr);
      if (address - start < b.size) {
        if (exact && address != start) {
          throw usage_error(fmt::format(
              "gpumem pinned pool: {}({}): the pointer is {} bytes inside the block at {} of {} "
              "bytes; pass the pointer allocate() returned",
              call, ptr, address - start, b.ptr, b.size));
        }
        if (b.state != block_state::allocated) {
          throw usage_error(fmt::format(
              "gpumem pinned pool: {}({}): the block at {} of {} bytes was already deallocated "
              "({}); a second free, or use after free",
              call, ptr, b.ptr, b.size,
              b.state == block_state::pending ? "it awaits its recorded events" : "it is cached"));
        }
        return b;
      }
    }
    throw usage_error(fmt::format(
        "gpumem pinned pool: {}({}): not memory allocated by this pinned pool", call, ptr));
  }

  // Records one event per recorded stream (each on its stream's device: pinned memory is
  // typically copied to several GPUs) and makes the block pending. All or nothing: on a failure
  // the events are taken back and the block stays allocated with its streams.
  void insert_events(block& b) {
    std::size_t recorded = 0;
    try {
      for (stream_type s : b.streams) {
        events_.record(s, &b);
        ++recorded;
      }
    } catch (...) {
      // Each stream appears once in b.streams, so its newest event is this block's.
      for (std::size_t i = 0; i < recorded; ++i) events_.unrecord_newest(b.streams[i]);
      throw;
    }
    b.event_count = recorded;
    b.streams.clear();
    b.state = block_state::pending;
  }

  // Retires completed events; a block whose last event completes is cached. Throws cuda_error
  // from query_event with the pool consistent.
  void process_events() {
    events_.retire_completed([this](block* b) noexcept {
      if (--b->event_count == 0) make_cached(*b);
    });
  }

  std::size_t count_blocks_locked(block_state state) const noexcept {
    std::size_t n = 0;
    for (const auto& entry : blocks_) n += entry.second->state == state ? 1 : 0;
    return n;
  }

  host_stats stats_locked() const noexcept {
    host_stats s = stats_;
    s.num_host_alloc = s.segment.allocated;
    s.num_host_free = s.segment.freed;
    s.num_alloc_retries = num_alloc_retries_;
    s.num_ooms = num_ooms_;
    return s;
  }

  const char* alloc_call_name() const noexcept {
    return use_register_ ? "cudaHostRegister" : "cudaHostAlloc";
  }

  [[noreturn]] void throw_oom(std::size_t bytes, std::size_t rounded, std::size_t length,
                              std::size_t released) const {
    out_of_memory::details d;
    d.requested_bytes = bytes;
    d.rounded_bytes = rounded;
    d.device_request_bytes = length;
    d.allocated_bytes = static_cast<std::size_t>(stats_.allocated_bytes.current);
    d.reserved_bytes = static_cast<std::size_t>(stats_.reserved_bytes.current);
    d.device = -1;  // host memory
    std::size_t pending_bytes = 0;
    std::size_t pending_count = 0;
    std::size_t cached_count = 0;
    for (const auto& entry : blocks_) {
      const block& b = *entry.second;
      if (b.state == block_state::pending) {
        pending_bytes += b.size;
        ++pending_count;
      } else if (b.state == block_state::cached) {
        d.free_cached_bytes += b.size;
        d.largest_free_block_bytes = std::max(d.largest_free_block_bytes, b.size);
        ++cached_count;
      }
    }
    if (rounded == 0) {
      throw out_of_memory(
          fmt::format("Pinned host memory: out of memory. Tried to allocate {} bytes: no "
                      "power-of-two block can hold that many bytes.",
                      bytes),
          d);
    }
    std::string msg = fmt::format(
        "Pinned host memory: out of memory. Tried to allocate {} ({} requested, rounded up to a "
        "power of two) with {}",
        detail::format_size(rounded), detail::format_size(bytes), alloc_call_name());
    if (length != rounded) fmt::format_to(std::back_inserter(msg), " of {} bytes", length);
    fmt::format_to(std::back_inserter(msg),
                   ", and again after releasing {} of cached blocks. The pinned pool holds {} in "
                   "{} blocks: {} allocated or awaiting events ({} in {} blocks awaiting events), "
                   "{} cached in {} blocks.",
                   detail::format_size(released), detail::format_size(d.reserved_bytes),
                   blocks_.size(), detail::format_size(d.allocated_bytes),
                   detail::format_size(pending_bytes), pending_count,
                   detail::format_size(d.free_cached_bytes), cached_count);
    if (pending_count > 0) {
      msg +=
          " Blocks awaiting events become reusable once the streams they were recorded on have "
          "passed the deallocation; synchronising those streams frees them.";
    } else {
      fmt::format_to(std::back_inserter(msg),
                     " Free pinned buffers that are no longer needed, or use smaller ones (a "
                     "request of {} costs a {} block).",
                     detail::format_size(bytes), detail::format_size(rounded));
    }
    throw out_of_memory(std::move(msg), d);
  }

  static std::string duration_cell(std::int64_t us) {
    if (us < 10'000'000) return fmt::format("{:7d} us", us);
    if (us < 10'000'000'000) return fmt::format("{:7d} ms", us / 1000);
    return fmt::format("{:7d} s ", us / 1'000'000);
  }

  std::string summary_locked() const {
    constexpr std::size_t width = 75;
    const host_stats s = stats_locked();
    const std::string rule_eq(width, '='), rule_dash(width, '-');
    std::vector<std::string> lines;
    lines.push_back(rule_eq);
    lines.push_back(fmt::format("{:^{}}", "gpumem pinned host memory summary", width));
    lines.push_back(rule_dash);
    // PyTorch's OOM line, in the same columns.
    lines.push_back(fmt::format("{:<{}}",
                                fmt::format("  {:9} Pinned OOMs: {:<10d} | {:6} host alloc "
                                            "retries: {:<8d}",
                                            "", s.num_ooms, "", s.num_alloc_retries),
                                width));
    lines.push_back(rule_eq);
    lines.push_back("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ");
    using cell_format = std::string (*)(std::int64_t, std::int64_t);
    const auto row = [](std::string_view name, const stat& v, cell_format f) {
      return fmt::format(" {:<21} | {} | {} | {} | {} ", name, f(v.current, v.current),
                         f(v.peak, v.peak), f(v.allocated, v.allocated), f(v.freed, v.freed));
    };
    const std::pair<const char*, const stat*> sizes[] = {{"Allocated memory", &s.allocated_bytes},
                                                         {"Reserved memory", &s.reserved_bytes}};
    const std::pair<const char*, const stat*> counts[] = {{"Allocations", &s.allocation},
                                                          {"Pinned blocks", &s.segment}};
    for (const auto& [name, v] : sizes) {
      lines.push_back(rule_dash);
      lines.push_back(row(name, *v, &detail::pytorch_table_size));
    }
    for (const auto& [name, v] : counts) {
      lines.push_back(rule_dash);
      lines.push_back(row(name, *v, &detail::pytorch_table_count));
    }
    lines.push_back(rule_eq);
    lines.push_back("        Timing         |   Total    |  Average   |    Min     |    Max     ");
    const auto time_row = [](std::string_view name, const duration_stat& d) {
      return fmt::format(" {:<21} | {} | {} | {} | {} ", name, duration_cell(d.total),
                         duration_cell(d.average()), duration_cell(d.min), duration_cell(d.max));
    };
    lines.push_back(rule_dash);
    lines.push_back(
        time_row(fmt::format("{} x{}", "Host alloc", s.host_alloc_time.count), s.host_alloc_time));
    lines.push_back(rule_dash);
    lines.push_back(
        time_row(fmt::format("{} x{}", "Host free", s.host_free_time.count), s.host_free_time));
    lines.push_back(rule_eq);

    std::size_t cached_bytes = 0, cached_count = 0, pending_bytes = 0, pending_count = 0;
    std::size_t events = 0;
    for (const auto& entry : blocks_) {
      const block& b = *entry.second;
      if (b.state == block_state::cached) {
        cached_bytes += b.size;
        ++cached_count;
      } else if (b.state == block_state::pending) {
        pending_bytes += b.size;
        ++pending_count;
      }
    }
    events = events_.size();
    constexpr std::size_t label_width = 21;
    constexpr std::size_t value_width = width - label_width - 5;
    const auto add = [&](std::string_view label, std::string_view value) {
      bool first = true;
      for (const auto& piece : detail::wrap_text(value, value_width)) {
        lines.push_back(fmt::format(" {:<{}} | {:<{}} ", first ? label : std::string_view(),
                                    label_width, piece, value_width));
        first = false;
      }
    };
    add("Cached blocks",
        fmt::format("{} in {} blocks", detail::format_size(cached_bytes), cached_count));
    add("Awaiting events", fmt::format("{} in {} blocks, {} events",
                                       detail::format_size(pending_bytes), pending_count, events));
    add("Pinning method",
        use_register_ ? fmt::format("malloc + cudaHostRegister, pages touched by {} thread{}",
                                    register_threads_, register_threads_ == 1 ? "" : "s")
                      : std::string("cudaHostAlloc(cudaHostAllocDefault)"));
    const std::string cfg = config_.to_string();
    add("Allocator config", cfg.empty() ? std::string_view("(defaults)") : std::string_view(cfg));
    for (const std::string& note : notes()) add("Not honoured", note);
    lines.push_back(rule_eq);

    std::string out;
    for (const auto& line : lines) {
      out += '|';
      out += line;
      out += "|\n";
    }
    return out;
  }

  void check_invariants_locked() const {
    const auto fail = [](const std::string& what) {
      throw std::logic_error("gpumem pinned pool invariant violated: " + what);
    };
    std::int64_t live = 0, live_bytes = 0, reserved = 0;
    std::map<const block*, std::size_t> in_lists;
    for (std::size_t i = 0; i < num_size_classes; ++i) {
      for (const block* b = free_lists_[i]; b != nullptr; b = b->next_free) {
        if (b->state != block_state::cached) fail("a block on a free list is not cached");
        if (b->size != std::size_t{1} << i) fail("a block is on the free list of another size");
        if (++in_lists[b] > 1) fail("a block is on a free list twice");
      }
    }
    std::map<const block*, std::size_t> queued;
    events_.for_each_owner([&queued](const block* b) { ++queued[b]; });
    for (const auto& [address, b] : blocks_) {
      if (address != address_of(b->ptr)) fail("a block is filed under another address");
      if (!detail::is_power_of_two(b->size)) fail("a block size is not a power of two");
      if (b->length < b->size) fail("a block is longer than its host allocation");
      reserved += static_cast<std::int64_t>(b->size);
      const std::size_t events = queued.count(b.get()) != 0 ? queued.at(b.get()) : 0;
      switch (b->state) {
        case block_state::allocated:
          ++live;
          live_bytes += static_cast<std::int64_t>(b->size);
          if (events != 0 || b->event_count != 0) fail("an allocated block has pending events");
          break;
        case block_state::pending:
          ++live;
          live_bytes += static_cast<std::int64_t>(b->size);
          if (events == 0 || events != b->event_count) {
            fail("a pending block's event count does not match the event queues");
          }
          if (!b->streams.empty()) fail("a pending block still holds recorded streams");
          break;
        case block_state::cached:
          if (in_lists.count(b.get()) == 0) fail("a cached block is on no free list");
          if (events != 0 || b->event_count != 0) fail("a cached block has pending events");
          break;
      }
      if (auto next = std::next(blocks_.find(address)); next != blocks_.end()) {
        if (address + b->size > next->first) fail("two blocks overlap");
      }
    }
    std::size_t listed = 0;
    for (const auto& entry : in_lists) listed += entry.second;
    if (listed != count_blocks_locked(block_state::cached)) fail("a free list holds a stranger");
    for (const auto& entry : queued) {
      const auto it = blocks_.find(address_of(entry.first->ptr));
      if (it == blocks_.end() || it->second.get() != entry.first) {
        fail("an event refers to no block of the pool");
      }
    }
    const auto expect = [&fail](const stat& s, std::int64_t value, const char* name) {
      if (s.current != value) {
        fail(fmt::format("{}.current is {} but the blocks add up to {}", name, s.current, value));
      }
      if (s.peak < s.current) fail(fmt::format("{}.peak is below current", name));
    };
    expect(stats_.allocation, live, "allocation");
    expect(stats_.allocated_bytes, live_bytes, "allocated_bytes");
    expect(stats_.segment, static_cast<std::int64_t>(blocks_.size()), "segment");
    expect(stats_.reserved_bytes, reserved, "reserved_bytes");
  }

  HostDevice& device_;
  const allocator_config config_;
  const bool use_register_;
  const std::size_t register_threads_;
  const std::size_t page_size_;

  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::unique_ptr<block>> blocks_;  // every block, by address
  std::array<block*, num_size_classes> free_lists_{};        // cached blocks, LIFO per size
  detail::stream_event_queue<HostDevice, block*> events_{device_, 0};
  host_stats stats_;
  std::int64_t num_alloc_retries_ = 0;
  std::int64_t num_ooms_ = 0;
};

}  // namespace gpumem
