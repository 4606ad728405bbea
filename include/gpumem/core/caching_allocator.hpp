// gpumem — caching_allocator<Device>: a caching device-memory allocator with PyTorch's semantics.
//
// docs/architecture.md defines the words used here (segment, block, pool, range, page, shared
// page, ...) and follows one allocation through this file, policy by policy. This class
// orchestrates: its components under core/detail/ (pools, free index, counters, pointer map, VMM
// pages, the VMM policies' decisions on a miss in vmm_growth, stitch's thresholds, policy rules,
// events, the invariant checker) each do one job and check their own invariants; "Components" in
// docs/architecture.md is the contract between them.
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
#include <array>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>  // std::lock_guard
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpumem/config.hpp"
#include "gpumem/core/allocator_events.hpp"
#include "gpumem/core/detail/allocator_invariants.hpp"
#include "gpumem/core/detail/block.hpp"
#include "gpumem/core/detail/block_list.hpp"
#include "gpumem/core/detail/event_reporter.hpp"
#include "gpumem/core/detail/free_block_index.hpp"
#include "gpumem/core/detail/oom_details.hpp"
#include "gpumem/core/detail/pointer_map.hpp"
#include "gpumem/core/detail/policy_rules.hpp"
#include "gpumem/core/detail/pool_counters.hpp"
#include "gpumem/core/detail/pools.hpp"
#include "gpumem/core/detail/segment_release.hpp"
#include "gpumem/core/detail/shared_pages.hpp"
#include "gpumem/core/detail/spin_mutex.hpp"
#include "gpumem/core/detail/split_rules.hpp"
#include "gpumem/core/detail/step_placement.hpp"
#include "gpumem/core/detail/stitch_policy.hpp"
#include "gpumem/core/detail/vmm_growth.hpp"
#include "gpumem/core/detail/vmm_pages.hpp"
#include "gpumem/core/size_policy.hpp"
#include "gpumem/device/detail/stream_event_queue.hpp"
#include "gpumem/device/device.hpp"
#include "gpumem/device/shared_block.hpp"
#include "gpumem/error.hpp"
#include "gpumem/report/memory_summary.hpp"
#include "gpumem/report/oom_report.hpp"
#include "gpumem/stats.hpp"

namespace gpumem {

namespace detail {

// Reserved bytes of several allocators counted together against the memory fraction
// (share_memory_limit_with): a device's default pool and its private pools, as PyTorch counts them.
struct reserved_ledger {
  std::atomic<std::size_t> bytes{0};
};

}  // namespace detail

/// State of one block, as reported by segment snapshots.
enum class block_state { active_allocated, active_pending_free, inactive };

struct block_snapshot {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  // The last request the block served, kept once it is free (PyTorch's rule: a free block keeps
  // its last request, a merge keeps the freed block's, a block cut from a free one starts at 0).
  std::size_t requested_size = 0;
  block_state state = block_state::inactive;
  bool mapped = true;  // false: an inactive range of a VMM segment with no physical memory
};

template <class Stream>
struct segment_snapshot {
  std::uintptr_t address = 0;
  std::size_t total_size = 0;
  std::size_t allocated_size = 0;
  std::size_t active_size = 0;
  std::size_t requested_size = 0;
  std::size_t mapped_size = 0;  // bytes backed by physical memory (total_size unless VMM)
  // The physical memory this segment accounts for: its mapped pages, except those it shares with
  // another segment that uses them (or, when none does, that mapped them first). Summed over the
  // segments, reserved memory. Below mapped_size only under stitch, whose pages may be mapped at
  // several addresses.
  std::size_t reserved_size = 0;
  Stream stream{};
  bool is_small = false;
  // An address range mapped page by page (the expandable and stitch policies): only the parts in
  // reserved_ranges hold memory of their own. False: a classic segment, all of it reserved.
  bool is_expandable = false;
  // The parts whose memory reserved memory counts, as (address, size), lowest address first:
  // the whole segment when classic, else the runs of pages counted in reserved_size. What
  // pytorch.org/memory_viz draws as the segment's memory.
  std::vector<std::pair<std::uintptr_t, std::size_t>> reserved_ranges;
  std::vector<block_snapshot> blocks;  // in address order
};

/// One part of a segment that reserved memory counts, with the blocks in it (segment_parts).
struct segment_part {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::vector<block_snapshot> blocks;  // in address order; free blocks cut at the part's edges
};

/// The parts of `s` that reserved memory counts — the whole segment when classic (or built by hand
/// without reserved_ranges), else each of its reserved_ranges — with their blocks: what a PyTorch
/// snapshot lists as segments, so that they add up to reserved memory even where stitch maps a
/// page at two addresses. A live block lies inside one part in a consistent allocator; one that
/// does not gets a part of its own (so that no allocation is lost) and, when `stray` is given, is
/// stored there (the first such block).
template <class Stream>
std::vector<segment_part> segment_parts(const segment_snapshot<Stream>& s,
                                        std::optional<block_snapshot>* stray = nullptr) {
  std::vector<segment_part> parts;
  if (!s.is_expandable && s.reserved_ranges.empty()) {
    parts.push_back(segment_part{s.address, s.total_size, {}});
  } else {
    for (const auto& [address, size] : s.reserved_ranges) {
      parts.push_back(segment_part{address, size, {}});
    }
  }
  for (const block_snapshot& b : s.blocks) {
    const std::uint64_t b_end = std::uint64_t{b.address} + b.size;
    bool inside = false;
    for (segment_part& part : parts) {
      const std::uint64_t lo = std::max<std::uint64_t>(b.address, part.address);
      const std::uint64_t hi =
          std::min<std::uint64_t>(b_end, std::uint64_t{part.address} + part.size);
      if (lo >= hi) continue;
      const bool whole = lo == b.address && hi == b_end;
      if (b.state != block_state::inactive && !whole) continue;  // a live block is never cut
      block_snapshot piece = b;
      piece.address = static_cast<std::uintptr_t>(lo);
      piece.size = static_cast<std::size_t>(hi - lo);
      part.blocks.push_back(piece);
      inside = inside || whole;
    }
    if (!inside && b.state != block_state::inactive) {
      parts.push_back(segment_part{b.address, b.size, {b}});  // lose no allocation
      if (stray != nullptr && !*stray) *stray = b;
    }
  }
  return parts;
}

/// One block of a checkpointed segment (checkpoint): where it is, and whether it was handed out.
struct checkpoint_block {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  bool allocated = false;  // false: free or pending-free when checkpointed
};

/// One segment of a checkpoint: its address, the stream and pool kind it serves, and its blocks
/// in address order (mapped and unmapped alike).
template <class Stream>
struct checkpoint_segment {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  Stream stream{};
  bool is_small = false;
  std::vector<checkpoint_block> blocks;
};

/// An allocator's block layout at one moment (caching_allocator::checkpoint), to return its
/// allocations to later (restore): PyTorch's PrivatePoolState, which CUDA-graph trees take after
/// each recording.
template <class Stream>
struct allocator_checkpoint {
  std::vector<checkpoint_segment<Stream>> segments;  // in segment creation order
};

/// What restore changed: every pointer that was allocated before it (now freed) and every block
/// allocated by it (at the checkpoint's addresses). A pointer may be in both.
struct checkpoint_delta {
  std::vector<void*> freed;
  std::vector<void*> allocated;
};

/// The three byte counts people watch, current values (what stats() reports in requested_bytes,
/// allocated_bytes and reserved_bytes [all], without copying every statistic).
struct memory_usage {
  std::size_t requested = 0;  ///< sizes asked for by live and pending-free blocks
  std::size_t allocated = 0;  ///< bytes of blocks handed out
  std::size_t reserved = 0;   ///< bytes held from the device
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
  using event_observer = std::function<void(const allocator_event<stream_type>&)>;
  /// Serves a request from memory outside this allocator when its own is exhausted (see
  /// set_out_of_memory_fallback): returns a pointer, or nullptr when it cannot.
  using out_of_memory_fallback = std::function<void*(std::size_t size, stream_type stream)>;

  /// Uses `config` as given (see allocator_config::resolve to combine it with the environment).
  /// Throws config_error when a setting is out of range (allocator_config::validate).
  explicit caching_allocator(Device& device,
                             allocator_config config = allocator_config::from_environment())
      : device_(device),
        config_(std::move(config)),
        vmm_(device),
        growth_(rules_, config_, 0),
        steps_(config_.stitch_step_match) {
    config_.validate();
    policy_ = config_.effective_policy(is_vmm_device_v<Device>);
    rules_ = detail::policy_rules::of(policy_);
    splits_ = detail::split_rules(rules_);
    release_ = detail::segment_release(rules_);
    std::size_t granularity = 0;  // the VMM page size, under a VMM policy only
    if constexpr (is_vmm_device_v<Device>) {
      if (rules_.maps_pages) granularity = device_.granularity();
    }
    growth_ = detail::vmm_growth(rules_, config_, granularity);
    stats_.max_split_size = static_cast<std::int64_t>(config_.max_split_size);
    capture_reuse_ = config_.graph_capture_record_stream_reuse;
    if (config_.has_memory_cap()) set_memory_fraction(*config_.per_process_memory_fraction);
    // PyTorch's limit for throw_on_cudamalloc_oom: the configured fraction (not a later
    // set_memory_fraction), of the whole device when unset, truncated. The device's total is kept,
    // as PyTorch keeps device_prop.totalGlobalMem, so that a rejection asks the device nothing.
    device_total_ = device_.total_memory();
    rejection_limit_ = static_cast<std::size_t>(config_.per_process_memory_fraction.value_or(1.0) *
                                                static_cast<double>(device_total_));
  }

  caching_allocator(const caching_allocator&) = delete;
  caching_allocator& operator=(const caching_allocator&) = delete;

  /// Returns every segment to the device, including those still holding allocated blocks
  /// (pointers handed out become invalid). Never throws.
  ~caching_allocator() {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    if (ledger_) ledger_->bytes.fetch_sub(reserved_total_);
    try {
      events_.destroy_all(/*wait=*/false);
      // cudaFree waits for the device; cuMemUnmap does not (see release_vmm_cache).
      if (release_.unmaps_pages() && segments_ != nullptr) device_.synchronize();
      for (segment_type* s = segments_; s != nullptr; s = s->next) {
        if (s->page_size != 0) {
          release_vmm_segment_unchecked(s);
        } else {
          device_.deallocate(reinterpret_cast<void*>(s->ptr), s->size);
        }
      }
    } catch (...) {
      // A destructor must not throw; the device reports whatever could not be returned.
    }
    // The slabs free their memory wholesale; run the destructors of what is still in them.
    for (segment_type* s = segments_; s != nullptr;) {
      segment_type* next_segment = s->next;
      for (block_type* b = s->head; b != nullptr;) {
        block_type* next_block = b->next;
        block_pool_.destroy(b);
        b = next_block;
      }
      segment_pool_.destroy(s);
      s = next_segment;
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
    reporter_.clear_error();
    // PyTorch's malloc: no event query while a capture may be under way (an event recorded in a
    // capture cannot be queried); what was freed meanwhile waits for the capture's end, or, with
    // graph_capture_record_stream_reuse, until the graph orders its uses before this stream's
    // next work.
    if (captures_underway_ == 0) {
      if (!events_.empty() || !deferred_.empty()) process_events();
    } else if (!free_markers_.empty()) {
      free_blocks_ordered_in_capture(stream);
    }
    if (size > detail::k_max_request) {
      throw_oom(size, size, size, lookup_pools(stream).large, false);
    }

    const std::size_t rounded = detail::round_size(size, config_.divisions_for(size));
    pools_type& sp = lookup_pools(stream);
    pool_type& p = pool_for(sp, rounded);
    if (rules_.stitches && steps_.enabled()) {
      return allocate_as_planned(p, sp.serial, rounded, size, stream);
    }
    block_type* b = get_free_block(p, rounded);
    if (b == nullptr) {
      b = allocate_new_block(p, size, rounded);
      if (b == nullptr) return std::exchange(fallback_ptr_, nullptr);  // served elsewhere
    }
    return hand_out(b, rounded, size, stream);  // stitch may borrow another's pages
  }

  /// allocate(size, device.default_stream()).
  void* allocate(std::size_t size) { return allocate(size, device_.default_stream()); }

  /// Allocates `size` bytes on `stream` from the cache only: a free block this allocator already
  /// holds (stitch: of any size class of the stream), never new device memory, nothing released.
  /// Returns nullptr when no cached block fits (and for size 0). What a pool marked use-on-OOM
  /// lends on another allocator's out-of-memory (PyTorch's try_mempool_fallback); the block stays
  /// this allocator's and returns here when freed. Throws what allocate throws for an observer.
  void* allocate_cached(std::size_t size, stream_type stream) {
    if (size == 0 || size > detail::k_max_request) return nullptr;
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    reporter_.clear_error();
    if (captures_underway_ == 0 && (!events_.empty() || !deferred_.empty())) {
      process_events();
    }
    const std::size_t rounded = detail::round_size(size, config_.divisions_for(size));
    pool_type& p = pool_for(lookup_pools(stream), rounded);
    block_type* b = get_free_block(p, rounded);
    if (b == nullptr) b = borrow_block(p, rounded, true);
    if (b == nullptr) return nullptr;
    return hand_out(b, rounded, size, stream);
  }

  /// Where a miss goes when the device refuses its first request, before this allocator frees any
  /// cached memory (PyTorch's order for pools marked use-on-OOM): `fallback` may serve it from
  /// memory outside this allocator (allocate then returns its pointer, which this allocator does
  /// not own: free it where it came from); when it returns nullptr the miss goes on (release the
  /// cache, retry, out_of_memory). Called with this allocator's lock held: it must not call this
  /// allocator. Called during a capture too; never for requests above the largest possible. An
  /// empty function removes it.
  void set_out_of_memory_fallback(out_of_memory_fallback fallback) {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    oom_fallback_ = std::move(fallback);
  }

  /// Never split a block (PyTorch's MemPool(no_split=True)): every request takes a whole free
  /// block, and a miss a whole new segment (expandable: the whole run it mapped). Throws
  /// usage_error under stitch, whose size-class pools hold only blocks of their class.
  void set_no_split(bool no_split) {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    if (no_split && !splits_.allows_no_split()) {
      throw usage_error(
          "gpumem: set_no_split under the stitch policy: a whole block of one size class cannot "
          "serve a request of another (use classic or expandable)");
    }
    no_split_ = no_split;
  }

  /// Frees memory returned by allocate. nullptr is ignored. Throws usage_error (and changes
  /// nothing) when `ptr` is not an allocation of this allocator, including a second free.
  void deallocate(void* ptr) {
    if (!try_deallocate(ptr)) {
      throw usage_error(
          fmt::format("gpumem: free of pointer {} that this allocator did not "
                      "allocate, or that was already freed",
                      ptr));
    }
  }

  /// deallocate(ptr) when `ptr` is a live allocation of this allocator (or nullptr), returning
  /// true; otherwise changes nothing and returns false. For callers that route a pointer among
  /// several allocators.
  bool try_deallocate(void* ptr) {
    if (ptr == nullptr) return true;
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    reporter_.clear_error();
    block_type* b = allocated_.erase(reinterpret_cast<std::uintptr_t>(ptr));
    if (b == nullptr) return false;
    release_allocated(b);
    report_reserved_changes();
    rethrow_observer_error();  // the block was freed all the same
    return true;
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
  /// allocated block to the device (PyTorch's emptyCache). Under stitch it also forgets which size
  /// classes freed blocks, so that the next phase of a program (training after an evaluation pass)
  /// is placed as if it ran alone. Throws cuda_error on device failure.
  ///
  /// Does nothing while a capture is under way (begin_capture), as PyTorch skips its default
  /// pool then: it would synchronise and free memory the capture may use. Does nothing while the
  /// memory is fixed (set_memory_fixed): a live private pool keeps its cache.
  void empty_cache() {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    if (captures_underway_ > 0) return;
    if (memory_fixed_) return;
    reporter_.clear_error();
    release_cached_blocks();
    forget_freed_classes();
    report_reserved_changes();
    rethrow_observer_error();
  }

  // ---------------------------------------------------------------------------------------------
  // CUDA graphs, private pools, peers

  /// A CUDA-graph capture (or a private pool's use, which PyTorch treats alike) begins on the
  /// allocator's device: until the matching end_capture, as PyTorch's allocator does while
  /// captures are under way, the allocator queries no event (an event recorded in a capture
  /// cannot be queried), a block freed with record_stream uses waits for the capture's end before
  /// its events are recorded, a miss never frees, unmaps or synchronises (no out-of-memory retry,
  /// no garbage collection: it only adds memory, in relaxed capture mode for the caller to set),
  /// stitch never makes a stream wait for another to reuse a page, and empty_cache does nothing.
  /// Calls nest (one per capture under way).
  void begin_capture() {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    ++captures_underway_;
  }

  /// Ends one begin_capture. Throws usage_error when none is under way.
  void end_capture() {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    if (captures_underway_ == 0) {
      throw usage_error("gpumem: end_capture without a capture under way (begin_capture)");
    }
    --captures_underway_;
  }

  /// PyTorch's graph_capture_record_stream_reuse (initially the configuration's): during a
  /// capture, a block freed with record_stream uses is reused by its own stream as soon as the
  /// graph being captured orders every use of it before that stream's next work (each stream
  /// that used it joined back, e.g. with an event wait), instead of after the capture. Needs a
  /// device that exposes the capture's graph (cuda_device, cuda_vmm_device); elsewhere the
  /// blocks wait for the capture's end as before.
  void set_capture_record_stream_reuse(bool reuse) {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    capture_reuse_ = reuse;
  }

  /// Applies the sizing settings PyTorch lets a program change while it runs
  /// (torch.cuda.memory._set_allocator_settings) from `settings`: max_split_size,
  /// max_non_split_rounding, roundup_power2_divisions, garbage_collection_threshold, and
  /// large_segment_size for the size of new cudaMalloc segments (a VMM policy keeps the page size
  /// it started with: its ranges are laid out in it). Every other key keeps its value from
  /// construction. As in PyTorch's allocator, each setting acts from the next request that
  /// consults it: blocks already cached stay cached and are judged by the new values when they
  /// are next looked up, and stats().max_split_size keeps the value at construction (PyTorch
  /// sets it when its device allocator is made). The oversize counters, as PyTorch's, count each
  /// allocation, free, segment and release against the max_split_size of that moment. Throws
  /// config_error (allocator_config::validate) and leaves the allocator unchanged when the values
  /// are out of range.
  void set_run_time_settings(const allocator_config& settings) {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    allocator_config next = config_;
    next.take_run_time_settings(settings);
    next.validate();
    max_split_changed_ = max_split_changed_ || next.max_split_size != config_.max_split_size;
    config_ = std::move(next);
  }

  /// Whether a capture is under way (begin_capture without its end_capture).
  bool capture_underway() const {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    return captures_underway_ > 0;
  }

  /// Fixes the allocator's memory (true) or frees it again (false). While fixed, no memory it
  /// holds is ever returned, unmapped or remapped: empty_cache does nothing, a miss neither
  /// frees cached blocks nor unmaps pages before asking the device for more (it fails with
  /// out_of_memory instead), garbage collection is off. For a CUDA graph's private pool, whose
  /// addresses the graph keeps using after its blocks are freed: fixed while the pool is in use,
  /// released (false) when the pool is, so that empty_cache can return it.
  void set_memory_fixed(bool fixed) {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    memory_fixed_ = fixed;
  }

  bool memory_fixed() const {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    return memory_fixed_;
  }

  /// Device `peer` may access this allocator's memory (PyTorch's addPeerAccess, after
  /// cudaDeviceEnablePeerAccess): VMM memory, which peer access does not cover, is granted to
  /// `peer` with cuMemSetAccess now for every mapped page and from now on for every page mapped.
  /// Does nothing on a device without VMM or for the allocator's own device; a peer is added once.
  /// Throws cuda_error when the device refuses.
  void add_peer_access(int peer) {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    if constexpr (is_vmm_device_v<Device> && detail::has_grant_access_v<Device>) {
      if (peer == device_.index() || vmm_.has_peer(peer)) return;
      vmm_.add_peer(peer);
      for (segment_type* s = segments_; s != nullptr; s = s->next) {
        if (s->page_size == 0) continue;
        for (std::size_t i = 0; i < s->pages.size();) {
          if (s->pages[i] == detail::no_page) {
            ++i;
            continue;
          }
          std::size_t j = i;
          while (j < s->pages.size() && s->pages[j] != detail::no_page) ++j;
          device_.grant_access(s->ptr + i * s->page_size, (j - i) * s->page_size, peer);
          i = j;
        }
      }
    } else {
      (void)peer;
    }
  }

  /// Counts this allocator's reserved memory together with `other`'s (and every allocator that
  /// shares with either) against the memory fraction, as PyTorch counts its private pools with the
  /// rest of the device. Call before either allocates concurrently with it; set the fraction on
  /// each (set_memory_fraction).
  void share_memory_limit_with(caching_allocator& other) {
    if (&other == this) return;
    std::shared_ptr<detail::reserved_ledger> ledger;
    {
      std::lock_guard<detail::spin_mutex> lock(other.mutex_);
      if (!other.ledger_) {
        other.ledger_ = std::make_shared<detail::reserved_ledger>();
        other.ledger_->bytes.fetch_add(other.reserved_total_);
      }
      ledger = other.ledger_;
    }
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    if (ledger_ == ledger) return;
    if (ledger_) ledger_->bytes.fetch_sub(reserved_total_);
    ledger_ = std::move(ledger);
    ledger_->bytes.fetch_add(reserved_total_);
  }

  /// The block layout of every segment (PyTorch's getCheckpointState of a private pool): what
  /// restore returns the allocator to. Blocks pending free count as free.
  allocator_checkpoint<stream_type> checkpoint() const {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    allocator_checkpoint<stream_type> out;
    for (const segment_type* s = segments_; s != nullptr; s = s->next) {
      checkpoint_segment<stream_type> cs;
      cs.address = s->ptr;
      cs.size = s->size;
      cs.stream = s->owner->stream;
      cs.is_small = s->owner->is_small;
      for (const block_type* b = s->head; b != nullptr; b = b->next) {
        cs.blocks.push_back(checkpoint_block{b->ptr, b->size, b->allocated});
      }
      out.segments.push_back(std::move(cs));
    }
    return out;
  }

  /// Returns the allocations to those of `cp` (PyTorch's setCheckpointPoolState, which CUDA-graph
  /// trees call before recording a graph after replaying others): every block allocated now is
  /// freed, then every block allocated in `cp` is allocated again at its address and size
  /// (requested size = its size, as PyTorch counts it), its segment cut around it; the rest of
  /// each segment is free. Segments made since `cp` stay, free. Returns the pointers freed and
  /// those allocated. Outside a capture, blocks pending on stream events are waited for first.
  /// The current statistics are those of a fresh allocation of each restored block.
  ///
  /// Works under every policy: the checkpointed blocks must lie in segments still there and,
  /// under expandable and stitch, on mapped pages; a private pool in use keeps both (its memory
  /// is fixed), and under stitch its pages mapped at two addresses were held by one range each at
  /// the checkpoint, so the restored blocks hold them again without conflict. Throws usage_error,
  /// changing nothing, when `cp` does not fit this allocator (a segment gone or moved, a block
  /// outside its segment, overlapping another, or on unmapped pages) or when, during a capture,
  /// a block is pending or used on other streams.
  checkpoint_delta restore(const allocator_checkpoint<stream_type>& cp) {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    reporter_.clear_error();
    const std::vector<segment_type*> targets = checkpoint_targets(cp);
    checkpoint_delta delta;
    std::vector<block_type*> live;
    for (segment_type* s = segments_; s != nullptr; s = s->next) {
      for (block_type* b = s->head; b != nullptr; b = b->next) {
        if (b->allocated) live.push_back(b);
      }
    }
    for (block_type* b : live) {  // freeing merges neighbours, never b's own address
      delta.freed.push_back(reinterpret_cast<void*>(b->ptr));
      allocated_.erase(b->ptr);
      release_allocated(b);
    }
    if (captures_underway_ == 0 && (!events_.empty() || !deferred_.empty())) {
      synchronize_and_free_events();
    }
    for (std::size_t k = 0; k < cp.segments.size(); ++k) {
      block_type* cursor = targets[k]->head;
      for (const checkpoint_block& cb : cp.segments[k].blocks) {
        if (!cb.allocated) continue;
        while (cursor != nullptr && cursor->ptr + cursor->size <= cb.address) {
          cursor = cursor->next;
        }
        block_type* b = restore_block(cursor, cb);
        delta.allocated.push_back(reinterpret_cast<void*>(b->ptr));
        if (reporter_.listening())
          notify(allocator_action::alloc, b->ptr, b->size, b->owner->stream);
        cursor = b->next;
      }
    }
    report_reserved_changes();
    rethrow_observer_error();
    return delta;
  }

  // ---------------------------------------------------------------------------------------------
  // Limits

  /// Caps reserved memory at fraction x device total (PyTorch's set_per_process_memory_fraction),
  /// rounded to the nearest byte as PyTorch does since 2.13 (2.12 and older truncate, which can
  /// leave the cap a byte short of a request that exactly fills it). 1 removes the cap (and with
  /// it garbage collection), as PyTorch does. Throws std::invalid_argument unless 0 <= fraction
  /// <= 1.
  void set_memory_fraction(double fraction) {
    if (!(fraction >= 0.0 && fraction <= 1.0)) {
      throw std::invalid_argument(
          fmt::format("gpumem: memory fraction {} is outside [0, 1]", fraction));
    }
    const std::size_t total = device_.total_memory();
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    fraction_ = fraction;
    fraction_set_ = fraction < 1.0;  // 1 removes the cap, as in PyTorch (2.11 and newer)
    allowed_memory_maximum_ =
        fraction_set_ ? static_cast<std::size_t>(std::round(fraction * static_cast<double>(total)))
                      : 0;
  }

  /// The bytes the memory fraction allows (reserved memory is capped there), or nothing when no
  /// fraction is set.
  std::optional<std::size_t> memory_cap_bytes() const {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    if (!fraction_set_) return std::nullopt;
    return allowed_memory_maximum_;
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

  /// Current requested, allocated and reserved bytes; cheap enough to call after every operation.
  memory_usage usage() const {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    memory_usage u;
    u.requested = static_cast<std::size_t>(counts_.current(counter::requested_bytes));
    u.allocated = static_cast<std::size_t>(counts_.current(counter::allocated_bytes));
    u.reserved = static_cast<std::size_t>(counts_.current(counter::reserved_bytes));
    return u;
  }

  /// Resets every stat's peak to its current value (and gpumem's fragmentation-at-peak).
  void reset_peak_stats() {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    note_requested_high_water();  // stitch's settling is not reset with the user's peaks
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
    stats_.num_oom_rejections = 0;
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
        block_snapshot bs{b->ptr, b->size, b->requested_size, block_state::inactive, b->mapped};
        if (b->mapped) ss.mapped_size += b->size;
        if (b->allocated) {
          bs.state = block_state::active_allocated;
          ss.allocated_size += b->size;
        } else if (b->event_count > 0 || !b->stream_uses.empty()) {
          bs.state = block_state::active_pending_free;
        }
        if (bs.state != block_state::inactive) {
          ss.active_size += b->size;
          ss.requested_size += b->requested_size;
        }
        ss.blocks.push_back(bs);
      }
      ss.reserved_size = s->page_size == 0 ? s->size : reserved_in(*s);
      ss.is_expandable = s->page_size != 0;
      for_each_reserved_run(*s, [&](std::uintptr_t address, std::size_t size) {
        ss.reserved_ranges.emplace_back(address, size);
      });
      out.push_back(std::move(ss));
    }
    return out;
  }

  /// The memory that reserved memory counts, as address ranges: each classic segment whole, and
  /// each run of the pages a VMM segment (expandable, stitch) accounts for (under stitch a page
  /// mapped at several addresses counts where a block uses it, else where it was mapped first).
  /// Segments in creation order, each one's runs lowest address first; the sizes sum to
  /// usage().reserved. O(segments + VMM pages): for exports that follow memory event by event.
  std::vector<reserved_range<stream_type>> reserved_ranges() const {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    return reserved_ranges_locked();
  }

  /// Also reports, to the event observer, every change in what reserved memory counts
  /// (reserved_ranges) as segment events of view segment_view::reserved, and marks the segment
  /// events of device calls segment_view::device — under stitch, where the two differ (a page
  /// mapped at two addresses counts once); other policies keep reporting segment_view::both. For
  /// a history that rebuilds reserved memory event by event (PyTorch's snapshots, memory_viz)
  /// while another listener registers the device's mappings (NCCL). Costs O(segments + pages)
  /// per operation while on. Starts from the memory counted now (no event for it).
  void set_reserved_events(bool on) {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    const bool stitch = rules_.stitches;
    reporter_.set_reserved_events(on && stitch, on && stitch
                                                    ? reserved_ranges_locked()
                                                    : std::vector<reserved_range<stream_type>>{});
  }

  /// The segment holding live allocation `ptr`: its base address and size (PyTorch's
  /// getBaseAllocation). Throws usage_error for a pointer that is not a live allocation.
  std::pair<void*, std::size_t> base_allocation(void* ptr) const {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    const block_type* b = allocated_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (b == nullptr) throw usage_error(fmt::format("gpumem: {} is not a live allocation", ptr));
    return {reinterpret_cast<void*>(b->seg->ptr), b->seg->size};
  }

  /// The physical pages under live allocation `ptr`, exported for another process to open with
  /// opened_block (gpumem/device/shared_block.hpp, which says what both sides must agree on): one
  /// POSIX file descriptor per page covering the block, in address order, owned by the caller (a
  /// fabric handle per page instead where the device creates memory with fabric handles).
  /// For the expandable and stitch policies on a device that exports handles (cuda_vmm_device).
  /// Throws usage_error for a pointer that is not a live allocation, or for memory that cannot be
  /// shared this way (classic cudaMalloc segments: cudaIpcGetMemHandle shares them); cuda_error
  /// when the driver refuses (memory created without a shareable handle type), with every
  /// descriptor made so far closed.
  shared_block share_block(void* ptr) const {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    const block_type* b = allocated_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (b == nullptr) throw usage_error(fmt::format("gpumem: {} is not a live allocation", ptr));
    if constexpr (is_vmm_device_v<Device> && detail::has_export_handle_v<Device>) {
      const segment_type& s = *b->seg;
      if (s.page_size != 0) {
        const auto [first, last] = detail::page_span(b);
        shared_block out;
        out.offset = b->ptr - (s.ptr + first * s.page_size);
        out.size = b->requested_size;
        out.page_size = s.page_size;
        bool fabric = false;
        if constexpr (detail::has_export_fabric_handle_v<Device>) {
          fabric = device_.shareable_handle_type() == Device::shareable_handle::fabric;
        }
        try {
          for (std::size_t i = first; i < last; ++i) {
            const auto handle =
                static_cast<typename Device::physical_handle>(vmm_.page(s.pages[i]).handle);
            if constexpr (detail::has_export_fabric_handle_v<Device>) {
              if (fabric) {
                out.fabric.push_back(device_.export_fabric_handle(handle));
                continue;
              }
            }
            out.fds.push_back(device_.export_handle(handle));
          }
        } catch (...) {
          close_descriptors(out);
          throw;
        }
        return out;
      }
    }
    throw usage_error(fmt::format(
        "gpumem: share_block({}): only the expandable and stitch policies on a CUDA VMM device "
        "export their memory as file descriptors; policy {} {}",
        ptr, to_string(policy_),
        is_vmm_device_v<Device> && detail::has_export_handle_v<Device>
            ? "keeps this block in a cudaMalloc segment (share it with cudaIpcGetMemHandle)"
            : "runs on a device that exports no handles"));
  }

  /// Whether `ptr` is a live allocation of this allocator.
  bool owns(const void* ptr) const {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    return allocated_.find(reinterpret_cast<std::uintptr_t>(ptr)) != nullptr;
  }

  /// Calls `observer` for every allocator_action from now on (an empty function stops it), with
  /// the allocator's lock held: it must be quick and must not call back into this allocator.
  /// An observer may throw: the operation still completes and leaves the allocator consistent
  /// (an allocate whose events threw is undone: nothing is handed out; a deallocate frees the
  /// block), then the member rethrows the first exception; an out_of_memory takes precedence.
  /// Not to be called concurrently with other members.
  void set_event_observer(event_observer observer) {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    reporter_.set_observer(std::move(observer));
  }

  /// The requested size of a live allocation. Throws usage_error for a foreign pointer.
  std::size_t allocation_size(void* ptr) const {
    std::lock_guard<detail::spin_mutex> lock(mutex_);
    const block_type* b = allocated_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (b == nullptr) throw usage_error(fmt::format("gpumem: {} is not a live allocation", ptr));
    return b->requested_size;
  }

  /// The configuration (with set_run_time_settings' values). Not synchronised with
  /// set_run_time_settings: read it while no other thread changes the settings.
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
  using block_links = detail::block_list<stream_type>;  // links, cuts, joins blocks

  static std::int64_t as_i64(std::size_t v) noexcept { return static_cast<std::int64_t>(v); }

  // The observer, told through reporter_ (core/detail/event_reporter.hpp). An observer that throws
  // must not leave the allocator half-changed: the first exception is kept, the operation goes on
  // to a consistent state, and the public member rethrows it.
  void notify(allocator_action action, std::uintptr_t address, std::size_t size,
              stream_type stream) const {
    reporter_.notify(action, address, size, stream);
  }
  void report_reserved_changes() {
    reporter_.report_reserved_changes([this] { return reserved_ranges_locked(); });
  }
  void rethrow_observer_error() { reporter_.rethrow_error(); }

  // allocate's and allocate_cached's last step: block b (found or made) is handed out for `size`
  // bytes and the observer told. An observer that throws undoes it: the caller gets the exception
  // and no pointer.
  void* hand_out(block_type* b, std::size_t rounded, std::size_t size, stream_type stream) {
    void* ptr = alloc_found_block(b, *b->owner, rounded, size);
    if (reporter_.listening()) {
      report_reserved_changes();
      notify(allocator_action::alloc, reinterpret_cast<std::uintptr_t>(ptr), size, stream);
      if (reporter_.failed()) {
        release_allocated(allocated_.erase(reinterpret_cast<std::uintptr_t>(ptr)));
        report_reserved_changes();
        rethrow_observer_error();
      }
    }
    return ptr;
  }

  // Frees block b, just taken out of the pointer map: deallocate's work.
  void release_allocated(block_type* b) {
    if (reporter_.listening()) {
      notify(allocator_action::free_requested, b->ptr, b->requested_size, b->owner->stream);
    }
    b->allocated = false;
    const bool small = b->owner->is_small;
    note_class_freed(b);
    counts_.decrease(small, counter::allocation, 1);
    counts_.decrease(small, counter::allocated_bytes, as_i64(b->size));
    if (b->size >= config_.max_split_size) stats_.oversize_allocations.decrease(1);
    if (b->stream_uses.empty()) {
      free_block(b);
    } else if (captures_underway_ > 0) {
      // PyTorch's free during a capture: an event recorded now on a capturing stream could never
      // be queried; the block waits (pending) until events can be recorded after the capture.
      deferred_.push_back(b);
      if (capture_reuse_) record_free_markers(b);
    } else {
      insert_events(b);
    }
  }

  // Stitch: the size class of a large block freed has freed blocks now, so it may borrow
  // (borrow_block). Nothing under the other policies.
  void note_class_freed(const block_type* b) {
    if (!growth_.borrows(b->owner->is_small)) return;
    pool_for(lookup_pools(b->owner->stream), b->size).has_freed = true;
  }

  // Whether the allocator may free, unmap or synchronise to serve a miss (PyTorch releases
  // nothing during a capture; a fixed allocator's memory stays put).
  bool may_release() const noexcept { return captures_underway_ == 0 && !memory_fixed_; }

  // Reserved bytes counted against the memory fraction: this allocator's, or those of every
  // allocator sharing its limit.
  std::size_t limited_total() const noexcept {
    return ledger_ ? ledger_->bytes.load(std::memory_order_relaxed) : reserved_total_;
  }
  void add_reserved(std::size_t bytes) noexcept {
    reserved_total_ += bytes;
    if (ledger_) ledger_->bytes.fetch_add(bytes, std::memory_order_relaxed);
  }
  void sub_reserved(std::size_t bytes) noexcept {
    reserved_total_ -= bytes;
    if (ledger_) ledger_->bytes.fetch_sub(bytes, std::memory_order_relaxed);
  }

  bool gc_enabled() const noexcept {
    return fraction_set_ && config_.garbage_collection_threshold > 0.0;
  }

  // --- checkpoints (checkpoint, restore) -------------------------------------------------------

  [[noreturn]] static void refuse_checkpoint(const std::string& why) {
    throw usage_error("gpumem: restore of a checkpoint that does not fit this allocator: " + why);
  }

  // restore's checks, before it changes anything: the segment of each checkpointed segment, or
  // usage_error.
  std::vector<segment_type*> checkpoint_targets(const allocator_checkpoint<stream_type>& cp) const {
    std::vector<segment_type*> targets;
    for (const checkpoint_segment<stream_type>& cs : cp.segments) {
      segment_type* s = segments_;
      while (s != nullptr && s->ptr != cs.address) s = s->next;
      if (s == nullptr || s->size != cs.size || !(s->owner->stream == cs.stream) ||
          s->owner->is_small != cs.is_small) {
        refuse_checkpoint(fmt::format("segment {:#x} of {} bytes is gone", cs.address, cs.size));
      }
      std::uintptr_t end = s->ptr;
      for (const checkpoint_block& cb : cs.blocks) {
        if (!cb.allocated) continue;
        if (cb.size == 0 || cb.address < end || cb.address + cb.size > s->ptr + s->size) {
          refuse_checkpoint(
              fmt::format("block {:#x} of {} bytes is outside its segment or overlaps another",
                          cb.address, cb.size));
        }
        end = cb.address + cb.size;
        if (s->page_size != 0) {
          const std::size_t first = (cb.address - s->ptr) / s->page_size;
          const std::size_t last = (end - s->ptr + s->page_size - 1) / s->page_size;
          for (std::size_t i = first; i < last; ++i) {
            if (s->pages[i] == 0) {
              refuse_checkpoint(fmt::format("block {:#x} lies on unmapped pages", cb.address));
            }
          }
        }
      }
      targets.push_back(s);
    }
    if (captures_underway_ > 0) {
      bool busy = !deferred_.empty() || !events_.empty();
      for (const segment_type* s = segments_; s != nullptr && !busy; s = s->next) {
        for (const block_type* b = s->head; b != nullptr && !busy; b = b->next) {
          busy = b->allocated && !b->stream_uses.empty();
        }
      }
      if (busy) {
        throw usage_error(
            "gpumem: restore of a checkpoint during a capture while blocks wait for stream events "
            "(used on other streams): restore it after the capture");
      }
    }
    return targets;
  }

  // restore: allocates checkpointed block `cb` out of free block b, which holds it (b's segment
  // has no allocated block left but those restored before it). Returns the allocated block.
  block_type* restore_block(block_type* b, const checkpoint_block& cb) {
    if (b == nullptr || b->allocated || !b->mapped || b->shadowed || !b->indexed ||
        b->ptr > cb.address || b->ptr + b->size < cb.address + cb.size) {
      throw std::logic_error(fmt::format(
          "gpumem invariant violated: checkpointed block {:#x} is not inside a free block",
          cb.address));
    }
    if constexpr (is_vmm_device_v<Device>) {
      const segment_type& s = *b->seg;
      if (s.shared_pages != 0) {
        const std::size_t first = (cb.address - s.ptr) / s.page_size;
        const std::size_t last = (cb.address + cb.size - s.ptr + s.page_size - 1) / s.page_size;
        for (std::size_t i = first; i < last; ++i) {
          if (vmm_.held_elsewhere(s, i)) {
            throw std::logic_error(fmt::format(
                "gpumem invariant violated: checkpointed block {:#x} is on a page another range "
                "holds",
                cb.address));
          }
        }
      }
    }
    pool_type& p = *b->owner;
    p.index.erase(b);
    alloc_found_block(cut_out(b, cb.address, cb.size), p, cb.size, cb.size);
    return b;
  }

  // Cuts [at, at + size) out of free block b, taken out of its pool's index (the range lies within
  // b): the pieces before and after go back to the index and the split counts follow
  // (split_rules::on_cut). Returns b, now exactly that range, to be handed out whole.
  block_type* cut_out(block_type* b, std::uintptr_t at, std::size_t size) {
    pool_type& p = *b->owner;
    const bool was_split = b->is_split();
    const std::size_t whole = b->size;
    int pieces = 1;
    if (b->ptr < at) {
      index_insert(p, cut_low(b, at));
      ++pieces;
    }
    if (b->ptr + b->size > at + size) {
      index_insert(p, cut(b, at + size));
      ++pieces;
    }
    count_inactive_split(p.is_small, splits_.on_cut(pieces, was_split, whole));
    return b;
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
    sp->serial = stream_pools_.size();
    stream_pools_.push_back(std::move(sp));
    return *(last_pools_ = stream_pools_.back().get());
  }

  GPUMEM_ALWAYS_INLINE pool_type& pool_for(pools_type& sp, std::size_t rounded) {
    if (detail::is_small_request(rounded)) return sp.small;
    if (!growth_.pools_by_class()) return sp.large;
    pool_type* p = sp.by_class[detail::stitch_size_class(rounded)];
    return p != nullptr ? *p : make_class_pool(sp, rounded);
  }

  pool_type& make_class_pool(pools_type& sp, std::size_t rounded) {
    sp.classes.push_back(std::make_unique<pool_type>());
    pool_type* p = sp.classes.back().get();
    p->stream = sp.small.stream;
    p->free_bound = &sp.free_bound[sp.classes.size() - 1];
    sp.by_class[detail::stitch_size_class(rounded)] = p;
    return *p;
  }

  GPUMEM_ALWAYS_INLINE void index_insert(pool_type& p, block_type* b) {
    if (!p.is_small) b->gc_count_base = large_free_lookups_;
    p.index.insert(b);
    if (p.free_bound != nullptr && *p.free_bound < b->size) *p.free_bound = b->size;
  }

  // Stitch: allocate's path, offering first the block the request one step before had
  // (step_placement.hpp).
  void* allocate_as_planned(pool_type& p, std::size_t stream_serial, std::size_t rounded,
                            std::size_t size, stream_type stream) {
    using placement = typename detail::step_placement<pool_type>::placement;
    const placement* plan = steps_.next(rounded, stream_serial);
    placement where;
    block_type* b = plan != nullptr ? place_as_planned(p, rounded, *plan, where) : nullptr;
    if (b == nullptr) {
      b = get_free_block(p, rounded);
      if (b == nullptr) b = allocate_new_block(p, size, rounded);
      if (b == nullptr) return std::exchange(fallback_ptr_, nullptr);  // served elsewhere
      where = placement{b->owner, b->ptr, b->ptr, b->size};
    }
    void* ptr = hand_out(b, rounded, size, stream);
    steps_.record(where);
    return ptr;
  }

  // The block the request one step before had, cut out of the free block that holds it now, or
  // nullptr when that is not wholly free and usable (in use, shadowed, waiting for a stream's
  // work, unmapped), during a capture, or not found quickly: the free block it was cut from
  // then, by size and address in the pool's index, else a walk of at most k_plan_walk blocks
  // from the first block of its range.
  static constexpr int k_plan_walk = 1024;
  block_type* place_as_planned(pool_type& p, std::size_t rounded,
                               const typename detail::step_placement<pool_type>::placement& plan,
                               typename detail::step_placement<pool_type>::placement& where) {
    if (plan.pool->stream != p.stream || captures_underway_ != 0) return nullptr;
    pool_type& owner = *plan.pool;
    const std::uintptr_t at = plan.ptr;
    // A block on shared pages that other ranges hold is shadowed in part, the rest back in the
    // index: then look again, once per shadowing.
    for (int looks = 0; looks < 4; ++looks) {
      block_type* b = owner.index.find(plan.free_size, plan.free_ptr);
      if (b == nullptr || at < b->ptr || at + rounded > b->ptr + b->size) {
        b = free_block_at(owner, at);
      }
      if (b == nullptr || b->ptr + b->size < at + rounded) return nullptr;
      if (b->size > rounded && b->size >= config_.max_split_size) return nullptr;  // never split
      owner.index.erase(b);
      if (b->seg->shared_pages != 0 && !usable_despite_sharing(b)) {
        restore_set_aside(nullptr);
        continue;
      }
      where = {&owner, at, b->ptr, b->size};
      // Exactly the planned block: what is after it may be the next request's plan.
      return cut_out(b, at, rounded);
    }
    return nullptr;
  }

  // The indexed (free, mapped, usable) block of pool p that holds address `at`, found by a walk
  // of at most k_plan_walk blocks from the first of its range; nullptr otherwise.
  block_type* free_block_at(pool_type& p, std::uintptr_t at) noexcept {
    for (segment_type* s = segments_; s != nullptr; s = s->next) {
      if (s->owner != &p || at < s->ptr || at >= s->ptr + s->size) continue;
      int walked = 0;
      for (block_type* b = s->head; b != nullptr && walked < k_plan_walk; b = b->next, ++walked) {
        if (at >= b->ptr + b->size) continue;
        return b->indexed && allocatable(b) && b->mapped ? b : nullptr;
      }
      return nullptr;
    }
    return nullptr;
  }

  // --- the classic policy ------------------------------------------------------------------------

  // PyTorch's get_free_block: the best fit on this stream, unless the oversize rules refuse it.
  // Stitch: a block on pages that another range holds is shadowed instead, and the search goes on.
  GPUMEM_ALWAYS_INLINE block_type* get_free_block(pool_type& p, std::size_t rounded) {
    if (gc_enabled() && !p.is_small) ++large_free_lookups_;
    for (;;) {
      block_type* b = p.index.lower_bound(rounded);
      if (b != nullptr && rules_.grows_one_range) b = least_expandable(p, b);
      if (b == nullptr || oversize_refuses(b->size, rounded)) return restore_set_aside(nullptr);
      p.index.erase(b);
      if (b->seg->shared_pages == 0 || usable_despite_sharing(b)) return restore_set_aside(b);
    }
  }

  // Stitch: free block b (out of its index) lies on a range with shared pages. True when b may be
  // used; false when the search must go on without it: the pages other ranges hold were shadowed
  // (the rest of b is back in the index), or b was set aside until the search ends.
  bool usable_despite_sharing(block_type* b) {
    if constexpr (is_vmm_device_v<Device>) {
      if (shadow_held_pages(b)) return false;
      if (orders_during_capture(b)) {
        set_aside_.push_back(b);
        return false;
      }
    }
    return true;
  }

  // Expandable, as PyTorch's get_free_block: a free block followed by unmapped address space
  // counts as large as it could grow (its size plus that space). From the best fit b, the search
  // moves on in (size, address) order while the next block could grow less than the current one.
  block_type* least_expandable(const pool_type& p, block_type* b) const noexcept {
    auto growable = [](const block_type* x) {
      return x->size + (x->next != nullptr && !x->next->mapped ? x->next->size : 0);
    };
    for (block_type* n = p.index.next(b); n != nullptr && growable(n) < growable(b);
         n = p.index.next(b)) {
      b = n;
    }
    return b;
  }

  // Stitch during a capture: whether using free block b (out of the index) would make its stream
  // wait for another one (a shared page last used elsewhere). Such a wait would record an event
  // on one stream and wait on another across the capture's boundary, which the capture forbids
  // (or drags the other stream into it), so the block is not used until the capture ends.
  bool orders_during_capture(const block_type* b) const noexcept {
    if (captures_underway_ == 0 || b->seg->shared_pages == 0) return false;
    const auto [first, last] = detail::page_span(b);
    return vmm_.would_order(*b->seg, first, last, b->owner->stream);
  }

  // Puts the blocks orders_during_capture set aside back into their pools' indexes.
  GPUMEM_ALWAYS_INLINE block_type* restore_set_aside(block_type* found) {
    if (!set_aside_.empty()) {
      for (block_type* b : set_aside_) index_insert(*b->owner, b);
      set_aside_.clear();
    }
    return found;
  }

  GPUMEM_ALWAYS_INLINE bool oversize_refuses(std::size_t block_size, std::size_t rounded) const {
    const std::size_t max_split = config_.max_split_size;
    // A request below max_split_size never takes an oversize block...
    if (rounded < max_split && block_size >= max_split) return true;
    // ...and an oversize request takes one only if it wastes less than max_non_split_rounding
    // (block_size >= rounded: the block was found for the request; the sum could overflow).
    return rounded >= max_split && block_size - rounded >= config_.max_non_split_rounding;
  }

  // PyTorch's try_mempool_fallback: the out-of-memory fallback's pointer is kept for allocate.
  bool try_fallback(std::size_t size, stream_type stream) {
    fallback_ptr_ = oom_fallback_(size, stream);
    return fallback_ptr_ != nullptr;
  }

  // PyTorch's miss path: GC, then the device, then the out-of-memory fallback (pools marked
  // use-on-OOM), then free one oversize block and retry, then free the whole cache and retry; then
  // out_of_memory. Returns nullptr when the fallback served the request (fallback_ptr_).
  block_type* allocate_new_block(pool_type& p, std::size_t size, std::size_t rounded) {
    if constexpr (is_vmm_device_v<Device>) {  // the VMM miss path exists only on a VMM device
      if (rules_.maps_pages) return vmm_allocate_new_block(p, size, rounded);
    }
    const std::size_t seg_size = detail::segment_size_for(rounded, config_.large_segment_size);
    const bool may_release_memory = may_release();
    if (gc_enabled() && may_release_memory) garbage_collect_cached_blocks();
    bool fraction_refused = false;
    block_type* b = alloc_block(p, size, rounded, seg_size, false, fraction_refused);
    if (b == nullptr && oom_fallback_ && try_fallback(size, p.stream)) return nullptr;
    if (b == nullptr && may_release_memory && release_available_cached_blocks(p, rounded)) {
      b = alloc_block(p, size, rounded, seg_size, false, fraction_refused);
    }
    if (b == nullptr && may_release_memory) {
      release_cached_blocks();
      b = alloc_block(p, size, rounded, seg_size, true, fraction_refused);
    }
    if (b == nullptr) throw_oom(size, rounded, seg_size, p, fraction_refused);
    return b;
  }

  // PyTorch's alloc_block; `size` and `rounded` (the request) only word a rejection.
  block_type* alloc_block(pool_type& p, std::size_t size, std::size_t rounded, std::size_t seg_size,
                          bool is_retry, bool& fraction_refused) {
    if (is_retry) ++stats_.num_alloc_retries;
    fraction_refused = false;
    if (fraction_set_ && limited_total() + seg_size > allowed_memory_maximum_) {
      fraction_refused = true;
      return nullptr;
    }
    if (rejects_preemptively(seg_size)) throw_rejection(size, rounded, seg_size);
    void* ptr = device_.allocate(seg_size);
    if (ptr == nullptr) return nullptr;
    ++stats_.num_device_alloc;
    add_reserved(seg_size);

    segment_type* s = segment_pool_.create();
    s->ptr = reinterpret_cast<std::uintptr_t>(ptr);
    s->size = seg_size;
    s->owner = &p;
    link_segment(s);

    block_type* b = block_pool_.create(s->ptr, seg_size, &p, s);
    s->head = b;
    if (reporter_.listening()) notify(allocator_action::segment_alloc, s->ptr, seg_size, p.stream);
    counts_.increase(p.is_small, counter::segment, 1);
    counts_.increase(p.is_small, counter::reserved_bytes, as_i64(seg_size));
    if (seg_size >= config_.max_split_size) stats_.oversize_segments.increase(1);
    return b;
  }

  // PyTorch's release_available_cached_blocks: only with max_split_size set. Frees the smallest
  // oversize block that covers the request, else the largest oversize blocks until enough.
  // The choice is segment_release's (core/detail/segment_release.hpp).
  bool release_available_cached_blocks(pool_type& p, std::size_t rounded) {
    bool enough = false;
    for (block_type* b : detail::segment_release::oversize_blocks<block_type>(
             p, rounded, config_.max_split_size, enough)) {
      release_block(b);
    }
    return enough;
  }

  // PyTorch's release_cached_blocks: wait for all events, then free every unsplit cached block.
  void release_cached_blocks() {
    synchronize_and_free_events();
    if (release_.unmaps_pages()) {
      release_vmm_cache();
      return;
    }
    for (block_type* b : detail::segment_release::whole_blocks<block_type>([&](auto&& visit) {
           for (auto& sp : stream_pools_) sp->for_each(visit);
         })) {
      release_block(b);
    }
  }

  // PyTorch's garbage_collect_cached_blocks: above threshold x cap, free unsplit large blocks
  // whose age (free-block lookups since they were cached) is at least the average, repeatedly.
  void garbage_collect_cached_blocks() {
    const auto threshold = static_cast<std::size_t>(config_.garbage_collection_threshold *
                                                    static_cast<double>(allowed_memory_maximum_));
    const std::size_t reserved = limited_total();
    if (reserved <= threshold) return;
    std::vector<block_type*> freeable =
        detail::segment_release::whole_blocks<block_type>([&](auto&& visit) {
          for (auto& sp : stream_pools_) visit(sp->large);
        });
    for (block_type* b : detail::segment_release::garbage(std::move(freeable), large_free_lookups_,
                                                          reserved - threshold)) {
      release_block(b);
    }
  }

  // Returns an unsplit free block's whole segment to the device.
  void release_block(block_type* b) {
    segment_type* s = b->seg;
    // Before the memory goes: an observer may have to deregister it (NCCL).
    if (reporter_.listening())
      notify(allocator_action::segment_free, s->ptr, s->size, b->owner->stream);
    device_.deallocate(reinterpret_cast<void*>(s->ptr), s->size);
    ++stats_.num_device_free;
    sub_reserved(s->size);
    pool_type& p = *b->owner;
    counts_.decrease(p.is_small, counter::segment, 1);
    counts_.decrease(p.is_small, counter::reserved_bytes, as_i64(s->size));
    if (s->size >= config_.max_split_size) stats_.oversize_segments.decrease(1);
    p.index.erase(b);
    block_pool_.destroy(b);
    unlink_segment(s);
    segment_pool_.destroy(s);
  }

  // PyTorch's alloc_found_block: split off the remainder if the rules say so, then hand out.
  GPUMEM_ALWAYS_INLINE void* alloc_found_block(block_type* b, pool_type& p, std::size_t rounded,
                                               std::size_t requested) {
    const bool already_split = b->is_split();
    if (!no_split_ && splits_.splits(b->size, rounded, p.is_small, config_.max_split_size)) {
      block_type* remaining = b;
      b = cut_low(remaining, remaining->ptr + rounded);
      index_insert(p, remaining);
      count_inactive_split(p.is_small, splits_.on_split(already_split, rounded, remaining->size));
    } else {
      count_inactive_split(p.is_small, splits_.on_take_whole(already_split, b->size));
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
    if (b->seg->shared_pages != 0) hold_pages(b);
    note_peak();
    return reinterpret_cast<void*>(b->ptr);
  }

  // Applies what the split rules (core/detail/split_rules.hpp) say a split, merge or cut changes.
  GPUMEM_ALWAYS_INLINE void count_inactive_split(bool small,
                                                 detail::inactive_split_change c) noexcept {
    counts_.change(small, counter::inactive_split, c.blocks);
    counts_.change(small, counter::inactive_split_bytes, c.bytes);
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
    if (reporter_.listening())
      notify(allocator_action::free_completed, b->ptr, b->requested_size, p.stream);
    if (b->seg->page_size != 0) {
      b->freed_at = allocation_total();
      if (b->seg->shared_pages != 0) release_held_pages(b);
    }
    const std::size_t original_size = b->size;
    const std::size_t requested = b->requested_size;
    std::int64_t merged = 0;
    std::size_t merged_bytes = 0;
    for (block_type* candidate : {b->prev, b->next}) {
      const std::size_t subsumed = try_merge_blocks(b, candidate, p);
      merged += subsumed > 0 ? 1 : 0;
      merged_bytes += subsumed;
    }
    index_insert(p, b);
    const bool small = p.is_small;
    count_inactive_split(small, splits_.on_free(merged, merged_bytes, b->is_split(), b->size));
    counts_.decrease(small, counter::active, 1);
    counts_.decrease(small, counter::active_bytes, as_i64(original_size));
    counts_.decrease(small, counter::requested_bytes, as_i64(requested));
  }

  GPUMEM_ALWAYS_INLINE std::size_t try_merge_blocks(block_type* dst, block_type* src,
                                                    pool_type& p) {
    if (src == nullptr || src->allocated || src->event_count > 0 || !src->stream_uses.empty() ||
        src->mapped != dst->mapped || src->shadowed != dst->shadowed) {
      return 0;
    }
    const std::size_t subsumed = block_links::join(dst, src);
    dst->freed_at = std::max(dst->freed_at, src->freed_at);
    if (src->shadowed) {
      p.shadowed.erase(src);
    } else if (src->mapped) {
      p.index.erase(src);
    } else {
      p.unmapped.erase(src);
    }
    block_pool_.destroy(src);
    return subsumed;
  }

  // --- the virtual-memory policies: expandable and stitch ---------------------------------------
  //
  // Both keep segments as reserved address ranges whose positions are each mapped to one physical
  // page (vmm_pages.hpp does the mapping and counts the pages). A block of such a segment is mapped
  // or unmapped; unmapped blocks are page-aligned, never in the free index, and kept per pool in
  // address order, so that a miss can grow a free block into the unmapped space after it
  // (PyTorch's find_expandable_block).
  //
  // expandable (PyTorch's expandable_segments): one range per stream and pool, 9/8 of the device,
  // growing by pages of 2 MiB (small pool) or large_segment_size (large pool); unused pages are
  // unmapped and released on empty_cache and on the out-of-memory retry. A cache hit is PyTorch's
  // best fit for expandable segments (least_expandable), which keeps the free block at the end of
  // the mapped part for requests that need it to grow.
  //
  // stitch: pages of the device's granularity. The small pool, and each size class of the large
  // requests (stitch_size_class: four per power of two), is a pool of its own per stream, with
  // address ranges of its own (1 GiB or more of addresses, no memory) into which it grows a page at
  // a time. A cache hit is the best fit in the request's pool and never touches the device. A miss
  // first borrows a free block of another class when both classes have freed blocks before
  // (borrow_block), else grows its class's range: with the free pages of cached blocks of any pool
  // first, mapped here *as well* (they stay mapped where they were: the page becomes shared), and
  // only then with new pages, so reserved memory grows only when no free page can serve the
  // request. A shared page is used by one range at a time; where another range holds it, the free
  // blocks on it are *shadowed* (taken out of the index) until it is free again. Nothing is ever
  // unmapped to be moved, so a miss waits for nothing, and once a loop has mapped the pages each of
  // its requests needs, its steps find them again: a training loop's steady state makes no device
  // call. Unmapping happens only in empty_cache and the out-of-memory retry.
  //
  // Why size classes: only whole pages can be shared, so the cost of a free gap is the partly used
  // pages at its edges. Blocks of one size tend to live alike (a layer's saved activations, its
  // temporaries); kept apart from other sizes, a class's blocks sit side by side and share their
  // edge pages, and the space other sizes leave free is in whole pages that the next miss can take.
  // Placed in allocation order instead, short-lived blocks leave sub-page gaps between long-lived
  // ones that pin pages (3-4% of the peak on a transformer's forward pass). The price: each class
  // with live blocks may end in a partly used page. Borrowing between classes whose blocks do get
  // freed lets a training loop's steady state reuse one phase's memory in the next (activations,
  // then gradients, then optimizer temporaries).

  static std::size_t round_up(std::size_t v, std::size_t to) noexcept {
    return (v + to - 1) / to * to;
  }

  std::size_t vmm_page_size(const pool_type& p) const noexcept {
    return growth_.page_size(p.is_small);
  }

  // Free and usable: a mapped free block that is not shadowed, or an unmapped one.
  static bool allocatable(const block_type* b) noexcept {
    return b != nullptr && !b->allocated && b->event_count == 0 && b->stream_uses.empty() &&
           !b->shadowed;
  }

  static bool is_out_of_memory(const cuda_error& e) noexcept { return e.code() == 2; }

  // Miss path of the VMM policies: the same retry order as classic (PyTorch releases the whole
  // cache, unmapping free pages, before its one retry). Stitch's large requests first borrow from
  // another class (if theirs has freed blocks), and borrow any block that fits when growing fails,
  // before the out-of-memory fallback and before the cache is given up.
  block_type* vmm_allocate_new_block(pool_type& p, std::size_t size, std::size_t rounded) {
    note_requested_high_water(size);
    if (p.has_freed) {  // only stitch's class pools free blocks of their class
      if (block_type* b = borrow_block(p, rounded, false)) return b;
    }
    bool fraction_refused = false;
    block_type* b = vmm_alloc_block(p, size, rounded, false, fraction_refused);
    if (b == nullptr) b = borrow_block(p, rounded, true);
    if (b == nullptr && oom_fallback_ && try_fallback(size, p.stream)) return nullptr;
    if (b == nullptr && may_release()) {
      release_cached_blocks();
      b = vmm_alloc_block(p, size, rounded, true, fraction_refused);
    }
    if (b == nullptr)
      throw_oom(size, rounded, round_up(rounded, vmm_page_size(p)), p, fraction_refused);
    return b;
  }

  // Stitch, on empty_cache: the size classes start again as never freed. Called between phases of
  // a program (an evaluation pass, then training), it keeps what one phase freed from deciding the
  // next one's placement: a class that freed blocks before would lend to the new phase's
  // long-lived blocks of that size, mixing them with short-lived ones (pinned partly used pages).
  void forget_freed_classes() noexcept {
    for (auto& sp : stream_pools_) {
      for (auto& c : sp->classes) c->has_freed = false;
    }
  }

  // Stitch: a free block of another size class of p's stream for a request of class pool p, taken
  // out of its pool's index (it stays in that pool: its remainder goes back there), or nullptr.
  // Normally only between classes that have freed blocks before (a class whose blocks were never
  // freed holds long-lived data: a short-lived block placed among them, or one of them placed
  // among short-lived blocks, would leave gaps that pin partly used pages), and only a block that
  // fits exactly or leaves at least a page (not a sliver that no large request can use); the exact
  // fit first, else the smallest. As a last resort before giving up the cache: the best fit.
  block_type* borrow_block(pool_type& p, std::size_t rounded, bool last_resort) {
    if (!growth_.borrows(p.is_small)) return nullptr;
    for (;;) {
      block_type* b = borrow_candidate(p, rounded, last_resort);
      if (b == nullptr) return restore_set_aside(nullptr);
      b->owner->index.erase(b);
      if (b->seg->shared_pages == 0 || usable_despite_sharing(b)) return restore_set_aside(b);
    }
  }

  block_type* borrow_candidate(pool_type& p, std::size_t rounded, bool last_resort) {
    pools_type& sp = lookup_pools(p.stream);
    const std::size_t roomy = rounded + growth_.granularity();
    block_type* best = nullptr;
    for (std::size_t i = 0; i < sp.classes.size(); ++i) {
      std::size_t& bound = sp.free_bound[i];
      if (bound < rounded) continue;
      pool_type* c = sp.classes[i].get();
      if (c == &p || (!last_resort && !c->has_freed)) continue;
      block_type* b = c->index.lower_bound(rounded);
      if (b == nullptr) {
        bound = rounded - 1;
        continue;
      }
      if (b->size != rounded && !last_resort) {
        b = c->index.lower_bound(roomy);
        if (b == nullptr) bound = roomy - 1;
      }
      if (b == nullptr || oversize_refuses(b->size, rounded)) continue;
      const bool exact = b->size == rounded;
      if (best == nullptr || exact > (best->size == rounded) ||
          (exact == (best->size == rounded) && b->size < best->size)) {
        best = b;
      }
    }
    return best;
  }

  // PyTorch's try_allocate_expandable_block, over every VMM segment of the pool: find free address
  // space, map what is unmapped in it, and return one free mapped block of at least `rounded`.
  block_type* vmm_alloc_block(pool_type& p, std::size_t size, std::size_t rounded, bool is_retry,
                              bool& fraction_refused) {
    if (is_retry) ++stats_.num_alloc_retries;
    fraction_refused = false;
    // PyTorch checks its allocation size, the segment classic would obtain, whatever the policy.
    const std::size_t alloc_size = detail::segment_size_for(rounded, config_.large_segment_size);
    if (rejects_preemptively(alloc_size)) throw_rejection(size, rounded, alloc_size);
    block_type* c = find_vmm_candidate(p, rounded);
    segment_type* fresh = nullptr;
    const std::size_t page = vmm_page_size(p);
    const std::size_t needed = round_up(rounded, page);
    if (c != nullptr && better_in_new_range(c, rounded)) {
      fresh = create_vmm_segment(p, growth_.fresh_range_size(needed), page);
      if (fresh != nullptr) c = fresh->head;
    }
    if (c == nullptr) {
      fresh = create_range(p, needed, page);
      if (fresh == nullptr) return nullptr;
      c = fresh->head;
    }
    if (growth_.counts_settled_miss(allocation_total())) ++p.settled_misses;
    bool ok = c->mapped || map_block(c, std::min(c->size, rounded), fraction_refused);
    while (ok && c->size < rounded) {
      block_type* next = c->next;  // unmapped: free mapped neighbours are always merged
      ok = map_block(next, std::min(rounded - c->size, next->size), fraction_refused);
      if (ok) c = next;
    }
    if (!ok) {
      if (fresh != nullptr && fresh->mapped_pages == 0) destroy_vmm_segment(fresh);
      return nullptr;
    }
    p.index.erase(c);
    return c;
  }

  // How many of `count` new pages of `page` bytes pool p's miss creates before sharing.
  std::size_t pages_to_create(const pool_type& p, std::size_t page,
                              std::size_t count) const noexcept {
    return growth_.pages_to_create(reserved_total_, allocation_total(), p.settled_misses, page,
                                   count);
  }

  std::uint64_t allocation_total() const noexcept {
    const stat_array a = counts_.get(counter::allocation);
    return static_cast<std::uint64_t>(std::max<std::int64_t>(a[0].allocated, 0));
  }

  // Raises stitch's high-water mark of requested bytes (counting a request of `pending` bytes being
  // served) from the peak statistic, which users may reset.
  void note_requested_high_water(std::size_t pending = 0) noexcept {
    const auto current = static_cast<std::size_t>(counts_.current(counter::requested_bytes));
    const auto peak = static_cast<std::size_t>(counts_.peak(counter::requested_bytes));
    growth_.note_request(std::max(peak, current + pending), allocation_total());
  }

  // Stitch: whether a new range would serve the run that starts at c with fewer new pages. A page
  // is mapped at most once per range, so the free pages already mapped in c's range (where they
  // are not contiguous enough to serve the request) cannot be shared into the run; in a new range
  // they can. A settled miss too large for the recurring rule takes a new range whenever it shares
  // (stitch_policy::shares_in_own_range).
  bool better_in_new_range(block_type* c, std::size_t rounded) {
    if (!growth_.weighs_new_range()) return false;
    const segment_type& s = *c->seg;
    std::size_t remaining = rounded;
    std::size_t pages = 0;
    for (block_type* b = c; b != nullptr && remaining > 0; b = b->next) {
      const std::size_t take = std::min(remaining, b->size);
      if (!b->mapped) pages += round_up(take, s.page_size) / s.page_size;
      remaining -= take;
    }
    if (pages == 0 || pages_to_create(*c->owner, s.page_size, pages) == pages) return false;
    if (growth_.shares_in_own_range(rounded, allocation_total())) return true;
    std::vector<detail::page_id>& found = page_scratch_;
    collect_free_pages(s, pages, found);
    const std::size_t here = found.size();
    if (here == pages) return false;
    segment_type elsewhere;  // a range that maps nothing yet
    elsewhere.page_size = s.page_size;
    elsewhere.stream = s.stream;
    elsewhere.owner = s.owner;
    collect_free_pages(elsewhere, pages, found);
    return found.size() > here;
  }

  // The lowest-address unmapped block (with the free block before it) that starts a run of free
  // blocks long enough for `size`. The free mapped blocks of a run are checked for pages held
  // elsewhere (and shadowed there) before the run is counted, so the run returned is all usable.
  block_type* find_vmm_candidate(pool_type& p, std::size_t size) {
    for (block_type* u : p.unmapped) {
      for (;;) {
        block_type* c = allocatable(u->prev) ? u->prev : u;
        std::size_t bytes = 0;
        bool changed = false;
        for (block_type* b = c; b != nullptr && bytes < size && allocatable(b); b = b->next) {
          if (b->mapped && b->seg->shared_pages != 0) {
            p.index.erase(b);
            if (shadow_held_pages(b)) {  // the blocks around u changed: count again
              changed = true;
              break;
            }
            index_insert(p, b);
            if (orders_during_capture(b)) break;  // the run ends before it (see get_free_block)
          }
          bytes += b->size;
        }
        if (changed) continue;
        if (bytes >= size) return c;
        break;
      }
    }
    return nullptr;
  }

  // A new range for pool p whose miss needs `needed` bytes of pages of `page` bytes, of the size
  // its policy gives (vmm_growth::range_size), or of a smaller one when the device refuses that;
  // nullptr when no address space is left.
  segment_type* create_range(pool_type& p, std::size_t needed, std::size_t page) {
    const std::size_t size =
        growth_.range_size(page, p.address_space, needed, device_.total_memory());
    segment_type* s = create_vmm_segment(p, size, page);
    if (s == nullptr) {
      if (const std::size_t smaller = growth_.smaller_range_size(size, needed)) {
        s = create_vmm_segment(p, smaller, page);
      }
    }
    return s;
  }

  void link_segment(segment_type* s) noexcept {
    s->prev = segments_tail_;
    s->next = nullptr;
    if (segments_tail_ != nullptr) {
      segments_tail_->next = s;
    } else {
      segments_ = s;
    }
    segments_tail_ = s;
  }

  void unlink_segment(segment_type* s) noexcept {
    (s->prev != nullptr ? s->prev->next : segments_) = s->next;
    (s->next != nullptr ? s->next->prev : segments_tail_) = s->prev;
  }

  // Reserves an address range with nothing mapped: one unmapped block covering it.
  segment_type* create_vmm_segment(pool_type& p, std::size_t size, std::size_t page) {
    if (size == 0) return nullptr;
    segment_type* s = segment_pool_.create();
    if (!vmm_.reserve(*s, size, page, growth_.granularity())) {
      segment_pool_.destroy(s);
      return nullptr;
    }
    s->owner = &p;
    s->stream = p.stream;
    link_segment(s);
    block_type* b = block_pool_.create(s->ptr, size, &p, s);
    b->mapped = false;
    s->head = b;
    p.unmapped.insert(b);
    p.address_space += size;
    counts_.increase(p.is_small, counter::segment, 1);
    return s;
  }

  // Frees the address range of a segment with nothing mapped.
  void destroy_vmm_segment([[maybe_unused]] segment_type* s) {
    if constexpr (is_vmm_device_v<Device>) {
      pool_type& p = *s->owner;
      block_type* b = s->head;
      p.unmapped.erase(b);
      block_pool_.destroy(b);
      vmm_.free_range(*s);
      p.address_space -= s->size;
      counts_.decrease(p.is_small, counter::segment, 1);
      unlink_segment(s);
      segment_pool_.destroy(s);
    }
  }

  // Cuts block b at `at` (inside it): b keeps the low part, the returned block (b's state, in no
  // set) the high part; cut_low returns the low part instead (core/detail/block_list.hpp).
  block_type* cut(block_type* b, std::uintptr_t at) { return block_links::cut(block_pool_, b, at); }
  block_type* cut_low(block_type* b, std::uintptr_t at) {
    return block_links::cut_low(block_pool_, b, at);
  }

  // --- stitch's shared pages

  std::vector<reserved_range<stream_type>> reserved_ranges_locked() const {
    std::vector<reserved_range<stream_type>> out;
    for (const segment_type* s = segments_; s != nullptr; s = s->next) {
      for_each_reserved_run(*s, [&](std::uintptr_t address, std::size_t size) {
        out.push_back(reserved_range<stream_type>{address, size, s->owner->stream,
                                                  s->owner->is_small, s->page_size != 0});
      });
    }
    return out;
  }

  // Calls f(address, size) for each run of segment s that reserved memory counts: all of a classic
  // segment, the runs of counted pages of a VMM one (reserved_in's pages).
  template <class F>
  void for_each_reserved_run(const segment_type& s, F&& f) const {
    if (s.page_size == 0) {
      f(s.ptr, s.size);
      return;
    }
    if constexpr (is_vmm_device_v<Device>) {
      if (s.mapped_pages == 0) return;
      std::size_t i = 0;
      const std::size_t n = s.pages.size();
      while (i < n) {
        while (i < n && !vmm_.counted_at(s, i)) ++i;
        const std::size_t first = i;
        while (i < n && vmm_.counted_at(s, i)) ++i;
        if (i > first) f(s.ptr + first * s.page_size, (i - first) * s.page_size);
      }
    }
  }

  // The bytes of physical memory VMM segment s accounts for (segment_snapshot::reserved_size).
  std::size_t reserved_in([[maybe_unused]] const segment_type& s) const {
    std::size_t bytes = 0;
    if constexpr (is_vmm_device_v<Device>) {
      for (std::size_t i = 0; i < s.pages.size(); ++i) {
        if (vmm_.counted_at(s, i)) bytes += s.page_size;
      }
    }
    return bytes;
  }
  // ----------------------------------------------------------------------

  // Stitch's shared pages (core/detail/shared_pages.hpp): holds, shadowed blocks, borrowed pages.
  using page_sharing = detail::shared_pages<stream_type>;

  // The block operations shared_pages uses: cut, merge with a free neighbour, index.
  struct block_ops {
    caching_allocator& a;
    block_type* cut(block_type* b, std::uintptr_t at) { return a.cut(b, at); }
    void merge(block_type* dst, block_type* src) { a.try_merge_blocks(dst, src, *dst->owner); }
    void insert_free(block_type* b) { a.index_insert(*b->owner, b); }
  };

  // A block of a range with shared pages becomes allocated: its range holds them now.
  void hold_pages([[maybe_unused]] block_type* b) {
    if constexpr (is_vmm_device_v<Device>) page_sharing::hold(vmm_, b);
  }

  // A block of a range with shared pages is free again: the pages that nobody holds any more are
  // usable again in their other ranges.
  void release_held_pages([[maybe_unused]] block_type* b) {
    if constexpr (is_vmm_device_v<Device>) {
      block_ops ops{*this};
      page_sharing::release(vmm_, b, ops);
    }
  }

  // Free block b (out of the index, mapped) lies on pages that other ranges hold: those pages
  // become shadowed blocks and what is left goes back to the index. False, b unchanged, when no
  // page of b is held elsewhere.
  bool shadow_held_pages(block_type* b) {
    block_ops ops{*this};
    return page_sharing::shadow_held(vmm_, b, ops);
  }

  // --- mapping and unmapping
  // ------------------------------------------------------------------------

  // Obtains `count` pages of `page` bytes for positions of range `target` in `out`. Stitch first
  // takes free pages mapped elsewhere (to be shared), then creates the rest; expandable creates
  // them all. On failure everything created is released and false returned.
  bool acquire_pages(segment_type& target, std::size_t page, std::size_t count,
                     std::vector<detail::page_id>& out, std::size_t& created,
                     bool& fraction_refused) {
    out.clear();
    created = 0;
    const bool small = target.owner->is_small;
    auto create = [&](std::size_t until) {
      while (out.size() < until) {
        if (fraction_set_ && limited_total() + (created + 1) * page > allowed_memory_maximum_) {
          fraction_refused = true;
          return;
        }
        const detail::page_id id = vmm_.create(page, small);
        if (id == detail::no_page) return;
        ++stats_.num_device_alloc;
        ++created;
        out.push_back(id);
      }
    };
    if (growth_.shares_free_pages()) {
      create(pages_to_create(*target.owner, page, count));
      if (out.size() < count) {
        std::vector<detail::page_id>& shared = shared_scratch_;
        collect_free_pages(target, count - out.size(), shared);
        out.insert(out.end(), shared.begin(), shared.end());
      }
    }
    create(count);
    if (out.size() == count) return true;
    release_created(out, created);
    return false;
  }

  // Releases the pages acquire_pages created (those mapped nowhere yet).
  void release_created([[maybe_unused]] std::vector<detail::page_id>& ids,
                       [[maybe_unused]] std::size_t created) {
    if constexpr (is_vmm_device_v<Device>) {
      for (detail::page_id id : ids) {
        if (created == 0) break;
        if (!vmm_.page(id).mappings.empty()) continue;
        vmm_.release(id);
        ++stats_.num_device_free;
        --created;
      }
      ids.clear();
    }
  }

  // Stitch: up to `count` free pages that can be mapped in range `target` as well
  // (shared_pages::collect_free).
  void collect_free_pages([[maybe_unused]] const segment_type& target,
                          [[maybe_unused]] std::size_t count,
                          [[maybe_unused]] std::vector<detail::page_id>& out) {
    if constexpr (is_vmm_device_v<Device>) {
      page_sharing::collect_free(vmm_, stream_pools_, target, count, captures_underway_ > 0, out);
    }
  }

  // The stats of pages that vmm_pages released (their last mapping went).
  void count_released(const detail::physical_page<stream_type>& page) {
    ++stats_.num_device_free;
    sub_reserved(page.bytes);
    counts_.decrease(page.small, counter::reserved_bytes, as_i64(page.bytes));
  }

  // PyTorch's unmap_block: unmaps the whole pages inside free block b (mapped, or shadowed: then
  // all of it), leaving mapped free blocks for the partial pages at its edges. The host waited for
  // b's stream (release_vmm_cache). Pages mapped nowhere any more are released.
  void unmap_block([[maybe_unused]] block_type* b) {
    if constexpr (is_vmm_device_v<Device>) {
      segment_type* s = b->seg;
      pool_type& p = *b->owner;
      const std::size_t page = s->page_size;
      const std::size_t first = round_up(b->ptr - s->ptr, page) / page;
      const std::size_t last = (b->ptr + b->size - s->ptr) / page;
      if (last <= first) return;
      const std::uintptr_t range_lo = s->ptr + first * page;
      const std::uintptr_t range_hi = s->ptr + last * page;
      if (reporter_.listening()) {  // before the pages go: an observer may have to deregister them
        notify(allocator_action::segment_unmap, range_lo, range_hi - range_lo, p.stream);
      }
      vmm_.unmap(*s, first, last - first,
                 [&](const detail::physical_page<stream_type>& pg) { count_released(pg); });
      if (b->shadowed) {
        p.shadowed.erase(b);  // page-aligned: all of it goes
      } else {
        p.index.erase(b);
        if (range_lo > b->ptr) index_insert(p, cut_low(b, range_lo));
        if (range_hi < b->ptr + b->size) index_insert(p, cut(b, range_hi));
      }
      b->mapped = false;
      b->shadowed = false;
      try_merge_blocks(b, b->prev, p);
      try_merge_blocks(b, b->next, p);
      p.unmapped.insert(b);
    }
  }

  // PyTorch's map_block: maps the first `size` bytes (rounded up to pages) of unmapped block
  // `to_map`, merges the result with free mapped neighbours and indexes it.
  bool map_block(block_type* to_map, std::size_t size, bool& fraction_refused) {
    segment_type* s = to_map->seg;
    pool_type& p = *to_map->owner;
    const std::size_t page = s->page_size;
    const std::size_t first = (to_map->ptr - s->ptr) / page;
    const std::size_t n = round_up(size, page) / page;
    std::vector<detail::page_id>& ids = page_scratch_;
    std::size_t created = 0;
    if (!acquire_pages(*s, page, n, ids, created, fraction_refused)) return false;
    try {
      vmm_.map(*s, first, ids.data(), n);
    } catch (const cuda_error& e) {
      release_created(ids, created);
      if (!is_out_of_memory(e)) throw;
      return false;
    }
    if (reporter_.listening())
      notify(allocator_action::segment_map, to_map->ptr, n * page, p.stream);
    add_reserved(created * page);
    counts_.increase(p.is_small, counter::reserved_bytes, as_i64(created * page));

    p.unmapped.erase(to_map);
    to_map->mapped = true;
    if (n * page < to_map->size) {
      block_type* rest = cut(to_map, to_map->ptr + n * page);
      rest->mapped = false;
      p.unmapped.insert(rest);
    }
    try_merge_blocks(to_map, to_map->prev, p);
    try_merge_blocks(to_map, to_map->next, p);
    index_insert(p, to_map);
    return true;
  }

  // empty_cache and the out-of-memory retry: unmap every whole free page (shadowed ones too) after
  // waiting for the streams that used them, release the pages mapped nowhere any more, then give
  // back the address ranges that have nothing mapped.
  void release_vmm_cache() {
    if constexpr (is_vmm_device_v<Device>) {
      std::vector<block_type*> free_blocks;
      std::vector<stream_type> streams;
      for (auto& sp : stream_pools_) {
        sp->for_each([&](pool_type& p) {
          const std::size_t before = free_blocks.size();
          p.index.for_each([&](block_type* b) {
            if (page_sharing::interior_pages(b) > 0) free_blocks.push_back(b);
          });
          for (block_type* b : p.shadowed) free_blocks.push_back(b);
          if (free_blocks.size() > before &&
              std::find(streams.begin(), streams.end(), p.stream) == streams.end()) {
            streams.push_back(p.stream);
          }
        });
      }
      vmm_.order_before_unmap(streams);
      for (block_type* b : free_blocks) unmap_block(b);
      for (segment_type* s = segments_; s != nullptr;) {
        segment_type* next = s->next;
        if (s->page_size != 0 && s->mapped_pages == 0) destroy_vmm_segment(s);
        s = next;
      }
    }
  }

  // Destructor helper: unmaps every page and releases the address range; the pages are released
  // with their last mapping. May throw.
  void release_vmm_segment_unchecked([[maybe_unused]] segment_type* s) {
    if constexpr (is_vmm_device_v<Device>) {
      for (std::size_t i = 0; i < s->pages.size();) {
        std::size_t j = i;
        while (j < s->pages.size() && s->pages[j] != detail::no_page) ++j;
        if (j > i) vmm_.unmap(*s, i, j - i, [](const detail::physical_page<stream_type>&) {});
        i = j + 1;
      }
      vmm_.free_range(*s);
    }
  }

  // --- stream events -----------------------------------------------------------------------------

  // PyTorch's insert_events: one event per stream the block was used on, created on that stream's
  // device. A stream whose event cannot be recorded (a device failure) is waited for instead of
  // being lost: the whole device is synchronised, then the error is rethrown once the block is
  // consistent (freed, or pending on the events that were recorded).
  void insert_events(block_type* b) {
    std::vector<stream_type> streams = std::move(b->stream_uses);
    b->stream_uses.clear();
    std::exception_ptr failure;
    for (stream_type s : streams) {
      try {
        events_.record(s, b);
        ++b->event_count;
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) {
      try {
        device_.synchronize();
      } catch (...) {
      }
      if (b->event_count == 0) free_block(b);
      std::rethrow_exception(failure);
    }
  }

  // graph_capture_record_stream_reuse, at a free during a capture: the capture's terminal nodes
  // on block b's stream and on every stream that used it mark its last uses. Not kept (the block
  // waits for the capture's end) when one of those streams is not capturing.
  void record_free_markers(block_type* b) {
    if constexpr (detail::has_capture_graph_v<Device>) {
      std::vector<graph_node> markers;
      std::vector<graph_node> terminals;
      auto add = [&](stream_type s) {
        if (!device_.capture_terminals(s, terminals)) return false;
        markers.insert(markers.end(), terminals.begin(), terminals.end());
        return true;
      };
      if (!add(b->owner->stream)) return;
      for (const stream_type& s : b->stream_uses) {
        if (!add(s)) return;
      }
      std::sort(markers.begin(), markers.end());
      markers.erase(std::unique(markers.begin(), markers.end()), markers.end());
      free_markers_.emplace(b, std::move(markers));
    } else {
      (void)b;
    }
  }

  // graph_capture_record_stream_reuse, at an allocation on `stream` during a capture: frees the
  // deferred blocks of `stream` whose markers all precede the stream's terminal nodes (every use
  // is then ordered before any work queued next on the stream, so no event is needed).
  void free_blocks_ordered_in_capture(stream_type stream) {
    if constexpr (detail::has_capture_graph_v<Device>) {
      std::vector<graph_node> pending;
      if (!device_.capture_terminals(stream, pending) || pending.empty()) return;
      std::unordered_set<graph_node> before;  // the terminals and everything they depend on
      std::vector<graph_node> parents;
      while (!pending.empty()) {
        const graph_node n = pending.back();
        pending.pop_back();
        if (!before.insert(n).second) continue;
        device_.graph_node_dependencies(n, parents);
        pending.insert(pending.end(), parents.begin(), parents.end());
      }
      for (auto it = free_markers_.begin(); it != free_markers_.end();) {
        block_type* b = it->first;
        const bool ordered = b->owner->stream == stream &&
                             std::all_of(it->second.begin(), it->second.end(),
                                         [&](const graph_node& m) { return before.count(m) != 0; });
        if (!ordered) {
          ++it;
          continue;
        }
        it = free_markers_.erase(it);
        deferred_.erase(std::find(deferred_.begin(), deferred_.end(), b));
        b->stream_uses.clear();  // the graph orders them
        free_block(b);
      }
    } else {
      (void)stream;
    }
  }

  // PyTorch's insert_events_deferred_until_no_capture: the blocks freed during captures get their
  // events now (the streams' work recorded since includes everything they were used for).
  void insert_deferred_events() {
    free_markers_.clear();
    std::vector<block_type*> blocks;
    blocks.swap(deferred_);
    for (block_type* b : blocks) insert_events(b);
  }

  // PyTorch's process_events: per stream, retire completed events in order. Never during a
  // capture (the callers check).
  void process_events() {
    if (!deferred_.empty()) insert_deferred_events();
    events_.retire_completed([this](block_type* b) { retire_event(b); });
  }

  void synchronize_and_free_events() {
    ++stats_.num_sync_all_streams;
    if (!deferred_.empty()) insert_deferred_events();
    events_.retire_all([this](block_type* b) { retire_event(b); });
  }

  void retire_event(block_type* b) {
    if (--b->event_count == 0) free_block(b);
  }

  // --- out of memory -----------------------------------------------------------------------------

  // PyTorch's preemptive rejection (throw_on_cudamalloc_oom, alloc_block, 2.12 to 2.15): after the
  // memory cap's own check, which wins (a miss the cap refuses takes the ordinary path: cache
  // release, retry, out-of-memory), a miss whose segment would take the reserved bytes past the
  // configured fraction of the device fails at once.
  bool rejects_preemptively(std::size_t alloc_size) const noexcept {
    if (!config_.throw_on_cudamalloc_oom) return false;
    const std::size_t reserved = limited_total();
    if (fraction_set_ && reserved + alloc_size > allowed_memory_maximum_) return false;
    return reserved + alloc_size > rejection_limit_;
  }

  // No device call (not even the free-memory query), no cache release, no retry: num_ooms and
  // the observer's oom event are left alone, as PyTorch leaves its OOM count and trace.
  [[noreturn]] void throw_rejection(std::size_t size, std::size_t rounded, std::size_t alloc_size) {
    ++stats_.num_oom_rejections;
    out_of_memory::details n;
    detail::describe_usage(n, {size, rounded, alloc_size}, device_total_, counts_,
                           detail::free_cache(stream_pools_), device_.index());
    n.preemptive_rejection = true;
    n.limit_bytes = rejection_limit_;
    n.counted_reserved_bytes = limited_total();
    reporter_.clear_error();
    throw out_of_memory(oom_rejection_message(n, config_.per_process_memory_fraction.value_or(1.0)),
                        n);
  }

  std::size_t largest_free_block() const noexcept {
    return detail::free_cache(stream_pools_).largest;
  }

  [[noreturn]] void throw_oom(std::size_t size, std::size_t rounded, std::size_t seg_size,
                              const pool_type& p, bool fraction_refused) {
    ++stats_.num_ooms;
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    device_.memory_info(free_bytes, total_bytes);
    oom_facts f;
    const detail::free_cache_totals free = detail::free_cache(stream_pools_);
    detail::describe_usage(f.numbers, {size, rounded, seg_size}, total_bytes, counts_, free,
                           device_.index());
    f.numbers.device_free_bytes = free_bytes;
    f.free_cached_blocks = free.blocks;
    if (const block_type* b = p.index.largest()) f.largest_free_block_in_pool = b->size;
    f.fraction_set = fraction_set_;
    f.fraction = fraction_;
    f.fraction_cap_bytes = allowed_memory_maximum_;
    f.fraction_was_limit = fraction_refused;
    f.max_split_size = config_.max_split_size;
    f.policy = std::string(to_string(policy_));
    if (reporter_.listening()) {
      report_reserved_changes();  // the out-of-memory retry may have released memory
      notify(allocator_action::oom, free_bytes, size, p.stream);
    }
    reporter_.clear_error();  // the out-of-memory error is the one the caller must see
    throw out_of_memory(oom_message(f), f.numbers);
  }

  // --- invariants --------------------------------------------------------------------------------

  void check_invariants_locked() const {
    detail::allocator_invariants<Device>::check(detail::allocator_state<Device>{
        segments_, stream_pools_, allocated_, counts_, stats_, vmm_, deferred_, free_markers_,
        reserved_total_, config_.max_split_size, growth_.pools_by_class(), !max_split_changed_,
        &growth_, &release_});
  }

  Device& device_;
  allocator_config config_;
  allocator_policy policy_ = allocator_policy::classic;
  detail::policy_rules rules_;       // what policy_ does differently (core/detail/policy_rules.hpp)
  detail::split_rules splits_;       // when to split, what inactive_split counts (split_rules.hpp)
  detail::segment_release release_;  // what giving memory back frees (segment_release.hpp)
  mutable detail::spin_mutex mutex_;

  std::vector<std::unique_ptr<pools_type>> stream_pools_;
  pools_type* last_pools_ = nullptr;
  detail::pointer_map<block_type> allocated_;
  detail::object_pool<block_type> block_pool_;
  detail::object_pool<segment_type> segment_pool_;
  segment_type* segments_ = nullptr;
  segment_type* segments_tail_ = nullptr;
  detail::stream_event_queue<Device, block_type*> events_{device_, device_.index()};
  std::vector<block_type*> deferred_;  // freed during a capture with record_stream uses
  // The deferred blocks' last uses in the graph being captured (graph_capture_record_stream_reuse).
  using graph_node = typename detail::capture_graph_node<Device>::type;
  std::unordered_map<block_type*, std::vector<graph_node>> free_markers_;
  bool capture_reuse_ = false;          // set_capture_record_stream_reuse
  std::vector<block_type*> set_aside_;  // get_free_block's blocks to put back (stitch, capture)
  int captures_underway_ = 0;           // begin_capture minus end_capture
  bool memory_fixed_ = false;           // set_memory_fixed
  bool no_split_ = false;               // set_no_split
  std::shared_ptr<detail::reserved_ledger> ledger_;  // share_memory_limit_with

  detail::pool_counters counts_;  // the per-pool stat arrays
  device_stats stats_;            // the scalar stats (its arrays are filled from counts_)
  std::size_t reserved_total_ = 0;
  // Free-block lookups in the large pools, the age clock of garbage collection. PyTorch counts
  // the small pool's lookups too but never reads them: collection frees large blocks only.
  std::uint64_t large_free_lookups_ = 0;
  bool fraction_set_ = false;
  double fraction_ = 1.0;
  std::size_t allowed_memory_maximum_ = 0;
  std::size_t rejection_limit_ = 0;  // throw_on_cudamalloc_oom's limit (rejects_preemptively)
  std::size_t device_total_ = 0;     // the device's memory, read once
  bool max_split_changed_ = false;   // by set_run_time_settings (check_invariants)
  std::int64_t peak_seen_ = -1;
  std::int64_t allocated_at_peak_ = 0;
  // The VMM policies' pages and ranges (nothing on devices without virtual memory management).
  detail::pages_for<Device> vmm_;
  std::vector<detail::page_id> page_scratch_;    // map_block's list of pages
  std::vector<detail::page_id> shared_scratch_;  // acquire_pages' list of free pages to share
  detail::vmm_growth growth_;  // what expandable and stitch decide on a miss (vmm_growth.hpp)
  detail::step_placement<pool_type> steps_;       // stitch: where each request one step before went
  detail::event_reporter<stream_type> reporter_;  // the observer, its error, the reserved view
  out_of_memory_fallback oom_fallback_;           // set_out_of_memory_fallback
  void* fallback_ptr_ = nullptr;                  // what oom_fallback_ gave the current miss
};

}  // namespace gpumem
