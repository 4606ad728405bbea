// gpumem — stitch's shared pages, as blocks see them: a physical page may be mapped in two ranges
// (one lends it to the other); while one range's block holds it (allocated, or waiting on a
// stream), the block covering it in every other range is shadowed: out of the free index, listed in
// its pool's shadowed set, and unshadowed the moment nobody holds the page. vmm_pages keeps which
// page is mapped where and who holds it; this component turns holds into shadowed and free blocks,
// and picks the free pages a range may borrow (docs/architecture.md, "Components").
//
// The contract:
//
// What caching_allocator guarantees:
//  - it calls only under its lock, with the VMM page table (vmm_pages) of its ranges, and only on
//    ranges with shared pages (segment::shared_pages != 0) for hold, release and shadow_held;
//  - it lends the block operations as an object `blocks` with cut(b, at) (block_list::cut),
//    merge(dst, src) (join dst with a free neighbour of the same state, if it may) and
//    insert_free(b) (into b's pool's free index);
//  - shadow_held gets a free, mapped block already out of the index; hold an allocated block,
//    release a block just freed (before it merges with its neighbours).
//
// What this component guarantees:
//  - after each call every page held by one range is shadowed in every other range that maps it,
//    and no other page is: shadowed blocks are page-aligned and listed in their pool's shadowed
//    set, the rest of what was looked at is back in the free index, merged with its neighbours;
//  - collect_free names only whole pages inside free blocks of large pools, of the target's page
//    size, held by no range and not mapped in the target, in stitch_policy::shared_before's order;
//    during a capture, none that would make the target's stream wait for another;
//  - no device call, no exception but std::bad_alloc, and std::logic_error on a broken invariant.
//
// Its invariant (check, called by allocator_invariants for every VMM range): a shadowed block is
// page-aligned, not in use, not indexed, listed in its pool's shadowed set, and each of its pages
// is held by another range.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpumem/core/detail/block.hpp"
#include "gpumem/core/detail/stitch_policy.hpp"
#include "gpumem/core/detail/vmm_pages.hpp"

namespace gpumem::detail {

template <class Stream>
struct shared_pages {
  using block_type = block<Stream>;
  using segment_type = segment<Stream>;
  using pool_type = pool<Stream>;

  /// Allocated block b of a range with shared pages: its range holds its pages now.
  template <class Pages>
  static void hold(Pages& pages, block_type* b) {
    const auto [first, last] = page_span(b);
    pages.hold(*b->seg, first, last, b->owner->stream);
  }

  /// Block b of a range with shared pages is free again: the pages nobody holds any more are
  /// unshadowed in their other ranges.
  template <class Pages, class Blocks>
  static void release(Pages& pages, block_type* b, Blocks& blocks) {
    const auto [first, last] = page_span(b);
    pages.release_hold(*b->seg, first, last, [&](page_id id) {
      for (const auto& m : pages.page(id).mappings) {
        if (m.seg != b->seg) unshadow(m.seg, m.index, blocks);
      }
    });
  }

  /// Free block b (out of the index, mapped) lies on pages that other ranges hold: those pages
  /// become shadowed blocks and what is left goes back to the index. False, b unchanged, when no
  /// page of b is held elsewhere.
  template <class Pages, class Blocks>
  static bool shadow_held(const Pages& pages, block_type* b, Blocks& blocks) {
    segment_type* s = b->seg;
    pool_type& p = *b->owner;
    const std::size_t page = s->page_size;
    auto [first, last] = page_span(b);
    std::size_t i = first;
    while (i < last && !pages.held_elsewhere(*s, i)) ++i;
    if (i == last) return false;
    block_type* rest = b;  // the part not yet looked at, from position i's page on
    while (i < last) {
      std::size_t j = i;
      while (j < last && pages.held_elsewhere(*s, j)) ++j;
      const std::uintptr_t lo = s->ptr + i * page;
      const std::uintptr_t hi = s->ptr + j * page;
      if (lo < rest->ptr || hi > rest->ptr + rest->size) {
        throw std::logic_error("gpumem invariant violated: a page held elsewhere is partly used");
      }
      if (lo > rest->ptr) {  // a free part before the held pages
        block_type* held = blocks.cut(rest, lo);
        blocks.insert_free(rest);
        rest = held;
      }
      block_type* after = hi < rest->ptr + rest->size ? blocks.cut(rest, hi) : nullptr;
      rest->shadowed = true;
      blocks.merge(rest, rest->prev);  // with shadowed neighbours
      p.shadowed.insert(rest);
      if (after == nullptr) return true;
      rest = after;
      i = j;
      while (i < last && !pages.held_elsewhere(*s, i)) ++i;
    }
    blocks.insert_free(rest);
    return true;
  }

  /// Position `index` of range s is free to use again: if a shadowed block covers it, that page
  /// becomes a free block (merged with its free neighbours, indexed).
  template <class Blocks>
  static void unshadow(segment_type* s, std::size_t index, Blocks& blocks) {
    pool_type& p = *s->owner;
    const std::uintptr_t lo = s->ptr + index * s->page_size;
    const std::uintptr_t hi = lo + s->page_size;
    auto it = p.shadowed.upper_bound(lo);
    if (it == p.shadowed.begin()) return;
    block_type* b = *std::prev(it);
    if (b->seg != s || b->ptr + b->size <= lo) return;  // a free block covers it: nothing to do
    p.shadowed.erase(std::prev(it));
    if (b->ptr < lo) {
      block_type* page_block = blocks.cut(b, lo);
      p.shadowed.insert(b);
      b = page_block;
    }
    if (hi < b->ptr + b->size) p.shadowed.insert(blocks.cut(b, hi));
    b->shadowed = false;
    blocks.merge(b, b->prev);
    blocks.merge(b, b->next);
    blocks.insert_free(b);
  }

  /// Up to `count` free pages that can be mapped in range `target` as well, into `out`: whole
  /// pages inside free blocks of any large pool of `stream_pools`, used by no range, not mapped in
  /// `target` yet, in the order of stitch_policy::shared_before (the target's own stream first).
  /// While `capturing`, none that would order the target's stream after another.
  template <class Pages, class StreamPools>
  static void collect_free(const Pages& pages, const StreamPools& stream_pools,
                           const segment_type& target, std::size_t count, bool capturing,
                           std::vector<page_id>& out) {
    out.clear();
    struct source {
      stitch_policy::page_source order;
      block_type* block;
    };
    std::vector<source> sources;
    for (auto& sp : stream_pools) {
      sp->for_each([&](pool_type& q) {
        if (q.is_small) return;  // sub-page blocks: a shared page would shadow many of them
        q.index.for_each([&](block_type* b) {
          if (b->seg == &target || b->seg->page_size != target.page_size) return;
          if (const std::size_t n = interior_pages(b)) {
            sources.push_back({{b->ptr, n, b->freed_at, !(q.stream == target.stream)}, b});
          }
        });
      });
    }
    // A heap, not a sort: a miss usually takes its pages from the first few of many sources.
    // shared_before is a total order (addresses differ), so they are taken in the sorted order.
    const auto later = [](const source& a, const source& b) {
      return stitch_policy::shared_before(b.order, a.order);
    };
    std::make_heap(sources.begin(), sources.end(), later);
    for (auto end = sources.end(); end != sources.begin(); --end) {
      std::pop_heap(sources.begin(), end, later);
      const source& src = *std::prev(end);
      const segment_type* s = src.block->seg;
      const std::size_t first = round_up(src.block->ptr - s->ptr, s->page_size) / s->page_size;
      for (std::size_t i = first; i < first + src.order.pages && out.size() < count; ++i) {
        const page_id id = s->pages[i];
        if (pages.held_elsewhere(*s, i) || pages.mapped_in(id, target) ||
            (capturing && pages.would_order(id, target.stream)) ||
            std::find(out.begin(), out.end(), id) != out.end()) {
          continue;
        }
        out.push_back(id);
      }
      if (out.size() == count) return;
    }
  }

  /// The whole pages inside mapped block b of a VMM range (0 for a classic segment).
  static std::size_t interior_pages(const block_type* b) noexcept {
    const segment_type* s = b->seg;
    if (s->page_size == 0 || !b->mapped) return 0;
    const std::size_t first = round_up(b->ptr - s->ptr, s->page_size) / s->page_size;
    const std::size_t last = (b->ptr + b->size - s->ptr) / s->page_size;
    return last > first ? last - first : 0;
  }

  /// Throws std::logic_error naming the first shadowed block of VMM range s that breaks the
  /// invariant (see the top of this file).
  template <class Pages>
  static void check(const Pages& pages, const segment_type& s) {
    const std::size_t page = s.page_size;
    for (const block_type* b = s.head; b != nullptr; b = b->next) {
      if (!b->shadowed || !b->mapped) continue;  // an unmapped block is never shadowed
      if ((b->ptr - s.ptr) % page != 0 || b->size % page != 0) {
        fail("shadowed block not page-aligned");
      }
      if (b->allocated || b->event_count > 0 || b->indexed) fail("shadowed block in use");
      if (s.owner->shadowed.count(const_cast<block_type*>(b)) == 0) {
        fail("shadowed block not listed");
      }
      const auto [first, last] = page_span(b);
      for (std::size_t i = first; i < last; ++i) {
        if (!pages.held_elsewhere(s, i)) {
          fail(fmt::format("shadowed block {:#x} lies on a free page", b->ptr));
        }
      }
    }
  }

 private:
  static std::size_t round_up(std::size_t v, std::size_t to) noexcept {
    return (v + to - 1) / to * to;
  }

  [[noreturn]] static void fail(const std::string& what) {
    throw std::logic_error("gpumem invariant violated: " + what);
  }
};

}  // namespace gpumem::detail
