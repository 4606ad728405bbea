// caching_allocator's event observer (what the LibTorch adapter turns into PyTorch's trace entries
// and allocator trace trackers), try_deallocate, owns and base_allocation.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/sim.hpp"

namespace {

using namespace gpumem_test;
using gpumem::allocator_action;
using gpumem::simulated_device;
using event = gpumem::allocator_event<simulated_device::stream_type>;

struct event_log {
  std::vector<event> events;
  void attach(allocator& a) {
    a.set_event_observer([this](const event& e) { events.push_back(e); });
  }
  std::vector<allocator_action> actions() const {
    std::vector<allocator_action> out;
    for (const event& e : events) out.push_back(e.action);
    return out;
  }
};

std::uintptr_t addr(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

TEST(AllocatorEvents, ClassicReportsSegmentsAllocationsAndFreesInOrder) {
  simulated_device dev{device_options(1 * GiB)};
  allocator a(dev, config());
  event_log log;
  log.attach(a);
  void* p = a.allocate(3 * MiB + 1);
  a.deallocate(p);
  a.empty_cache();
  using A = allocator_action;
  ASSERT_EQ(log.actions(), (std::vector<A>{A::segment_alloc, A::alloc, A::free_requested,
                                           A::free_completed, A::segment_free}));
  EXPECT_EQ(log.events[0].size, 20 * MiB);  // requests of 1-10 MiB take a 20 MiB segment
  EXPECT_EQ(log.events[0].address, addr(p));
  EXPECT_EQ(log.events[1].size, 3 * MiB + 1);  // alloc and frees carry the requested size
  EXPECT_EQ(log.events[1].address, addr(p));
  EXPECT_EQ(log.events[2].size, 3 * MiB + 1);
  EXPECT_EQ(log.events[3].size, 3 * MiB + 1);
  EXPECT_EQ(log.events[4].size, 20 * MiB);
  EXPECT_EQ(log.events[1].stream, dev.default_stream());
}

TEST(AllocatorEvents, FreeCompletesOnlyWhenTheRecordedStreamsEventCompletes) {
  simulated_device dev{device_options(1 * GiB, gpumem::event_completion::manual)};
  allocator a(dev, config());
  const auto side = dev.create_stream();
  void* p = a.allocate(4 * MiB);
  a.record_stream(p, side);
  event_log log;
  log.attach(a);
  a.deallocate(p);
  ASSERT_EQ(log.actions(), std::vector<allocator_action>{allocator_action::free_requested});
  dev.complete_stream(side);
  void* q = a.allocate(1024);  // retires completed events first
  ASSERT_GE(log.events.size(), 2u);
  EXPECT_EQ(log.events[1].action, allocator_action::free_completed);
  EXPECT_EQ(log.events[1].address, addr(p));
  a.deallocate(q);
}

TEST(AllocatorEvents, OutOfMemoryIsReportedBeforeTheThrow) {
  simulated_device dev{device_options(64 * MiB)};
  allocator a(dev, config());
  event_log log;
  log.attach(a);
  EXPECT_THROW(a.allocate(1 * GiB), gpumem::out_of_memory);
  ASSERT_FALSE(log.events.empty());
  EXPECT_EQ(log.events.back().action, allocator_action::oom);
  EXPECT_EQ(log.events.back().size, 1 * GiB);
  EXPECT_EQ(log.events.back().address, 64 * MiB);  // the device's free bytes
}

TEST(AllocatorEvents, VmmPoliciesReportMapsAndUnmapsOfWholePages) {
  for (const char* policy : {"policy:expandable", "policy:stitch"}) {
    SCOPED_TRACE(policy);
    simulated_device dev{device_options(1 * GiB)};
    allocator a(dev, config(policy));
    event_log log;
    log.attach(a);
    void* p = a.allocate(5 * MiB);
    a.deallocate(p);
    a.empty_cache();
    std::size_t mapped = 0;
    std::size_t unmapped = 0;
    for (const event& e : log.events) {
      EXPECT_NE(e.action, allocator_action::segment_alloc);  // VMM ranges map, never cudaMalloc
      if (e.action == allocator_action::segment_map) mapped += e.size;
      if (e.action == allocator_action::segment_unmap) unmapped += e.size;
      if (e.action == allocator_action::segment_map ||
          e.action == allocator_action::segment_unmap) {
        EXPECT_EQ(e.size % (2 * MiB), 0u);
      }
    }
    EXPECT_GE(mapped, 6 * MiB);
    EXPECT_EQ(mapped, unmapped);  // empty_cache gives every page back
  }
}

TEST(AllocatorEvents, AnEmptyObserverStopsTheEvents) {
  simulated_device dev{device_options(1 * GiB)};
  allocator a(dev, config());
  event_log log;
  log.attach(a);
  a.set_event_observer({});
  a.deallocate(a.allocate(1024));
  EXPECT_TRUE(log.events.empty());
}

TEST(Ownership, TryDeallocateRefusesForeignPointersAndChangesNothing) {
  simulated_device dev{device_options(1 * GiB)};
  allocator a(dev, config());
  allocator b(dev, config());
  void* p = a.allocate(1024);
  EXPECT_TRUE(a.owns(p));
  EXPECT_FALSE(b.owns(p));
  EXPECT_FALSE(b.try_deallocate(p));
  EXPECT_TRUE(a.owns(p));
  EXPECT_TRUE(a.try_deallocate(p));
  EXPECT_FALSE(a.owns(p));
  EXPECT_FALSE(a.try_deallocate(p));  // a second free
  EXPECT_TRUE(a.try_deallocate(nullptr));
  a.check_invariants();
  b.check_invariants();
}

TEST(Ownership, BaseAllocationIsTheSegmentHoldingTheBlock) {
  simulated_device dev{device_options(1 * GiB)};
  allocator a(dev, config());
  void* p = a.allocate(1 * MiB + 512);  // large pool: a 20 MiB segment, split
  void* q = a.allocate(2 * MiB);        // the next block of the same segment
  const auto [base, size] = a.base_allocation(q);
  EXPECT_EQ(base, p);
  EXPECT_EQ(size, 20 * MiB);
  EXPECT_GT(addr(q), addr(base));
  a.deallocate(p);
  EXPECT_THROW(a.base_allocation(p), gpumem::usage_error);
  a.deallocate(q);
}

}  // namespace
