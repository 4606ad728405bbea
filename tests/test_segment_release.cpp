// What giving memory back frees, per policy (core/detail/segment_release.hpp): PyTorch's choices
// of cached segments to return, and the invariant the component checks for allocator_invariants.

#include "gpumem/core/detail/segment_release.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <vector>

#include "support/components.hpp"

namespace {

using gpumem::allocator_policy;
using gpumem::detail::policy_rules;
using gpumem::detail::segment_release;
using namespace gpumem_test;

constexpr std::size_t no_limit = std::numeric_limits<std::size_t>::max();

// Free blocks in one pool's index, each the whole of its own segment unless split() is asked.
struct cached {
  sim_pool pool;
  std::vector<std::unique_ptr<sim_segment>> segments;
  std::vector<std::unique_ptr<sim_block>> blocks;
  sim_block neighbour;  // the allocated rest of a split segment

  sim_block* add(std::size_t size, std::uint64_t gc_base = 0) {
    segments.push_back(std::make_unique<sim_segment>());
    sim_segment* s = segments.back().get();
    s->ptr = 0x10000000 * segments.size();
    s->size = size;
    blocks.push_back(std::make_unique<sim_block>(s->ptr, size, &pool, s));
    sim_block* b = blocks.back().get();
    b->gc_count_base = gc_base;
    s->head = b;
    pool.index.insert(b);
    return b;
  }
  void split(sim_block* b) { b->next = &neighbour; }
  ~cached() {
    for (auto& b : blocks) pool.index.erase(b.get());
  }
};

std::vector<sim_block*> oversize(const cached& c, std::size_t rounded, std::size_t max_split,
                                 bool& enough) {
  return segment_release::oversize_blocks<sim_block>(c.pool, rounded, max_split, enough);
}

TEST(SegmentRelease, PolicyDecidesHowMemoryGoesBack) {
  EXPECT_FALSE(segment_release(policy_rules::of(allocator_policy::classic)).unmaps_pages());
  EXPECT_TRUE(segment_release(policy_rules::of(allocator_policy::expandable)).unmaps_pages());
  EXPECT_TRUE(segment_release(policy_rules::of(allocator_policy::stitch)).unmaps_pages());
}

TEST(SegmentRelease, WholeBlocksLeaveSplitSegments) {
  cached c;
  sim_block* a = c.add(20 * MiB);
  sim_block* b = c.add(2 * MiB);
  c.split(c.add(4 * MiB));
  const auto whole = segment_release::whole_blocks<sim_block>([&](auto&& visit) { visit(c.pool); });
  EXPECT_EQ(whole, (std::vector<sim_block*>{b, a}));  // smallest first, the split one left
}

TEST(SegmentRelease, OversizeTakesTheSmallestThatCovers) {
  cached c;
  c.add(30 * MiB);
  sim_block* fit = c.add(24 * MiB);
  c.add(10 * MiB);
  bool enough = false;
  EXPECT_TRUE(oversize(c, 21 * MiB, no_limit, enough).empty());  // max_split_size unset
  EXPECT_FALSE(enough);
  EXPECT_EQ(oversize(c, 21 * MiB, 20 * MiB, enough), std::vector<sim_block*>{fit});
  EXPECT_TRUE(enough);
  // A request below max_split_size looks for a block of at least max_split_size.
  EXPECT_EQ(oversize(c, 2 * MiB, 20 * MiB, enough), std::vector<sim_block*>{fit});
}

TEST(SegmentRelease, OversizeElseTheLargestUntilEnough) {
  cached c;
  sim_block* large = c.add(30 * MiB);
  sim_block* next = c.add(24 * MiB);
  c.add(22 * MiB);
  c.add(10 * MiB);  // not oversize: never chosen
  bool enough = false;
  EXPECT_EQ(oversize(c, 50 * MiB, 20 * MiB, enough), (std::vector<sim_block*>{large, next}));
  EXPECT_TRUE(enough);
  c.split(next);  // a split block is passed over
  const auto chosen = oversize(c, 80 * MiB, 20 * MiB, enough);
  EXPECT_EQ(chosen.size(), 2u);  // 30 + 22 MiB: not enough, released all the same
  EXPECT_FALSE(enough);
}

TEST(SegmentRelease, GarbageIsTheOldestRoundAfterRound) {
  cached c;
  sim_block* old = c.add(20 * MiB, 0);     // age 100
  sim_block* mid = c.add(20 * MiB, 50);    // age 50
  sim_block* young = c.add(20 * MiB, 90);  // age 10
  const std::vector<sim_block*> all{old, mid, young};
  // Average age 53.3: only the oldest, which reclaims enough.
  EXPECT_EQ(segment_release::garbage(all, 100, 20 * MiB), std::vector<sim_block*>{old});
  // More to reclaim: a second round over the two left (average 30) takes the middle one.
  EXPECT_EQ(segment_release::garbage(all, 100, 30 * MiB), (std::vector<sim_block*>{old, mid}));
  EXPECT_TRUE(segment_release::garbage(std::vector<sim_block*>{}, 100, GiB).empty());
}

TEST(SegmentRelease, ChecksTheKindOfSegment) {
  const segment_release classic(policy_rules::of(allocator_policy::classic));
  const segment_release stitch(policy_rules::of(allocator_policy::stitch));
  sim_segment s;
  EXPECT_NO_THROW(classic.check(s));
  EXPECT_THROW(stitch.check(s), std::logic_error);
  s.page_size = 2 * MiB;
  EXPECT_THROW(classic.check(s), std::logic_error);
  EXPECT_NO_THROW(stitch.check(s));
}

// The allocator releases what the component chooses: empty_cache returns every whole cached
// segment and keeps a split one that holds an allocation, under each policy's release path.
TEST(SegmentRelease, AllocatorGivesBackWhatItChose) {
  for_each_policy([](allocator& a, gpumem::simulated_device& dev, const std::string& policy) {
    void* keep = a.allocate(2 * MiB, dev.default_stream());
    void* other = a.allocate(2 * MiB, dev.default_stream());
    void* big = a.allocate(100 * MiB, dev.default_stream());
    a.deallocate(other);
    a.deallocate(big);
    a.empty_cache();
    EXPECT_NO_THROW(a.check_invariants()) << policy;
    EXPECT_LT(reserved(a), 100 * std::int64_t{MiB}) << policy;
    EXPECT_GE(reserved(a), 2 * std::int64_t{MiB}) << policy;
    a.deallocate(keep);
    a.empty_cache();
    EXPECT_EQ(reserved(a), 0) << policy;
  });
}

}  // namespace
