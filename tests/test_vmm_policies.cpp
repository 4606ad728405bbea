// The virtual-memory policies: expandable (PyTorch's expandable_segments) and stitch.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/pinned_segments.hpp"
#include "support/sim.hpp"

namespace {

using namespace gpumem_test;
using gpumem::simulated_device;

std::uintptr_t addr(void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

// Pages of `page` bytes that hold at least one byte of a live (allocated or pending) block.
std::size_t live_pages(const allocator& a, std::size_t page) {
  std::size_t pages = 0;
  for (const auto& seg : a.snapshot()) {
    std::vector<bool> used(seg.total_size / page + 1, false);
    for (const auto& b : seg.blocks) {
      if (b.state == gpumem::block_state::inactive) continue;
      for (std::uintptr_t p = (b.address - seg.address) / page;
           p <= (b.address + b.size - 1 - seg.address) / page; ++p) {
        used[p] = true;
      }
    }
    for (bool u : used) pages += u ? 1 : 0;
  }
  return pages;
}

TEST(PolicySelection, AutomaticIsStitchWhereTheDeviceHasVmm) {
  simulated_device dev{device_options(1 * GiB)};
  allocator a(dev, gpumem::allocator_config::parse(""));
  EXPECT_EQ(a.policy(), gpumem::allocator_policy::stitch);
  allocator b(dev, gpumem::allocator_config::parse("expandable_segments:True"));
  EXPECT_EQ(b.policy(), gpumem::allocator_policy::expandable);
  allocator c(dev, gpumem::allocator_config::parse("policy:classic"));
  EXPECT_EQ(c.policy(), gpumem::allocator_policy::classic);
}

TEST(Expandable, GrowsOneRangeByLargePagesAndShrinksOnEmptyCache) {
  simulated_device dev{device_options(8 * GiB)};
  allocator a(dev, config("policy:expandable"));
  void* p = a.allocate(5 * MiB);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(20 * MiB));  // one 20 MiB page
  void* q = a.allocate(30 * MiB);
  EXPECT_EQ(addr(q), addr(p) + 5 * MiB);  // the same range, grown in place
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(40 * MiB));
  EXPECT_EQ(a.stats().segment[0].current, 1);
  EXPECT_EQ(dev.counters().mem_create, 2u);
  EXPECT_EQ(dev.counters().malloc, 0u);
  a.deallocate(q);
  a.empty_cache();  // the second page is free: unmapped and released
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(20 * MiB));
  a.deallocate(p);
  a.empty_cache();
  EXPECT_EQ(reserved(a), 0);
  EXPECT_EQ(a.stats().segment[0].current, 0);
  EXPECT_EQ(dev.bytes_in_use(), 0u);
  EXPECT_EQ(dev.live_reservations(), 0u);
  a.check_invariants();
}

// PyTorch's best fit under expandable_segments counts a free block followed by unmapped space as
// large as it could grow, and moves on from it to the next block in size order that could grow
// less: the block at the end of the mapped part is kept for requests that need it to grow.
TEST(Expandable, BestFitCountsTheUnmappedSpaceAfterABlock) {
  simulated_device dev{device_options(8 * GiB)};
  allocator a(dev, config("policy:expandable"));
  void* p = a.allocate(12 * MiB);
  void* q = a.allocate(8 * MiB);   // fills the first 20 MiB page
  void* r = a.allocate(30 * MiB);  // two more pages: 10 MiB free at the end, then unmapped
  EXPECT_EQ(addr(r), addr(q) + 8 * MiB);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(60 * MiB));
  a.deallocate(p);  // 12 MiB free, between nothing and q: it cannot grow
  void* s = a.allocate(10 * MiB);
  EXPECT_EQ(addr(s), addr(p));  // not the 10 MiB at the end, the exact best fit
  void* t = a.allocate(10 * MiB);
  EXPECT_EQ(addr(t), addr(r) + 30 * MiB);  // the 10 MiB at the end, no growth needed
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(60 * MiB));
  for (void* x : {q, r, s, t}) a.deallocate(x);
  a.check_invariants();
}

TEST(Expandable, SmallPoolGrowsBy2MiBPages) {
  simulated_device dev{device_options(8 * GiB)};
  allocator a(dev, config("policy:expandable"));
  std::vector<void*> ptrs;
  for (int i = 0; i < 5; ++i) ptrs.push_back(a.allocate(1 * MiB));
  EXPECT_EQ(a.stats().reserved_bytes[1].current, static_cast<std::int64_t>(6 * MiB));
  for (int i = 1; i < 5; ++i) EXPECT_EQ(addr(ptrs[i]), addr(ptrs[i - 1]) + 1 * MiB);
  for (void* p : ptrs) a.deallocate(p);
  a.check_invariants();
}

TEST(Stitch, UnderPressureSucceedsWhereClassicFails) {
  // 200 MiB are live at the end of pin_segments. Classic holds exactly that (ten full segments);
  // stitch packs each size class side by side, so the 9.5 + 9 MiB class and the 1.5 MiB class
  // each end in a partly used page: it needs one page more.
  constexpr std::size_t capacity = 202 * MiB;
  simulated_device classic_dev{device_options(capacity)};
  allocator classic(classic_dev, config("policy:classic"));
  auto classic_keep = pin_segments(classic);
  EXPECT_THROW(classic.allocate(30 * MiB), gpumem::out_of_memory);

  simulated_device dev{device_options(capacity)};
  allocator a(dev, config("policy:stitch"));
  auto keep = pin_segments(a);
  const auto creates = dev.counters().mem_create;
  const auto syncs = dev.counters().host_synchronizations();
  void* big = a.allocate(30 * MiB);  // the free blocks' pages, mapped here as well
  EXPECT_NE(big, nullptr);
  EXPECT_EQ(dev.counters().mem_create, creates);  // no new physical memory
  EXPECT_GE(dev.counters().mem_map, 15u);
  EXPECT_EQ(dev.counters().mem_unmap, 0u);  // shared, not moved: nothing to wait for
  EXPECT_EQ(dev.counters().host_synchronizations(), syncs);
  EXPECT_LE(reserved(a), static_cast<std::int64_t>(capacity));
  void* more = a.allocate(100 * MiB);  // still fits: 15 + 30 + 100 MiB live of 202
  a.check_invariants();
  for (void* p : keep) a.deallocate(p);
  a.deallocate(big);
  a.deallocate(more);
  for (void* p : classic_keep) classic.deallocate(p);
}

// What a miss costs in the driver under stitch (bench/README.md, "First-step cost"): one
// cuMemCreate and one cuMemMap per 2 MiB page it creates (cuMemMap maps a handle from offset 0, so
// a page that may be shared alone is an allocation of its own), one cuMemMap per free page it
// shares, and one cuMemSetAccess over the whole run it mapped, not one per page. The simulated time
// is exactly the cost model's charge for those calls.
TEST(Stitch, AMissCreatesAndMapsEachPageAndSetsAccessOnce) {
  simulated_device::options o = device_options(1 * GiB);
  o.costs = gpumem::cost_model::typical();
  simulated_device dev{o};
  allocator a(dev, config("policy:stitch"));
  void* first = a.allocate(100 * MiB);  // 50 new pages in a new range
  gpumem::call_counters c = dev.counters();
  EXPECT_EQ(c.address_reserve, 1u);
  EXPECT_EQ(c.mem_create, 50u);
  EXPECT_EQ(c.mem_map, 50u);
  EXPECT_EQ(c.set_access, 1u);
  EXPECT_EQ(c.memory_calls(), 102u);
  const gpumem::cost_model& m = o.costs;
  const double expected = m.address_reserve +
                          50 * (m.mem_create + 2 * MiB * m.mem_create_per_byte) +
                          50 * (m.mem_map + 2 * MiB * m.mem_map_per_byte) + m.set_access +
                          100 * MiB * m.set_access_per_byte;
  EXPECT_NEAR(dev.simulated_seconds(), expected, 1e-9);
  EXPECT_NEAR(expected, 1.3044e-3, 1e-7);  // about 26 us a page: 20 us create, 5 us map

  // A second block larger than the cached one: the miss maps the 50 free pages of `first` at a
  // second address (one cuMemMap each, no create) and creates only what the headroom allows.
  a.deallocate(first);
  void* second = a.allocate(120 * MiB);
  const gpumem::call_counters d = dev.counters() - c;
  EXPECT_EQ(d.mem_map, 60u);  // every page of the run: 50 shared, 10 new
  EXPECT_EQ(d.mem_create + 50u, d.mem_map);
  EXPECT_EQ(d.set_access, 1u);
  a.check_invariants();
  a.deallocate(second);
}

TEST(Stitch, OutOfMemoryOnlyWhenTheLiveSetPlusTheRequestDoesNotFit) {
  constexpr std::size_t capacity = 256 * MiB;
  constexpr std::size_t page = 2 * MiB;
  int ooms = 0;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    simulated_device dev{device_options(capacity)};
    allocator a(dev, config("policy:stitch"));
    std::mt19937_64 rng(seed);
    std::vector<void*> live;
    for (int op = 0; op < 300; ++op) {
      if (rng() % 100 < 55 || live.empty()) {
        const std::size_t size = rng() % 4 == 0 ? 1 + rng() % (1 * MiB) : 1 + rng() % (40 * MiB);
        const std::size_t live_before = live_pages(a, page);
        try {
          live.push_back(a.allocate(size));
        } catch (const gpumem::out_of_memory&) {
          ++ooms;
          // Only when the pages the live blocks touch plus the request's pages exceed the device.
          const std::size_t request_pages = (size + page - 1) / page;
          EXPECT_GT(live_before + request_pages, capacity / page)
              << "seed " << seed << " op " << op << " size " << size;
        }
      } else {
        const std::size_t i = rng() % live.size();
        a.deallocate(live[i]);
        live[i] = live.back();
        live.pop_back();
      }
      a.check_invariants();
      if (::testing::Test::HasFailure()) return;
    }
    for (void* p : live) a.deallocate(p);
  }
  EXPECT_GT(ooms, 0);  // the sizes do exhaust the device sometimes
}

TEST(Stitch, SteadyStateMakesNoDeviceCall) {
  simulated_device dev{device_options(1 * GiB)};
  allocator a(dev, config("policy:stitch"));
  auto step = [&](int seq) {
    std::vector<void*> acts;
    for (int layer = 0; layer < 12; ++layer) {
      acts.push_back(a.allocate(static_cast<std::size_t>(seq) * 4096));
      acts.push_back(a.allocate(static_cast<std::size_t>(seq) * 12288));
    }
    for (auto it = acts.rbegin(); it != acts.rend(); ++it) a.deallocate(*it);
  };
  // The first steps place blocks differently from one step to the next (best fit picks other
  // blocks once everything is cached) and stitch moves pages instead of growing; it settles.
  for (int i = 0; i < 5; ++i) step(1024);
  const auto warm = dev.counters();
  for (int i = 0; i < 20; ++i) step(1024);
  EXPECT_EQ(dev.counters(), warm);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(12 * 16 * MiB));  // exactly the step's live set
  a.check_invariants();
}

TEST(Stitch, ReservedStaysNearPeakRequestedWhenShapesChange) {
  simulated_device dev{device_options(8 * GiB)};
  allocator a(dev, config("policy:stitch"));
  std::mt19937_64 rng(3);
  std::size_t peak_requested = 0;
  for (int step = 0; step < 50; ++step) {
    const std::size_t seq = 256 + 64 * (rng() % 60);
    std::vector<void*> acts;
    std::size_t requested = 0;
    for (int layer = 0; layer < 16; ++layer) {
      for (std::size_t size : {seq * 8192, seq * 24576}) {
        acts.push_back(a.allocate(size));
        requested += size;
      }
    }
    peak_requested = std::max(peak_requested, requested);
    for (auto it = acts.rbegin(); it != acts.rend(); ++it) a.deallocate(*it);
  }
  const auto peak_reserved = static_cast<double>(a.stats().reserved_bytes[0].peak);
  EXPECT_LE(peak_reserved, 1.10 * static_cast<double>(peak_requested));
  a.check_invariants();
}

// Blocks of one size class are placed side by side in the class's address range and share the
// pages at their edges: eight 24.5 MiB blocks take 98 pages, where a range of their own each would
// end in a partly used page (8 x 13 pages, 208 MiB).
TEST(Stitch, BlocksOfOneSizeClassShareTheirEdgePages) {
  simulated_device dev{device_options(1 * GiB)};
  allocator a(dev, config("policy:stitch"));
  constexpr std::size_t size = 24 * MiB + 512 * KiB;
  std::vector<void*> live;
  for (int i = 0; i < 8; ++i) live.push_back(a.allocate(size));
  for (int i = 1; i < 8; ++i) EXPECT_EQ(addr(live[i]), addr(live[i - 1]) + size);
  EXPECT_EQ(a.stats().reserved_bytes[0].peak, static_cast<std::int64_t>(8 * size));  // 98 pages
  a.check_invariants();
  for (void* p : live) a.deallocate(p);
}

// The pattern of a transformer's forward pass: each layer keeps activations (1.125 and 4.5 MiB)
// for the backward pass and frees its temporaries (1.5 and 3 MiB). Placed in allocation order, the
// temporaries' free space would sit between kept blocks, in pages the kept blocks share, where it
// cannot be unmapped (152 MiB held for 140 MiB live at the peak). With a range per size class the
// temporaries' pages are whole, and the last request takes them over.
TEST(Stitch, TemporariesDoNotPinPagesBetweenKeptBlocks) {
  simulated_device dev{device_options(1 * GiB)};
  allocator a(dev, config("policy:stitch"));
  // Capped at exactly the peak requested (140 MiB of 1 GiB), so that no new page can be created
  // past it (whatever stitch_headroom says) and the pages must come from the temporaries: pinned
  // pages would make the last request fail.
  a.set_memory_fraction(140.0 / 1024.0);
  std::vector<void*> kept;
  for (int layer = 0; layer < 16; ++layer) {
    std::vector<void*> temporaries;
    temporaries.push_back(a.allocate(1536 * KiB));
    kept.push_back(a.allocate(1152 * KiB));
    temporaries.push_back(a.allocate(3 * MiB));
    kept.push_back(a.allocate(4608 * KiB));
    temporaries.push_back(a.allocate(3 * MiB));
    temporaries.push_back(a.allocate(1536 * KiB));
    kept.push_back(a.allocate(1152 * KiB));
    for (void* p : temporaries) a.deallocate(p);
  }
  kept.push_back(a.allocate(32 * MiB));  // peak requested: 16 x 6.75 + 32 = 140 MiB
  EXPECT_EQ(a.stats().reserved_bytes[0].peak, static_cast<std::int64_t>(140 * MiB));
  EXPECT_EQ(a.stats().requested_bytes[0].current, static_cast<std::int64_t>(140 * MiB));
  a.check_invariants();
  for (void* p : kept) a.deallocate(p);
}

// A training step's phases use different sizes one after the other (activations, then gradients).
// Size classes whose blocks get freed borrow each other's free blocks, so the steady state makes
// no device call and holds one phase's memory, not the sum of the phases.
TEST(Stitch, PhasesOfDifferentSizesShareMemoryWithoutDeviceCalls) {
  simulated_device dev{device_options(1 * GiB)};
  allocator a(dev, config("policy:stitch"));
  auto phase = [&](std::size_t size, int count) {
    std::vector<void*> blocks;
    for (int i = 0; i < count; ++i) blocks.push_back(a.allocate(size));
    for (void* p : blocks) a.deallocate(p);
  };
  auto step = [&] {
    phase(6 * MiB, 10);  // 60 MiB
    phase(10 * MiB, 8);  // 80 MiB
    phase(3 * MiB, 20);  // 60 MiB
  };
  for (int i = 0; i < 3; ++i) step();
  const auto warm = dev.counters();
  for (int i = 0; i < 10; ++i) step();
  EXPECT_EQ(dev.counters(), warm);
  EXPECT_EQ(a.stats().reserved_bytes[0].peak, static_cast<std::int64_t>(80 * MiB));
  a.check_invariants();
}

TEST(VmmPolicies, EmptyCacheAndDestructionReturnEverything) {
  for (const char* policy : {"policy:expandable", "policy:stitch"}) {
    simulated_device dev{device_options(2 * GiB)};
    {
      allocator a(dev, config(policy));
      std::vector<void*> ptrs;
      for (std::size_t s : {300u, 700000u, 3000000u, 50000000u, 12345678u}) {
        ptrs.push_back(a.allocate(s));
      }
      for (void* p : ptrs) a.deallocate(p);
      a.empty_cache();
      EXPECT_EQ(reserved(a), 0) << policy;
      EXPECT_EQ(dev.bytes_in_use(), 0u) << policy;
      a.allocate(5 * MiB);  // left live: the destructor must return it
    }
    EXPECT_EQ(dev.bytes_in_use(), 0u) << policy;
    EXPECT_EQ(dev.live_reservations(), 0u) << policy;
    EXPECT_EQ(dev.live_mappings(), 0u) << policy;
  }
}

TEST(VmmPolicies, FaultsOnCreateOrMapLeaveTheAllocatorConsistent) {
  for (const char* policy : {"policy:expandable", "policy:stitch"}) {
    simulated_device clean{device_options(1 * GiB)};
    auto run = [&](simulated_device& dev) {
      int ooms = 0;
      {
        allocator a(dev, config(policy));
        std::vector<void*> live;
        for (int i = 0; i < 40; ++i) {
          try {
            live.push_back(a.allocate((static_cast<std::size_t>(i) % 7 + 1) * 3 * MiB + 1000));
          } catch (const gpumem::out_of_memory&) {
            ++ooms;
          }
          if (i % 3 == 2 && !live.empty()) {
            a.deallocate(live.front());
            live.erase(live.begin());
          }
          a.check_invariants();
        }
        for (void* p : live) a.deallocate(p);
        a.check_invariants();
      }
      EXPECT_EQ(dev.bytes_in_use(), 0u) << policy;
      EXPECT_EQ(dev.live_reservations(), 0u) << policy;
      return ooms;
    };
    ASSERT_EQ(run(clean), 0);
    const std::size_t fallible = clean.fallible_calls();
    ASSERT_GT(fallible, 3u);
    for (std::size_t n = 1; n <= fallible; ++n) {
      auto o = device_options(1 * GiB);
      o.faults.fail_nth_call = n;
      simulated_device dev{o};
      run(dev);  // an OOM may be reported; consistency and no leak are what must hold
      EXPECT_EQ(dev.injected_faults(), 1u) << policy << " n=" << n;
      if (::testing::Test::HasFailure()) return;
    }
  }
}

}  // namespace
