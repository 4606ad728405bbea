// gpumem — when a free block is split, and how split segments count in inactive_split: PyTorch's
// rules for its native segments (classic) and for expandable segments (expandable, stitch).
// caching_allocator asks this component wherever a block is split, taken whole, merged or cut,
// and applies the counter changes it answers (docs/architecture.md, "Components").
//
// The contract:
//
// What caching_allocator guarantees:
//  - it calls only under its lock, with the figures of the moment (the block's size, the request
//    rounded, max_split_size as set now);
//  - it splits exactly when splits() says so (and never while set_no_split is on), and applies
//    each inactive_split_change it is given to the pool's inactive_split and
//    inactive_split_bytes counters, once;
//  - it refuses set_no_split where allows_no_split() is false.
//
// What this component guarantees:
//  - classic: PyTorch's should_split (a small block keeps a remainder of 512 B or more, a large
//    one a remainder above 1 MiB, and only for a request below max_split_size), and every free
//    block of a split segment counted in inactive_split; VMM policies: any remainder of 512 B or
//    more is kept, and nothing is counted in inactive_split (as PyTorch's expandable segments);
//  - no device call, no allocation, no exception from the answers.
//
// Its invariant (check, called by allocator_invariants for every segment): no block is smaller
// than the smallest remainder the split rules keep (512 B). Which blocks inactive_split counts
// (counts_inactive_split) is what the checker's recount follows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "gpumem/core/detail/policy_rules.hpp"
#include "gpumem/core/size_policy.hpp"

namespace gpumem::detail {

/// A change of a pool's inactive_split (blocks) and inactive_split_bytes counters.
struct inactive_split_change {
  std::int64_t blocks = 0;
  std::int64_t bytes = 0;
};

class split_rules {
 public:
  split_rules() noexcept = default;
  explicit split_rules(policy_rules rules) noexcept
      : maps_pages_(rules.maps_pages), allows_no_split_(!rules.stitches) {}

  /// Whether set_no_split may be turned on: not under stitch, whose size-class pools hold only
  /// blocks of their class (a whole block of one class cannot serve a request of another).
  bool allows_no_split() const noexcept { return allows_no_split_; }

  /// Whether free block of `block_size` bytes, taken for a request of `rounded` bytes, is split
  /// (the remainder stays free). `small_pool`: the block is in a small pool.
  bool splits(std::size_t block_size, std::size_t rounded, bool small_pool,
              std::size_t max_split_size) const noexcept {
    if (maps_pages_) return block_size - rounded >= k_min_block_size;
    return should_split(block_size, rounded, small_pool, max_split_size);
  }

  /// Whether free blocks of split segments count in inactive_split (classic only).
  bool counts_inactive_split() const noexcept { return !maps_pages_; }

  /// A free block was split: `taken` bytes are handed out, `remaining` stay free.
  /// `already_split`: its segment was split before.
  inactive_split_change on_split(bool already_split, std::size_t taken,
                                 std::size_t remaining) const noexcept {
    if (!counts_inactive_split()) return {};
    if (already_split) return {0, -as_i64(taken)};
    return {1, as_i64(remaining)};
  }

  /// A free block of `size` bytes is handed out whole.
  inactive_split_change on_take_whole(bool already_split, std::size_t size) const noexcept {
    if (!counts_inactive_split() || !already_split) return {};
    return {-1, -as_i64(size)};
  }

  /// A block became free and absorbed `merged` free neighbours of `merged_bytes` bytes; it is now
  /// `size` bytes, and its segment is split (`split`) or not.
  inactive_split_change on_free(std::int64_t merged, std::size_t merged_bytes, bool split,
                                std::size_t size) const noexcept {
    if (!counts_inactive_split()) return {};
    inactive_split_change c{-merged, -as_i64(merged_bytes)};
    if (split) {
      c.blocks += 1;
      c.bytes += as_i64(size);
    }
    return c;
  }

  /// A free block of `whole` bytes was cut into `pieces` (restoring a checkpoint), one of which
  /// is then handed out whole (on_take_whole counts that one).
  inactive_split_change on_cut(int pieces, bool already_split, std::size_t whole) const noexcept {
    if (!counts_inactive_split() || pieces <= 1) return {};
    return {pieces - (already_split ? 1 : 0), already_split ? 0 : as_i64(whole)};
  }

  /// Throws std::logic_error when a block of segment `s` (a detail::segment) is smaller than any
  /// block the split rules leave.
  template <class Segment>
  static void check(const Segment& s) {
    for (const auto* b = s.head; b != nullptr; b = b->next) {
      if (b->size < k_min_block_size) {
        throw std::logic_error(
            fmt::format("gpumem invariant violated: block {:#x} of segment {:#x} has {} B, less "
                        "than the smallest remainder a split keeps",
                        b->ptr, s.ptr, b->size));
      }
    }
  }

 private:
  static std::int64_t as_i64(std::size_t v) noexcept { return static_cast<std::int64_t>(v); }

  bool maps_pages_ = false;
  bool allows_no_split_ = true;
};

}  // namespace gpumem::detail
