// Stitch's shared pages as blocks see them (core/detail/shared_pages.hpp): pages another range
// holds become shadowed blocks, pages nobody holds any more become free blocks again, and the
// check names a shadowed block that breaks the invariant.

#include "gpumem/core/detail/shared_pages.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <stdexcept>
#include <vector>

#include "gpumem/core/detail/block_list.hpp"
#include "support/components.hpp"

namespace {

using namespace gpumem_test;
using sharing = gpumem::detail::shared_pages<sim_stream>;
using blocks = gpumem::detail::block_list<sim_stream>;

constexpr std::uintptr_t base = 0x200000;
constexpr std::size_t page = 4 * KiB;

// The page table as shared_pages reads it: which positions of the range another range holds.
struct held_positions {
  std::set<std::size_t> held;
  bool held_elsewhere(const sim_segment&, std::size_t i) const { return held.count(i) != 0; }
};

// One range of 8 mapped pages, all one free block, with the block operations the allocator lends.
struct one_range {
  gpumem::detail::object_pool<sim_block> slab;
  sim_pool pool;
  sim_segment s;
  std::vector<sim_block*> indexed;  // insert_free's calls, in order

  one_range() {
    s.ptr = base;
    s.size = 8 * page;
    s.page_size = page;
    s.owner = &pool;
    s.pages.assign(8, 1);
    s.head = slab.create(base, s.size, &pool, &s);
  }

  sim_block* cut(sim_block* b, std::uintptr_t at) { return blocks::cut(slab, b, at); }
  void merge(sim_block* dst, sim_block* src) {
    if (src == nullptr || src->allocated || src->shadowed != dst->shadowed) return;
    if (src->shadowed) {
      pool.shadowed.erase(src);
    } else if (src->indexed) {
      pool.index.erase(src);
    }
    blocks::join(dst, src);
    slab.destroy(src);
  }
  void insert_free(sim_block* b) {
    pool.index.insert(b);
    indexed.push_back(b);
  }

  // (offset in pages, size in pages, shadowed) of each block, in address order.
  std::vector<std::vector<std::size_t>> layout() const {
    std::vector<std::vector<std::size_t>> out;
    for (const sim_block* b = s.head; b != nullptr; b = b->next) {
      out.push_back({(b->ptr - base) / page, b->size / page, b->shadowed ? 1u : 0u});
    }
    return out;
  }
};

using layout_t = std::vector<std::vector<std::size_t>>;

TEST(SharedPages, ShadowsOnlyThePagesHeldElsewhere) {
  one_range r;
  held_positions pages{{2, 3, 6}};
  sim_block* whole = r.s.head;
  ASSERT_TRUE(sharing::shadow_held(pages, whole, r));
  EXPECT_EQ(r.layout(), (layout_t{{0, 2, 0}, {2, 2, 1}, {4, 2, 0}, {6, 1, 1}, {7, 1, 0}}));
  EXPECT_EQ(r.pool.shadowed.size(), 2u);
  EXPECT_EQ(r.indexed.size(), 3u);  // the free parts are back in the index
  EXPECT_NO_THROW(sharing::check(pages, r.s));
}

TEST(SharedPages, LeavesABlockOnFreePagesAlone) {
  one_range r;
  held_positions pages;
  EXPECT_FALSE(sharing::shadow_held(pages, r.s.head, r));
  EXPECT_EQ(r.layout(), (layout_t{{0, 8, 0}}));
  EXPECT_TRUE(r.indexed.empty());
  EXPECT_TRUE(r.pool.shadowed.empty());
}

TEST(SharedPages, UnshadowsAFreedPageAndMergesIt) {
  one_range r;
  held_positions pages{{2, 3, 6}};
  ASSERT_TRUE(sharing::shadow_held(pages, r.s.head, r));
  pages.held.erase(3);
  sharing::unshadow(&r.s, 3, r);
  EXPECT_EQ(r.layout(), (layout_t{{0, 2, 0}, {2, 1, 1}, {3, 3, 0}, {6, 1, 1}, {7, 1, 0}}));
  EXPECT_NO_THROW(sharing::check(pages, r.s));
  sharing::unshadow(&r.s, 4, r);  // a free block covers it: nothing changes
  EXPECT_EQ(r.layout(), (layout_t{{0, 2, 0}, {2, 1, 1}, {3, 3, 0}, {6, 1, 1}, {7, 1, 0}}));
  pages.held.erase(6);
  sharing::unshadow(&r.s, 6, r);
  EXPECT_EQ(r.layout(), (layout_t{{0, 2, 0}, {2, 1, 1}, {3, 5, 0}}));
  EXPECT_EQ(r.pool.shadowed.size(), 1u);
  EXPECT_NO_THROW(sharing::check(pages, r.s));
}

TEST(SharedPages, CheckNamesAShadowedBlockOnAFreePage) {
  one_range r;
  held_positions pages{{2, 3}};
  ASSERT_TRUE(sharing::shadow_held(pages, r.s.head, r));
  pages.held.erase(3);  // freed without unshadowing
  EXPECT_THROW(sharing::check(pages, r.s), std::logic_error);
}

TEST(SharedPages, CheckNamesAnUnlistedShadowedBlock) {
  one_range r;
  held_positions pages{{0, 1, 2, 3, 4, 5, 6, 7}};
  r.s.head->shadowed = true;  // shadowed but in no pool's set
  EXPECT_THROW(sharing::check(pages, r.s), std::logic_error);
  r.pool.shadowed.insert(r.s.head);
  EXPECT_NO_THROW(sharing::check(pages, r.s));
}

TEST(SharedPages, InteriorPagesCountsWholePagesOnly) {
  one_range r;
  sim_block* high = blocks::cut(r.slab, r.s.head, base + page / 2);
  EXPECT_EQ(sharing::interior_pages(r.s.head), 0u);  // half a page
  EXPECT_EQ(sharing::interior_pages(high), 7u);
  high->mapped = false;
  EXPECT_EQ(sharing::interior_pages(high), 0u);
}

// The free pages a miss may share, in stitch_policy::shared_before's order: the request's own
// stream first, free the longest first; another stream's largest first; none held by another
// range. Five ranges of one pool, each with one free block, and a sixth (the target) to share into.
TEST(SharedPages, CollectFreeTakesTheSourcesInSharingOrder) {
  gpumem::detail::object_pool<sim_block> slab;
  std::vector<std::unique_ptr<gpumem::detail::stream_pools<sim_stream>>> streams;
  streams.push_back(std::make_unique<gpumem::detail::stream_pools<sim_stream>>());
  streams.push_back(std::make_unique<gpumem::detail::stream_pools<sim_stream>>());
  gpumem::simulated_device dev{device_options(GiB)};
  const sim_stream mine = dev.create_stream();
  const sim_stream other = dev.create_stream();
  streams[0]->large.stream = mine;
  streams[1]->large.stream = other;
  std::vector<sim_segment> ranges(6);
  struct shape {
    std::size_t pages;
    std::uint64_t freed_at;
    int stream;  // index into streams
  };
  // Range i: `pages` pages, each with a page id of its own (1, 2, ... in range order), all one
  // free block.
  const shape shapes[5] = {{2, 30, 0}, {3, 10, 0}, {2, 10, 0}, {1, 5, 1}, {4, 50, 1}};
  gpumem::detail::page_id next_id = 1;
  for (std::size_t i = 0; i < 6; ++i) {
    sim_segment& s = ranges[i];
    const std::size_t n = i < 5 ? shapes[i].pages : 4;
    s.ptr = base + i * 16 * page;
    s.size = n * page;
    s.page_size = page;
    for (std::size_t k = 0; k < n; ++k) s.pages.push_back(next_id++);
    if (i == 5) break;  // the target maps its own pages, none free
    sim_pool& pool = streams[static_cast<std::size_t>(shapes[i].stream)]->large;
    s.owner = &pool;
    s.stream = pool.stream;
    sim_block* b = slab.create(s.ptr, s.size, &pool, &s);
    b->freed_at = shapes[i].freed_at;
    s.head = b;
    pool.index.insert(b);
  }
  sim_segment& target = ranges[5];
  target.stream = mine;
  struct page_table {
    std::set<gpumem::detail::page_id> held;  // held by some other range
    bool held_elsewhere(const sim_segment& s, std::size_t i) const {
      return held.count(s.pages[i]) != 0;
    }
    bool mapped_in(gpumem::detail::page_id, const sim_segment&) const { return false; }
    bool would_order(gpumem::detail::page_id, const sim_stream&) const { return false; }
  } pages;
  pages.held.insert(ranges[1].pages[1]);  // the middle page of range 1 is used elsewhere
  std::vector<gpumem::detail::page_id> out;
  sharing::collect_free(pages, streams, target, 100, false, out);
  // Own stream by freed_at (10: range 1, 3 pages, before range 2, 2 pages; then range 0 at 30),
  // then the other stream's largest first (range 4, then range 3).
  std::vector<gpumem::detail::page_id> expected = {ranges[1].pages[0], ranges[1].pages[2]};
  for (std::size_t r : {2, 0, 4, 3}) {
    for (gpumem::detail::page_id id : ranges[r].pages) expected.push_back(id);
  }
  EXPECT_EQ(out, expected);
  // Only as many as asked for, from the front of that order.
  sharing::collect_free(pages, streams, target, 3, false, out);
  EXPECT_EQ(out, std::vector<gpumem::detail::page_id>(expected.begin(), expected.begin() + 3));
  for (sim_segment& s : ranges) {
    if (s.head != nullptr) {
      s.owner->index.erase(s.head);
      slab.destroy(s.head);
    }
  }
}

}  // namespace
