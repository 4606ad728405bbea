// Misuse, under every policy: each is a clear error or documented behaviour, and the allocator
// stays consistent (the invariant checker runs after each).
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "support/sim.hpp"

namespace {

using namespace gpumem_test;
using gpumem::simulated_device;

class Misuse : public ::testing::TestWithParam<const char*> {
 protected:
  simulated_device dev{device_options(1 * GiB)};
  allocator a{dev, config(GetParam())};
  void TearDown() override { a.check_invariants(); }
};

TEST_P(Misuse, DoubleFreeIsAUsageErrorAndChangesNothing) {
  void* p = a.allocate(3 * MiB);
  a.deallocate(p);
  const auto before = a.stats();
  try {
    a.deallocate(p);
    FAIL() << "a double free passed";
  } catch (const gpumem::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("already freed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.stats().allocation[0], before.allocation[0]);
}

TEST_P(Misuse, ForeignAndInteriorPointersAreRefused) {
  void* p = a.allocate(3 * MiB);
  int local = 0;
  EXPECT_THROW(a.deallocate(&local), gpumem::usage_error);
  EXPECT_THROW(a.deallocate(static_cast<char*>(p) + 512), gpumem::usage_error);  // interior
  EXPECT_THROW(a.record_stream(&local, dev.default_stream()), gpumem::usage_error);
  // Another device's allocation ("freeing on the wrong device") is foreign here.
  simulated_device other{device_options(1 * GiB)};
  allocator b(other, config(GetParam()));
  void* q = b.allocate(1 * MiB);
  EXPECT_THROW(a.deallocate(q), gpumem::usage_error);
  EXPECT_TRUE(b.owns(q));
  b.deallocate(q);
  a.deallocate(p);
}

TEST_P(Misuse, FreeingOnAnotherStreamIsDocumentedRecordStreamThenFree) {
  // A block is freed into its allocation stream's pool; use on another stream must be declared
  // with record_stream, after which reuse waits for that stream.
  simulated_device manual{device_options(1 * GiB, gpumem::event_completion::manual)};
  allocator m(manual, config(GetParam()));
  const auto side = manual.create_stream();
  void* p = m.allocate(4 * MiB);
  m.record_stream(p, side);
  m.deallocate(p);
  EXPECT_EQ(m.stats().active[0].current, 1);
  manual.complete_stream(side);
  m.deallocate(m.allocate(512));  // retires the event
  EXPECT_EQ(m.stats().active[0].current, 0);
  m.check_invariants();
}

TEST_P(Misuse, SizeZeroIsNullAndNullFreeIsANoOp) {
  EXPECT_EQ(a.allocate(0), nullptr);
  EXPECT_NO_THROW(a.deallocate(nullptr));
  EXPECT_EQ(a.stats().allocation[0].allocated, 0);
}

TEST_P(Misuse, HugeSizesAreOutOfMemoryNotOverflow) {
  for (std::size_t size :
       {std::numeric_limits<std::size_t>::max(), std::numeric_limits<std::size_t>::max() - 511,
        std::size_t{1} << 63, (std::size_t{1} << 60) + 1, std::size_t{2} * GiB}) {
    SCOPED_TRACE(size);
    EXPECT_THROW(a.allocate(size), gpumem::out_of_memory);
    a.check_invariants();
  }
  EXPECT_EQ(a.usage().reserved, 0u);
  void* p = a.allocate(1 * MiB);  // still works
  a.deallocate(p);
}

TEST_P(Misuse, BadFractionsAreRefusedAndChangeNothing) {
  for (double f : {std::nan(""), -0.1, 1.5, std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(f);
    EXPECT_THROW(a.set_memory_fraction(f), std::invalid_argument);
    EXPECT_DOUBLE_EQ(a.memory_fraction(), 1.0);
  }
}

TEST_P(Misuse, LoweringTheFractionBelowLiveMemoryKeepsLiveBlocksAndRefusesGrowth) {
  // Documented: the cap applies to new device memory; what is live stays valid.
  void* p = a.allocate(100 * MiB);
  a.set_memory_fraction(0.05);  // 51 MiB < what is reserved
  EXPECT_THROW(a.allocate(100 * MiB), gpumem::out_of_memory);
  a.deallocate(p);
  a.set_memory_fraction(1.0);
  a.deallocate(a.allocate(100 * MiB));
}

TEST_P(Misuse, RecordStreamAfterFreeIsAUsageError) {
  void* p = a.allocate(2 * MiB);
  a.deallocate(p);
  EXPECT_THROW(a.record_stream(p, dev.default_stream()), gpumem::usage_error);
}

INSTANTIATE_TEST_SUITE_P(EveryPolicy, Misuse,
                         ::testing::Values("policy:classic", "policy:expandable", "policy:stitch"));

TEST(MisuseConfig, TheConfigurationIsFixedAtConstruction) {
  // Changing the environment while allocations are live does not touch a running allocator: its
  // configuration was copied at construction (documented in caching_allocator's constructor).
  simulated_device dev{device_options(1 * GiB)};
  allocator a(dev, config("policy:classic,max_split_size_mb:64"));
  void* p = a.allocate(100 * MiB);
  ::setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:1024", 1);
  EXPECT_EQ(a.config().max_split_size, 64 * MiB);
  ::unsetenv("PYTORCH_CUDA_ALLOC_CONF");
  a.deallocate(p);
  a.check_invariants();
}

TEST(MisuseConfig, ExtremeSizeSettingsAllocateOrRunOutOfMemory) {
  // The largest accepted sizes under every policy: each request is served or is an out-of-memory
  // error, never an overflow (a SIGFPE or a zero-sized address reservation before the bounds).
  for (const char* policy : {"policy:classic", "policy:expandable", "policy:stitch"}) {
    SCOPED_TRACE(policy);
    simulated_device dev{device_options(1 * GiB)};
    allocator a(dev, config(std::string(policy) +
                            ",large_segment_size_mb:1048576,max_split_size_mb:17592186044415,"
                            "max_non_split_rounding_mb:17592186044415"));
    for (std::size_t size : {5 * MiB, 512 * KiB, 12 * MiB, 300 * MiB}) {
      SCOPED_TRACE(size);
      try {
        a.deallocate(a.allocate(size));
      } catch (const gpumem::out_of_memory&) {
      }
      a.check_invariants();
    }
  }
}

TEST(MisuseConfig, OutOfRangeSettingsMadeInCodeAreRefusedAtConstruction) {
  simulated_device dev{device_options(1 * GiB)};
  gpumem::allocator_config c = config("policy:expandable");
  c.large_segment_size = std::numeric_limits<std::size_t>::max() - 1;
  EXPECT_THROW(allocator(dev, c), gpumem::config_error);
}

TEST(MisuseConfig, AnUnlimitedNonSplitRoundingReusesOversizeBlocks) {
  // max_non_split_rounding "unlimited": any cached oversize block serves an oversize request (the
  // waste test must not overflow into refusing every block).
  simulated_device dev{device_options(1 * GiB)};
  allocator a(dev, config("max_split_size_mb:20,max_non_split_rounding_mb:17592186044415"));
  a.deallocate(a.allocate(200 * MiB));
  const auto calls = a.stats().num_device_alloc;
  a.deallocate(a.allocate(100 * MiB));
  EXPECT_EQ(a.stats().num_device_alloc, calls);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(200 * MiB));
  a.check_invariants();
}

}  // namespace
