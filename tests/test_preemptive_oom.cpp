// throw_on_cudamalloc_oom, PyTorch's preemptive out-of-memory (2.12 to 2.15, read from
// libc10_cuda.so's alloc_block and malloc): a miss whose segment would take the reserved bytes past
// the configured per_process_memory_fraction of the device fails at once, with no device call and
// no cache release, and counts num_oom_rejections instead of num_ooms. A memory cap in force is
// checked first. Also the cap's rounding (std::round since PyTorch 2.13).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "support/sim.hpp"

namespace {

using namespace gpumem_test;
using gpumem::out_of_memory;
using gpumem::simulated_device;

// Runs `f`, which must throw out_of_memory, and returns the error's numbers and message.
template <class F>
std::pair<out_of_memory::details, std::string> oom_of(F&& f) {
  try {
    f();
  } catch (const out_of_memory& e) {
    return {e.info(), e.what()};
  }
  ADD_FAILURE() << "no out_of_memory";
  return {};
}

// Every policy: classic, and the VMM policies whose miss path maps pages instead.
struct PreemptiveOom : ::testing::TestWithParam<std::string> {
  simulated_device dev{device_options(1 * GiB)};
  gpumem::allocator_config with(const std::string& settings) {
    return config("policy:" + GetParam() + (settings.empty() ? "" : "," + settings));
  }
};

INSTANTIATE_TEST_SUITE_P(Policies, PreemptiveOom,
                         ::testing::Values("classic", "expandable", "stitch"));

TEST_P(PreemptiveOom, ARequestPastTheDeviceIsRefusedWithoutAskingItOrReleasingTheCache) {
  allocator a(dev, with("throw_on_cudamalloc_oom:True"));  // no fraction: the whole device
  a.deallocate(a.allocate(400 * MiB));                     // 400 MiB cached
  const gpumem::call_counters before = dev.counters();
  const auto [n, what] = oom_of([&] { a.allocate(700 * MiB); });  // 400 + 700 > 1024 MiB
  EXPECT_EQ(dev.counters() - before, gpumem::call_counters{});    // not one device call
  EXPECT_TRUE(n.preemptive_rejection);
  EXPECT_EQ(n.requested_bytes, 700 * MiB);
  EXPECT_EQ(n.device_request_bytes, 700 * MiB);
  EXPECT_EQ(n.counted_reserved_bytes, 400 * MiB);
  EXPECT_EQ(n.limit_bytes, 1 * GiB);
  EXPECT_NE(what.find("preemptively rejected"), std::string::npos) << what;
  EXPECT_NE(what.find("400.00 MiB reserved + a 700.00 MiB segment would exceed the limit of "
                      "1024.00 MiB (per_process_memory_fraction 1 of the device's 1024.00 MiB)"),
            std::string::npos)
      << what;
  const gpumem::device_stats s = a.stats();
  EXPECT_EQ(s.num_oom_rejections, 1);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.num_alloc_retries, 0);
  EXPECT_EQ(s.num_sync_all_streams, 0);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(400 * MiB));  // the cache was kept
  a.check_invariants();

  void* p = a.allocate(600 * MiB);  // 400 + 600 fits: the device is asked as usual
  EXPECT_EQ(a.stats().num_oom_rejections, 1);
  a.deallocate(p);
  a.reset_accumulated_stats();
  EXPECT_EQ(a.stats().num_oom_rejections, 0);  // reset with the other counters, as in PyTorch
}

TEST_P(PreemptiveOom, WithoutTheKeyTheCacheIsReleasedAndTheSameRequestSucceeds) {
  allocator a(dev, with(""));
  a.deallocate(a.allocate(400 * MiB));
  void* p = a.allocate(700 * MiB);
  const gpumem::device_stats s = a.stats();
  EXPECT_EQ(s.num_oom_rejections, 0);
  EXPECT_GT(s.num_device_alloc, 1);  // the device was asked
  a.deallocate(p);
  a.check_invariants();
}

TEST_P(PreemptiveOom, ACapInForceIsCheckedFirstAndItsOrdinaryPathRuns) {
  // PyTorch's order: the memory cap (set from the same fraction when the allocator starts) refuses
  // first, so its cache release, retry and out-of-memory run, and nothing counts as a rejection.
  allocator a(dev, with("per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True"));
  void* live = a.allocate(400 * MiB);
  const auto [n, what] = oom_of([&] { a.allocate(200 * MiB); });  // 600 MiB > the 512 MiB cap
  EXPECT_FALSE(n.preemptive_rejection) << what;
  EXPECT_EQ(a.stats().num_oom_rejections, 0);
  EXPECT_EQ(a.stats().num_ooms, 1);
  EXPECT_EQ(a.stats().num_alloc_retries, 1);
  a.deallocate(live);
  a.check_invariants();
}

TEST_P(PreemptiveOom, TheLimitIsTheConfiguredFractionNotSetMemoryFractions) {
  allocator a(dev, with("per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True"));
  void* live = a.allocate(400 * MiB);
  a.set_memory_fraction(0.75);  // a 768 MiB cap: 600 MiB passes it, then the 512 MiB limit refuses
  const gpumem::call_counters before = dev.counters();
  const auto [n, what] = oom_of([&] { a.allocate(200 * MiB); });
  EXPECT_TRUE(n.preemptive_rejection) << what;
  EXPECT_EQ(n.limit_bytes, 512 * MiB);
  EXPECT_EQ(dev.counters() - before, gpumem::call_counters{});
  EXPECT_EQ(a.stats().num_oom_rejections, 1);
  EXPECT_EQ(a.stats().num_ooms, 0);
  a.deallocate(live);
  a.check_invariants();
}

TEST(PreemptiveOomRetry, ARetryThatPassesTheCapIsStillRefusedByTheLimit) {
  // PyTorch checks every attempt: the cap refuses the first, the cache is released, and the retry,
  // under the cap now, is refused by the configured limit (counted as a retry and a rejection).
  simulated_device dev{device_options(1 * GiB)};
  allocator a(dev, config("per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True"));
  a.set_memory_fraction(0.75);  // a 768 MiB cap over the 512 MiB limit
  void* live = a.allocate(300 * MiB);
  a.deallocate(a.allocate(200 * MiB));                            // 500 MiB reserved
  const auto [n, what] = oom_of([&] { a.allocate(300 * MiB); });  // 800 > 768, then 600 > 512
  EXPECT_TRUE(n.preemptive_rejection) << what;
  EXPECT_EQ(n.counted_reserved_bytes, 300 * MiB);
  const gpumem::device_stats s = a.stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_oom_rejections, 1);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(300 * MiB));
  a.deallocate(live);
  a.check_invariants();
}

TEST(PreemptiveOomSmallPool, ASmallRequestCountsItsTwoMiBSegment) {
  simulated_device dev{device_options(64 * MiB)};
  allocator a(dev, config("throw_on_cudamalloc_oom:True"));
  void* live = a.allocate(63 * MiB);  // a 64 MiB segment: the device is full
  const auto [n, what] = oom_of([&] { a.allocate(1000); });
  EXPECT_TRUE(n.preemptive_rejection) << what;
  EXPECT_EQ(n.device_request_bytes, 2 * MiB);
  EXPECT_EQ(n.rounded_bytes, 1024u);
  a.deallocate(live);
}

// PyTorch 2.13+ rounds fraction x total to the nearest byte (std::round); 2.12 truncated. The
// expected caps are std::round of the same double product, worked out independently; the first
// two are one byte above truncation.
TEST(MemoryCapRounding, IsPyTorchsForSeveralDeviceSizes) {
  struct case_ {
    std::size_t total;
    double fraction;
    std::size_t cap;
  };
  for (const case_& c :
       {case_{24 * GiB, 0.3, 7730941133u}, case_{1 * GiB + 5, 0.1, 107374183u},
        case_{16 * GiB, 1.0 / 3.0, 5726623061u}, case_{80 * GiB, 0.95, 81604378624u}}) {
    SCOPED_TRACE(c.total);
    simulated_device dev{device_options(c.total)};
    allocator a(dev, config());
    EXPECT_EQ(a.memory_cap_bytes(), std::nullopt);
    a.set_memory_fraction(c.fraction);
    EXPECT_EQ(a.memory_cap_bytes(), std::optional<std::size_t>(c.cap));
  }
}

TEST(MemoryCapRounding, TheRejectionLimitTruncatesAsPyTorchDoes) {
  // PyTorch computes the limit of throw_on_cudamalloc_oom from the configured fraction without
  // rounding: 0.1 of 1 GiB + 5 bytes is 107374182.9 bytes, a cap of 107374183, a limit of
  // 107374182.
  simulated_device dev{device_options(1 * GiB + 5)};
  allocator a(dev, config("per_process_memory_fraction:0.1,throw_on_cudamalloc_oom:True"));
  EXPECT_EQ(a.memory_cap_bytes(), std::optional<std::size_t>(107374183u));
  a.set_memory_fraction(1.0);  // the cap steps aside; the configured limit stays
  const auto [n, what] = oom_of([&] { a.allocate(200 * MiB); });
  EXPECT_TRUE(n.preemptive_rejection) << what;
  EXPECT_EQ(n.limit_bytes, 107374182u);
}

}  // namespace
