// Stitch's shared pages as blocks see them (core/detail/shared_pages.hpp): pages another range
// holds become shadowed blocks, pages nobody holds any more become free blocks again, and the
// check names a shadowed block that breaks the invariant.

#include "gpumem/core/detail/shared_pages.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
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

}  // namespace
