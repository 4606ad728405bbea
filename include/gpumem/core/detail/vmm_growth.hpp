// gpumem — how a VMM policy grows a pool on a miss: everything expandable and stitch decide
// differently there. caching_allocator's miss path (vmm_allocate_new_block and what it calls) is
// the same code for both; wherever they part, it asks this component and carries out the answer.
// A new VMM policy adds its answers here (docs/architecture.md, "How to add a policy").
//
// The contract, as RMM's stream_ordered_memory_resource writes down what it guarantees its
// derived resources and what they must provide:
//
// What caching_allocator guarantees:
//  - it calls only under its lock, and only when its policy maps pages (policy_rules::maps_pages),
//    but for pools_by_class and borrows, which it asks under every policy (false under classic);
//  - it keeps one pool per size class for large requests exactly where pools_by_class says so;
//  - it passes the figures of the moment (reserved bytes, allocations made, the pool's misses
//    since the workload settled, the device's memory): this component reads nothing else;
//  - it carries out each answer exactly: a range of range_size's bytes (then, when refused, of
//    smaller_range_size's), pages of page_size's bytes, pages_to_create new pages before it shares
//    free ones, borrowing and sharing only where borrows and shares_free_pages say so;
//  - it reports every request served by a miss (note_request) and every miss after the workload
//    settled that counts_settled_miss counts.
//
// What this component guarantees:
//  - the answers of the policy it was made for, and under expandable exactly PyTorch's
//    expandable_segments (one range of 9/8 of the device per pool, pages of 2 MiB or
//    large_segment_size, no borrowing, no sharing);
//  - no device call, no allocation, no exception from the answers; check() throws
//    std::logic_error naming what a range or a pool breaks of the rules below.
//
// Its invariants (check and check_pool, called by allocator_invariants for every VMM range and
// every pool): a range's pages are the size its pool's policy gives (page_size); a policy that
// shares no free page has no shared page; only stitch keeps size-class state in a pool (freed
// classes, settled misses), and only in the pools that borrow, freed classes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "gpumem/config.hpp"
#include "gpumem/core/detail/policy_rules.hpp"
#include "gpumem/core/detail/stitch_policy.hpp"
#include "gpumem/core/size_policy.hpp"
#include "gpumem/detail/bits.hpp"

namespace gpumem::detail {

class vmm_growth {
 public:
  /// The policy of `rules` (one that maps pages, or none: then no answer is asked), stitch's
  /// thresholds from `config`, pages of at least `granularity` bytes (the device's; 0 without
  /// VMM). large_segment_size is read once: ranges are laid out in the page size they start with.
  vmm_growth(policy_rules rules, const allocator_config& config, std::size_t granularity) noexcept
      : rules_(rules),
        stitch_(config),
        granularity_(granularity),
        large_page_size_(config.large_segment_size) {}

  /// The device's granularity, which every page size and range size is a multiple of.
  std::size_t granularity() const noexcept { return granularity_; }

  /// The pages of a pool's ranges. Expandable: 2 MiB in the small pool, large_segment_size in the
  /// large one (PyTorch's segment sizes), rounded up to the granularity. Stitch: the granularity,
  /// so that free pages can be shared as finely as the device allows.
  std::size_t page_size(bool small_pool) const noexcept {
    if (!rules_.grows_one_range) return granularity_;
    return round_up(small_pool ? k_small_buffer : large_page_size_, granularity_);
  }

  /// The range a pool whose pages are `page` bytes reserves when none of its ranges has room for
  /// `needed` bytes; 0 when no such range can be expressed (out of memory). Expandable: PyTorch
  /// reserves 9/8 of the device per range, so that one range can hold all of the device's memory
  /// with room for rounding. Stitch: stitch_policy::range_size.
  std::size_t range_size(std::size_t page, std::size_t pool_address_space, std::size_t needed,
                         std::size_t device_total) const noexcept {
    if (!rules_.grows_one_range) {
      return stitch_policy::range_size(pool_address_space, needed, granularity_, device_total);
    }
    std::size_t range = 0;
    if (device_total > std::numeric_limits<std::size_t>::max() - device_total / 8 ||
        !checked_round_up(device_total + device_total / 8, page, range)) {
      return 0;
    }
    return range;
  }

  /// The range to try when the device refused one of `refused` bytes, or 0 for none. Stitch
  /// settles for what the request needs; expandable's range is all or nothing, as PyTorch's.
  std::size_t smaller_range_size(std::size_t refused, std::size_t needed) const noexcept {
    return rules_.stitches && refused > needed ? needed : 0;
  }

  /// Whether large requests go to one pool per size class (stitch_size_class; the allocator's
  /// pool_for): stitch. The others keep one large pool per stream.
  bool pools_by_class() const noexcept { return rules_.stitches; }

  /// Whether a pool borrows free blocks of its stream's other pools (borrow_block): stitch's
  /// size-class pools, not its small pool; never under expandable.
  bool borrows(bool small_pool) const noexcept { return rules_.stitches && !small_pool; }

  /// Whether a miss compares its candidate run with a new range (better_in_new_range): stitch,
  /// where a page is mapped at most once per range.
  bool weighs_new_range() const noexcept { return rules_.stitches; }

  /// The range a miss reserves when weighs_new_range preferred a new one to its candidate run.
  static std::size_t fresh_range_size(std::size_t needed) noexcept {
    return stitch_policy::fresh_range_size(needed);
  }

  /// Whether a miss maps free pages of cached blocks as well instead of creating them all.
  bool shares_free_pages() const noexcept { return rules_.stitches; }

  /// How many of `count` pages of `page` bytes a miss creates before it shares free pages (all of
  /// them where the policy shares none). `reserved`: the allocator's reserved bytes;
  /// `allocations`: allocations made so far; `pool_misses`: the pool's misses since the workload
  /// settled.
  std::size_t pages_to_create(std::size_t reserved, std::uint64_t allocations,
                              std::uint32_t pool_misses, std::size_t page,
                              std::size_t count) const noexcept {
    if (!rules_.stitches) return count;
    return stitch_.pages_to_create(reserved, stitch_.settled(allocations), pool_misses, page,
                                   count);
  }

  /// Whether a miss of `bytes` that must share pages takes an address range of its own (stitch,
  /// once the workload settled, for a request beyond the recurring rule: see
  /// stitch_policy::shares_in_own_range).
  bool shares_in_own_range(std::size_t bytes, std::uint64_t allocations) const noexcept {
    return rules_.stitches && stitch_.shares_in_own_range(bytes, stitch_.settled(allocations));
  }

  /// A request is being served by a miss, or the peak statistics are reset: `mark` is the
  /// high-water mark of requested bytes so far. Stitch's thresholds follow it.
  void note_request(std::size_t mark, std::uint64_t allocations) noexcept {
    if (rules_.stitches) stitch_.note_requested(mark, allocations);
  }

  /// Whether a miss now counts against its pool (pool::settled_misses): stitch, once the workload
  /// settled.
  bool counts_settled_miss(std::uint64_t allocations) const noexcept {
    return rules_.stitches && stitch_.settled(allocations);
  }

  /// Throws std::logic_error naming what VMM range `s` (a detail::segment) breaks of this
  /// policy's rules.
  template <class Segment>
  void check(const Segment& s) const {
    const std::size_t expected = page_size(s.owner->is_small);
    if (s.page_size != expected) {
      fail(fmt::format("range {:#x} has pages of {} B, its pool's policy {} B", s.ptr, s.page_size,
                       expected));
    }
    if (!shares_free_pages() && s.shared_pages != 0) {
      fail(fmt::format("range {:#x} shares pages under a policy that shares none", s.ptr));
    }
  }

  /// Throws std::logic_error when pool `p` (a detail::pool) keeps state of stitch's size classes
  /// that its policy never gives it.
  template <class Pool>
  void check_pool(const Pool& p) const {
    if (!rules_.stitches && (p.has_freed || p.settled_misses != 0)) {
      fail("a pool counts freed classes or settled misses under a policy without size classes");
    }
    if (p.has_freed && !borrows(p.is_small)) fail("a pool that never borrows counts freed blocks");
  }

 private:
  static std::size_t round_up(std::size_t v, std::size_t to) noexcept {
    return (v + to - 1) / to * to;
  }

  [[noreturn]] static void fail(const std::string& what) {
    throw std::logic_error("gpumem invariant violated: " + what);
  }

  policy_rules rules_;
  stitch_policy stitch_;  // stitch's thresholds and the high-water mark they follow
  std::size_t granularity_;
  std::size_t large_page_size_;
};

}  // namespace gpumem::detail
