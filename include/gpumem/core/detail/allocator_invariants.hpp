// gpumem — the caching allocator's invariant checker (caching_allocator::check_invariants).
//
// Each component checks its own structure: the free-block index its treaps and bitmaps, a pool
// its sets, the stream pools their size classes (pools.hpp), vmm_pages its page table,
// shared_pages the shadowed blocks, the counters a recount. This file checks what ties them
// together — the blocks tile each segment, each block is in the one set its state says, free
// neighbours are merged, an unmapped or shadowed block agrees with the page table, every statistic
// equals a recount from the blocks, a block with capture free markers is deferred — and calls the
// components' checks. docs/architecture.md ("Components") lists who checks what.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpumem/core/detail/block.hpp"
#include "gpumem/core/detail/block_list.hpp"
#include "gpumem/core/detail/pointer_map.hpp"
#include "gpumem/core/detail/pool_counters.hpp"
#include "gpumem/core/detail/pools.hpp"
#include "gpumem/core/detail/segment_release.hpp"
#include "gpumem/core/detail/shared_pages.hpp"
#include "gpumem/core/detail/split_rules.hpp"
#include "gpumem/core/detail/vmm_growth.hpp"
#include "gpumem/core/detail/vmm_pages.hpp"
#include "gpumem/core/size_policy.hpp"
#include "gpumem/device/device.hpp"
#include "gpumem/stats.hpp"

namespace gpumem::detail {

/// What the checker reads of a caching_allocator, under its lock: every member it checks.
template <class Device>
struct allocator_state {
  using stream_type = typename Device::stream_type;
  const segment<stream_type>* segments = nullptr;  // in creation order
  const std::vector<std::unique_ptr<stream_pools<stream_type>>>& pools;
  const pointer_map<block<stream_type>>& allocated;
  const pool_counters& counts;
  const device_stats& stats;
  const pages_for<Device>& pages;
  // Captures: the blocks freed during one (waiting for it to end), and the graph nodes of the last
  // uses of those the graph may order (graph_capture_record_stream_reuse).
  const std::vector<block<stream_type>*>& deferred;
  const std::unordered_map<block<stream_type>*,
                           std::vector<typename capture_graph_node<Device>::type>>& free_markers;
  std::size_t reserved_total = 0;
  std::size_t max_split_size = 0;
  bool stitch = false;
  // False once max_split_size changed at run time: the oversize counters then count each block
  // and segment against the value of the moment, as PyTorch's do, and no recount can match.
  bool oversize_counts_exact = true;
  // The VMM policy's rules for ranges and pools (vmm_growth::check, check_pool); none: unchecked.
  const vmm_growth* growth = nullptr;
  // Which kind of segment the policy gives back (segment_release::check); none: unchecked.
  const segment_release* release = nullptr;
};

template <class Device>
class allocator_invariants {
 public:
  using stream_type = typename Device::stream_type;
  using block_type = block<stream_type>;
  using segment_type = segment<stream_type>;
  using pool_type = pool<stream_type>;
  using pools_type = stream_pools<stream_type>;

  /// Throws std::logic_error naming the first violation. O(blocks + pages).
  static void check(const allocator_state<Device>& a) {
    check_capture(a);
    pool_counters::recount rc{};
    std::int64_t oversize_allocs = 0;
    std::int64_t oversize_segs = 0;
    std::size_t allocated_blocks = 0;
    std::size_t indexed_blocks = 0;
    std::size_t reserved = 0;
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
    auto count = [&rc](counter c, std::size_t pool_entry, std::int64_t amount) {
      for (std::size_t t : {std::size_t{0}, pool_entry})
        rc[static_cast<std::size_t>(c)][t] += amount;
    };
    for (const segment_type* s = a.segments; s != nullptr; s = s->next) {
      ranges.emplace_back(s->ptr, s->ptr + s->size);
      const bool vmm = s->page_size != 0;
      // A VMM range's memory is its physical pages, counted once below (they may be shared).
      const std::size_t seg_reserved = vmm ? 0 : s->size;
      reserved += seg_reserved;
      if (vmm) {
        check_vmm_segment(s);
        if (a.growth != nullptr) a.growth->check(*s);
      }
      block_list<stream_type>::check(*s);  // the blocks tile the segment
      split_rules::check(*s);
      if (a.release != nullptr) a.release->check(*s);
      const bool split = s->head->next != nullptr;
      const std::size_t pt = s->owner->is_small ? 1 : 2;
      count(counter::segment, pt, 1);
      count(counter::reserved_bytes, pt, as_i64(seg_reserved));
      if (!vmm && s->size >= a.max_split_size) ++oversize_segs;
      for (const block_type* b = s->head; b != nullptr; b = b->next) {
        const bool pending = !b->allocated && (b->event_count > 0 || !b->stream_uses.empty());
        const bool is_free = !b->allocated && !pending && b->mapped && !b->shadowed;
        if (b->allocated) {
          ++allocated_blocks;
          if (a.allocated.find(b->ptr) != b) fail("allocated block missing from the pointer map");
          if (b->indexed) fail("allocated block is in the free index");
          if (b->size >= a.max_split_size) ++oversize_allocs;
          if (a.stitch && !b->owner->is_small && outside_class_pools(a, b)) {
            fail(fmt::format("block {:#x} of {} B is outside the size class pools", b->ptr,
                             b->size));
          }
        }
        if (is_free) {
          if (!b->indexed) fail(fmt::format("free block {:#x} is not indexed", b->ptr));
          ++indexed_blocks;
          if (b->next != nullptr && !b->next->allocated && b->next->event_count == 0 &&
              b->next->stream_uses.empty() && b->next->mapped && !b->next->shadowed) {
            fail(fmt::format("free neighbours {:#x} and {:#x} were not merged", b->ptr,
                             b->next->ptr));
          }
        } else if (b->indexed) {
          fail("busy or unmapped block is in the free index");
        }
        // Unmapped and shadowed blocks hold nothing of their own; check_vmm_segment checks them.
        if (!b->mapped || b->shadowed) continue;
        if (b->allocated) {
          count(counter::allocation, pt, 1);
          count(counter::allocated_bytes, pt, as_i64(b->size));
        }
        if (!is_free) {
          count(counter::active, pt, 1);
          count(counter::active_bytes, pt, as_i64(b->size));
          count(counter::requested_bytes, pt, as_i64(b->requested_size));
        } else if (split && !vmm) {
          count(counter::inactive_split, pt, 1);
          count(counter::inactive_split_bytes, pt, as_i64(b->size));
        }
      }
    }
    std::sort(ranges.begin(), ranges.end());
    for (std::size_t i = 1; i < ranges.size(); ++i) {
      if (ranges[i].first < ranges[i - 1].second) fail("segments overlap");
    }
    if (allocated_blocks != a.allocated.size()) {
      fail("pointer map holds blocks that are not allocated");
    }
    std::size_t index_total = 0;
    std::size_t unmapped_listed = 0;
    for (const auto& sp : a.pools) {
      const pools_type& pools = *sp;
      pools.check(a.stitch);  // each pool's sets, the size classes
      pools.for_each([&](const pool_type& p) {
        if (a.growth != nullptr) a.growth->check_pool(p);
        index_total += p.index.size();
        unmapped_listed += p.unmapped.size();
        std::size_t address_space = 0;
        for (const segment_type* s = a.segments; s != nullptr; s = s->next) {
          if (s->owner == &p && s->page_size != 0) address_space += s->size;
        }
        if (address_space != p.address_space) fail("pool's address space total is wrong");
      });
    }
    if (index_total != indexed_blocks) fail("free index holds blocks that are not free");
    std::size_t unmapped_blocks = 0;
    for (const segment_type* s = a.segments; s != nullptr; s = s->next) {
      for (const block_type* b = s->head; b != nullptr; b = b->next) {
        unmapped_blocks += b->mapped ? 0 : 1;
      }
    }
    if (unmapped_listed != unmapped_blocks) fail("unmapped sets hold blocks that are not unmapped");
    check_pages(a, rc[static_cast<std::size_t>(counter::reserved_bytes)], reserved);
    if (reserved != a.reserved_total) fail("reserved total disagrees with the segments");
    a.counts.check(rc);
    if (!a.oversize_counts_exact) return;
    if (a.stats.oversize_allocations.current != oversize_allocs) fail("oversize_allocations");
    if (a.stats.oversize_segments.current != oversize_segs) fail("oversize_segments");
  }

 private:
  [[noreturn]] static void fail(const std::string& what) {
    throw std::logic_error("gpumem invariant violated: " + what);
  }

  static std::int64_t as_i64(std::size_t v) noexcept { return static_cast<std::int64_t>(v); }

  // Every block with capture free markers is deferred: freed during the capture, in no pool yet.
  static void check_capture(const allocator_state<Device>& a) {
    for (const auto& entry : a.free_markers) {
      if (std::find(a.deferred.begin(), a.deferred.end(), entry.first) == a.deferred.end()) {
        fail("a block with capture free markers is not deferred");
      }
    }
  }

  // Stitch: a large allocated block lies in the class pool of its size (not the large pool).
  static bool outside_class_pools(const allocator_state<Device>& a, const block_type* b) {
    for (const auto& sp : a.pools) {
      if (!(sp->small.stream == b->owner->stream)) continue;
      return sp->by_class[stitch_size_class(b->size)] == nullptr || b->owner == &sp->large;
    }
    return true;
  }

  // The mapping of a VMM segment agrees with its blocks: unmapped blocks are page-aligned, hold no
  // page, are listed in their pool's unmapped set and merged with unmapped neighbours; every page
  // a mapped block touches is mapped; a shadowed block is page-aligned, unused and listed.
  static void check_vmm_segment(const segment_type* s) {
    const std::size_t page = s->page_size;
    if (s->stream != s->owner->stream) fail("segment's stream is not its pool's");
    for (const block_type* b = s->head; b != nullptr; b = b->next) {
      const auto [first, last] = page_span(b);
      if (!b->mapped) {
        if ((b->ptr - s->ptr) % page != 0 || b->size % page != 0) {
          fail("unmapped block not page-aligned");
        }
        if (b->allocated || b->event_count > 0) fail("unmapped block in use");
        if (s->owner->unmapped.count(const_cast<block_type*>(b)) == 0) {
          fail("unmapped block not listed");
        }
        if (b->next != nullptr && !b->next->mapped) fail("unmapped neighbours not merged");
        for (std::size_t i = first; i < last; ++i) {
          if (s->pages[i] != 0) fail(fmt::format("unmapped block {:#x} has a mapped page", b->ptr));
        }
      } else {
        for (std::size_t i = first; i < last; ++i) {
          if (s->pages[i] == 0)
            fail(fmt::format("mapped block {:#x} has an unmapped page", b->ptr));
        }
      }
    }
  }

  // The VMM pages: vmm_pages checks itself against the blocks; their bytes are what the VMM ranges
  // reserve; shared_pages checks the shadowed blocks (on pages another range holds, and only there:
  // pages are unshadowed as soon as they are free).
  static void check_pages(const allocator_state<Device>& a,
                          std::array<std::int64_t, num_stat_types>& reserved_bytes,
                          std::size_t& reserved) {
    if constexpr (is_vmm_device_v<Device>) {
      std::map<const segment_type*, std::vector<std::uint32_t>> users;  // per range and position
      for (const segment_type* s = a.segments; s != nullptr; s = s->next) {
        if (s->page_size == 0) continue;
        std::vector<std::uint32_t>& u = users[s];
        u.assign(s->pages.size(), 0);
        for (const block_type* b = s->head; b != nullptr; b = b->next) {
          const auto [first, last] = page_span(b);
          if (b->allocated || b->event_count > 0 || !b->stream_uses.empty()) {
            for (std::size_t i = first; i < last; ++i) ++u[i];
          }
        }
        shared_pages<stream_type>::check(a.pages, *s);  // the shadowed blocks
      }
      a.pages.check(
          [&](auto&& visit) {
            for (const segment_type* s = a.segments; s != nullptr; s = s->next) {
              if (s->page_size != 0) visit(*s);
            }
          },
          [&](const segment_type& s, std::size_t index) -> std::size_t {
            return users.at(&s)[index];
          });
      const std::size_t small = a.pages.small_bytes();
      const std::size_t large = a.pages.large_bytes();
      reserved_bytes[0] += as_i64(small + large);
      reserved_bytes[1] += as_i64(small);
      reserved_bytes[2] += as_i64(large);
      reserved += small + large;
    } else {
      (void)a, (void)reserved_bytes, (void)reserved;
    }
  }
};

}  // namespace gpumem::detail
