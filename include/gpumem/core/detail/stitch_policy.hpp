// gpumem — what the stitch policy decides, apart from the mechanics: how large its address ranges
// are, when a miss creates pages and when it shares free ones, and which free pages it shares
// first. vmm_growth.hpp asks these questions for caching_allocator's miss path, which carries out
// the answers (vmm_pages.hpp does the mapping); every tunable of stitch is here.
//
// Sharing a free page couples two ranges: while one uses it, the other's blocks on it are
// shadowed, and a request that found one of them before may miss and share pages again elsewhere.
// New pages couple nothing. A repeating loop's couplings are settled by placing each request where
// the same request of the step before went (step_placement.hpp), so a miss mostly shares free
// pages before it creates any. Thresholds make a miss create pages first while reserved memory
// stays within a fraction of the high-water mark of requested bytes (each a configuration key,
// docs/configuration.md):
//  - stitch_headroom (0) always;
//  - stitch_settle_limit (0.5%) once the workload has settled (that mark unchanged for
//    stitch_settled_allocations, 1024): a workload whose requests never repeat (a KV cache that
//    grows) would otherwise search the free pages of every range on each of its many misses;
//  - stitch_recurring_limit (0), for all of a request or none of it, in a pool that has missed
//    stitch_recurring_misses (3) times since the workload settled (a coupling back every step);
//    without placement, a settled miss larger than that bound shares pages in a range of its own.
// Beyond those bounds free pages are shared (never moved: nothing waits for the GPU), and when no
// free page is left new ones are created: fragmentation never causes an out-of-memory error.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "gpumem/config.hpp"
#include "gpumem/detail/bits.hpp"

namespace gpumem::detail {

class stitch_policy {
 public:
  /// Address space a size class reserves at least per range (addresses cost no memory).
  static constexpr std::size_t k_min_range = std::size_t{1024} << 20;

  /// The thresholds of `config` (its stitch_* keys).
  explicit stitch_policy(const allocator_config& config) noexcept
      : headroom_(config.stitch_headroom),
        settle_limit_(config.stitch_settle_limit),
        recurring_limit_(config.stitch_recurring_limit),
        recurring_misses_(config.stitch_recurring_misses),
        settled_allocations_(config.stitch_settled_allocations),
        own_ranges_(config.stitch_step_match == 0) {}

  /// Raises the high-water mark of requested bytes to `mark` (the peak statistic, or what is live
  /// plus a request being served); notes when it last grew, in allocations made so far.
  void note_requested(std::size_t mark, std::uint64_t allocations) noexcept {
    if (mark > high_water_ || allocations < high_water_at_) {
      high_water_ = std::max(mark, high_water_);
      high_water_at_ = allocations;
    }
  }

  std::size_t high_water() const noexcept { return high_water_; }

  /// Whether the workload has settled: no new high-water mark for stitch_settled_allocations.
  bool settled(std::uint64_t allocations) const noexcept {
    return allocations >= high_water_at_ && allocations - high_water_at_ >= settled_allocations_;
  }

  /// How many of `count` pages of `page` bytes a miss creates before sharing free pages, given the
  /// reserved bytes, whether the workload settled and how often the pool missed since.
  std::size_t pages_to_create(std::size_t reserved, bool settled, std::uint32_t pool_misses,
                              std::size_t page, std::size_t count) const noexcept {
    auto pages_within = [&](double limit) -> std::size_t {
      const double room =
          (1.0 + limit) * static_cast<double>(high_water_) - static_cast<double>(reserved);
      return room > 0 ? static_cast<std::size_t>(room / static_cast<double>(page)) : 0;
    };
    if (!settled) return std::min(count, pages_within(headroom_));
    if (pool_misses >= recurring_misses_ && pages_within(recurring_limit_) >= count) return count;
    return std::min(count, pages_within(settle_limit_));
  }

  /// Whether a settled miss of `bytes` that must share pages gets an address range of its own:
  /// when the request is beyond what the recurring rule could ever create pages for
  /// (stitch_recurring_limit of the high-water mark), its coupling never turns into new pages, so
  /// the block it stitches should be one a later miss of the pattern finds whole again (as
  /// GMLake's cached stitched blocks), not a run in a range whose other blocks lend the same pages.
  /// Only without placement by the step before (stitch_step_match:0): with it, a repeating miss
  /// finds its block where the step before placed it, and a miss that does not repeat (a KV cache
  /// growing) would reserve a range each time.
  bool shares_in_own_range(std::size_t bytes, bool settled) const noexcept {
    return own_ranges_ && settled &&
           static_cast<double>(bytes) > recurring_limit_ * static_cast<double>(high_water_);
  }

  /// The address range a size class reserves when none of its ranges has room for `needed` bytes:
  /// as large as all its ranges together (at least k_min_range, at most the device), so that a
  /// class rarely needs more than a few and its blocks sit side by side, sharing edge pages.
  static std::size_t range_size(std::size_t pool_address_space, std::size_t needed,
                                std::size_t page, std::size_t device_total) noexcept {
    const std::size_t size = std::min(std::max(pool_address_space, k_min_range), device_total);
    std::size_t range = 0;
    return checked_round_up(size, page, range) ? std::max(range, needed) : needed;
  }

  /// The range a size class reserves when its own ranges already map the free pages a request
  /// could share (a page is mapped once per range): a fresh one, where all of them can be mapped.
  static std::size_t fresh_range_size(std::size_t needed) noexcept {
    return std::max(needed, k_min_range);
  }

  /// A free block whose whole pages a miss may share, as the allocator sees it.
  struct page_source {
    std::uintptr_t address = 0;  // the block's
    std::size_t pages = 0;       // its whole pages
    std::uint64_t freed_at = 0;  // allocations made when it became free
    bool other_stream = false;   // on another stream than the request (sharing then orders them)
  };

  /// The order in which free pages are shared: the request's own stream first (no wait between
  /// streams), then the blocks free the longest (least likely to be wanted back soon), then the
  /// largest, then the lowest address. Another stream's blocks go largest first: each one shared
  /// couples the request to a block that stream takes back on its own schedule, so the fewer of
  /// them, the sooner a loop over several streams finds its couplings again every step.
  static bool shared_before(const page_source& a, const page_source& b) noexcept {
    if (a.other_stream != b.other_stream) return !a.other_stream;
    if (a.other_stream && a.pages != b.pages) return a.pages > b.pages;
    if (a.freed_at != b.freed_at) return a.freed_at < b.freed_at;
    return a.pages != b.pages ? a.pages > b.pages : a.address < b.address;
  }

 private:
  double headroom_;
  double settle_limit_;
  double recurring_limit_;
  std::uint32_t recurring_misses_;
  std::uint64_t settled_allocations_;
  bool own_ranges_;  // shares_in_own_range applies (placement by the step before is off)
  std::size_t high_water_ = 0;
  std::uint64_t high_water_at_ = 0;
};

}  // namespace gpumem::detail
