// When a block is split and how split segments count in inactive_split
// (core/detail/split_rules.hpp), and the invariant the component checks for allocator_invariants.

#include "gpumem/core/detail/split_rules.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "support/components.hpp"

namespace {

using gpumem::allocator_policy;
using gpumem::detail::inactive_split_change;
using gpumem::detail::policy_rules;
using gpumem::detail::split_rules;
using namespace gpumem_test;

constexpr std::size_t no_limit = ~std::size_t{0};

split_rules rules_of(allocator_policy policy) {
  return split_rules(policy_rules::of(policy));
}

void expect_change(inactive_split_change c, std::int64_t blocks, std::int64_t bytes) {
  EXPECT_EQ(c.blocks, blocks);
  EXPECT_EQ(c.bytes, bytes);
}

TEST(SplitRules, ClassicIsPyTorchsShouldSplit) {
  const split_rules r = rules_of(allocator_policy::classic);
  EXPECT_TRUE(r.splits(2 * MiB, 2 * MiB - 512, true, no_limit));  // small: 512 B remain
  EXPECT_FALSE(r.splits(2 * MiB, 2 * MiB - 256, true, no_limit));
  EXPECT_FALSE(r.splits(20 * MiB, 19 * MiB, false, no_limit));  // large: 1 MiB is not above 1 MiB
  EXPECT_TRUE(r.splits(20 * MiB, 19 * MiB - 512, false, no_limit));
  EXPECT_FALSE(r.splits(40 * MiB, 20 * MiB, false, 20 * MiB));  // an oversize request: never
  EXPECT_TRUE(r.allows_no_split());
  EXPECT_TRUE(r.counts_inactive_split());
}

TEST(SplitRules, VmmPoliciesKeepAnyRemainderOf512Bytes) {
  for (allocator_policy p : {allocator_policy::expandable, allocator_policy::stitch}) {
    const split_rules r = rules_of(p);
    EXPECT_TRUE(r.splits(20 * MiB, 20 * MiB - 512, false, no_limit));
    EXPECT_FALSE(r.splits(20 * MiB, 20 * MiB - 256, false, no_limit));
    EXPECT_TRUE(r.splits(40 * MiB, 20 * MiB, false, 20 * MiB));  // max_split_size does not matter
    EXPECT_FALSE(r.counts_inactive_split());
  }
  EXPECT_TRUE(rules_of(allocator_policy::expandable).allows_no_split());
  EXPECT_FALSE(rules_of(allocator_policy::stitch).allows_no_split());
}

TEST(SplitRules, ClassicCountsFreeBlocksOfSplitSegments) {
  const split_rules r = rules_of(allocator_policy::classic);
  expect_change(r.on_split(false, 3 * MiB, 17 * MiB), 1, 17 * MiB);  // the remainder is inactive
  expect_change(r.on_split(true, 3 * MiB, 14 * MiB), 0, -3 * std::int64_t{MiB});
  expect_change(r.on_take_whole(true, 2 * MiB), -1, -2 * std::int64_t{MiB});
  expect_change(r.on_take_whole(false, 2 * MiB), 0, 0);
  // Freed, merged with two free neighbours of 5 MiB in all, in a segment still split.
  expect_change(r.on_free(2, 5 * MiB, true, 8 * MiB), -1, 3 * MiB);
  // Merged into the whole segment again: nothing of it is inactive any more.
  expect_change(r.on_free(1, 17 * MiB, false, 20 * MiB), -1, -17 * std::int64_t{MiB});
  expect_change(r.on_cut(3, false, 20 * MiB), 3, 20 * MiB);
  expect_change(r.on_cut(2, true, 6 * MiB), 1, 0);
  expect_change(r.on_cut(1, false, 6 * MiB), 0, 0);
}

TEST(SplitRules, VmmPoliciesCountNothing) {
  const split_rules r = rules_of(allocator_policy::stitch);
  expect_change(r.on_split(false, 3 * MiB, 17 * MiB), 0, 0);
  expect_change(r.on_take_whole(true, 2 * MiB), 0, 0);
  expect_change(r.on_free(2, 5 * MiB, true, 8 * MiB), 0, 0);
  expect_change(r.on_cut(3, false, 20 * MiB), 0, 0);
}

TEST(SplitRules, ChecksNoBlockIsASliver) {
  sim_segment s;
  sim_block low(0x1000, 512, nullptr, &s);
  sim_block high(0x1200, 1024, nullptr, &s);
  s.ptr = 0x1000;
  s.size = 1536;
  s.head = &low;
  low.next = &high;
  high.prev = &low;
  EXPECT_NO_THROW(split_rules::check(s));
  low.size = 256;
  high.ptr = 0x1100;
  high.size = 1280;
  EXPECT_THROW(split_rules::check(s), std::logic_error);
}

// The allocator follows the rules it is given: the inactive_split counters it keeps equal the
// checker's recount under each policy, and stitch refuses no_split.
TEST(SplitRules, AllocatorCountsWhatTheRulesSay) {
  for_each_policy([](allocator& a, gpumem::simulated_device& dev, const std::string& policy) {
    void* x = a.allocate(3 * MiB, dev.default_stream());
    void* y = a.allocate(3 * MiB, dev.default_stream());
    void* z = a.allocate(1000, dev.default_stream());
    a.deallocate(x);
    EXPECT_NO_THROW(a.check_invariants()) << policy;
    const std::int64_t inactive = a.stats().inactive_split[0].current;
    EXPECT_EQ(inactive > 0, policy == "policy:classic") << policy;
    a.deallocate(y);
    a.deallocate(z);
    EXPECT_NO_THROW(a.check_invariants()) << policy;
    if (policy == "policy:stitch") {
      EXPECT_THROW(a.set_no_split(true), gpumem::usage_error);
    } else {
      EXPECT_NO_THROW(a.set_no_split(true)) << policy;
    }
  });
}

}  // namespace
