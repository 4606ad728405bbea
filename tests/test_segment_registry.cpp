// gpumem::nccl::segment_registry with a fake registrar: under every policy, after every operation,
// the registered ranges are exactly the memory the allocator reserves.
#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "gpumem/nccl/segment_registry.hpp"
#include "support/sim.hpp"

namespace {

using namespace gpumem_test;
using gpumem::allocator_action;
using gpumem::simulated_device;
using gpumem::nccl::segment_registry;

// A registrar that checks what NCCL checks: no range registered twice, deregistered handles known.
struct fake_library {
  std::map<void*, std::pair<std::uintptr_t, std::size_t>> live;  // handle -> range
  int next = 1;
  gpumem::nccl::registrar registrar() {
    return {[this](void* ptr, std::size_t size) {
              for (const auto& [h, r] : live) {
                const auto a = reinterpret_cast<std::uintptr_t>(ptr);
                if (a < r.first + r.second && r.first < a + size) {
                  throw std::logic_error("overlapping registration");
                }
              }
              void* handle = reinterpret_cast<void*>(static_cast<std::uintptr_t>(next++));
              live[handle] = {reinterpret_cast<std::uintptr_t>(ptr), size};
              return handle;
            },
            [this](void* handle) {
              if (live.erase(handle) != 1) throw std::logic_error("unknown handle");
            }};
  }
};

// Every registered byte is mapped (a mapped block of a segment) and every mapped byte is
// registered: under stitch a page may be mapped at several addresses, each registered.
void expect_registered_is_reserved(const allocator& a, const segment_registry& registry) {
  std::size_t registered = 0;
  std::size_t mapped = 0;
  for (const auto& seg : a.snapshot()) mapped += seg.mapped_size;
  for (const auto& [address, size] : registry.ranges()) {
    registered += size;
    bool inside = false;
    for (const auto& seg : a.snapshot()) {
      std::uintptr_t run_start = 0;
      std::uintptr_t run_end = 0;
      for (const auto& b : seg.blocks) {
        if (!b.mapped) continue;
        if (b.address != run_end) run_start = b.address;
        run_end = b.address + b.size;
        inside |= address >= run_start && address + size <= run_end;
      }
    }
    EXPECT_TRUE(inside) << "registered range " << address << "+" << size << " is not reserved";
  }
  EXPECT_EQ(registered, mapped);
  EXPECT_GE(registered, a.usage().reserved);
}

class SegmentRegistry : public ::testing::TestWithParam<const char*> {};

TEST_P(SegmentRegistry, RegisteredRangesAreTheReservedMemoryAfterEveryOperation) {
  simulated_device dev{device_options(2 * GiB)};
  allocator a(dev, config(GetParam()));
  fake_library nccl;
  {
    segment_registry registry(nccl.registrar());
    a.set_event_observer(
        [&registry](const gpumem::allocator_event<simulated_device::stream_type>& e) {
          registry.on_event(e.action, e.address, e.size);
        });
    std::mt19937_64 rng(17);
    std::vector<void*> live;
    const std::size_t sizes[] = {512, 100 * KiB, 3 * MiB, 13 * MiB, 70 * MiB, 300 * MiB};
    for (int op = 0; op < 600; ++op) {
      const auto r = rng() % 10;
      if (r < 5 || live.empty()) {
        try {
          live.push_back(a.allocate(sizes[rng() % 6] + rng() % 4096));
        } catch (const gpumem::out_of_memory&) {
        }
      } else if (r < 9) {
        const std::size_t i = rng() % live.size();
        a.deallocate(live[i]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        a.empty_cache();
      }
      expect_registered_is_reserved(a, registry);
      if (HasFailure()) return;
    }
    for (void* p : live) a.deallocate(p);
    a.empty_cache();
    EXPECT_TRUE(registry.ranges().empty());
    EXPECT_EQ(registry.registrations(), registry.deregistrations());
    EXPECT_GT(registry.registrations(), 10u);
    a.set_event_observer({});
  }
  EXPECT_TRUE(nccl.live.empty());
}

INSTANTIATE_TEST_SUITE_P(EveryPolicy, SegmentRegistry,
                         ::testing::Values("policy:classic", "policy:expandable", "policy:stitch"));

TEST(SegmentRegistryUnmap, AnUnmapInsideARangeKeepsTheRestRegistered) {
  fake_library nccl;
  segment_registry registry(nccl.registrar());
  registry.on_event(allocator_action::segment_map, 0x1000000, 8 * MiB);
  registry.on_event(allocator_action::segment_unmap, 0x1000000 + 2 * MiB, 4 * MiB);
  using R = std::vector<std::pair<std::uintptr_t, std::size_t>>;
  EXPECT_EQ(registry.ranges(), (R{{0x1000000, 2 * MiB}, {0x1000000 + 6 * MiB, 2 * MiB}}));
  EXPECT_EQ(nccl.live.size(), 2u);
  registry.on_event(allocator_action::alloc, 0x5, 5);  // other actions are ignored
  EXPECT_EQ(registry.ranges().size(), 2u);
  EXPECT_THROW(segment_registry(gpumem::nccl::registrar{}), std::invalid_argument);
}

}  // namespace
