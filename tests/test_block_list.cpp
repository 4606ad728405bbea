// A segment's blocks as a list (core/detail/block_list.hpp): cuts and joins keep the blocks
// tiling their segment, and the check names where they do not.

#include "gpumem/core/detail/block_list.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>

#include "support/components.hpp"

namespace {

using namespace gpumem_test;
using blocks = gpumem::detail::block_list<sim_stream>;

struct one_segment {
  gpumem::detail::object_pool<sim_block> slab;
  sim_pool pool;
  sim_segment s;
  sim_block* whole = nullptr;

  explicit one_segment(std::uintptr_t base = 0x100000, std::size_t size = 8 * KiB) {
    s.ptr = base;
    s.size = size;
    s.owner = &pool;
    whole = slab.create(base, size, &pool, &s);
    s.head = whole;
  }
};

TEST(BlockList, CutsKeepTheSegmentTiled) {
  one_segment t;
  t.whole->mapped = false;
  sim_block* high = blocks::cut(t.slab, t.whole, 0x100000 + 3 * KiB);
  EXPECT_EQ(t.whole->size, 3 * KiB);
  EXPECT_EQ(high->ptr, 0x100000 + 3 * KiB);
  EXPECT_EQ(high->size, 5 * KiB);
  EXPECT_FALSE(high->mapped);  // the piece has the state of the block it was cut from
  EXPECT_EQ(high->owner, &t.pool);
  EXPECT_EQ(t.whole->next, high);
  EXPECT_NO_THROW(blocks::check(t.s));

  sim_block* low = blocks::cut_low(t.slab, t.whole, 0x100000 + KiB);
  EXPECT_EQ(t.s.head, low);  // the new low piece is the head now
  EXPECT_EQ(low->size, KiB);
  EXPECT_EQ(t.whole->ptr, 0x100000 + KiB);
  EXPECT_EQ(t.whole->size, 2 * KiB);
  EXPECT_EQ(low->next, t.whole);
  EXPECT_EQ(t.whole->prev, low);
  EXPECT_NO_THROW(blocks::check(t.s));
}

TEST(BlockList, JoinsNeighboursOnEitherSide) {
  one_segment t;
  sim_block* mid = blocks::cut(t.slab, t.whole, 0x100000 + 2 * KiB);
  sim_block* high = blocks::cut(t.slab, mid, 0x100000 + 6 * KiB);
  sim_block* low = t.whole;
  EXPECT_EQ(blocks::join(mid, high), 2 * KiB);  // the block after
  EXPECT_EQ(mid->next, nullptr);
  EXPECT_EQ(mid->size, 6 * KiB);
  EXPECT_EQ(blocks::join(mid, low), 2 * KiB);  // the block before: mid is the head now
  EXPECT_EQ(t.s.head, mid);
  EXPECT_EQ(mid->ptr, 0x100000u);
  EXPECT_EQ(mid->size, 8 * KiB);
  EXPECT_EQ(low->prev, nullptr);  // unlinked, for the caller to destroy
  EXPECT_EQ(low->next, nullptr);
  EXPECT_NO_THROW(blocks::check(t.s));
}

TEST(BlockList, CheckNamesTheFirstBreak) {
  one_segment t;
  sim_block* high = blocks::cut(t.slab, t.whole, 0x100000 + 4 * KiB);
  high->ptr += 512;  // a gap
  try {
    blocks::check(t.s);
    ADD_FAILURE() << "a gap passed the check";
  } catch (const std::logic_error& e) {
    EXPECT_STREQ(e.what(),
                 "gpumem invariant violated: gap or overlap at 0x101200 in segment 0x100000");
  }
  high->ptr -= 512;
  high->prev = nullptr;
  EXPECT_THROW(blocks::check(t.s), std::logic_error);  // broken back link
  high->prev = t.whole;
  t.s.size += 512;
  EXPECT_THROW(blocks::check(t.s), std::logic_error);  // the last block ends short
  t.s.size -= 512;
  sim_pool other;
  high->owner = &other;
  EXPECT_THROW(blocks::check(t.s), std::logic_error);  // another pool's block
  high->owner = &t.pool;
  EXPECT_NO_THROW(blocks::check(t.s));
}

// The allocator cuts and joins through the component: after splits, frees and merges under each
// policy the blocks still tile their segments (allocator_invariants calls the check).
TEST(BlockList, AllocatorSegmentsStayTiled) {
  for_each_policy([](allocator& a, gpumem::simulated_device& dev, const std::string& policy) {
    void* x = a.allocate(3 * MiB, dev.default_stream());
    void* y = a.allocate(5 * MiB, dev.default_stream());
    void* z = a.allocate(3 * MiB, dev.default_stream());
    a.deallocate(y);
    a.deallocate(x);
    EXPECT_NO_THROW(a.check_invariants()) << policy;
    a.deallocate(z);
    EXPECT_NO_THROW(a.check_invariants()) << policy;
    a.empty_cache();
    EXPECT_NO_THROW(a.check_invariants()) << policy;
  });
}

}  // namespace
