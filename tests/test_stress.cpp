// Concurrency stress: threads x streams x sizes on one allocator per policy (random record_stream,
// random empty_cache, events completing as simulated time advances) and on the pinned pool. Run
// in every build, and under ThreadSanitizer by tools/reliability.sh. GPUMEM_STRESS_OPS sets the
// operations per thread (default 4000); the totals are printed for the Reliability figures.
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gpumem/core/detail/spin_mutex.hpp"
#include "gpumem/device/simulated_device.hpp"
#include "gpumem/host/pinned_pool.hpp"
#include "gpumem/host/simulated_host_device.hpp"
#include "support/sim.hpp"

namespace {

using namespace gpumem_test;
using gpumem::simulated_device;

std::size_t ops_per_thread() {
  const char* v = std::getenv("GPUMEM_STRESS_OPS");
  return v != nullptr && std::atoi(v) > 0 ? static_cast<std::size_t>(std::atoi(v)) : 4000;
}

constexpr int threads = 4;

class Stress : public ::testing::TestWithParam<const char*> {};

TEST_P(Stress, ThreadsStreamsAndSizesOnOneAllocator) {
  simulated_device dev{device_options(4 * GiB, gpumem::event_completion::manual)};
  allocator a(dev, config(GetParam()));
  std::vector<simulated_device::stream_type> streams{dev.default_stream()};
  for (int i = 0; i < 3; ++i) streams.push_back(dev.create_stream());
  const std::size_t ops = ops_per_thread();
  std::atomic<std::size_t> done{0};
  std::atomic<std::size_t> ooms{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + static_cast<unsigned>(t));
      std::vector<void*> live;
      const std::size_t sizes[] = {512, 4 * KiB, 700 * KiB, 2 * MiB, 9 * MiB, 33 * MiB};
      for (std::size_t i = 0; i < ops; ++i) {
        const auto r = rng() % 100;
        const auto stream = streams[rng() % streams.size()];
        if (r < 45 || live.empty()) {
          try {
            live.push_back(a.allocate(sizes[rng() % 6] + rng() % 1000, stream));
          } catch (const gpumem::out_of_memory&) {
            ++ooms;
          }
        } else if (r < 85) {
          const std::size_t k = rng() % live.size();
          a.deallocate(live[k]);
          live[k] = live.back();
          live.pop_back();
        } else if (r < 95) {
          a.record_stream(live[rng() % live.size()], streams[rng() % streams.size()]);
        } else if (r < 98) {
          dev.complete_stream(streams[rng() % streams.size()]);
        } else {
          a.empty_cache();
        }
        ++done;
      }
      for (void* p : live) a.deallocate(p);
    });
  }
  for (auto& w : workers) w.join();
  dev.complete_all();
  a.empty_cache();
  a.check_invariants();
  EXPECT_EQ(a.usage().allocated, 0u);
  EXPECT_EQ(a.usage().reserved, 0u);
  EXPECT_EQ(dev.bytes_in_use(), 0u);  // nothing lost
  std::printf("gpumem stress: %s: %zu operations on %d threads, %zu out-of-memory\n", GetParam(),
              done.load(), threads, ooms.load());
}

INSTANTIATE_TEST_SUITE_P(EveryPolicy, Stress,
                         ::testing::Values("policy:classic", "policy:expandable", "policy:stitch",
                                           "policy:classic,max_split_size_mb:40,"
                                           "garbage_collection_threshold:0.6,"
                                           "per_process_memory_fraction:0.5"));

TEST(StressPinnedPool, ThreadsStreamsAndSizes) {
  simulated_device dev{device_options(1 * GiB, gpumem::event_completion::manual)};
  gpumem::simulated_host_device host(dev);
  gpumem::pinned_pool<gpumem::simulated_host_device> pool(host, config());
  std::vector<simulated_device::stream_type> streams{dev.default_stream(), dev.create_stream()};
  const std::size_t ops = ops_per_thread() / 2;
  std::atomic<std::size_t> done{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(77 + static_cast<unsigned>(t));
      std::vector<void*> live;
      for (std::size_t i = 0; i < ops; ++i) {
        const auto r = rng() % 100;
        if (r < 45 || live.empty()) {
          void* p = pool.allocate(1 + rng() % (256 * KiB));
          static_cast<volatile char*>(p)[0] = 1;  // real host memory
          live.push_back(p);
        } else if (r < 85) {
          const std::size_t k = rng() % live.size();
          pool.deallocate(live[k]);
          live[k] = live.back();
          live.pop_back();
        } else if (r < 95) {
          pool.record_event(live[rng() % live.size()], streams[rng() % streams.size()]);
        } else if (r < 98) {
          dev.complete_stream(streams[rng() % streams.size()]);
        } else {
          pool.empty_cache();
        }
        ++done;
      }
      for (void* p : live) pool.deallocate(p);
    });
  }
  for (auto& w : workers) w.join();
  dev.complete_all();
  pool.empty_cache();
  EXPECT_EQ(pool.stats().allocation.current, 0);
  EXPECT_EQ(pool.stats().reserved_bytes.current, 0);
  std::printf("gpumem stress: pinned pool: %zu operations on %d threads\n", done.load(), threads);
}

// The allocator's lock while its holder waits on the GPU (an out-of-memory retry, empty_cache):
// a waiter spins briefly, then sleeps until the unlock, rather than burning a core on yields.
TEST(SpinMutex, AWaiterSleepsWhileTheHolderIsSlow) {
  gpumem::detail::spin_mutex m;
  std::atomic<bool> holding{false};
  std::thread holder([&] {
    m.lock();
    holding = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    m.unlock();
  });
  while (!holding) std::this_thread::yield();
  double cpu_seconds = 0;
  const auto start = std::chrono::steady_clock::now();
  std::thread waiter([&] {
    m.lock();  // blocks about 300 ms
    m.unlock();
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    cpu_seconds = static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  });
  waiter.join();
  holder.join();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(waited, 0.2);
  EXPECT_LT(cpu_seconds, 0.05) << "the waiter used the CPU for " << cpu_seconds << " s of "
                               << waited << " s";
}

// Many threads contending for the lock all get it, and its critical sections do not overlap.
TEST(SpinMutex, ContendedLockIsExclusive) {
  gpumem::detail::spin_mutex m;
  long counter = 0;
  std::vector<std::thread> workers;
  for (int t = 0; t < 4; ++t) {
    workers.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        m.lock();
        if (i % 1000 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        ++counter;
        m.unlock();
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(counter, 4 * 20000);
}

}  // namespace
