// What expandable and stitch decide on a miss (core/detail/vmm_growth.hpp), and the invariants
// the component checks for allocator_invariants.

#include "gpumem/core/detail/vmm_growth.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>

#include "gpumem/core/detail/block.hpp"
#include "gpumem/core/detail/pools.hpp"
#include "support/sim.hpp"

namespace {

using gpumem::allocator_policy;
using gpumem::simulated_device;
using gpumem::detail::policy_rules;
using gpumem::detail::stitch_policy;
using gpumem::detail::vmm_growth;
using namespace gpumem_test;

using stream_type = gpumem::simulated_device::stream_type;
using segment_type = gpumem::detail::segment<stream_type>;
using pool_type = gpumem::detail::pool<stream_type>;

constexpr std::size_t granularity = 2 * MiB;

vmm_growth growth_of(allocator_policy policy, const std::string& text = "") {
  return vmm_growth(policy_rules::of(policy), config(text), granularity);
}

TEST(VmmGrowth, ExpandableIsPyTorchsExpandableSegments) {
  const vmm_growth g = growth_of(allocator_policy::expandable, "large_segment_size_mb:41");
  EXPECT_EQ(g.page_size(true), 2 * MiB);
  EXPECT_EQ(g.page_size(false), 42 * MiB);  // large_segment_size, rounded up to the granularity
  // 9/8 of the device per range, in whole pages, whatever the pool already holds or needs.
  EXPECT_EQ(g.range_size(42 * MiB, 0, 2 * MiB, 8 * GiB), 9 * GiB + 24 * MiB);
  EXPECT_EQ(g.range_size(2 * MiB, 5 * GiB, 2 * MiB, 8 * GiB), 9 * GiB);
  EXPECT_EQ(g.range_size(2 * MiB, 0, 2 * MiB, std::numeric_limits<std::size_t>::max()), 0u);
  EXPECT_EQ(g.smaller_range_size(9 * GiB, 2 * MiB), 0u);  // all or nothing
  EXPECT_FALSE(g.pools_by_class());                       // one large pool per stream
  EXPECT_FALSE(g.borrows(false));
  EXPECT_FALSE(g.weighs_new_range());
  EXPECT_FALSE(g.shares_free_pages());
  EXPECT_EQ(g.pages_to_create(0, 0, 0, 2 * MiB, 7), 7u);  // every page is new
}

TEST(VmmGrowth, StitchFollowsStitchPolicy) {
  vmm_growth g = growth_of(allocator_policy::stitch, "stitch_settled_allocations:10");
  EXPECT_EQ(g.page_size(true), granularity);
  EXPECT_EQ(g.page_size(false), granularity);
  EXPECT_EQ(g.range_size(granularity, 3 * GiB, 4 * MiB, 8 * GiB),
            stitch_policy::range_size(3 * GiB, 4 * MiB, granularity, 8 * GiB));
  EXPECT_EQ(g.smaller_range_size(GiB, 4 * MiB), 4 * MiB);
  EXPECT_EQ(g.smaller_range_size(4 * MiB, 4 * MiB), 0u);
  EXPECT_TRUE(g.pools_by_class());
  EXPECT_TRUE(g.borrows(false));
  EXPECT_FALSE(g.borrows(true));  // the small pool has no size classes
  EXPECT_TRUE(g.weighs_new_range());
  EXPECT_TRUE(g.shares_free_pages());
  // No high-water mark yet: no room under the headroom, every page is shared first.
  EXPECT_EQ(g.pages_to_create(0, 0, 0, granularity, 4), 0u);
  g.note_request(100 * MiB, 0);
  EXPECT_EQ(g.pages_to_create(0, 0, 0, granularity, 4), 4u);
  EXPECT_EQ(g.pages_to_create(100 * MiB, 0, 0, granularity, 4), 0u);  // no headroom by default
  EXPECT_FALSE(g.counts_settled_miss(9));
  EXPECT_TRUE(g.counts_settled_miss(10));  // the mark unchanged for stitch_settled_allocations
  // Placement by the step before finds a repeating miss's block: no range of its own.
  EXPECT_FALSE(g.shares_in_own_range(50 * MiB, 10));
}

// Without placement by the step before, a settled miss beyond what the recurring rule could create
// pages for shares them in an address range of its own.
TEST(VmmGrowth, StitchWithoutPlacementSharesLargeSettledMissesInRangesOfTheirOwn) {
  vmm_growth g = growth_of(allocator_policy::stitch,
                           "stitch_settled_allocations:10,stitch_step_match:0,"
                           "stitch_recurring_limit:0.2");
  g.note_request(100 * MiB, 0);
  EXPECT_FALSE(g.shares_in_own_range(50 * MiB, 9));  // not settled yet
  EXPECT_TRUE(g.shares_in_own_range(50 * MiB, 10));
  EXPECT_FALSE(g.shares_in_own_range(20 * MiB, 10));  // within the recurring bound
}

TEST(VmmGrowth, ExpandableIgnoresStitchsHighWaterMark) {
  vmm_growth g = growth_of(allocator_policy::expandable, "stitch_settled_allocations:10");
  g.note_request(100 * MiB, 0);
  EXPECT_FALSE(g.counts_settled_miss(1000));
}

TEST(VmmGrowth, ChecksARangesPageSizeAndSharing) {
  pool_type large;
  segment_type s;
  s.owner = &large;
  s.page_size = 20 * MiB;
  const vmm_growth expandable = growth_of(allocator_policy::expandable);
  EXPECT_NO_THROW(expandable.check(s));
  s.shared_pages = 1;
  EXPECT_THROW(expandable.check(s), std::logic_error);  // expandable never shares a page
  const vmm_growth stitch = growth_of(allocator_policy::stitch);
  EXPECT_THROW(stitch.check(s), std::logic_error);  // stitch's pages are the granularity
  s.page_size = granularity;
  EXPECT_NO_THROW(stitch.check(s));
  try {
    expandable.check(s);
    ADD_FAILURE() << "a range of stitch's pages passed expandable's check";
  } catch (const std::logic_error& e) {
    EXPECT_STREQ(e.what(),
                 "gpumem invariant violated: range 0x0 has pages of 2097152 B, its pool's "
                 "policy 20971520 B");
  }
}

TEST(VmmGrowth, ChecksSizeClassStateInPools) {
  const vmm_growth expandable = growth_of(allocator_policy::expandable);
  const vmm_growth stitch = growth_of(allocator_policy::stitch);
  pool_type p;
  EXPECT_NO_THROW(expandable.check_pool(p));
  p.settled_misses = 1;
  EXPECT_THROW(expandable.check_pool(p), std::logic_error);
  EXPECT_NO_THROW(stitch.check_pool(p));
  p.settled_misses = 0;
  p.has_freed = true;
  EXPECT_THROW(expandable.check_pool(p), std::logic_error);
  EXPECT_NO_THROW(stitch.check_pool(p));
  p.is_small = true;  // stitch's small pool never borrows
  EXPECT_THROW(stitch.check_pool(p), std::logic_error);
}

// The allocator hands its growth component to the checker: ranges made under each VMM policy pass.
TEST(VmmGrowth, AllocatorRangesFollowTheirPolicy) {
  for (const char* policy : {"policy:expandable", "policy:stitch"}) {
    simulated_device dev{device_options(GiB)};
    allocator a(dev, config(policy));
    void* small = a.allocate(1000, dev.default_stream());
    void* large = a.allocate(30 * MiB, dev.default_stream());
    a.deallocate(small);
    EXPECT_NO_THROW(a.check_invariants()) << policy;
    a.deallocate(large);
    EXPECT_NO_THROW(a.check_invariants()) << policy;
  }
}

}  // namespace
