// The allocator invariants (no overlap, exact tiling, no unmerged free neighbours, statistics
// equal to a recount from the blocks) checked after every operation of randomized sequences of
// allocate / deallocate / record_stream / empty_cache / event completion, for every policy and
// several configurations. One typed suite: each policy the library offers is a type here.
#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>

#include "gpumem/core/detail/allocator_invariants.hpp"
#include "support/sim.hpp"

namespace {

using namespace gpumem_test;
using gpumem::simulated_device;

struct classic_policy {
  static constexpr const char* name = "classic";
};
struct expandable_policy {
  static constexpr const char* name = "expandable";
};
struct stitch_policy {
  static constexpr const char* name = "stitch";
};

template <class Policy>
class AllocatorInvariants : public ::testing::Test {
 protected:
  gpumem::allocator_config make_config(const std::string& extra) {
    return config(std::string("policy:") + Policy::name + (extra.empty() ? "" : "," + extra));
  }

  // Variants: every block unsplit (set_no_split, MemPool(no_split=True)); a second allocator on
  // the device (a pool marked use-on-OOM) that a quarter of the requests go to and that lends its
  // cached blocks on the first allocator's out-of-memory (set_out_of_memory_fallback).
  bool no_split_ = false;
  bool with_lender_ = false;
  int borrowed_ = 0;  // allocations of the first allocator the lender served
  // The sequence run this many times, as the steps of a loop (everything freed and the streams'
  // work completed between steps): stitch then places each step's requests where the step before
  // placed them (step_placement), and the checker runs after each of those too.
  int steps_ = 1;

  // One randomized sequence; returns the number of operations that hit out_of_memory.
  int run_sequence(std::uint64_t seed, const std::string& extra, int operations) {
    simulated_device dev{device_options(2 * GiB, gpumem::event_completion::manual)};
    std::mt19937_64 rng(seed);
    int ooms = 0;
    {
      allocator a(dev, make_config(extra));
      a.set_no_split(no_split_);
      std::unique_ptr<allocator> lender;
      if (with_lender_) {
        lender = std::make_unique<allocator>(dev, make_config(extra));
        a.set_out_of_memory_fallback([&lender](std::size_t size, auto stream) {
          return lender->allocate_cached(size, stream);
        });
      }
      auto owner = [&](void* p) -> allocator& { return lender && lender->owns(p) ? *lender : a; };
      std::vector<decltype(dev.create_stream())> streams{dev.default_stream(), dev.create_stream(),
                                                         dev.create_stream()};
      std::vector<void*> live;
      auto random_size = [&]() -> std::size_t {
        switch (rng() % 8) {
          case 0:
            return 1 + rng() % 4096;
          case 1:
          case 2:
            return 1 + rng() % (1u << 20);
          case 3:
          case 4:
            return (1u << 20) + rng() % (9u << 20);
          case 5:
            return (10u << 20) + rng() % (60u << 20);
          case 6:
            return (64u << 20) + rng() % (400u << 20);
          default:
            return 512 * (1 + rng() % 64);
        }
      };
      for (int op = 0; op < operations * steps_; ++op) {
        if (op % operations == 0 && op != 0) {  // the next step: the same sequence again
          for (void* p : live) owner(p).deallocate(p);
          live.clear();
          dev.complete_all();
          rng.seed(seed);
        }
        const unsigned kind = static_cast<unsigned>(rng() % 100);
        if (kind < 50 || live.empty()) {
          allocator& to = lender && rng() % 4 == 0 ? *lender : a;
          try {
            live.push_back(to.allocate(random_size(), streams[rng() % streams.size()]));
            if (&to == &a && lender && lender->owns(live.back())) ++borrowed_;
          } catch (const gpumem::out_of_memory&) {
            ++ooms;
          }
        } else if (kind < 88) {
          const std::size_t i = rng() % live.size();
          owner(live[i]).deallocate(live[i]);
          live[i] = live.back();
          live.pop_back();
        } else if (kind < 95) {
          void* p = live[rng() % live.size()];
          owner(p).record_stream(p, streams[rng() % streams.size()]);
        } else if (kind < 98) {
          dev.complete_stream(streams[rng() % streams.size()]);
        } else {
          a.empty_cache();
          if (lender) lender->empty_cache();
        }
        a.check_invariants();
        if (lender) lender->check_invariants();
      }
      for (void* p : live) owner(p).deallocate(p);
      dev.complete_all();
      for (allocator* x : {&a, lender.get()}) {
        if (x == nullptr) continue;
        x->empty_cache();
        x->check_invariants();
        EXPECT_EQ(x->stats().reserved_bytes[0].current, 0);
        EXPECT_EQ(x->stats().allocated_bytes[0].current, 0);
      }
    }
    EXPECT_EQ(dev.bytes_in_use(), 0u);
    return ooms;
  }

  void run_many(const std::string& extra) {
    int ooms = 0;
    for (std::uint64_t seed = 1; seed <= 1000; ++seed) {
      ooms += run_sequence(seed * 7919 + extra.size(), extra, 200);
      if (HasFailure()) {
        ADD_FAILURE() << "first failing seed " << seed << " config '" << extra << "'";
        return;
      }
    }
    // The sizes are chosen so the 2 GiB device does run out sometimes: OOM paths are exercised.
    EXPECT_GT(ooms, 0);
  }
};

using policies = ::testing::Types<classic_policy, expandable_policy, stitch_policy>;
// Named by policy. (The name generator is also what keeps the macro's variadic argument list
// non-empty, which clang's -Wpedantic requires.)
struct policy_name {
  template <class Policy>
  static std::string GetName(int) {
    return Policy::name;
  }
};
TYPED_TEST_SUITE(AllocatorInvariants, policies, policy_name);

TYPED_TEST(AllocatorInvariants, DefaultConfig) {
  this->run_many("");
}
TYPED_TEST(AllocatorInvariants, MaxSplitSize) {
  this->run_many("max_split_size_mb:64");
}
TYPED_TEST(AllocatorInvariants, PowerOfTwoDivisions) {
  this->run_many("roundup_power2_divisions:4");
}
TYPED_TEST(AllocatorInvariants, FractionWithGarbageCollection) {
  this->run_many("per_process_memory_fraction:0.6,garbage_collection_threshold:0.5");
}
TYPED_TEST(AllocatorInvariants, NoSplit) {
  if (std::string(TypeParam::name) == "stitch") {
    simulated_device dev{device_options(GiB)};
    allocator a(dev, this->make_config(""));
    EXPECT_THROW(a.set_no_split(true), gpumem::usage_error);  // size classes need splits
    return;
  }
  this->no_split_ = true;
  this->run_many("");
}
TYPED_TEST(AllocatorInvariants, OutOfMemoryFallbackToALender) {
  this->with_lender_ = true;
  this->run_many("");
  EXPECT_GT(this->borrowed_, 0);
}
TYPED_TEST(AllocatorInvariants, RepeatedSteps) {
  this->steps_ = 4;
  this->run_many("stitch_step_match:16");
}
TYPED_TEST(AllocatorInvariants, EverythingAtOnce) {
  this->run_many(
      "max_split_size_mb:32,max_non_split_rounding_mb:64,roundup_power2_divisions:[64:8,256:4,>:1],"
      "per_process_memory_fraction:0.9,garbage_collection_threshold:0.7");
}

// The capture invariant, on a state built by hand: free markers exist only while a capture is
// under way, and only an allocator's own bug could give them to a block that is not deferred.
TEST(AllocatorInvariantChecker, ABlockWithCaptureFreeMarkersMustBeDeferred) {
  using device = gpumem::simulated_device;
  using stream_type = device::stream_type;
  using block_type = gpumem::detail::block<stream_type>;
  using graph_node = gpumem::detail::capture_graph_node<device>::type;
  simulated_device dev{device_options(GiB)};
  const std::vector<std::unique_ptr<gpumem::detail::stream_pools<stream_type>>> pools;
  const gpumem::detail::pointer_map<block_type> allocated;
  const gpumem::detail::pool_counters counts;
  const gpumem::device_stats stats;
  const gpumem::detail::pages_for<device> pages(dev);
  block_type freed;
  std::vector<block_type*> deferred;
  const std::unordered_map<block_type*, std::vector<graph_node>> markers{{&freed, {}}};
  const auto check = [&] {
    gpumem::detail::allocator_invariants<device>::check(
        {nullptr, pools, allocated, counts, stats, pages, deferred, markers});
  };
  try {
    check();
    ADD_FAILURE() << "free markers of a block that is not deferred were not caught";
  } catch (const std::logic_error& e) {
    EXPECT_STREQ(e.what(),
                 "gpumem invariant violated: a block with capture free markers is not deferred");
  }
  deferred.push_back(&freed);
  EXPECT_NO_THROW(check());
}

}  // namespace
