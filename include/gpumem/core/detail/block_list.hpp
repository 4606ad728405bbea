// gpumem — a segment's blocks as a list: doubly linked in address order (block::prev, next; the
// segment's head), tiling the segment exactly. The one code that links, cuts and joins blocks;
// caching_allocator decides where to cut and what to join, and keeps the free index, the
// unmapped and shadowed sets and the counters (docs/architecture.md, "Components").
//
// The contract:
//
// What caching_allocator guarantees:
//  - it calls only under its lock, on blocks of its own segments, with a cut point strictly inside
//    the block cut, and joins only address-order neighbours;
//  - it takes a joined block out of whatever set holds it, and destroys it, right after join.
//
// What this component guarantees:
//  - after each call the blocks still tile their segment: cut gives the new piece b's state
//    (mapped, shadowed, pool, segment) and lists nothing anywhere else; join leaves the joined
//    block unlinked;
//  - no device call, no exception but std::bad_alloc from the slab (cut, cut_low).
//
// Its invariant (check, called by allocator_invariants for every segment): the head starts the
// list, links agree both ways, every block belongs to the segment and its pool, is not empty, and
// each starts where the one before ends, the last at the segment's end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "gpumem/core/detail/block.hpp"

namespace gpumem::detail {

template <class Stream>
struct block_list {
  using block_type = block<Stream>;
  using segment_type = segment<Stream>;
  using slab_type = object_pool<block_type>;

  /// Links new block b between `before` and `after` (either may be null: b is then the head, or
  /// the last block) of b's segment.
  static void splice(block_type* b, block_type* before, block_type* after) noexcept {
    b->prev = before;
    b->next = after;
    if (before != nullptr) {
      before->next = b;
    } else {
      b->seg->head = b;
    }
    if (after != nullptr) after->prev = b;
  }

  /// Cuts b at `at` (b->ptr < at < b->ptr + b->size): b keeps the low part, the returned block
  /// (b's state, not listed in any set) the high part.
  static block_type* cut(slab_type& slab, block_type* b, std::uintptr_t at) {
    block_type* high = piece_of(slab, b, at, b->ptr + b->size - at);
    splice(high, b, b->next);
    b->size = at - b->ptr;
    return high;
  }

  /// Cuts b at `at`: the returned block (b's state, not listed in any set) is the low part, b
  /// keeps the high part.
  static block_type* cut_low(slab_type& slab, block_type* b, std::uintptr_t at) {
    block_type* low = piece_of(slab, b, b->ptr, at - b->ptr);
    splice(low, b->prev, b);
    b->size -= at - b->ptr;
    b->ptr = at;
    return low;
  }

  /// Joins src, dst's neighbour (before or after it), into dst: dst covers both, src is unlinked.
  /// Returns src's size.
  static std::size_t join(block_type* dst, block_type* src) noexcept {
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
    dst->size += src->size;
    src->prev = src->next = nullptr;
    return src->size;
  }

  /// Throws std::logic_error naming the first place where the blocks of `s` do not tile it.
  static void check(const segment_type& s) {
    if (s.head == nullptr || s.head->prev != nullptr) fail("segment head is not its first block");
    std::uintptr_t expect = s.ptr;
    for (const block_type* b = s.head; b != nullptr; b = b->next) {
      if (b->ptr != expect) {
        fail(fmt::format("gap or overlap at {:#x} in segment {:#x}", b->ptr, s.ptr));
      }
      if (b->size == 0) fail("empty block");
      if (b->seg != &s || b->owner != s.owner) fail("block points at the wrong segment or pool");
      if (b->next != nullptr && b->next->prev != b) fail("broken prev/next links");
      expect += b->size;
    }
    if (expect != s.ptr + s.size) fail(fmt::format("blocks do not tile segment {:#x}", s.ptr));
  }

 private:
  static block_type* piece_of(slab_type& slab, const block_type* b, std::uintptr_t ptr,
                              std::size_t size) {
    block_type* piece = slab.create(ptr, size, b->owner, b->seg);
    piece->mapped = b->mapped;
    piece->shadowed = b->shadowed;
    return piece;
  }

  [[noreturn]] static void fail(const std::string& what) {
    throw std::logic_error("gpumem invariant violated: " + what);
  }
};

}  // namespace gpumem::detail
