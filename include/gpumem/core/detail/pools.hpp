// gpumem — the pools of the caching allocator: where free blocks of one kind wait, per stream.
//
// A pool owns its free blocks: the mapped ones in its free-block index, and under the VMM
// policies the unmapped and shadowed ones in address-ordered sets (docs/architecture.md,
// "Vocabulary": pool, stream pools, size class). caching_allocator decides which pool a request
// goes to and moves blocks between the sets; a pool checks that each set holds what it says.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpumem/core/detail/block.hpp"
#include "gpumem/core/detail/free_block_index.hpp"
#include "gpumem/core/size_policy.hpp"

namespace gpumem::detail {

template <class Stream>
struct address_order {
  using is_transparent = void;  // also compares with an address
  bool operator()(const block<Stream>* a, const block<Stream>* b) const noexcept {
    return a->ptr < b->ptr;
  }
  bool operator()(const block<Stream>* a, std::uintptr_t b) const noexcept { return a->ptr < b; }
  bool operator()(std::uintptr_t a, const block<Stream>* b) const noexcept { return a < b->ptr; }
};

template <class Stream>
struct pool {
  Stream stream{};
  bool is_small = false;
  free_block_index<Stream> index;  // free mapped blocks
  // Unmapped blocks of this pool's VMM segments, lowest address first (touched on misses only).
  std::set<block<Stream>*, address_order<Stream>> unmapped;
  // Stitch: its shadowed blocks (free, mapped to pages other ranges hold), lowest address first.
  std::set<block<Stream>*, address_order<Stream>> shadowed;
  std::size_t address_space = 0;  // bytes of address ranges its VMM segments hold
  // Stitch class pools: a block of this size class has been freed since the allocator started or
  // the cache was last emptied (the class's blocks are not all long-lived), so the class may borrow
  // free blocks of other such classes (borrow_block).
  bool has_freed = false;
  // Stitch: misses since the workload settled (see pages_to_create).
  std::uint32_t settled_misses = 0;
  // Stitch class pools: this pool's slot in stream_pools::free_bound (nullptr for other pools).
  std::size_t* free_bound = nullptr;

  /// Each set holds blocks of this pool in the state it stands for (the index checks its own
  /// order), and the free bound covers the largest free block. Throws std::logic_error.
  void check() const {
    auto fail = [](const std::string& what) {
      throw std::logic_error("gpumem invariant violated: " + what);
    };
    index.check();
    index.for_each([&](const block<Stream>* b) {
      if (b->owner != this) fail("block indexed in a foreign pool");
    });
    for (const block<Stream>* b : unmapped) {
      if (b->owner != this || b->mapped) fail("unmapped set holds a foreign or mapped block");
    }
    for (const block<Stream>* b : shadowed) {
      if (b->owner != this || !b->shadowed) fail("shadowed set holds a foreign or used block");
    }
    const block<Stream>* largest = index.largest();
    if (free_bound != nullptr && largest != nullptr && largest->size > *free_bound) {
      fail(fmt::format("class pool's free bound {} is below its largest free block ({} B)",
                       *free_bound, largest->size));
    }
  }
};

template <class Stream>
struct stream_pools {
  pool<Stream> small;
  pool<Stream> large;  // the large requests (stitch: only those above k_max_request, refused)
  // Stitch: the large requests' pools, one per size class (stitch_size_class), made on first use.
  std::array<pool<Stream>*, k_stitch_classes> by_class{};
  std::vector<std::unique_ptr<pool<Stream>>> classes;  // the ones made, in creation order
  // For each of `classes`, same order: at least the size of its largest free block. Raised on
  // every insert, lowered when a lookup finds nothing, so borrow_block skips a class that cannot
  // lend without searching its index (a stream has dozens of classes; most cannot lend).
  std::array<std::size_t, k_stitch_classes> free_bound{};
  // Its place among the allocator's streams, in the order of their first request (stable from
  // run to run, unlike addresses: stitch's step_placement keys requests by it).
  std::size_t serial = 0;

  /// Visits every pool of the stream: large, small, then the stitch classes.
  template <class F>
  void for_each(F&& f) {
    f(large);
    f(small);
    for (auto& c : classes) f(*c);
  }
  template <class F>
  void for_each(F&& f) const {
    f(large);
    f(small);
    for (const auto& c : classes) f(static_cast<const pool<Stream>&>(*c));
  }

  /// Every pool checks itself; the class pools are large pools of this stream, each with its own
  /// free bound; under stitch the large pool holds nothing (its requests go to the classes).
  void check(bool stitch) const {
    auto fail = [](const std::string& what) {
      throw std::logic_error("gpumem invariant violated: " + what);
    };
    for_each([](const pool<Stream>& p) { p.check(); });
    if (stitch && (!large.index.empty() || large.address_space != 0)) {
      fail("stitch serves large requests from the class pools only");
    }
    for (const pool<Stream>* p : by_class) {
      if (p != nullptr && (p->is_small || p->stream != small.stream)) {
        fail("class pool of the wrong kind or stream");
      }
    }
    for (std::size_t i = 0; i < classes.size(); ++i) {
      if (classes[i]->free_bound != &free_bound[i]) {
        fail("class pool points at another's free bound");
      }
    }
  }
};

/// What the pools of every stream hold free: bytes, blocks, the largest block.
struct free_cache_totals {
  std::size_t bytes = 0;
  std::size_t blocks = 0;
  std::size_t largest = 0;
};

template <class Stream>
free_cache_totals free_cache(const std::vector<std::unique_ptr<stream_pools<Stream>>>& all) {
  free_cache_totals t;
  for (const auto& sp : all) {
    static_cast<const stream_pools<Stream>&>(*sp).for_each([&](const pool<Stream>& p) {
      t.bytes += p.index.bytes();
      t.blocks += p.index.size();
      if (const block<Stream>* b = p.index.largest()) t.largest = std::max(t.largest, b->size);
    });
  }
  return t;
}

}  // namespace gpumem::detail
