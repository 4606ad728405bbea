// gpumem — what giving memory back frees, per policy: PyTorch's choices of the cached segments to
// return (release_cached_blocks, release_available_cached_blocks, garbage_collect_cached_blocks)
// and whether a release unmaps pages instead. caching_allocator asks this component which blocks
// to release and releases them, in the order given (docs/architecture.md, "Components").
//
// The contract:
//
// What caching_allocator guarantees:
//  - it calls only under its lock, and releases nothing while a capture is under way or its
//    memory is fixed (these choices are never asked then);
//  - it releases exactly the blocks it is given (each a free, unsplit block: one whole segment),
//    in the order given; under a policy that unmaps pages it gives memory back by unmapping the
//    whole free pages of its ranges (release_vmm_cache), and synchronises the device before
//    unmapping in its destructor.
//
// What this component guarantees:
//  - PyTorch's choices, block for block: every unsplit cached block on release_cached_blocks; on
//    a miss with max_split_size set, the smallest oversize block that covers the request, else
//    the largest oversize blocks until enough; on garbage collection, the unsplit blocks at least
//    as old as the average, round after round, until the target is reclaimed;
//  - it returns only free, unsplit blocks of the pools it was given; no device call, no
//    exception but std::bad_alloc.
//
// Its invariant (check, called by allocator_invariants for every segment): a segment is of the
// kind its policy gives back (an address range under a policy that unmaps pages, a whole cudaMalloc
// segment otherwise), so that each release path meets only segments it can return.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "gpumem/core/detail/policy_rules.hpp"

namespace gpumem::detail {

class segment_release {
 public:
  segment_release() noexcept = default;
  explicit segment_release(policy_rules rules) noexcept : unmaps_pages_(rules.maps_pages) {}

  /// Whether memory goes back by unmapping the whole free pages of address ranges (expandable,
  /// stitch) rather than by freeing whole unsplit segments (classic). cuMemUnmap does not wait for
  /// the device as cudaFree does: the destructor synchronises first under such a policy.
  bool unmaps_pages() const noexcept { return unmaps_pages_; }

  /// PyTorch's release_cached_blocks: every unsplit free block of the pools `for_each_pool`
  /// visits (it calls its argument with each pool), in the pools' order, each pool's smallest
  /// first.
  template <class Block, class ForEachPool>
  static std::vector<Block*> whole_blocks(ForEachPool&& for_each_pool) {
    std::vector<Block*> whole;
    for_each_pool([&](auto& p) {
      p.index.for_each([&](Block* b) {
        if (!b->is_split()) whole.push_back(b);
      });
    });
    return whole;
  }

  /// What PyTorch's release_available_cached_blocks frees from pool `p` for a request of `rounded`
  /// bytes: with max_split_size unset, nothing; else the smallest oversize block covering the
  /// request (at least max_split_size), else the largest oversize blocks until they cover it.
  /// `enough`: whether what is returned covers the request (the miss retries then).
  template <class Block, class Pool>
  static std::vector<Block*> oversize_blocks(const Pool& p, std::size_t rounded,
                                             std::size_t max_split_size, bool& enough) {
    std::vector<Block*> chosen;
    enough = false;
    if (max_split_size == std::numeric_limits<std::size_t>::max()) return chosen;
    const std::size_t key = std::max(rounded, max_split_size);
    if (Block* b = p.index.lower_bound(key)) {
      // A split block cannot be found here under the split rules; never free live memory.
      enough = !b->is_split();
      if (enough) chosen.push_back(b);
      return chosen;
    }
    std::vector<Block*> descending;
    p.index.for_each([&](Block* b) { descending.push_back(b); });
    std::reverse(descending.begin(), descending.end());
    std::size_t released = 0;
    for (Block* b : descending) {
      if (released >= key || b->size < max_split_size) break;
      if (b->is_split()) continue;
      released += b->size;
      chosen.push_back(b);
    }
    enough = released >= key;
    return chosen;
  }

  /// PyTorch's garbage_collect_cached_blocks, given the unsplit free blocks it may free
  /// (`freeable`), the age clock `now` (each block's age is now - gc_count_base) and the bytes to
  /// reclaim: round after round, every block at least as old as the average of those left, until
  /// the target is reached or a round frees nothing. The blocks to free, in order.
  template <class Block>
  static std::vector<Block*> garbage(std::vector<Block*> freeable, std::uint64_t now,
                                     std::size_t target) {
    std::vector<Block*> chosen;
    std::uint64_t total_age = 0;
    for (Block* b : freeable) total_age += now - b->gc_count_base;
    std::size_t reclaimed = 0;
    bool freed_any = true;
    while (reclaimed < target && freed_any && !freeable.empty()) {
      const double age_threshold =
          static_cast<double>(total_age) / static_cast<double>(freeable.size());
      freed_any = false;
      std::vector<Block*> keep;
      for (Block* b : freeable) {
        const std::uint64_t age = now - b->gc_count_base;
        if (static_cast<double>(age) >= age_threshold) {
          freed_any = true;
          reclaimed += b->size;
          total_age -= age;
          chosen.push_back(b);
        } else {
          keep.push_back(b);
        }
      }
      freeable.swap(keep);
    }
    return chosen;
  }

  /// Throws std::logic_error when segment `s` (a detail::segment) is not of the kind this policy
  /// gives back.
  template <class Segment>
  void check(const Segment& s) const {
    if ((s.page_size != 0) != unmaps_pages_) {
      throw std::logic_error(
          fmt::format("gpumem invariant violated: segment {:#x} is {} under a policy that {}",
                      s.ptr, s.page_size != 0 ? "an address range" : "a cudaMalloc segment",
                      unmaps_pages_ ? "maps pages" : "frees whole segments"));
    }
  }

 private:
  bool unmaps_pages_ = false;
};

}  // namespace gpumem::detail
