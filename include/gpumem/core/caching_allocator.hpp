// gpumem — caching_allocator<Device>: a caching device-memory allocator with PyTorch's semantics.
//
// Vocabulary (DESIGN.md): the *device* gives raw memory in *segments*; the allocator cuts them
// into *blocks*; free blocks wait in a *pool* per (stream, small/large) until a request of the
// same stream fits. *reserved* = bytes held from the device, *allocated* = bytes in blocks handed
// out, *requested* = what callers asked for before rounding.
//
// The classic policy reproduces PyTorch's native CUDACachingAllocator decision for decision
// (rounding, pools, segment sizes, split rules, oversize rules, the retry order on device OOM,
// the memory fraction and garbage collection), so a replay under gpumem predicts PyTorch.
//
// Hot path: a cache hit takes the one mutex, looks the size up in a bitmap-indexed free-block
// index, updates plain integer statistics and a flat pointer table. It makes no heap allocation
// and no system call once the allocator has warmed up.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>  // std::lock_guard
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpumem/config.hpp"
#include "gpumem/core/detail/block.hpp"
#include "gpumem/core/detail/free_block_index.hpp"
#include "gpumem/core/detail/pointer_map.hpp"
#include "gpumem/core/detail/pool_counters.hpp"
#include "gpumem/core/detail/spin_mutex.hpp"
#include "gpumem/core/size_policy.hpp"
#include "gpumem/device/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/report/memory_summary.hpp"
#include "gpumem/report/oom_report.hpp"
#include "gpumem/stats.hpp"

namespace gpumem {

namespace detail {

template <class Stream>
struct pool {
  Stream stream{};
  bool is_small = false;
  free_block_index<Stream> index;
};

template <class Stream>
struct stream_pools {
  pool<Stream> small;
  pool<Stream> large;
};

}  // namespace detail

/// State of one block, as reported by segment snapshots.
enum class block_state { active_allocated, active_pending_free, inactive };

struct block_snapshot {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested_size = 0;  // 0 unless allocated or pending
  block_state state = block_state::inactive;
};

template <class Stream>
struct segment_snapshot {
  std::uintptr_t address = 0;
  std::size_t total_size = 0;
  std::size_t allocated_size = 0;
  std::size_t active_size = 0;
  std::size_t requested_size = 0;
  Stream stream{};
  bool is_small = false;
  std::vector<block_snapshot> blocks;  // in address order
};

/// A caching allocator over `Device` (see device/device.hpp for the device concept).
///
/// Thread safety: every public member function may be called concurrently; one lock serialises
/// them. Stream ordering: memory freed on a stream is reused only by requests on the same stream;
/// after record_stream(ptr, s) it is reused only once the work queued on `s` before the free has
/// completed (an event recorded at free time). The device object must outlive the allocator.
template <class Device>
class caching_allocator {
  static_assert(is_device_v<Device>, "Device does not model gpumem's device concept");

 public:
  using device_type = Device;
  using stream_type = typename Device::stream_type;
  using event_type = typename Device::event_type;

  /// Uses `config` as given (see allocator_config::resolve to combine it with the environment).
  /// Throws config_error when the configuration asks for a policy this build does not provide.
  explicit caching_allocator(Device& device,
                             allocator_config config = allocator_config::from_environment())
      : device_(device), config_(std::move(config)) {
    policy_ = config_.effective_policy(false);
    if (policy_ != allocator_policy::classic) {
      throw config_error(fmt::format("gpumem config: policy '{}' is not available for this device; "
                                     "use policy:classic",
                                     to_string(policy_)),
                         "policy", std::string(to_string(policy_)), 0);
    }
    stats_.max_split_size = static_cast<std::int64_t>(config_.max_split_size);
    if (config_.has_memory_cap()) set_memory_fraction(*config_.per_process_memory_fraction);
  }

  caching_allocator(const caching_allocator&) = delete;
  caching_allocator& operator=(const caching_allocator&) = delete;

  /// Returns every segment to the device, including those still holding allocated blocks
  /// (pointers handed out become invalid). Never throws.
  ~caching_allocator() {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    try {
      for (auto& [stream, queue] : pending_events_) {
        for (auto& pe : queue) device_.destroy_event(pe.event);
      }
      for (event_type e : free_events_) device_.destroy_event(e);
      for (segment_type* s = segments_; s != nullptr; s = s->next) {
        device_.deallocate(reinterpret_cast<void*>(s->ptr), s->size);
      }
    } catch (...) {
      // A destructor must not throw; the device reports whatever could not be returned.
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Allocation

  /// Allocates `size` bytes usable on `stream`. Returns nullptr for size 0.
  /// Throws out_of_memory when the request cannot be met after freeing the cache (the allocator is
  /// unchanged apart from the cache it released); cuda_error when the device fails otherwise.
  void* allocate(std::size_t size, stream_type stream) {
    if (size == 0) return nullptr;
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    if (!pending_events_.empty()) process_events();
    if (size > detail::k_max_request) {
      throw_oom(size, size, size, lookup_pools(stream).large, false);
    }

    const std::size_t rounded = detail::round_size(size, config_.divisions_for(size));
    pool_type& p = pool_for(lookup_pools(stream), rounded);
    block_type* b = get_free_block(p, rounded);
    if (b == nullptr) b = allocate_new_block(p, size, rounded);
    return alloc_found_block(b, p, rounded, size);
  }

  /// allocate(size, device.default_stream()).
  void* allocate(std::size_t size) { return allocate(size, device_.default_stream()); }

  /// Frees memory returned by allocate. nullptr is ignored. Throws usage_error (and changes
  /// nothing) when `ptr` is not an allocation of this allocator, including a second free.
  void deallocate(void* ptr) {
    if (ptr == nullptr) return;
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    block_type* b = allocated_.erase(reinterpret_cast<std::uintptr_t>(ptr));
    if (b == nullptr) {
      throw usage_error(
          fmt::format("gpumem: free of pointer {} that this allocator did not "
                      "allocate, or that was already freed",
                      ptr));
    }
    b->allocated = false;
    const bool small = b->owner->is_small;
    counts_.decrease(small, counter::allocation, 1);
    counts_.decrease(small, counter::allocated_bytes, as_i64(b->size));
    if (b->size >= config_.max_split_size) stats_.oversize_allocations.decrease(1);
    if (!b->stream_uses.empty()) {
      insert_events(b);
    } else {
      free_block(b);
    }
  }

  /// Marks `ptr` as in use on `stream` (besides its allocation stream): when freed, the block
  /// is reused only after the work queued on `stream` up to the free has completed.
  /// Throws usage_error when `ptr` is not a live allocation of this allocator.
  void record_stream(void* ptr, stream_type stream) {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    block_type* b = allocated_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (b == nullptr) {
      throw usage_error(
          fmt::format("gpumem: record_stream on pointer {} that is not a live "
                      "allocation of this allocator",
                      ptr));
    }
    if (stream == b->owner->stream) return;
    if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end()) {
      b->stream_uses.push_back(stream);
    }
  }

  /// Waits for outstanding stream events, then returns every cached segment that holds no
  /// allocated block to the device (PyTorch's emptyCache). Throws cuda_error on device failure.
  void empty_cache() {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    release_cached_blocks();
  }

  // ---------------------------------------------------------------------------------------------
  // Limits

  /// Caps reserved memory at fraction x device total (PyTorch's set_per_process_memory_fraction).
  /// Throws std::invalid_argument unless 0 <= fraction <= 1.
  void set_memory_fraction(double fraction) {
    if (!(fraction >= 0.0 && fraction <= 1.0)) {
      throw std::invalid_argument(
          fmt::format("gpumem: memory fraction {} is outside [0, 1]", fraction));
    }
    const std::size_t total = device_.total_memory();
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    fraction_ = fraction;
    fraction_set_ = true;
    allowed_memory_maximum_ = static_cast<std::size_t>(fraction * static_cast<double>(total));
  }

  /// The memory fraction in force (1.0 when none was set).
  double memory_fraction() const {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    return fraction_set_ ? fraction_ : 1.0;
  }

  // ---------------------------------------------------------------------------------------------
  // Observation

  device_stats stats() const {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    device_stats out = stats_;
    counts_.export_to(out);
    return out;
  }

  /// Resets every stat's peak to its current value (and gpumem's fragmentation-at-peak).
  void reset_peak_stats() {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    counts_.reset_peak();
    stats_.oversize_allocations.reset_peak();
    stats_.oversize_segments.reset_peak();
    allocated_at_peak_ = counts_.current(counter::allocated_bytes);
  }

  /// Resets the allocated/freed totals and the event counters, as PyTorch does.
  void reset_accumulated_stats() {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    counts_.reset_accumulated();
    stats_.oversize_allocations.reset_accumulated();
    stats_.oversize_segments.reset_accumulated();
    stats_.num_alloc_retries = 0;
    stats_.num_ooms = 0;
    stats_.num_sync_all_streams = 0;
    stats_.num_device_alloc = 0;
    stats_.num_device_free = 0;
  }

  /// The numbers of memory_summary's gpumem section.
  summary_info summary_numbers() const {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    summary_info info;
    info.device = device_.index();
    info.largest_free_block = largest_free_block();
    const auto reserved = static_cast<std::size_t>(counts_.current(counter::reserved_bytes));
    const auto allocated = static_cast<std::size_t>(counts_.current(counter::allocated_bytes));
    info.free_cached_bytes =
        reserved - static_cast<std::size_t>(counts_.current(counter::active_bytes));
    info.fragmentation_bytes = reserved - allocated;
    info.peak_reserved_bytes = static_cast<std::size_t>(counts_.peak(counter::reserved_bytes));
    info.fragmentation_at_peak_bytes =
        info.peak_reserved_bytes - static_cast<std::size_t>(allocated_at_peak_);
    info.device_alloc_calls = stats_.num_device_alloc;
    info.device_free_calls = stats_.num_device_free;
    info.device_sync_calls = stats_.num_sync_all_streams;
    info.policy = std::string(to_string(policy_));
    info.config = config_.to_string();
    return info;
  }

  /// PyTorch's memory_summary table (titled for gpumem), then gpumem's section.
  std::string memory_summary(bool abbreviated = false) const {
    return gpumem::memory_summary(stats(), summary_numbers(), abbreviated);
  }

  /// The segments and their blocks, in segment creation order (PyTorch's snapshot "segments").
  std::vector<segment_snapshot<stream_type>> snapshot() const {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    std::vector<segment_snapshot<stream_type>> out;
    for (const segment_type* s = segments_; s != nullptr; s = s->next) {
      segment_snapshot<stream_type> ss;
      ss.address = s->ptr;
      ss.total_size = s->size;
      ss.stream = s->owner->stream;
      ss.is_small = s->owner->is_small;
      for (const block_type* b = s->head; b != nullptr; b = b->next) {
        block_snapshot bs{b->ptr, b->size, 0, block_state::inactive};
        if (b->allocated) {
          bs.state = block_state::active_allocated;
          ss.allocated_size += b->size;
        } else if (b->event_count > 0) {
          bs.state = block_state::active_pending_free;
        }
        if (bs.state != block_state::inactive) {
          bs.requested_size = b->requested_size;
          ss.active_size += b->size;
          ss.requested_size += b->requested_size;
        }
        ss.blocks.push_back(bs);
      }
      out.push_back(std::move(ss));
    }
    return out;
  }

  /// The requested size of a live allocation. Throws usage_error for a foreign pointer.
  std::size_t allocation_size(void* ptr) const {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    const block_type* b = allocated_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (b == nullptr) throw usage_error(fmt::format("gpumem: {} is not a live allocation", ptr));
    return b->requested_size;
  }

  const allocator_config& config() const noexcept { return config_; }
  allocator_policy policy() const noexcept { return policy_; }
  Device& device() noexcept { return device_; }

  /// Checks every structural invariant and that every statistic equals a recount from the
  /// blocks. Throws std::logic_error naming the first violation. O(blocks); for tests and debug.
  void check_invariants() const {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    check_invariants_locked();
  }

 private:
  using counter = detail::counter;
  using block_type = detail::block<stream_type>;
  using segment_type = detail::segment<stream_type>;
  using pool_type = detail::pool<stream_type>;
  using pools_type = detail::stream_pools<stream_type>;

  struct pending_event {
    event_type event;
    block_type* block;
  };

  static std::int64_t as_i64(std::size_t v) noexcept { return static_cast<std::int64_t>(v); }

  bool gc_enabled() const noexcept {
    return fraction_set_ && config_.garbage_collection_threshold > 0.0;
  }

  // --- pools
  // --------------------------------------------------------------------------------------

  pools_type& lookup_pools(stream_type stream) {
    if (last_pools_ != nullptr && last_pools_->small.stream == stream) return *last_pools_;
    for (auto& sp : stream_pools_) {
      if (sp->small.stream == stream) return *(last_pools_ = sp.get());
    }
    auto sp = std::make_unique<pools_type>();
    sp->small.stream = sp->large.stream = stream;
    sp->small.is_small = true;
    stream_pools_.push_back(std::move(sp));
    return *(last_pools_ = stream_pools_.back().get());
  }

  static pool_type& pool_for(pools_type& sp, std::size_t rounded) noexcept {
    return detail::is_small_request(rounded) ? sp.small : sp.large;
  }

  std::uint64_t& gc_counter(const pool_type& p) noexcept { return gc_calls_[p.is_small ? 0 : 1]; }

  GPUMEM_ALWAYS_INLINE void index_insert(pool_type& p, block_type* b) {
    b->gc_count_base = gc_counter(p);
    p.index.insert(b);
  }

  // --- the classic policy ------------------------------------------------------------------------

  // PyTorch's get_free_block: the best fit on this stream, unless the oversize rules refuse it.
  GPUMEM_ALWAYS_INLINE block_type* get_free_block(pool_type& p, std::size_t rounded) {
    if (gc_enabled()) ++gc_counter(p);
    block_type* b = p.index.lower_bound(rounded);
    if (b == nullptr) return nullptr;
    const std::size_t max_split = config_.max_split_size;
    // A request below max_split_size never takes an oversize block...
    if (rounded < max_split && b->size >= max_split) return nullptr;
    // ...and an oversize request takes one only if it wastes less than max_non_split_rounding.
    if (rounded >= max_split && b->size >= rounded + config_.max_non_split_rounding) return nullptr;
    p.index.erase(b);
    return b;
  }

  // PyTorch's miss path: GC, then the device, then free one oversize block and retry, then free
  // the whole cache and retry; then out_of_memory.
  block_type* allocate_new_block(pool_type& p, std::size_t size, std::size_t rounded) {
    const std::size_t seg_size = detail::allocation_size(rounded, config_.large_segment_size);
    if (gc_enabled()) garbage_collect_cached_blocks();
    bool fraction_refused = false;
    block_type* b = alloc_block(p, seg_size, false, fraction_refused);
    if (b == nullptr && release_available_cached_blocks(p, rounded)) {
      b = alloc_block(p, seg_size, false, fraction_refused);
    }
    if (b == nullptr) {
      release_cached_blocks();
      b = alloc_block(p, seg_size, true, fraction_refused);
    }
    if (b == nullptr) throw_oom(size, rounded, seg_size, p, fraction_refused);
    return b;
  }

  block_type* alloc_block(pool_type& p, std::size_t seg_size, bool is_retry,
                          bool& fraction_refused) {
    if (is_retry) ++stats_.num_alloc_retries;
    fraction_refused = false;
    if (fraction_set_ && reserved_total_ + seg_size > allowed_memory_maximum_) {
      fraction_refused = true;
      return nullptr;
    }
    void* ptr = device_.allocate(seg_size);
    if (ptr == nullptr) return nullptr;
    ++stats_.num_device_alloc;
    reserved_total_ += seg_size;

    segment_type* s = segment_pool_.create();
    s->ptr = reinterpret_cast<std::uintptr_t>(ptr);
    s->size = seg_size;
    s->owner = &p;
    s->prev = segments_tail_;
    if (segments_tail_ != nullptr) {
      segments_tail_->next = s;
    } else {
      segments_ = s;
    }
    segments_tail_ = s;

    block_type* b = block_pool_.create(s->ptr, seg_size, &p, s);
    s->head = b;
    counts_.increase(p.is_small, counter::segment, 1);
    counts_.increase(p.is_small, counter::reserved_bytes, as_i64(seg_size));
    if (seg_size >= config_.max_split_size) stats_.oversize_segments.increase(1);
    return b;
  }

  // PyTorch's release_available_cached_blocks: only with max_split_size set. Frees the smallest
  // oversize block that covers the request, else the largest oversize blocks until enough.
  bool release_available_cached_blocks(pool_type& p, std::size_t rounded) {
    const std::size_t max_split = config_.max_split_size;
    if (max_split == std::numeric_limits<std::size_t>::max()) return false;
    const std::size_t key = rounded < max_split ? max_split : rounded;
    if (block_type* b = p.index.lower_bound(key)) {
      if (b->is_split())
        return false;  // cannot happen with the split rules; never free live memory
      release_block(b);
      return true;
    }
    std::vector<block_type*> descending;
    p.index.for_each([&](block_type* b) { descending.push_back(b); });
    std::reverse(descending.begin(), descending.end());
    std::size_t released = 0;
    for (block_type* b : descending) {
      if (released >= key || b->size < max_split) break;
      if (b->is_split()) continue;
      released += b->size;
      release_block(b);
    }
    return released >= key;
  }

  // PyTorch's release_cached_blocks: wait for all events, then free every unsplit cached block.
  void release_cached_blocks() {
    synchronize_and_free_events();
    std::vector<block_type*> whole;
    for (auto& sp : stream_pools_) {
      for (pool_type* p : {&sp->large, &sp->small}) {
        p->index.for_each([&](block_type* b) {
          if (!b->is_split()) whole.push_back(b);
        });
      }
    }
    for (block_type* b : whole) release_block(b);
  }

  // PyTorch's garbage_collect_cached_blocks: above threshold x cap, free unsplit large blocks
  // whose age (free-block lookups since they were cached) is at least the average, repeatedly.
  void garbage_collect_cached_blocks() {
    const auto threshold = static_cast<std::size_t>(config_.garbage_collection_threshold *
                                                    static_cast<double>(allowed_memory_maximum_));
    if (reserved_total_ <= threshold) return;
    const std::size_t target = reserved_total_ - threshold;
    const std::uint64_t now = gc_calls_[1];
    std::vector<block_type*> freeable;
    for (auto& sp : stream_pools_) {
      sp->large.index.for_each([&](block_type* b) {
        if (!b->is_split()) freeable.push_back(b);
      });
    }
    if (freeable.empty()) return;
    std::uint64_t total_age = 0;
    for (block_type* b : freeable) total_age += now - b->gc_count_base;
    std::size_t reclaimed = 0;
    bool freed_any = true;
    while (reclaimed < target && freed_any && !freeable.empty()) {
      const double age_threshold =
          static_cast<double>(total_age) / static_cast<double>(freeable.size());
      freed_any = false;
      std::vector<block_type*> keep;
      for (block_type* b : freeable) {
        const std::uint64_t age = now - b->gc_count_base;
        if (static_cast<double>(age) >= age_threshold) {
          freed_any = true;
          reclaimed += b->size;
          total_age -= age;
          release_block(b);
        } else {
          keep.push_back(b);
        }
      }
      freeable.swap(keep);
    }
  }

  // Returns an unsplit free block's whole segment to the device.
  void release_block(block_type* b) {
    segment_type* s = b->seg;
    device_.deallocate(reinterpret_cast<void*>(s->ptr), s->size);
    ++stats_.num_device_free;
    reserved_total_ -= s->size;
    pool_type& p = *b->owner;
    counts_.decrease(p.is_small, counter::segment, 1);
    counts_.decrease(p.is_small, counter::reserved_bytes, as_i64(s->size));
    if (s->size >= config_.max_split_size) stats_.oversize_segments.decrease(1);
    p.index.erase(b);
    block_pool_.destroy(b);
    (s->prev != nullptr ? s->prev->next : segments_) = s->next;
    (s->next != nullptr ? s->next->prev : segments_tail_) = s->prev;
    segment_pool_.destroy(s);
  }

  // PyTorch's alloc_found_block: split off the remainder if the rules say so, then hand out.
  GPUMEM_ALWAYS_INLINE void* alloc_found_block(block_type* b, pool_type& p, std::size_t rounded,
                                               std::size_t requested) {
    const bool already_split = b->is_split();
    if (detail::should_split(b->size, rounded, p.is_small, config_.max_split_size)) {
      block_type* remaining = b;
      b = block_pool_.create(remaining->ptr, rounded, &p, remaining->seg);
      b->prev = remaining->prev;
      if (b->prev != nullptr) {
        b->prev->next = b;
      } else {
        b->seg->head = b;
      }
      b->next = remaining;
      remaining->prev = b;
      remaining->ptr += rounded;
      remaining->size -= rounded;
      index_insert(p, remaining);
      if (already_split) {
        counts_.decrease(p.is_small, counter::inactive_split_bytes, as_i64(rounded));
      } else {
        counts_.increase(p.is_small, counter::inactive_split_bytes, as_i64(remaining->size));
        counts_.increase(p.is_small, counter::inactive_split, 1);
      }
    } else if (already_split) {
      counts_.decrease(p.is_small, counter::inactive_split_bytes, as_i64(b->size));
      counts_.decrease(p.is_small, counter::inactive_split, 1);
    }
    b->allocated = true;
    b->requested_size = requested;
    allocated_.insert(b->ptr, b);
    counts_.increase(p.is_small, counter::allocation, 1);
    counts_.increase(p.is_small, counter::allocated_bytes, as_i64(b->size));
    counts_.increase(p.is_small, counter::active, 1);
    counts_.increase(p.is_small, counter::active_bytes, as_i64(b->size));
    counts_.increase(p.is_small, counter::requested_bytes, as_i64(requested));
    if (b->size >= config_.max_split_size) stats_.oversize_allocations.increase(1);
    note_peak();
    return reinterpret_cast<void*>(b->ptr);
  }

  // Tracks the most bytes allocated while reserved memory stood at its peak.
  GPUMEM_ALWAYS_INLINE void note_peak() noexcept {
    const std::int64_t peak = counts_.peak(counter::reserved_bytes);
    if (counts_.current(counter::reserved_bytes) != peak) return;
    const std::int64_t allocated = counts_.current(counter::allocated_bytes);
    if (peak != peak_seen_) {
      peak_seen_ = peak;
      allocated_at_peak_ = allocated;
    } else {
      allocated_at_peak_ = std::max(allocated_at_peak_, allocated);
    }
  }

  // PyTorch's free_block: merge with free neighbours and return to the pool.
  GPUMEM_ALWAYS_INLINE void free_block(block_type* b) {
    pool_type& p = *b->owner;
    const std::size_t original_size = b->size;
    const std::size_t requested = b->requested_size;
    std::int64_t net_inactive_blocks = 0;
    std::int64_t net_inactive_bytes = 0;
    for (block_type* candidate : {b->prev, b->next}) {
      const std::size_t subsumed = try_merge_blocks(b, candidate, p);
      if (subsumed > 0) {
        net_inactive_blocks -= 1;
        net_inactive_bytes -= as_i64(subsumed);
      }
    }
    index_insert(p, b);
    if (b->is_split()) {
      net_inactive_blocks += 1;
      net_inactive_bytes += as_i64(b->size);
    }
    const bool small = p.is_small;
    if (net_inactive_blocks > 0)
      counts_.increase(small, counter::inactive_split, net_inactive_blocks);
    if (net_inactive_blocks < 0)
      counts_.decrease(small, counter::inactive_split, -net_inactive_blocks);
    if (net_inactive_bytes > 0) {
      counts_.increase(small, counter::inactive_split_bytes, net_inactive_bytes);
    }
    if (net_inactive_bytes < 0) {
      counts_.decrease(small, counter::inactive_split_bytes, -net_inactive_bytes);
    }
    counts_.decrease(small, counter::active, 1);
    counts_.decrease(small, counter::active_bytes, as_i64(original_size));
    counts_.decrease(small, counter::requested_bytes, as_i64(requested));
  }

  GPUMEM_ALWAYS_INLINE std::size_t try_merge_blocks(block_type* dst, block_type* src,
                                                    pool_type& p) {
    if (src == nullptr || src->allocated || src->event_count > 0 || !src->stream_uses.empty()) {
      return 0;
    }
    if (dst->prev == src) {
      dst->ptr = src->ptr;
      dst->prev = src->prev;
      if (dst->prev != nullptr) {
        dst->prev->next = dst;
      } else {
        dst->seg->head = dst;
      }
    } else {
      dst->next = src->next;
      if (dst->next != nullptr) dst->next->prev = dst;
    }
    const std::size_t subsumed = src->size;
    dst->size += subsumed;
    p.index.erase(src);
    block_pool_.destroy(src);
    return subsumed;
  }

  // --- stream events -----------------------------------------------------------------------------

  event_type take_event() {
    if (free_events_.empty()) return device_.create_event();
    event_type e = free_events_.back();
    free_events_.pop_back();
    return e;
  }

  void insert_events(block_type* b) {
    std::vector<stream_type> streams = std::move(b->stream_uses);
    b->stream_uses.clear();
    for (stream_type s : streams) {
      event_type e = take_event();
      device_.record_event(e, s);
      ++b->event_count;
      queue_for(s).push_back(pending_event{e, b});
    }
  }

  std::deque<pending_event>& queue_for(stream_type s) {
    for (auto& [stream, queue] : pending_events_) {
      if (stream == s) return queue;
    }
    pending_events_.emplace_back(s, std::deque<pending_event>{});
    return pending_events_.back().second;
  }

  // PyTorch's process_events: per stream, retire completed events in order.
  void process_events() {
    for (auto it = pending_events_.begin(); it != pending_events_.end();) {
      auto& queue = it->second;
      while (!queue.empty()) {
        pending_event& pe = queue.front();
        if (!device_.query_event(pe.event)) break;
        retire_event(pe);
        queue.pop_front();
      }
      it = queue.empty() ? pending_events_.erase(it) : it + 1;
    }
  }

  void synchronize_and_free_events() {
    ++stats_.num_sync_all_streams;
    for (auto& [stream, queue] : pending_events_) {
      for (pending_event& pe : queue) {
        device_.synchronize_event(pe.event);
        retire_event(pe);
      }
    }
    pending_events_.clear();
  }

  void retire_event(pending_event& pe) {
    free_events_.push_back(pe.event);
    if (--pe.block->event_count == 0) free_block(pe.block);
  }

  // --- out of memory -----------------------------------------------------------------------------

  std::size_t largest_free_block() const noexcept {
    std::size_t largest = 0;
    for (const auto& sp : stream_pools_) {
      for (const pool_type* p : {&sp->large, &sp->small}) {
        if (const block_type* b = p->index.largest()) largest = std::max(largest, b->size);
      }
    }
    return largest;
  }

  [[noreturn]] void throw_oom(std::size_t size, std::size_t rounded, std::size_t seg_size,
                              const pool_type& p, bool fraction_refused) {
    ++stats_.num_ooms;
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    device_.memory_info(free_bytes, total_bytes);
    oom_facts f;
    auto& n = f.numbers;
    n.requested_bytes = size;
    n.rounded_bytes = rounded;
    n.device_request_bytes = seg_size;
    n.device_total_bytes = total_bytes;
    n.device_free_bytes = free_bytes;
    n.allocated_bytes = static_cast<std::size_t>(counts_.current(counter::allocated_bytes));
    n.reserved_bytes = static_cast<std::size_t>(counts_.current(counter::reserved_bytes));
    n.largest_free_block_bytes = largest_free_block();
    n.device = device_.index();
    for (const auto& sp : stream_pools_) {
      for (const pool_type* q : {&sp->large, &sp->small}) {
        n.free_cached_bytes += q->index.bytes();
        f.free_cached_blocks += q->index.size();
      }
    }
    if (const block_type* b = p.index.largest()) f.largest_free_block_in_pool = b->size;
    f.fraction_set = fraction_set_;
    f.fraction = fraction_;
    f.fraction_cap_bytes = allowed_memory_maximum_;
    f.fraction_was_limit = fraction_refused;
    f.max_split_size = config_.max_split_size;
    f.policy = std::string(to_string(policy_));
    throw out_of_memory(oom_message(f), n);
  }

  // --- invariants --------------------------------------------------------------------------------

  void check_invariants_locked() const {
    auto fail = [](const std::string& what) {
      throw std::logic_error("gpumem invariant violated: " + what);
    };
    struct recount {
      std::int64_t allocation = 0, segment = 0, active = 0, inactive_split = 0;
      std::int64_t allocated_bytes = 0, reserved_bytes = 0, active_bytes = 0,
                   inactive_split_bytes = 0, requested_bytes = 0;
    };
    recount rc[num_stat_types];
    std::int64_t oversize_allocs = 0;
    std::int64_t oversize_segs = 0;
    std::size_t allocated_blocks = 0;
    std::size_t indexed_blocks = 0;
    std::size_t reserved = 0;
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
    for (const segment_type* s = segments_; s != nullptr; s = s->next) {
      ranges.emplace_back(s->ptr, s->ptr + s->size);
      reserved += s->size;
      if (s->head == nullptr || s->head->prev != nullptr)
        fail("segment head is not its first block");
      std::uintptr_t expect = s->ptr;
      const bool split = s->head->next != nullptr;
      const std::size_t pt = s->owner->is_small ? 1 : 2;
      for (std::size_t t : {std::size_t{0}, pt}) {
        rc[t].segment += 1;
        rc[t].reserved_bytes += as_i64(s->size);
      }
      if (s->size >= config_.max_split_size) ++oversize_segs;
      for (const block_type* b = s->head; b != nullptr; b = b->next) {
        if (b->ptr != expect)
          fail(fmt::format("gap or overlap at {:#x} in segment {:#x}", b->ptr, s->ptr));
        if (b->size == 0) fail("empty block");
        if (b->seg != s || b->owner != s->owner) fail("block points at the wrong segment or pool");
        if (b->next != nullptr && b->next->prev != b) fail("broken prev/next links");
        expect += b->size;
        const bool pending = !b->allocated && b->event_count > 0;
        const bool is_free = !b->allocated && !pending;
        if (b->allocated) {
          ++allocated_blocks;
          if (allocated_.find(b->ptr) != b) fail("allocated block missing from the pointer map");
          if (b->indexed) fail("allocated block is in the free index");
          if (b->size >= config_.max_split_size) ++oversize_allocs;
        }
        if (is_free) {
          if (!b->indexed) fail(fmt::format("free block {:#x} is not indexed", b->ptr));
          ++indexed_blocks;
          if (b->next != nullptr && !b->next->allocated && b->next->event_count == 0 &&
              b->next->stream_uses.empty()) {
            fail(fmt::format("free neighbours {:#x} and {:#x} were not merged", b->ptr,
                             b->next->ptr));
          }
        } else if (b->indexed) {
          fail("busy block is in the free index");
        }
        for (std::size_t t : {std::size_t{0}, pt}) {
          if (b->allocated) {
            rc[t].allocation += 1;
            rc[t].allocated_bytes += as_i64(b->size);
          }
          if (!is_free) {
            rc[t].active += 1;
            rc[t].active_bytes += as_i64(b->size);
            rc[t].requested_bytes += as_i64(b->requested_size);
          } else if (split) {
            rc[t].inactive_split += 1;
            rc[t].inactive_split_bytes += as_i64(b->size);
          }
        }
      }
      if (expect != s->ptr + s->size) fail(fmt::format("blocks do not tile segment {:#x}", s->ptr));
    }
    std::sort(ranges.begin(), ranges.end());
    for (std::size_t i = 1; i < ranges.size(); ++i) {
      if (ranges[i].first < ranges[i - 1].second) fail("segments overlap");
    }
    if (allocated_blocks != allocated_.size())
      fail("pointer map holds blocks that are not allocated");
    std::size_t index_total = 0;
    for (const auto& sp : stream_pools_) {
      for (const pool_type* p : {&sp->large, &sp->small}) {
        index_total += p->index.size();
        p->index.for_each([&](const block_type* b) {
          if (b->owner != p) fail("block indexed in a foreign pool");
        });
      }
    }
    if (index_total != indexed_blocks) fail("free index holds blocks that are not free");
    if (reserved != reserved_total_) fail("reserved total disagrees with the segments");
    auto check = [&](const stat_array& a, std::int64_t recount::*field, const char* name) {
      for (std::size_t t = 0; t < num_stat_types; ++t) {
        if (a[t].current != rc[t].*field) {
          fail(fmt::format("stat {}[{}] is {} but the blocks say {}", name, t, a[t].current,
                           rc[t].*field));
        }
        if (a[t].current > a[t].peak) {
          fail(fmt::format("stat {}[{}] is above its peak", name, t));
        }
      }
    };
    check(counts_.get(counter::allocation), &recount::allocation, "allocation");
    check(counts_.get(counter::segment), &recount::segment, "segment");
    check(counts_.get(counter::active), &recount::active, "active");
    check(counts_.get(counter::inactive_split), &recount::inactive_split, "inactive_split");
    check(counts_.get(counter::allocated_bytes), &recount::allocated_bytes, "allocated_bytes");
    check(counts_.get(counter::reserved_bytes), &recount::reserved_bytes, "reserved_bytes");
    check(counts_.get(counter::active_bytes), &recount::active_bytes, "active_bytes");
    check(counts_.get(counter::inactive_split_bytes), &recount::inactive_split_bytes,
          "inactive_split_bytes");
    check(counts_.get(counter::requested_bytes), &recount::requested_bytes, "requested_bytes");
    if (stats_.oversize_allocations.current != oversize_allocs) fail("oversize_allocations");
    if (stats_.oversize_segments.current != oversize_segs) fail("oversize_segments");
  }

  Device& device_;
  allocator_config config_;
  allocator_policy policy_ = allocator_policy::classic;
  mutable detail::spin_mutex mutex_;

  std::vector<std::unique_ptr<pools_type>> stream_pools_;
  pools_type* last_pools_ = nullptr;
  detail::pointer_map<block_type> allocated_;
  detail::object_pool<block_type> block_pool_;
  detail::object_pool<segment_type> segment_pool_;
  segment_type* segments_ = nullptr;
  segment_type* segments_tail_ = nullptr;
  std::vector<std::pair<stream_type, std::deque<pending_event>>> pending_events_;
  std::vector<event_type> free_events_;

  detail::pool_counters counts_;  // the per-pool stat arrays
  device_stats stats_;            // the scalar stats (its arrays are filled from counts_)
  std::size_t reserved_total_ = 0;
  std::uint64_t gc_calls_[2] = {0, 0};  // free-block lookups per pool kind (small, large)
  bool fraction_set_ = false;
  double fraction_ = 1.0;
  std::size_t allowed_memory_maximum_ = 0;
  std::int64_t peak_seen_ = -1;
  std::int64_t allocated_at_peak_ = 0;
};

}  // namespace gpumem
