// caching_allocator's event observer (what the LibTorch adapter turns into PyTorch's trace entries
// and allocator trace trackers), try_deallocate, owns and base_allocation.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
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

// The 2 MiB pages a list of segment events leaves counted, replayed from `events` of the views
// in `views` (the VMM policies map whole 2 MiB pages).
std::set<std::uintptr_t> counted_pages(const std::vector<event>& events,
                                       std::initializer_list<gpumem::segment_view> views) {
  std::set<std::uintptr_t> pages;
  for (const event& e : events) {
    if (std::find(views.begin(), views.end(), e.view) == views.end()) continue;
    const bool add =
        e.action == allocator_action::segment_map || e.action == allocator_action::segment_alloc;
    const bool remove =
        e.action == allocator_action::segment_unmap || e.action == allocator_action::segment_free;
    if (!add && !remove) continue;
    EXPECT_EQ(e.address % (2 * MiB), 0u);
    EXPECT_EQ(e.size % (2 * MiB), 0u);
    for (std::uintptr_t a = e.address; a < e.address + e.size; a += 2 * MiB) {
      if (add) {
        EXPECT_TRUE(pages.insert(a).second) << "page 0x" << std::hex << a << " counted twice";
      } else {
        EXPECT_EQ(pages.erase(a), 1u) << "page 0x" << std::hex << a << " was not counted";
      }
    }
  }
  return pages;
}

std::set<std::uintptr_t> reserved_pages(const allocator& a) {
  std::set<std::uintptr_t> pages;
  for (const auto& r : a.reserved_ranges()) {
    for (std::uintptr_t p = r.address; p < r.address + r.size; p += 2 * MiB) pages.insert(p);
  }
  return pages;
}

TEST(AllocatorEvents, StitchReportsWhatReservedMemoryCountsApartFromItsMappings) {
  // A 50 MiB block stitched from the pages of a freed 60 MiB one while a 20 MiB block keeps part
  // of its range, on a 100 MiB device: those pages are mapped at two addresses.
  simulated_device dev{device_options(100 * MiB)};
  allocator a(dev, config("policy:stitch"));
  event_log log;
  log.attach(a);
  a.set_reserved_events(true);
  using V = gpumem::segment_view;
  const auto check = [&](const char* after) {
    EXPECT_EQ(counted_pages(log.events, {V::both, V::reserved}), reserved_pages(a)) << after;
  };
  a.deallocate(a.allocate(60 * MiB));
  check("60 MiB allocated and freed");
  void* keep = a.allocate(20 * MiB);
  check("20 MiB allocated");
  void* stitched = a.allocate(50 * MiB);
  check("50 MiB stitched");
  std::size_t mapped = 0;
  for (const auto& seg : a.snapshot()) mapped += seg.mapped_size;
  EXPECT_GT(mapped, a.usage().reserved) << "the workload no longer maps a page twice";
  // The device's view is every mapping: more addresses than reserved memory counts.
  EXPECT_GT(counted_pages(log.events, {V::device}).size(), reserved_pages(a).size());
  a.deallocate(keep);
  check("20 MiB freed");
  a.deallocate(stitched);
  check("50 MiB freed");
  a.empty_cache();
  check("empty_cache");
  EXPECT_TRUE(reserved_pages(a).empty());
}

TEST(AllocatorEvents, OtherPoliciesReportEverySegmentEventForBothViews) {
  for (const char* policy : {"policy:classic", "policy:expandable"}) {
    simulated_device dev{device_options(100 * MiB)};
    allocator a(dev, config(policy));
    event_log log;
    log.attach(a);
    a.set_reserved_events(true);
    a.deallocate(a.allocate(60 * MiB));
    void* keep = a.allocate(20 * MiB);
    a.empty_cache();
    for (const event& e : log.events) EXPECT_EQ(e.view, gpumem::segment_view::both) << policy;
    EXPECT_FALSE(log.events.empty());
    a.deallocate(keep);
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

// An observer that throws (NCCL registration failing, the plugin's history running out of memory)
// must not corrupt the allocator: for every action and policy, the first such event throws; the
// call that raised it rethrows the observer's exception, and the allocator stays consistent,
// hands out nothing that was undone, and gives every byte back on empty_cache.
struct observer_failure : std::runtime_error {
  observer_failure() : std::runtime_error("observer failed") {}
};

class ThrowingObserver
    : public ::testing::TestWithParam<std::tuple<const char*, allocator_action>> {};

TEST_P(ThrowingObserver, LeavesTheAllocatorConsistentAndLosesNothing) {
  const auto [policy, action] = GetParam();
  simulated_device dev{device_options(1 * GiB, gpumem::event_completion::manual)};
  allocator a(dev, config(policy));
  const auto side = dev.create_stream();
  int thrown = 0;
  a.set_event_observer([&, throw_on = action](const event& e) {
    if (e.action == throw_on && thrown == 0) {
      ++thrown;
      throw observer_failure();
    }
  });
  std::vector<void*> live;
  auto attempt = [&](auto op) {
    try {
      op();
    } catch (const observer_failure&) {
    }
    a.check_invariants();
  };
  // Grow, free with and without record_stream, steal pages (stitch), release, grow again.
  for (int round = 0; round < 3; ++round) {
    for (std::size_t size : {3 * MiB, 700 * KiB, 40 * MiB, 9 * MiB, 120 * MiB}) {
      attempt([&] { live.push_back(a.allocate(size)); });
    }
    if (!live.empty()) attempt([&] { a.record_stream(live.front(), side); });
    while (live.size() > 1) {
      void* p = live.back();
      live.pop_back();
      attempt([&] { a.deallocate(p); });
      EXPECT_FALSE(a.owns(p));  // freed even when the observer threw
    }
    dev.complete_all();
    attempt([&] { a.empty_cache(); });
  }
  EXPECT_EQ(thrown, 1) << "the sequence never produced the action";
  a.set_event_observer({});
  for (void* p : live) a.deallocate(p);
  dev.complete_all();
  a.empty_cache();
  a.check_invariants();
  EXPECT_EQ(a.usage().allocated, 0u);
  EXPECT_EQ(a.usage().reserved, 0u);
}

TEST(ThrowingObserverOnAlloc, TheAllocationIsUndoneAndTheExceptionReachesTheCaller) {
  simulated_device dev{device_options(1 * GiB)};
  allocator a(dev, config());
  a.set_event_observer([](const event& e) {
    if (e.action == allocator_action::alloc) throw observer_failure();
  });
  EXPECT_THROW(a.allocate(4 * MiB), observer_failure);
  EXPECT_EQ(a.usage().allocated, 0u);
  EXPECT_EQ(a.stats().allocation[0].current, 0);
  a.check_invariants();
}

TEST(ThrowingObserverOnOom, TheOutOfMemoryErrorWins) {
  simulated_device dev{device_options(64 * MiB)};
  allocator a(dev, config());
  a.set_event_observer([](const event& e) {
    if (e.action == allocator_action::oom) throw observer_failure();
  });
  EXPECT_THROW(a.allocate(128 * MiB), gpumem::out_of_memory);
  a.check_invariants();
}

// The actions each policy reports: classic obtains whole segments, the VMM policies map pages.
INSTANTIATE_TEST_SUITE_P(Classic, ThrowingObserver,
                         ::testing::Combine(::testing::Values("policy:classic"),
                                            ::testing::Values(allocator_action::alloc,
                                                              allocator_action::free_requested,
                                                              allocator_action::free_completed,
                                                              allocator_action::segment_alloc,
                                                              allocator_action::segment_free)));
INSTANTIATE_TEST_SUITE_P(Vmm, ThrowingObserver,
                         ::testing::Combine(::testing::Values("policy:expandable", "policy:stitch"),
                                            ::testing::Values(allocator_action::alloc,
                                                              allocator_action::free_requested,
                                                              allocator_action::free_completed,
                                                              allocator_action::segment_map,
                                                              allocator_action::segment_unmap)));

// The names PyTorch's trace entries use (TraceEntry::Action), one per action, as the snapshot
// export and the adapter's skip_actions both read them.
TEST(AllocatorAction, NamesArePyTorchsTraceEntryActions) {
  using gpumem::allocator_action;
  const std::pair<allocator_action, const char*> names[] = {
      {allocator_action::alloc, "alloc"},
      {allocator_action::free_requested, "free_requested"},
      {allocator_action::free_completed, "free_completed"},
      {allocator_action::segment_alloc, "segment_alloc"},
      {allocator_action::segment_free, "segment_free"},
      {allocator_action::segment_map, "segment_map"},
      {allocator_action::segment_unmap, "segment_unmap"},
      {allocator_action::oom, "oom"}};
  for (const auto& [action, name] : names) EXPECT_EQ(gpumem::to_string(action), name);
}

}  // namespace
