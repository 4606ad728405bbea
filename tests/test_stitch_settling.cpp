// Stitch in a training loop's steady state: its headroom and settling (no page moved back and
// forth every step), and the stream waits before any page is unmapped.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpumem/trace/replay.hpp"
#include "gpumem/trace/trace_io.hpp"
#include "support/sim.hpp"

namespace {

using namespace gpumem_test;
using gpumem::simulated_device;

// GPT-2 small's training step (the bundled trace), step after step on a GPU larger than it needs.
// Stealing alone would keep moving pages between the same ranges every step (dozens of maps and
// unmaps, each after a stream wait); with its headroom, stitch makes no device call from the
// second step on, while reserved memory stays within 1.5% of the peak requested.
TEST(StitchSettling, TrainingStepsMakeNoDeviceCallOnceSettled) {
  const auto trace = gpumem::read_trace(GPUMEM_EXAMPLE_TRACES "/gpt2-small-b4-s512.trace");
  simulated_device dev{device_options(80 * GiB)};
  allocator a(dev, config("policy:stitch"));
  gpumem::step_replayer step(trace);
  step.run(a);
  const auto first_peak = static_cast<double>(a.stats().reserved_bytes[0].peak);
  const auto peak_requested = static_cast<double>(a.stats().requested_bytes[0].peak);
  EXPECT_LE(first_peak, 1.015 * peak_requested);
  step.run(a);  // settling: the second step may still create a few pages
  for (int i = 0; i < 6; ++i) {
    const auto before = dev.counters();
    step.run(a);
    EXPECT_EQ(dev.counters().memory_calls(), before.memory_calls()) << "step " << i + 3;
  }
  EXPECT_LE(static_cast<double>(a.stats().reserved_bytes[0].peak), 1.015 * peak_requested);
  a.check_invariants();
}

// A phase with other shapes first (every size class from 1 MiB to 272 MiB allocated and freed):
// had its frees marked those classes as freeing, GPT-2's long-lived blocks of those sizes would be
// lent among short-lived ones, and stitch would keep moving pages every step at its settle limit.
// empty_cache between the phases starts the classes afresh: GPT-2 settles as if it ran alone.
TEST(StitchSettling, EmptyCacheBetweenPhasesLetsTheNextOneSettle) {
  const auto trace = gpumem::read_trace(GPUMEM_EXAMPLE_TRACES "/gpt2-small-b4-s512.trace");
  simulated_device dev{device_options(80 * GiB)};
  allocator a(dev, config("policy:stitch"));
  for (std::size_t i = 0; i < 4096; ++i) {
    a.deallocate(a.allocate(MiB + (i * 2654435761u) % (271 * MiB)));
  }
  a.empty_cache();
  gpumem::step_replayer step(trace);
  for (int i = 0; i < 4; ++i) step.run(a);
  for (int i = 0; i < 4; ++i) {
    const auto before = dev.counters();
    step.run(a);
    EXPECT_EQ(dev.counters().memory_calls(), before.memory_calls()) << "step " << i + 5;
  }
  a.check_invariants();
}

// Bundled traces, eight steps each: whether or not a workload settles, stitch's reserved memory
// stays within its bounds (1.5% headroom, 2% settle limit) plus the partial pages that stealing
// cannot hand over: within 3% of the peak requested.
TEST(StitchSettling, ReservedMemoryStaysBoundedOverManySteps) {
  for (const char* name : {"gpt2-small-b4-s512-ckpt", "gpt2-small-b4-s512",
                           "llama-tiny-b4-s512-accum2", "resnet50-b32"}) {
    const auto trace = gpumem::read_trace(std::string(GPUMEM_EXAMPLE_TRACES "/") + name + ".trace");
    simulated_device dev{device_options(80 * GiB)};
    allocator a(dev, config("policy:stitch"));
    gpumem::step_replayer step(trace);
    for (int i = 0; i < 8; ++i) step.run(a);
    const auto peak_requested = static_cast<double>(a.stats().requested_bytes[0].peak);
    EXPECT_LE(static_cast<double>(a.stats().reserved_bytes[0].peak), 1.03 * peak_requested) << name;
    a.check_invariants();
  }
}

// Under pressure stitch still steals: with the memory fraction 1% above the peak requested (below
// its headroom), GPT-2's steps go on without an out-of-memory error and without reserving more
// than the cap.
TEST(StitchSettling, TheMemoryFractionOverridesTheHeadroom) {
  const auto trace = gpumem::read_trace(GPUMEM_EXAMPLE_TRACES "/gpt2-small-b4-s512.trace");
  simulated_device dev{device_options(8 * GiB)};
  gpumem::step_replayer step(trace);
  std::size_t peak_requested = 0;
  {
    allocator probe(dev, config("policy:stitch"));
    step.run(probe);
    peak_requested = static_cast<std::size_t>(probe.stats().requested_bytes[0].peak);
  }
  allocator a(dev, config("policy:stitch"));
  const std::size_t cap = peak_requested + peak_requested / 100;
  a.set_memory_fraction(static_cast<double>(cap) / static_cast<double>(8 * GiB));
  for (int i = 0; i < 8; ++i) ASSERT_NO_THROW(step.run(a)) << "step " << i + 1;
  EXPECT_LE(static_cast<std::size_t>(a.stats().reserved_bytes[0].peak), cap);
  a.check_invariants();
}

// A free block may still be read by work queued on its stream; cuMemUnmap does not wait for it.
// Stitch takes pages from such a block only after that work completed.
TEST(StitchSettling, PagesAreStolenOnlyAfterTheirStreamsWorkCompleted) {
  simulated_device dev{device_options(1 * GiB, gpumem::event_completion::manual)};
  allocator a(dev, config("policy:stitch"));
  a.set_memory_fraction(64.0 / 1024.0);  // 64 MiB: no headroom, pages must be stolen
  const auto stream = dev.create_stream();
  a.deallocate(a.allocate(40 * MiB, stream));
  const auto kernel = dev.create_event();  // work queued after the free that still reads the block
  dev.record_event(kernel, stream);
  ASSERT_FALSE(dev.query_event(kernel));

  int unmaps = 0;
  bool unmapped_under_running_work = false;
  a.set_event_observer([&](const gpumem::allocator_event<simulated_device::stream_type>& e) {
    if (e.action != gpumem::allocator_action::segment_unmap) return;
    ++unmaps;
    unmapped_under_running_work = unmapped_under_running_work || !dev.query_event(kernel);
  });
  void* other = a.allocate(24 * MiB + 512 * KiB, stream);  // another size class: steals pages
  EXPECT_GT(unmaps, 0);
  EXPECT_FALSE(unmapped_under_running_work);
  a.set_event_observer(nullptr);
  a.deallocate(other);
  dev.destroy_event(kernel);
  a.check_invariants();
}

TEST(StitchSettling, EmptyCacheUnmapsOnlyAfterTheStreamsWorkCompleted) {
  for (const char* policy : {"policy:stitch", "policy:expandable"}) {
    simulated_device dev{device_options(1 * GiB, gpumem::event_completion::manual)};
    allocator a(dev, config(policy));
    const auto stream = dev.create_stream();
    a.deallocate(a.allocate(40 * MiB, stream));
    const auto kernel = dev.create_event();
    dev.record_event(kernel, stream);
    bool unmapped_under_running_work = false;
    a.set_event_observer([&](const gpumem::allocator_event<simulated_device::stream_type>& e) {
      if (e.action == gpumem::allocator_action::segment_unmap && !dev.query_event(kernel)) {
        unmapped_under_running_work = true;
      }
    });
    a.empty_cache();
    EXPECT_FALSE(unmapped_under_running_work) << policy;
    EXPECT_EQ(reserved(a), 0) << policy;
    a.set_event_observer(nullptr);
    dev.destroy_event(kernel);
  }
}

}  // namespace
