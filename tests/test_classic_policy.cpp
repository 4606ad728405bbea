// One test per rule of the classic policy (PyTorch's native CUDACachingAllocator semantics).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "support/sim.hpp"

namespace {

using namespace gpumem_test;
using gpumem::simulated_device;
namespace d = gpumem::detail;

std::uintptr_t addr(void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

struct ClassicPolicy : ::testing::Test {
  simulated_device dev{device_options(8 * GiB)};
};

// --- rounding ------------------------------------------------------------------------------------

TEST(RoundingTable, RequestsRoundTo512Bytes) {
  EXPECT_EQ(d::round_size(0, 0), 512u);
  EXPECT_EQ(d::round_size(1, 0), 512u);
  EXPECT_EQ(d::round_size(512, 0), 512u);
  EXPECT_EQ(d::round_size(513, 0), 1024u);
  EXPECT_EQ(d::round_size(1200, 0), 1536u);
  EXPECT_EQ(d::round_size(1200, 1), 1536u);  // 1 division = off
  EXPECT_EQ(d::round_size(10 * MiB + 1, 0), 10 * MiB + 512);
}

TEST(RoundingTable, PowerOfTwoDivisionStepIsThePowerIntervalOverDivisions) {
  // The division arithmetic: 1200 lies in [1024, 2048); 4 steps of 256 -> 1280.
  EXPECT_EQ(d::roundup_power2_next_division(1200, 4), 1280u);
  EXPECT_EQ(d::roundup_power2_next_division(1024, 4), 1024u);
  EXPECT_EQ(d::roundup_power2_next_division(3000, 4), 3072u);
  EXPECT_EQ(d::roundup_power2_next_division(5000, 4), 5120u);
  EXPECT_EQ(d::roundup_power2_next_division(5120, 4), 5120u);
  EXPECT_EQ(d::roundup_power2_next_division(100 * MiB + 1, 8), 104 * MiB);
}

TEST(RoundingTable, DivisionsApplyOnlyAbove512BytesTimesDivisionsAsInPyTorchsCode) {
  // PyTorch's round_size uses divisions only when size > 512 * divisions; below, 512 B granules.
  EXPECT_EQ(d::round_size(1200, 4), 1536u);
  EXPECT_EQ(d::round_size(2048, 4), 2048u);
  EXPECT_EQ(d::round_size(2049, 4), 2560u);
  EXPECT_EQ(d::round_size(3000, 4), 3072u);
  EXPECT_EQ(d::round_size(1200, 2), 1536u);  // 1200 > 1024: [1024, 2048) in 2 steps -> 1536
  EXPECT_EQ(d::round_size(5 * MiB + 1, 4), 6 * MiB);
}

TEST_F(ClassicPolicy, RoundingTableFromConfigListForm) {
  allocator a(dev, config("roundup_power2_divisions:[64:8,256:4,>:1]"));
  void* p = a.allocate(100 * MiB + 1);  // [64 MiB, 128 MiB): 8 divisions -> 104 MiB
  EXPECT_EQ(allocated(a), static_cast<std::int64_t>(104 * MiB));
  EXPECT_EQ(a.stats().requested_bytes[0].current, static_cast<std::int64_t>(100 * MiB + 1));
  a.deallocate(p);
  void* q = a.allocate(300 * MiB + 1);  // [256 MiB, 512 MiB): 4 divisions -> 320 MiB
  EXPECT_EQ(allocated(a), static_cast<std::int64_t>(320 * MiB));
  a.deallocate(q);
  void* r = a.allocate(600 * MiB + 1);  // [512 MiB, 1 GiB): '>' gave 1 -> 512 B granules
  EXPECT_EQ(allocated(a), static_cast<std::int64_t>(600 * MiB + 512));
  a.deallocate(r);
  a.check_invariants();
}

// --- pools and segment sizes --------------------------------------------------------------------

TEST_F(ClassicPolicy, PoolChoiceSmallPoolUpTo1MiB) {
  allocator a(dev, config());
  void* p = a.allocate(1 * MiB);
  auto s = a.stats();
  EXPECT_EQ(s.allocation[1].current, 1);  // small pool
  EXPECT_EQ(s.reserved_bytes[1].current, static_cast<std::int64_t>(2 * MiB));
  void* q = a.allocate(1 * MiB + 1);
  s = a.stats();
  EXPECT_EQ(s.allocation[2].current, 1);  // large pool
  EXPECT_EQ(s.reserved_bytes[2].current, static_cast<std::int64_t>(20 * MiB));
  a.deallocate(p);
  a.deallocate(q);
  a.check_invariants();
}

TEST_F(ClassicPolicy, SegmentSizesSmallRequestsPackIn2MiBSegments) {
  allocator a(dev, config());
  std::vector<void*> ptrs;
  for (int i = 0; i < 4; ++i) ptrs.push_back(a.allocate(512 * KiB));
  EXPECT_EQ(a.stats().segment[0].current, 1);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(2 * MiB));
  ptrs.push_back(a.allocate(512));
  EXPECT_EQ(a.stats().segment[0].current, 2);
  for (void* p : ptrs) a.deallocate(p);
  a.check_invariants();
}

TEST_F(ClassicPolicy, SegmentSizesRequestsBelow10MiBTake20MiBSegments) {
  allocator a(dev, config());
  void* p = a.allocate(5 * MiB);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(20 * MiB));
  void* q = a.allocate(5 * MiB);  // carved from the same segment
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(addr(q), addr(p) + 5 * MiB);
  void* r = a.allocate(10 * MiB - 512);  // still below 10 MiB but only 10 MiB left: fits exactly
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(20 * MiB));
  for (void* x : {p, q, r}) a.deallocate(x);
  a.check_invariants();
}

TEST_F(ClassicPolicy, SegmentSizesLargerRequestsRoundTo2MiB) {
  allocator a(dev, config());
  void* p = a.allocate(10 * MiB);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(10 * MiB));
  void* q = a.allocate(11 * MiB + 1);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(10 * MiB + 12 * MiB));
  EXPECT_EQ(d::segment_size_for(1 * MiB), 2 * MiB);
  EXPECT_EQ(d::segment_size_for(1 * MiB + 512), 20 * MiB);
  EXPECT_EQ(d::segment_size_for(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(d::segment_size_for(10 * MiB), 10 * MiB);
  EXPECT_EQ(d::segment_size_for(13 * MiB + 512), 14 * MiB);
  a.deallocate(p);
  a.deallocate(q);
}

// --- best fit and streams -----------------------------------------------------------------------

TEST_F(ClassicPolicy, BestFitTakesTheSmallestBlockThatFits) {
  allocator a(dev, config());
  void* p12 = a.allocate(12 * MiB);
  void* p16 = a.allocate(16 * MiB);
  void* p14 = a.allocate(14 * MiB);
  for (void* p : {p12, p16, p14}) a.deallocate(p);
  const auto before = a.stats().num_device_alloc;
  void* got = a.allocate(13 * MiB);
  EXPECT_EQ(got, p14);
  EXPECT_EQ(a.stats().num_device_alloc, before);
  a.deallocate(got);
  a.check_invariants();
}

TEST_F(ClassicPolicy, BestFitBreaksTiesByLowestAddress) {
  allocator a(dev, config());
  void* x = a.allocate(12 * MiB);
  void* y = a.allocate(12 * MiB);
  a.deallocate(y);
  a.deallocate(x);
  void* got = a.allocate(12 * MiB);
  EXPECT_EQ(addr(got), std::min(addr(x), addr(y)));
  a.deallocate(got);
}

TEST_F(ClassicPolicy, StreamSeparatedReuse) {
  allocator a(dev, config());
  const auto s2 = dev.create_stream();
  void* p = a.allocate(12 * MiB);
  a.deallocate(p);
  void* q = a.allocate(12 * MiB, s2);  // the cached block belongs to the default stream
  EXPECT_NE(q, p);
  EXPECT_EQ(a.stats().num_device_alloc, 2);
  void* r = a.allocate(12 * MiB);  // the default stream reuses its own block
  EXPECT_EQ(r, p);
  a.deallocate(q);
  a.deallocate(r);
  a.check_invariants();
}

// --- split thresholds ---------------------------------------------------------------------------

TEST_F(ClassicPolicy, SplitThresholdSmallPoolKeepsRemaindersOf512Bytes) {
  allocator a(dev, config());
  void* p = a.allocate(1 * MiB);
  void* q = a.allocate(1 * MiB - 512);  // leaves exactly 512 B: split (>= 512)
  EXPECT_EQ(allocated(a), static_cast<std::int64_t>(2 * MiB - 512));
  EXPECT_EQ(a.stats().inactive_split_bytes[0].current, 512);
  void* r = a.allocate(512);
  EXPECT_EQ(addr(r), addr(q) + 1 * MiB - 512);
  EXPECT_EQ(a.stats().segment[0].current, 1);
  for (void* x : {p, q, r}) a.deallocate(x);
  a.check_invariants();
}

TEST_F(ClassicPolicy, SplitThresholdLargePoolOnlyWhenRemainderAbove1MiB) {
  allocator a(dev, config());
  void* p = a.allocate(19 * MiB);  // 20 MiB segment, 1 MiB remainder: not > 1 MiB, no split
  EXPECT_EQ(allocated(a), static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(a.stats().inactive_split[0].current, 0);
  a.deallocate(p);
  void* q = a.allocate(19 * MiB - 512);  // 1 MiB + 512 remainder: split
  EXPECT_EQ(allocated(a), static_cast<std::int64_t>(19 * MiB - 512));
  EXPECT_EQ(a.stats().inactive_split_bytes[0].current, static_cast<std::int64_t>(1 * MiB + 512));
  a.deallocate(q);
  a.check_invariants();
}

TEST_F(ClassicPolicy, SplitThresholdNoSplitAtOrAboveMaxSplitSize) {
  allocator a(dev, config("max_split_size_mb:40"));
  void* p = a.allocate(50 * MiB);
  a.deallocate(p);
  void* q = a.allocate(45 * MiB);  // oversize request, waste 5 MiB < 20 MiB: takes it whole
  EXPECT_EQ(q, p);
  EXPECT_EQ(allocated(a), static_cast<std::int64_t>(50 * MiB));
  EXPECT_EQ(a.stats().inactive_split[0].current, 0);
  EXPECT_EQ(a.stats().oversize_allocations.current, 1);
  EXPECT_EQ(a.stats().oversize_segments.current, 1);
  a.deallocate(q);
  a.check_invariants();
}

// --- oversize rules -----------------------------------------------------------------------------

TEST_F(ClassicPolicy, OversizeSmallRequestNeverTakesAnOversizeBlock) {
  allocator a(dev, config("max_split_size_mb:40"));
  void* big = a.allocate(50 * MiB);
  a.deallocate(big);
  void* p = a.allocate(30 * MiB);  // below max_split_size: refuses the cached 50 MiB block
  EXPECT_NE(p, big);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(80 * MiB));
  a.deallocate(p);
  a.check_invariants();
}

TEST_F(ClassicPolicy, OversizeRequestTakesCachedBlockOnlyIfWasteBelowMaxNonSplitRounding) {
  allocator a(dev, config("max_split_size_mb:40"));
  void* big = a.allocate(80 * MiB);
  a.deallocate(big);
  void* p = a.allocate(60 * MiB);  // waste exactly 20 MiB: refused
  EXPECT_NE(p, big);
  a.deallocate(p);
  void* q = a.allocate(61 * MiB);  // waste 19 MiB: taken
  EXPECT_EQ(q, big);
  a.deallocate(q);
  a.check_invariants();
}

TEST_F(ClassicPolicy, OversizeMaxNonSplitRoundingIsConfigurable) {
  allocator a(dev, config("max_split_size_mb:40,max_non_split_rounding_mb:50"));
  void* big = a.allocate(80 * MiB);
  a.deallocate(big);
  void* p = a.allocate(60 * MiB);
  EXPECT_EQ(p, big);
  a.deallocate(p);
}

// --- memory fraction and garbage collection ------------------------------------------------------

TEST_F(ClassicPolicy, FractionCapsReservedBytes) {
  allocator a(dev, config("per_process_memory_fraction:0.25"));  // 2 GiB of 8 GiB
  void* p = a.allocate(1536 * MiB);
  EXPECT_THROW(a.allocate(1 * GiB), gpumem::out_of_memory);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(1536 * MiB));
  a.set_memory_fraction(0.5);
  void* q = a.allocate(1 * GiB);
  EXPECT_DOUBLE_EQ(a.memory_fraction(), 0.5);
  EXPECT_THROW(a.set_memory_fraction(1.5), std::invalid_argument);
  a.deallocate(p);
  a.deallocate(q);
  a.check_invariants();
}

TEST_F(ClassicPolicy, GcSelectionOrderFreesBlocksAtLeastAverageAgeFirst) {
  simulated_device small{device_options(1000 * MiB)};
  allocator a(small, config("garbage_collection_threshold:0.5"));
  a.set_memory_fraction(0.999);  // a cap enables garbage collection (1 removes it, as in PyTorch)
  const auto clock_stream = small.create_stream();
  auto tick = [&](int n) {  // each lookup in the large pool ages cached large blocks by one
    for (int i = 0; i < n; ++i) a.deallocate(a.allocate(12 * MiB, clock_stream));
  };
  tick(1);  // the clock's own 12 MiB segment, before the cache grows past the threshold
  void* pa = a.allocate(200 * MiB);
  void* pb = a.allocate(200 * MiB);
  void* pc = a.allocate(200 * MiB);
  a.deallocate(pa);
  tick(10);
  a.deallocate(pb);
  tick(10);
  a.deallocate(pc);
  tick(2);
  // reserved = 612 MiB > 500 MiB threshold: the next miss collects A and B (age >= mean), not C.
  const auto frees_before = a.stats().num_device_free;
  void* big = a.allocate(250 * MiB);
  EXPECT_EQ(a.stats().num_device_free - frees_before, 2);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>((12 + 200 + 250) * MiB));
  void* again = a.allocate(200 * MiB);
  EXPECT_EQ(again, pc);  // the youngest block survived
  a.deallocate(big);
  a.deallocate(again);
  a.check_invariants();
}

TEST_F(ClassicPolicy, GcOnlyWithAMemoryFraction) {
  simulated_device small{device_options(1000 * MiB)};
  allocator a(small, config("garbage_collection_threshold:0.5"));
  void* pa = a.allocate(300 * MiB);
  void* pb = a.allocate(300 * MiB);
  a.deallocate(pa);
  void* big = a.allocate(350 * MiB);
  EXPECT_EQ(a.stats().num_device_free, 0);
  a.deallocate(pb);
  a.deallocate(big);
}

// --- settings changed at run time (set_run_time_settings) -------------------------------------

// Reserved, allocated and split-block counts after each step of a sequence that rounds, splits,
// refuses oversize blocks and takes them whole.
std::vector<std::int64_t> decisions(allocator& a) {
  std::vector<std::int64_t> out;
  auto note = [&] {
    const auto s = a.stats();
    out.insert(out.end(), {s.reserved_bytes[0].current, s.allocated_bytes[0].current,
                           s.inactive_split[0].current, s.num_device_alloc});
  };
  std::vector<void*> live;
  for (std::size_t size : {84 * MiB, 50 * MiB, 1200 * std::size_t{1}, 100 * MiB + 1}) {
    live.push_back(a.allocate(size));
    note();
  }
  a.deallocate(live[1]);  // a cached 50 MiB block
  for (std::size_t size : {30 * MiB, 45 * MiB, 5 * MiB + 1}) {
    live.push_back(a.allocate(size));
    note();
  }
  for (std::size_t i = 0; i < live.size(); ++i) {
    if (i != 1) a.deallocate(live[i]);
  }
  live.assign({a.allocate(61 * MiB), a.allocate(300 * MiB + 1)});
  note();
  for (void* p : live) a.deallocate(p);
  a.check_invariants();
  return out;
}

TEST(RunTimeSettings, DecisionsAfterAChangeAreThoseOfTheConfigGivenAtConstruction) {
  const std::pair<std::string, std::string> changes[] = {
      {"", "roundup_power2_divisions:4"},
      {"roundup_power2_divisions:4", ""},
      {"", "roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]"},
      {"", "max_split_size_mb:40"},
      {"max_split_size_mb:40", ""},
      {"max_split_size_mb:40", "max_split_size_mb:40,max_non_split_rounding_mb:50"},
      {"", "large_segment_size_mb:40,max_split_size_mb:60"},
  };
  for (const auto& [before, after] : changes) {
    SCOPED_TRACE(before + " -> " + after);
    simulated_device dev1{device_options(8 * GiB)}, dev2{device_options(8 * GiB)},
        dev3{device_options(8 * GiB)};
    allocator changed(dev1, config(before));
    changed.set_run_time_settings(config(after));
    allocator constructed(dev2, config(after));
    allocator unchanged(dev3, config(before));
    const auto expected = decisions(constructed);
    EXPECT_EQ(decisions(changed), expected);
    EXPECT_NE(decisions(unchanged), expected);  // the change matters to the sequence
  }
}

TEST(RunTimeSettings, CachedBlocksStayAndAreJudgedByTheNewValues) {
  simulated_device dev{device_options(8 * GiB)};
  allocator a(dev, config("max_split_size_mb:40"));
  void* big = a.allocate(50 * MiB);
  a.deallocate(big);
  void* p = a.allocate(30 * MiB);  // below max_split_size: the cached oversize block is refused
  EXPECT_NE(p, big);
  a.deallocate(p);
  a.set_run_time_settings(config(""));
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(80 * MiB));  // nothing was released
  void* q = a.allocate(45 * MiB);  // no longer oversize: the 50 MiB block splits
  EXPECT_EQ(q, big);
  EXPECT_EQ(a.stats().inactive_split[0].current, 1);
  // As PyTorch's memory_stats: max_split_size is the value the allocator was made with.
  EXPECT_EQ(a.stats().max_split_size, static_cast<std::int64_t>(40 * MiB));
  a.deallocate(q);
  a.check_invariants();
}

TEST(RunTimeSettings, GarbageCollectionThresholdActsFromTheNextMiss) {
  for (const bool set : {false, true}) {
    SCOPED_TRACE(set);
    simulated_device small{device_options(1000 * MiB)};
    allocator a(small, config());
    a.set_memory_fraction(0.999);
    void* pa = a.allocate(300 * MiB);
    void* pb = a.allocate(300 * MiB);
    a.deallocate(pa);
    if (set) a.set_run_time_settings(config("garbage_collection_threshold:0.5"));
    void* big = a.allocate(350 * MiB);  // 600 MiB reserved > 500 MiB: collected when set
    EXPECT_EQ(a.stats().num_device_free, set ? 1 : 0);
    a.deallocate(pb);
    a.deallocate(big);
  }
}

TEST(RunTimeSettings, OutOfRangeValuesAreRefusedAndChangeNothing) {
  simulated_device dev{device_options(8 * GiB)};
  allocator a(dev, config("roundup_power2_divisions:4"));
  gpumem::allocator_config bad = config();
  bad.max_split_size = 2 * MiB;  // below large_segment_size
  EXPECT_THROW(a.set_run_time_settings(bad), gpumem::config_error);
  void* p = a.allocate(84 * MiB);
  EXPECT_EQ(allocated(a), static_cast<std::int64_t>(96 * MiB));  // still 4 divisions
  a.deallocate(p);
}

// --- retry order on device out-of-memory --------------------------------------------------------

TEST(RetryOrder, FirstFreesOneBigEnoughOversizeBlockThenRetries) {
  simulated_device dev{device_options(200 * MiB)};
  allocator a(dev, config("max_split_size_mb:40"));
  void* p60 = a.allocate(60 * MiB);
  void* p120 = a.allocate(120 * MiB);
  a.deallocate(p60);
  a.deallocate(p120);
  // 100 MiB: the 120 MiB block wastes 20 MiB (refused); the device has 20 MiB left.
  void* p = a.allocate(100 * MiB);
  const auto s = a.stats();
  EXPECT_EQ(s.num_device_free, 1);    // only the 120 MiB block went back
  EXPECT_EQ(s.num_alloc_retries, 0);  // not the free-everything retry
  EXPECT_EQ(s.num_sync_all_streams, 0);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(160 * MiB));
  a.deallocate(p);
  a.check_invariants();
}

TEST(RetryOrder, ThenFreesTheWholeCacheAndRetries) {
  simulated_device dev{device_options(200 * MiB)};
  allocator a(dev, config());
  void* p60 = a.allocate(60 * MiB);
  void* p120 = a.allocate(120 * MiB);
  a.deallocate(p60);
  a.deallocate(p120);
  void* p = a.allocate(150 * MiB);
  const auto s = a.stats();
  EXPECT_EQ(s.num_device_free, 2);
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_sync_all_streams, 1);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(150 * MiB));
  a.deallocate(p);
  a.check_invariants();
}

TEST(RetryOrder, ThenThrowsOutOfMemoryLeavingTheAllocatorConsistent) {
  simulated_device dev{device_options(200 * MiB)};
  allocator a(dev, config());
  void* live = a.allocate(120 * MiB);
  void* cached = a.allocate(60 * MiB);
  a.deallocate(cached);
  EXPECT_THROW(a.allocate(100 * MiB), gpumem::out_of_memory);
  const auto s = a.stats();
  EXPECT_EQ(s.num_ooms, 1);
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(120 * MiB));  // the cache was released
  a.check_invariants();
  a.deallocate(live);
}

// --- record_stream ------------------------------------------------------------------------------

TEST(DeferredReuse, BlockIsReusedOnlyAfterTheOtherStreamsEventsComplete) {
  simulated_device dev{device_options(1 * GiB, gpumem::event_completion::manual)};
  allocator a(dev, config());
  const auto side = dev.create_stream();
  void* p = a.allocate(4 * MiB);
  a.record_stream(p, side);
  a.deallocate(p);
  auto s = a.stats();
  EXPECT_EQ(s.allocation[0].current, 0);
  EXPECT_EQ(s.active[0].current, 1);  // pending until the side stream's event completes
  void* q = a.allocate(4 * MiB);
  EXPECT_NE(q, p);
  a.check_invariants();
  dev.complete_stream(side);
  void* r = a.allocate(4 * MiB);
  EXPECT_EQ(r, p);
  a.deallocate(q);
  a.deallocate(r);
  a.check_invariants();
}

TEST(DeferredReuse, RecordingTheAllocationStreamItselfDefersNothing) {
  simulated_device dev{device_options(1 * GiB, gpumem::event_completion::manual)};
  allocator a(dev, config());
  void* p = a.allocate(4 * MiB);
  a.record_stream(p, dev.default_stream());
  a.deallocate(p);
  EXPECT_EQ(a.allocate(4 * MiB), p);
  EXPECT_EQ(dev.counters().event_record, 0u);
}

TEST(DeferredReuse, EmptyCacheWaitsForPendingEvents) {
  simulated_device dev{device_options(1 * GiB, gpumem::event_completion::manual)};
  allocator a(dev, config());
  const auto side = dev.create_stream();
  void* p = a.allocate(12 * MiB);
  a.record_stream(p, side);
  a.deallocate(p);
  a.empty_cache();
  EXPECT_EQ(reserved(a), 0);
  EXPECT_EQ(a.stats().num_sync_all_streams, 1);
  a.check_invariants();
}

// --- empty_cache and API contracts ---------------------------------------------------------------

TEST_F(ClassicPolicy, EmptyCacheReleasesOnlySegmentsWithoutLiveBlocks) {
  allocator a(dev, config());
  void* x = a.allocate(4 * MiB);
  void* y = a.allocate(4 * MiB);  // same 20 MiB segment
  void* z = a.allocate(12 * MiB);
  a.deallocate(y);
  a.deallocate(z);
  a.empty_cache();
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(20 * MiB));
  a.deallocate(x);
  a.empty_cache();
  EXPECT_EQ(reserved(a), 0);
  EXPECT_EQ(dev.bytes_in_use(), 0u);
  a.check_invariants();
}

TEST_F(ClassicPolicy, ZeroBytesIsNullAndFreeingNullIsANoOp) {
  allocator a(dev, config());
  EXPECT_EQ(a.allocate(0), nullptr);
  a.deallocate(nullptr);
  EXPECT_EQ(a.stats().allocation[0].allocated, 0);
}

TEST_F(ClassicPolicy, DoubleFreeAndForeignPointersAreUsageErrors) {
  allocator a(dev, config());
  void* p = a.allocate(1000);
  a.deallocate(p);
  EXPECT_THROW(a.deallocate(p), gpumem::usage_error);
  int local = 0;
  EXPECT_THROW(a.deallocate(&local), gpumem::usage_error);
  EXPECT_THROW(a.record_stream(&local, dev.default_stream()), gpumem::usage_error);
  a.check_invariants();
}

TEST_F(ClassicPolicy, HugeRequestsAreOutOfMemoryNotOverflow) {
  allocator a(dev, config());
  EXPECT_THROW(a.allocate(SIZE_MAX), gpumem::out_of_memory);
  EXPECT_THROW(a.allocate(SIZE_MAX - 100), gpumem::out_of_memory);
  EXPECT_THROW(a.allocate(100 * GiB), gpumem::out_of_memory);
  a.check_invariants();
}

TEST_F(ClassicPolicy, DestructionReturnsEverySegmentToTheDevice) {
  {
    allocator a(dev, config());
    a.allocate(3 * MiB);
    a.allocate(300);
    a.allocate(100 * MiB);
    EXPECT_GT(dev.bytes_in_use(), 0u);
  }
  EXPECT_EQ(dev.bytes_in_use(), 0u);
}

TEST_F(ClassicPolicy, StatsCountDeviceCallsAndPeaks) {
  allocator a(dev, config());
  void* p = a.allocate(12 * MiB);
  void* q = a.allocate(12 * MiB);
  a.deallocate(p);
  a.deallocate(q);
  a.empty_cache();
  auto s = a.stats();
  EXPECT_EQ(s.num_device_alloc, 2);
  EXPECT_EQ(s.num_device_free, 2);
  EXPECT_EQ(s.reserved_bytes[0].peak, static_cast<std::int64_t>(24 * MiB));
  EXPECT_EQ(s.allocated_bytes[0].allocated, static_cast<std::int64_t>(24 * MiB));
  EXPECT_EQ(s.allocated_bytes[0].freed, static_cast<std::int64_t>(24 * MiB));
  a.reset_peak_stats();
  EXPECT_EQ(a.stats().reserved_bytes[0].peak, 0);
  a.reset_accumulated_stats();
  s = a.stats();
  EXPECT_EQ(s.allocated_bytes[0].allocated, 0);
  EXPECT_EQ(s.num_device_alloc, 0);
  EXPECT_EQ(s.max_split_size, -1);
}

}  // namespace
