// pinned_pool<HostDevice>: PyTorch's CachingHostAllocator semantics on the simulated host device
// (real memory, simulated pinning, manual event completion), the host devices themselves, and
// cuda_host_device, which is compiled and linked everywhere; its GPU test skips with a message
// where cudaGetDeviceCount fails or reports 0 (and runs under the CUDA simulator or on a GPU).
#include "gpumem/host/pinned_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "gpumem/device/fault_injection.hpp"
#include "gpumem/device/simulated_device.hpp"
#include "gpumem/host/cuda_host_device.hpp"
#include "gpumem/host/host_device.hpp"
#include "gpumem/host/simulated_host_device.hpp"

// Every member of the pool instantiated for the CUDA runtime: compiled and linked everywhere.
template class gpumem::pinned_pool<gpumem::cuda_host_device>;

namespace {

using gpumem::allocator_config;
using gpumem::cuda_error;
using gpumem::cuda_host_device;
using gpumem::event_completion;
using gpumem::fault_injection;
using gpumem::host_stats;
using gpumem::out_of_memory;
using gpumem::simulated_device;
using gpumem::simulated_host_device;
using gpumem::usage_error;

using pool = gpumem::pinned_pool<simulated_host_device>;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

static_assert(gpumem::is_host_device_v<simulated_host_device>);
static_assert(gpumem::is_host_device_v<cuda_host_device>);
static_assert(!gpumem::is_host_device_v<simulated_device>);  // no host_alloc
static_assert(!gpumem::is_host_device_v<int>);
static_assert(std::is_same_v<cuda_host_device::stream_type, cudaStream_t>);
static_assert(pool::round_size(0) == 0 && pool::round_size(1) == 1 && pool::round_size(3) == 4);
static_assert(pool::round_size(4096) == 4096 && pool::round_size(4097) == 8192);

/// A config from `text` alone: tests ignore the environment.
allocator_config config(const std::string& text = "") {
  return allocator_config::parse(text);
}

simulated_device::options gpu_options(event_completion completion = event_completion::manual) {
  simulated_device::options o;
  o.capacity = std::size_t{1} << 30;
  o.completion = completion;
  return o;
}

simulated_host_device::options host_options(std::size_t capacity = SIZE_MAX) {
  simulated_host_device::options o;
  o.capacity = capacity;
  return o;
}

/// The four stats' current values, for "nothing changed" checks.
std::vector<std::int64_t> currents(const host_stats& s) {
  return {s.allocation.current, s.segment.current, s.allocated_bytes.current,
          s.reserved_bytes.current};
}

// ---------------------------------------------------------------------------------------------
// Rounding and reuse
// ---------------------------------------------------------------------------------------------

TEST(PinnedPool, RoundsRequestsUpToAPowerOfTwo) {
  EXPECT_EQ(pool::round_size(5000), 8192u);
  EXPECT_EQ(pool::round_size(MiB + 1), 2 * MiB);
  const std::size_t half = std::size_t{1} << 63;
  EXPECT_EQ(pool::round_size(half), half);
  EXPECT_EQ(pool::round_size(half + 1), 0u);  // no power of two holds it

  simulated_device gpu(gpu_options());
  simulated_host_device host(gpu);
  pool p(host, config());
  void* a = p.allocate(3);
  void* b = p.allocate(5000);
  void* c = p.allocate(4096);
  EXPECT_EQ(p.block_size(a), 4u);
  EXPECT_EQ(p.block_size(b), 8192u);
  EXPECT_EQ(p.block_size(c), 4096u);
  EXPECT_EQ(p.stats().allocated_bytes.current, 4 + 8192 + 4096);
  EXPECT_EQ(p.stats().reserved_bytes.current, 4 + 8192 + 4096);
  // The host device was asked for the rounded sizes (and pins whole pages of them).
  EXPECT_EQ(host.pinned_bytes(), 4096u + 8192u + 4096u);
  EXPECT_THROW(p.allocate(half + 1), out_of_memory);
  EXPECT_EQ(p.stats().num_ooms, 1);
  EXPECT_EQ(host.counters().host_alloc, 3u);  // the impossible request never reached the device
  p.check_invariants();
}

TEST(PinnedPool, ZeroBytesAndNullPointersAreNoOps) {
  simulated_device gpu(gpu_options());
  simulated_host_device host(gpu);
  pool p(host, config());
  EXPECT_EQ(p.allocate(0), nullptr);
  p.deallocate(nullptr);
  p.record_event(nullptr, gpu.default_stream());
  EXPECT_EQ(currents(p.stats()), (std::vector<std::int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(host.counters().total(), 0u);
}

TEST(PinnedPool, ReusesAFreedBlockOfTheSameSizeClass) {
  simulated_device gpu(gpu_options());
  simulated_host_device host(gpu);
  pool p(host, config());
  void* a = p.allocate(1000);
  p.deallocate(a);
  EXPECT_EQ(p.cached_blocks(), 1u);
  EXPECT_EQ(p.allocate(1000), a);
  p.deallocate(a);
  EXPECT_EQ(p.allocate(600), a);  // 600 also rounds to 1024
  EXPECT_EQ(host.counters().host_alloc, 1u);
  void* big = p.allocate(2000);  // 2048: another size class, a new block
  EXPECT_NE(big, a);
  EXPECT_EQ(host.counters().host_alloc, 2u);
  p.deallocate(big);
  void* small = p.allocate(500);  // 512: the cached 2048 block is not split or reused
  EXPECT_NE(small, big);
  EXPECT_EQ(host.counters().host_alloc, 3u);

  // Most recently freed first, as PyTorch's free lists pop from the back.
  void* x = p.allocate(1000);
  p.deallocate(a);
  p.deallocate(x);
  EXPECT_EQ(p.allocate(1000), x);
  EXPECT_EQ(p.allocate(1000), a);
  p.check_invariants();
}

// ---------------------------------------------------------------------------------------------
// Events: deferred reuse
// ---------------------------------------------------------------------------------------------

TEST(PinnedPool, NoReuseBeforeTheRecordedEventCompletesAndReuseAfter) {
  simulated_device gpu(gpu_options(event_completion::manual));
  simulated_host_device host(gpu);
  pool p(host, config());
  const auto copy_stream = gpu.create_stream();

  void* a = p.allocate(64 * KiB);
  p.record_event(static_cast<char*>(a) + 100, copy_stream);  // any byte of the block will do
  p.deallocate(a);
  EXPECT_EQ(p.pending_blocks(), 1u);
  EXPECT_EQ(gpu.counters().event_record, 1u);
  // Pending blocks still count as allocated (PyTorch decreases only when reusable).
  EXPECT_EQ(p.stats().allocation.current, 1);
  EXPECT_EQ(p.stats().allocated_bytes.current, static_cast<std::int64_t>(64 * KiB));

  void* b = p.allocate(64 * KiB);
  EXPECT_NE(b, a) << "a block was reused while the copy recorded on it may still run";
  EXPECT_EQ(host.counters().host_alloc, 2u);
  p.deallocate(b);  // no stream recorded: cached at once

  gpu.complete_stream(copy_stream);
  // allocate() sees the event complete and caches a, on top of b: a is reused first.
  EXPECT_EQ(p.allocate(64 * KiB), a);
  EXPECT_EQ(p.pending_blocks(), 0u);
  EXPECT_EQ(p.allocate(64 * KiB), b);
  EXPECT_EQ(host.counters().host_alloc, 2u);
  p.check_invariants();
}

TEST(PinnedPool, WaitsForEveryRecordedStream) {
  simulated_device gpu(gpu_options(event_completion::manual));
  simulated_host_device host(gpu);
  pool p(host, config());
  const auto s1 = gpu.create_stream();
  const auto s2 = gpu.create_stream();

  void* a = p.allocate(4 * KiB);
  p.record_event(a, s1);
  p.record_event(a, s2);
  p.record_event(a, s1);  // recorded twice = once
  p.deallocate(a);
  EXPECT_EQ(gpu.counters().event_record, 2u);

  gpu.complete_stream(s1);
  void* b = p.allocate(4 * KiB);
  EXPECT_NE(b, a);
  EXPECT_EQ(p.pending_blocks(), 1u);
  p.check_invariants();

  gpu.complete_stream(s2);
  EXPECT_EQ(p.allocate(4 * KiB), a);
  p.check_invariants();
}

TEST(PinnedPool, CompletedEventsAreReused) {
  simulated_device gpu(gpu_options(event_completion::manual));
  simulated_host_device host(gpu);
  pool p(host, config());
  const auto s = gpu.create_stream();
  for (int i = 0; i < 5; ++i) {
    void* a = p.allocate(KiB);
    p.record_event(a, s);
    p.deallocate(a);
    gpu.complete_stream(s);
    p.empty_cache();  // processes the event (and releases the block)
  }
  EXPECT_EQ(gpu.counters().event_create, 1u);
  EXPECT_EQ(gpu.counters().event_record, 5u);
  EXPECT_EQ(host.counters().host_alloc, 5u);
}

TEST(PinnedPool, AFailedEventRecordLeavesTheBlockAllocated) {
  simulated_device gpu(gpu_options(event_completion::manual));
  simulated_host_device host(gpu);
  pool p(host, config());
  const auto s = gpu.create_stream();
  void* a = p.allocate(KiB);
  p.record_event(a, gpu.default_stream());
  p.record_event(a, s);
  gpu.destroy_stream(s);  // recording on it now fails, as in CUDA
  const auto before = p.stats();
  EXPECT_THROW(p.deallocate(a), cuda_error);
  EXPECT_EQ(currents(p.stats()), currents(before));
  EXPECT_EQ(p.block_size(a), KiB);  // still allocated
  EXPECT_EQ(p.pending_blocks(), 0u);
  p.check_invariants();
}

// ---------------------------------------------------------------------------------------------
// empty_cache and the destructor
// ---------------------------------------------------------------------------------------------

TEST(PinnedPool, EmptyCacheReleasesOnlyUnusedBlocks) {
  simulated_device gpu(gpu_options(event_completion::manual));
  simulated_host_device host(gpu);
  pool p(host, config());
  const auto s = gpu.create_stream();
  void* in_use = p.allocate(8 * KiB);
  void* cached = p.allocate(16 * KiB);
  void* pending = p.allocate(32 * KiB);
  p.deallocate(cached);
  p.record_event(pending, s);
  p.deallocate(pending);

  p.empty_cache();
  EXPECT_EQ(host.counters().host_free, 1u);
  EXPECT_FALSE(host.is_pinned(cached));
  EXPECT_TRUE(host.is_pinned(in_use));
  EXPECT_TRUE(host.is_pinned(pending));
  EXPECT_EQ(host.pinned_bytes(), 40 * KiB);
  EXPECT_EQ(p.stats().segment.current, 2);
  EXPECT_EQ(p.stats().reserved_bytes.current, static_cast<std::int64_t>(40 * KiB));
  p.check_invariants();

  gpu.complete_stream(s);
  p.empty_cache();  // the copy is done: the pending block is cached, then released
  EXPECT_EQ(host.pinned_bytes(), 8 * KiB);
  EXPECT_EQ(p.stats().segment.current, 1);
  std::memset(in_use, 1, 8 * KiB);  // the allocated block was left alone
  p.check_invariants();
}

TEST(PinnedPool, DestructorWaitsForEventsAndReturnsEverything) {
  simulated_device gpu(gpu_options(event_completion::manual));
  simulated_host_device host(gpu);
  const auto s = gpu.create_stream();
  for (const char* cfg : {"", "pinned_use_cuda_host_register:True"}) {
    {
      pool p(host, config(cfg));
      void* leaked = p.allocate(KiB);  // never freed by the user
      void* pending = p.allocate(2 * KiB);
      p.record_event(pending, s);
      p.deallocate(pending);
      void* cached = p.allocate(4 * KiB);
      p.deallocate(cached);
      (void)leaked;
      EXPECT_GT(host.pinned_bytes(), 0u);
    }
    EXPECT_EQ(host.pinned_bytes(), 0u) << cfg;
    EXPECT_EQ(host.live_host_allocations() + host.live_registrations(), 0u);
    EXPECT_EQ(gpu.live_events(), 0u);
  }
  EXPECT_GE(gpu.counters().event_synchronize, 2u);  // the pending copies were waited for
}

// ---------------------------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------------------------

TEST(PinnedPool, StatsFollowHostMemoryStats) {
  simulated_device gpu(gpu_options(event_completion::manual));
  simulated_host_device host(gpu);
  pool p(host, config());
  const auto s = gpu.create_stream();
  const auto kib = [](std::int64_t n) { return n * 1024; };

  void* a = p.allocate(1 * KiB);
  void* b = p.allocate(2 * KiB);
  void* c = p.allocate(3 * KiB);  // 4 KiB
  host_stats st = p.stats();
  EXPECT_EQ(st.allocation, (gpumem::stat{3, 3, 3, 0}));
  EXPECT_EQ(st.segment, (gpumem::stat{3, 3, 3, 0}));
  EXPECT_EQ(st.allocated_bytes, (gpumem::stat{kib(7), kib(7), kib(7), 0}));
  EXPECT_EQ(st.reserved_bytes, (gpumem::stat{kib(7), kib(7), kib(7), 0}));
  EXPECT_EQ(st.num_host_alloc, 3);
  EXPECT_EQ(st.num_host_free, 0);

  p.deallocate(a);
  p.record_event(b, s);
  p.deallocate(b);
  st = p.stats();
  EXPECT_EQ(st.allocation, (gpumem::stat{2, 3, 3, 1}));  // b is pending: still counted
  EXPECT_EQ(st.allocated_bytes, (gpumem::stat{kib(6), kib(7), kib(7), kib(1)}));

  void* a2 = p.allocate(KiB);  // reuses a: no host call, allocation counted again
  EXPECT_EQ(a2, a);
  st = p.stats();
  EXPECT_EQ(st.allocation, (gpumem::stat{3, 3, 4, 1}));
  EXPECT_EQ(st.segment, (gpumem::stat{3, 3, 3, 0}));

  gpu.complete_stream(s);
  p.deallocate(a2);
  p.deallocate(c);
  p.empty_cache();  // b's event completes, then a, b, c are released
  st = p.stats();
  EXPECT_EQ(st.allocation, (gpumem::stat{0, 3, 4, 4}));
  EXPECT_EQ(st.segment, (gpumem::stat{0, 3, 3, 3}));
  EXPECT_EQ(st.reserved_bytes, (gpumem::stat{0, kib(7), kib(7), kib(7)}));
  EXPECT_EQ(st.num_host_alloc, 3);
  EXPECT_EQ(st.num_host_free, 3);

  void* d = p.allocate(KiB);
  p.reset_peak_stats();
  st = p.stats();
  EXPECT_EQ(st.allocation.peak, 1);
  EXPECT_EQ(st.reserved_bytes.peak, kib(1));
  p.reset_accumulated_stats();
  st = p.stats();
  EXPECT_EQ(st.allocation, (gpumem::stat{1, 1, 0, 0}));
  EXPECT_EQ(st.num_host_alloc, 0);
  EXPECT_EQ(st.num_host_free, 0);
  p.deallocate(d);
  p.check_invariants();
}

TEST(PinnedPool, DurationStatFollowsPyTorchsRules) {
  gpumem::duration_stat d;
  EXPECT_EQ(d.average(), 0);
  d.increase(5);
  d.increase(3);
  d.increase(10);
  EXPECT_EQ(d.total, 18);
  EXPECT_EQ(d.count, 3);
  EXPECT_EQ(d.max, 10);
  EXPECT_EQ(d.min, 3);
  EXPECT_EQ(d.average(), 6);
  d.reset_peak();
  EXPECT_EQ(d.min, 0);
  EXPECT_EQ(d.max, 0);
  EXPECT_EQ(d.total, 18);
  d.increase(7);
  EXPECT_EQ(d.min, 7);  // 0 = unset: the next sample becomes the minimum
  d.reset_accumulated();
  EXPECT_EQ(d.total, 0);
  EXPECT_EQ(d.count, 0);
  EXPECT_EQ(d.max, 7);
}

TEST(PinnedPool, TimesHostCalls) {
  simulated_device gpu(gpu_options());
  simulated_host_device::options o;
  o.call_latency = std::chrono::microseconds(2000);
  simulated_host_device host(gpu, o);
  pool p(host, config());
  void* a = p.allocate(KiB);
  void* b = p.allocate(2 * KiB);
  void* c = p.allocate(4 * KiB);
  p.deallocate(a);
  EXPECT_EQ(p.allocate(KiB), a);  // a cache hit is not a host call: not timed
  host_stats st = p.stats();
  EXPECT_EQ(st.host_alloc_time.count, 3);
  EXPECT_GE(st.host_alloc_time.min, 2000);
  EXPECT_GE(st.host_alloc_time.max, st.host_alloc_time.min);
  EXPECT_GE(st.host_alloc_time.total, 3 * 2000);
  EXPECT_GE(st.host_alloc_time.average(), 2000);
  EXPECT_EQ(st.host_free_time.count, 0);

  for (void* x : {a, b, c}) p.deallocate(x);
  p.empty_cache();
  st = p.stats();
  EXPECT_EQ(st.host_free_time.count, 3);
  EXPECT_GE(st.host_free_time.min, 2000);
  EXPECT_GE(st.host_free_time.total, 3 * 2000);

  p.reset_peak_stats();
  st = p.stats();
  EXPECT_EQ(st.host_alloc_time.min, 0);
  EXPECT_EQ(st.host_alloc_time.max, 0);
  EXPECT_EQ(st.host_alloc_time.count, 3);
  p.reset_accumulated_stats();
  st = p.stats();
  EXPECT_EQ(st.host_alloc_time.total, 0);
  EXPECT_EQ(st.host_alloc_time.count, 0);
  EXPECT_EQ(st.host_free_time.count, 0);
}

TEST(PinnedPool, SummaryIsA75ColumnTable) {
  simulated_device gpu(gpu_options(event_completion::manual));
  simulated_host_device host(gpu);
  pool p(host, config("pinned_use_cuda_host_register:True,pinned_use_background_threads:True"));
  const auto s = gpu.create_stream();
  void* a = p.allocate(3 * MiB);
  void* b = p.allocate(KiB);
  p.record_event(b, s);
  p.deallocate(b);
  const std::string text = p.summary();
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  std::size_t start = 0;
  int lines = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    const std::string line = text.substr(start, end - start);
    EXPECT_EQ(line.size(), 77u) << "line " << lines << ": '" << line << "'";
    EXPECT_EQ(line.front(), '|');
    EXPECT_EQ(line.back(), '|');
    start = end + 1;
    ++lines;
  }
  EXPECT_GT(lines, 20);
  for (const char* expected :
       {"gpumem pinned host memory summary", "Pinned OOMs: 0", "host alloc retries: 0",
        "Allocated memory", "Reserved memory", "   4097 KiB", "Host alloc x2",
        "malloc + cudaHostRegister", "1024 bytes in 1 blocks, 1 events",
        "Not honoured          | pinned_use_background_threads:True"}) {
    EXPECT_NE(text.find(expected), std::string::npos) << expected << "\n" << text;
  }
  p.deallocate(a);
}

TEST(PinnedPool, NotesNameThePinnedSettingsItDoesNotHonour) {
  simulated_device gpu(gpu_options());
  simulated_host_device host(gpu);
  EXPECT_TRUE(pool(host, config("pinned_use_cuda_host_register:True,"
                                "pinned_num_register_threads:8"))
                  .notes()
                  .empty());
  const auto notes = pool(host, config("pinned_use_background_threads:True,"
                                       "pinned_reserve_segment_size_mb:64"))
                         .notes();
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_NE(notes[0].find("pinned_use_background_threads"), std::string::npos);
  EXPECT_NE(notes[1].find("pinned_reserve_segment_size_mb:64"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// The cudaHostRegister path
// ---------------------------------------------------------------------------------------------

TEST(PinnedPool, RegisterPathCountsRegisterAndUnregisterCalls) {
  simulated_device gpu(gpu_options());
  simulated_host_device host(gpu);
  pool p(host, config("pinned_use_cuda_host_register:True"));
  EXPECT_TRUE(p.uses_host_register());
  void* a = p.allocate(100);  // a 128-byte block in a whole page of its own
  void* b = p.allocate(64 * KiB);
  const std::size_t page = gpumem::detail::host_page_size();
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % page, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % page, 0u);
  EXPECT_EQ(host.counters().host_register, 2u);
  EXPECT_EQ(host.counters().host_alloc, 0u);
  EXPECT_EQ(host.live_registrations(), 2u);
  EXPECT_EQ(p.stats().reserved_bytes.current, static_cast<std::int64_t>(128 + 64 * KiB));
  EXPECT_EQ(p.stats().num_host_alloc, 2);
  std::memset(a, 0x5a, 128);
  p.deallocate(a);
  p.deallocate(b);
  p.empty_cache();
  EXPECT_EQ(host.counters().host_unregister, 2u);
  EXPECT_EQ(host.counters().host_free, 0u);
  EXPECT_EQ(host.pinned_bytes(), 0u);
  EXPECT_EQ(p.stats().num_host_free, 2);
  p.check_invariants();

  pool plain(host, config());
  EXPECT_FALSE(plain.uses_host_register());
  plain.deallocate(plain.allocate(KiB));
  plain.empty_cache();
  EXPECT_EQ(host.counters().host_alloc, 1u);
  EXPECT_EQ(host.counters().host_free, 1u);
  EXPECT_EQ(host.counters().host_register, 2u);
}

TEST(PinnedPool, RegisterThreadsTouchPagesInParallelChunks) {
  const std::size_t page = gpumem::detail::host_page_size();
  std::vector<unsigned char> memory(64 * page + 17, 0xff);
  EXPECT_EQ(gpumem::detail::prefault_pages(memory.data(), memory.size(), 4, page), 4u);
  std::size_t touched = 0;
  for (unsigned char byte : memory) touched += byte == 0 ? 1 : 0;
  // Every page that starts inside the range had its first byte written, nothing else.
  const auto start = reinterpret_cast<std::uintptr_t>(memory.data());
  const std::uintptr_t first = (start + page - 1) / page * page;
  const std::size_t pages = (start + memory.size() - first + page - 1) / page;
  EXPECT_EQ(touched, pages);
  // Too few pages for the threads: the caller alone.
  EXPECT_EQ(gpumem::detail::prefault_pages(memory.data(), 2 * page, 4, page), 1u);
  EXPECT_EQ(gpumem::detail::prefault_pages(memory.data(), memory.size(), 1, page), 1u);

  simulated_device gpu(gpu_options());
  simulated_host_device host(gpu);
  pool p(host, config("pinned_use_cuda_host_register:True,pinned_num_register_threads:4"));
  EXPECT_EQ(p.register_threads(), 4u);
  void* a = p.allocate(MiB);
  std::memset(a, 0x11, MiB);
  EXPECT_EQ(static_cast<unsigned char*>(a)[MiB - 1], 0x11);
  EXPECT_EQ(host.counters().host_register, 1u);  // one registration however many threads
  p.deallocate(a);
}

// ---------------------------------------------------------------------------------------------
// Out of memory and fault injection
// ---------------------------------------------------------------------------------------------

TEST(PinnedPool, ReleasesTheCacheAndRetriesOnce) {
  simulated_device gpu(gpu_options());
  simulated_host_device host(gpu, host_options(64 * KiB));
  pool p(host, config());
  void* a = p.allocate(16 * KiB);
  void* b = p.allocate(16 * KiB);
  void* c = p.allocate(8 * KiB);
  p.deallocate(a);
  p.deallocate(b);  // 32 KiB cached, 40 KiB pinned

  // A 32 KiB block does not fit next to 40 KiB; it does once the cache is released.
  void* d = p.allocate(20 * KiB);
  ASSERT_NE(d, nullptr);
  const host_stats st = p.stats();
  EXPECT_EQ(st.num_alloc_retries, 1);
  EXPECT_EQ(st.num_ooms, 0);
  EXPECT_EQ(st.segment.current, 2);
  EXPECT_EQ(st.num_host_free, 2);
  EXPECT_EQ(host.counters().host_alloc, 5u);  // a, b, c, the failed try, the retry
  EXPECT_EQ(host.out_of_memory_failures(), 1u);
  EXPECT_EQ(host.pinned_bytes(), 40 * KiB);
  EXPECT_EQ(p.cached_blocks(), 0u);
  p.check_invariants();
  p.deallocate(c);
  p.deallocate(d);
}

TEST(PinnedPool, OutOfMemoryIsAClearErrorAndLeavesThePoolConsistent) {
  simulated_device gpu(gpu_options(event_completion::manual));
  simulated_host_device host(gpu, host_options(64 * KiB));
  pool p(host, config());
  const auto s = gpu.create_stream();
  void* a = p.allocate(32 * KiB);
  void* b = p.allocate(16 * KiB);
  void* c = p.allocate(8 * KiB);
  p.record_event(c, s);
  p.deallocate(c);  // pending: not released by the retry
  p.deallocate(b);  // cached: released by the retry

  try {
    p.allocate(20 * KiB);
    FAIL() << "expected out_of_memory";
  } catch (const out_of_memory& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("Pinned host memory: out of memory. Tried to allocate 32.00 KiB", 0), 0u)
        << what;
    EXPECT_NE(what.find("20.00 KiB requested"), std::string::npos) << what;
    EXPECT_NE(what.find("after releasing 16.00 KiB of cached blocks"), std::string::npos) << what;
    EXPECT_NE(what.find("awaiting events"), std::string::npos) << what;
    EXPECT_EQ(e.info().requested_bytes, 20 * KiB);
    EXPECT_EQ(e.info().rounded_bytes, 32 * KiB);
    EXPECT_EQ(e.info().reserved_bytes, 40 * KiB);
    EXPECT_EQ(e.info().allocated_bytes, 40 * KiB);
    EXPECT_EQ(e.info().free_cached_bytes, 0u);
  }
  const host_stats st = p.stats();
  EXPECT_EQ(st.num_ooms, 1);
  EXPECT_EQ(st.num_alloc_retries, 1);
  EXPECT_EQ(st.segment.current, 2);  // the cached block was released, the others stay
  EXPECT_EQ(host.pinned_bytes(), 40 * KiB);
  p.check_invariants();
  EXPECT_TRUE((std::is_base_of_v<std::bad_alloc, out_of_memory>));

  // Once the copy completes, the retry can release the pending block too.
  gpu.complete_stream(s);
  void* d = p.allocate(20 * KiB);
  EXPECT_NE(d, nullptr);
  EXPECT_EQ(p.stats().num_ooms, 1);
  p.deallocate(a);
  p.deallocate(d);
  p.check_invariants();
}

// A representative sequence: several sizes, reuse, a recorded stream with manual completion,
// empty_cache, and one request above the injected size limit (always out of memory).
struct sequence_result {
  int ooms = 0;
};

sequence_result run_sequence(simulated_host_device& host, simulated_device& gpu,
                             const allocator_config& cfg) {
  sequence_result r;
  pool p(host, cfg);
  const auto s = gpu.create_stream();
  std::vector<void*> live;
  const auto alloc = [&](std::size_t bytes) {
    try {
      void* ptr = p.allocate(bytes);
      std::memset(ptr, 0x3c, bytes);
      live.push_back(ptr);
    } catch (const out_of_memory& e) {
      ++r.ooms;
      EXPECT_EQ(std::string(e.what()).rfind("Pinned host memory: out of memory.", 0), 0u);
      EXPECT_EQ(e.info().requested_bytes, bytes);
    }
    p.check_invariants();
  };
  const auto free_at = [&](std::size_t i, bool with_event) {
    if (i >= live.size()) return;
    if (with_event) p.record_event(live[i], s);
    p.deallocate(live[i]);
    live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    p.check_invariants();
  };
  alloc(KiB);
  alloc(3 * KiB);
  alloc(64 * KiB);
  alloc(2 * MiB + 1);  // above fail_above_bytes: both tries fail
  free_at(0, true);
  alloc(KiB);  // the first block is pending: a new block
  free_at(1, false);
  alloc(2 * KiB);
  gpu.complete_stream(s);
  alloc(100 * KiB);
  alloc(KiB);
  free_at(0, false);
  p.empty_cache();
  p.check_invariants();
  alloc(16 * KiB);
  alloc(16 * KiB);
  while (!live.empty()) free_at(live.size() - 1, live.size() % 2 == 0);
  alloc(8 * KiB);  // left allocated: the destructor returns it
  return r;
}

TEST(PinnedPool, FaultInjectionAtEveryCall) {
  for (const char* cfg : {"", "pinned_use_cuda_host_register:True"}) {
    // The baseline counts the fallible calls of the sequence.
    std::size_t calls = 0;
    {
      simulated_device gpu(gpu_options(event_completion::manual));
      fault_injection limit;
      limit.fail_above_bytes = 2 * MiB;
      simulated_host_device::options o;
      o.faults = limit;
      simulated_host_device host(gpu, o);
      EXPECT_EQ(run_sequence(host, gpu, config(cfg)).ooms, 1);
      calls = host.fallible_calls();
      EXPECT_EQ(host.pinned_bytes(), 0u);
    }
    ASSERT_GT(calls, 8u);
    for (std::size_t n = 1; n <= calls + 1; ++n) {
      SCOPED_TRACE(std::string(cfg) + " failing fallible call " + std::to_string(n));
      simulated_device gpu(gpu_options(event_completion::manual));
      fault_injection f;
      f.fail_above_bytes = 2 * MiB;
      f.fail_nth_call = n;
      simulated_host_device::options o;
      o.faults = f;
      simulated_host_device host(gpu, o);
      // A single injected failure is absorbed by the retry; the size limit still throws once.
      EXPECT_EQ(run_sequence(host, gpu, config(cfg)).ooms, 1);
      EXPECT_EQ(host.pinned_bytes(), 0u);
      EXPECT_EQ(host.live_host_allocations() + host.live_registrations(), 0u);
      EXPECT_EQ(gpu.live_events(), 0u);
    }
  }
}

TEST(PinnedPool, RandomFaultsKeepThePoolConsistent) {
  int total_ooms = 0;
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    simulated_device gpu(gpu_options(event_completion::manual));
    fault_injection f;
    f.fail_probability = 0.5;
    f.seed = seed;
    simulated_host_device::options o;
    o.faults = f;
    simulated_host_device host(gpu, o);
    total_ooms += run_sequence(host, gpu, config()).ooms;
    EXPECT_EQ(host.pinned_bytes(), 0u) << "seed " << seed;
  }
  EXPECT_GT(total_ooms, 20);  // the size-limit-free requests failed too, at random
}

// ---------------------------------------------------------------------------------------------
// Bad use
// ---------------------------------------------------------------------------------------------

TEST(PinnedPool, BadUseIsAUsageErrorAndChangesNothing) {
  simulated_device gpu(gpu_options(event_completion::manual));
  simulated_host_device host(gpu);
  pool p(host, config());
  const auto s = gpu.create_stream();
  void* live = p.allocate(KiB);
  void* freed = p.allocate(2 * KiB);
  p.deallocate(freed);
  void* pending = p.allocate(4 * KiB);
  p.record_event(pending, s);
  p.deallocate(pending);
  int not_ours = 0;

  const host_stats before = p.stats();
  const auto host_before = host.counters();
  const auto gpu_before = gpu.counters();
  const auto expect_error = [&](auto&& call, const char* text) {
    try {
      call();
      ADD_FAILURE() << "expected usage_error containing '" << text << "'";
    } catch (const usage_error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error([&] { p.deallocate(&not_ours); }, "not memory allocated by this pinned pool");
  expect_error([&] { p.deallocate(static_cast<char*>(live) + 8); }, "8 bytes inside the block");
  expect_error([&] { p.deallocate(freed); }, "already deallocated (it is cached)");
  expect_error([&] { p.deallocate(pending); }, "already deallocated (it awaits its recorded");
  expect_error([&] { p.record_event(&not_ours, s); }, "record_event");
  expect_error([&] { p.record_event(freed, s); }, "already deallocated");
  expect_error([&] { (void)p.block_size(&not_ours); }, "block_size");

  const host_stats after = p.stats();
  EXPECT_EQ(currents(after), currents(before));
  EXPECT_EQ(after.allocation, before.allocation);
  EXPECT_EQ(host.counters(), host_before);
  EXPECT_EQ(gpu.counters(), gpu_before);
  EXPECT_EQ(p.pending_blocks(), 1u);
  EXPECT_EQ(p.cached_blocks(), 1u);
  p.check_invariants();
  p.deallocate(live);  // the pool still works
  EXPECT_EQ(p.allocate(KiB), live);
}

TEST(SimulatedHostDevice, MisuseIsACudaErrorAndChangesNothing) {
  simulated_device gpu(gpu_options());
  simulated_host_device host(gpu);
  void* a = host.host_alloc(10 * KiB);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(host.pinned_bytes(), 12 * KiB);  // whole 4 KiB pages
  std::vector<unsigned char> mine(3 * 4096);
  ASSERT_TRUE(host.host_register(mine.data(), mine.size()));
  const auto before = host.counters();
  const auto code_of = [](auto&& call) {
    try {
      call();
    } catch (const cuda_error& e) {
      return e.code();
    }
    return 0;
  };
  int local = 0;
  EXPECT_EQ(code_of([&] { host.host_free(&local, 4); }),
            simulated_host_device::error_invalid_value);
  EXPECT_EQ(code_of([&] { host.host_free(a, 4); }), simulated_host_device::error_invalid_value);
  EXPECT_EQ(code_of([&] { host.host_free(static_cast<char*>(a) + 1, 4); }),
            simulated_host_device::error_invalid_value);
  EXPECT_EQ(code_of([&] { host.host_free(mine.data(), mine.size()); }),
            simulated_host_device::error_invalid_value);
  EXPECT_EQ(code_of([&] { host.host_register(mine.data() + 1, 10); }),
            simulated_host_device::error_host_memory_already_registered);
  EXPECT_EQ(code_of([&] { host.host_register(a, 10); }),
            simulated_host_device::error_host_memory_already_registered);
  EXPECT_EQ(code_of([&] { host.host_register(nullptr, 10); }),
            simulated_host_device::error_invalid_value);
  EXPECT_EQ(code_of([&] { host.host_unregister(a, 10 * KiB); }),
            simulated_host_device::error_host_memory_not_registered);
  EXPECT_EQ(code_of([&] { host.host_unregister(mine.data(), 1); }),
            simulated_host_device::error_invalid_value);
  EXPECT_EQ(host.counters(), before);
  EXPECT_EQ(host.live_registrations(), 1u);
  EXPECT_EQ(host.live_host_allocations(), 1u);

  host.host_unregister(mine.data(), mine.size());
  host.host_free(a, 10 * KiB);
  EXPECT_EQ(host.pinned_bytes(), 0u);
  EXPECT_EQ(
      host.peak_pinned_bytes(),
      12 * KiB + 3 * 4096 + (reinterpret_cast<std::uintptr_t>(mine.data()) % 4096 != 0 ? 4096 : 0));
  EXPECT_EQ(host.counters().host_alloc, 1u);
  EXPECT_EQ(host.counters().host_register, 1u);
}

TEST(SimulatedHostDevice, CapacityAndFaultsFailLikeOutOfMemory) {
  simulated_device gpu(gpu_options());
  simulated_host_device host(gpu, host_options(16 * KiB));
  void* a = host.host_alloc(12 * KiB);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(host.host_alloc(8 * KiB), nullptr);  // over the capacity
  EXPECT_EQ(host.out_of_memory_failures(), 1u);
  fault_injection f;
  f.fail_nth_call = 1;
  host.set_faults(f);
  EXPECT_EQ(host.host_alloc(KiB), nullptr);  // injected
  EXPECT_EQ(host.injected_faults(), 1u);
  void* b = host.host_alloc(KiB);  // the next call works
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(host.counters().host_alloc, 4u);
  EXPECT_THROW(host.set_faults(fault_injection{0, 0, 1.5, 0}), std::invalid_argument);
  host.host_free(a, 12 * KiB);
  host.host_free(b, KiB);
  EXPECT_EQ(host.pinned_bytes(), 0u);
}

// ---------------------------------------------------------------------------------------------
// Real memory, threads
// ---------------------------------------------------------------------------------------------

TEST(PinnedPool, MemoryIsReallyWritable) {
  simulated_device gpu(gpu_options());
  simulated_host_device host(gpu);
  for (const char* cfg : {"", "pinned_use_cuda_host_register:True"}) {
    pool p(host, config(cfg));
    for (std::size_t bytes : {std::size_t{1}, 4 * KiB + 1, 3 * MiB}) {
      auto* data = static_cast<unsigned char*>(p.allocate(bytes));
      const std::size_t size = p.block_size(data);
      std::memset(data, 0xab, size);  // the whole block, not only what was asked for
      for (std::size_t i = 0; i < size; i += 511) ASSERT_EQ(data[i], 0xab);
      EXPECT_EQ(data[size - 1], 0xab);
      p.deallocate(data);
      auto* again = static_cast<unsigned char*>(p.allocate(bytes));  // reused: still writable
      EXPECT_EQ(again, data);
      std::memset(again, 0x01, size);
      EXPECT_EQ(again[size / 2], 0x01);
      p.deallocate(again);
    }
  }
  EXPECT_EQ(host.pinned_bytes(), 0u);
}

TEST(PinnedPool, TwoThreadSmoke) {
  simulated_device gpu(gpu_options(event_completion::immediate));
  simulated_host_device host(gpu);
  {
    pool p(host, config());
    std::atomic<int> errors{0};
    std::atomic<int> ready{0};
    const auto worker = [&](unsigned seed) {
      std::mt19937 rng(seed);
      const auto stream = gpu.create_stream();
      std::vector<unsigned char*> mine;
      ready.fetch_add(1);
      while (ready.load() < 2) std::this_thread::yield();  // start together

      for (int i = 0; i < 20000; ++i) {
        if (mine.empty() || (mine.size() < 64 && rng() % 2 != 0)) {
          // Few size classes, so that both threads work on the same free lists.
          const std::size_t bytes = std::size_t{1000} << (rng() % 4);
          auto* data = static_cast<unsigned char*>(p.allocate(bytes));
          data[0] = static_cast<unsigned char>(seed);
          data[bytes - 1] = static_cast<unsigned char>(seed);
          if (rng() % 4 == 0) p.record_event(data, stream);
          mine.push_back(data);
        } else {
          const std::size_t at = rng() % mine.size();
          if (mine[at][0] != static_cast<unsigned char>(seed)) ++errors;  // nobody else wrote
          p.deallocate(mine[at]);
          mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(at));
        }
        if (i % 5000 == 4999) p.empty_cache();
      }
      for (unsigned char* data : mine) p.deallocate(data);
    };
    std::thread t1(worker, 1u);
    std::thread t2(worker, 2u);
    t1.join();
    t2.join();
    EXPECT_EQ(errors.load(), 0);
    p.check_invariants();
    p.empty_cache();
    const host_stats st = p.stats();
    EXPECT_EQ(st.allocation.current, 0);
    EXPECT_EQ(st.segment.current, 0);
    EXPECT_EQ(st.allocation.allocated, st.allocation.freed);
    EXPECT_GT(st.allocation.allocated, st.segment.allocated);  // blocks were reused
  }
  EXPECT_EQ(host.pinned_bytes(), 0u);
}

// ---------------------------------------------------------------------------------------------
// cuda_host_device
// ---------------------------------------------------------------------------------------------

TEST(CudaHostDevice, ConstructionMakesNoCudaCall) {
  cuda_host_device host(2);
  EXPECT_EQ(host.index(), 2);
  EXPECT_EQ(host.default_stream(), nullptr);
  gpumem::pinned_pool<cuda_host_device> p(host, config());  // no CUDA call either
  EXPECT_EQ(p.allocate(0), nullptr);
  EXPECT_EQ(p.stats().segment.allocated, 0);
}

TEST(CudaHostDevice, PoolOnARealGpu) {
  if (cuda_host_device::device_count() <= 0) {
    GTEST_SKIP() << "needs a CUDA GPU (or the CUDA simulator): cudaGetDeviceCount failed or "
                    "reported 0";
  }
  cuda_host_device host(0);
  for (const char* cfg : {"", "pinned_use_cuda_host_register:True,pinned_num_register_threads:4"}) {
    SCOPED_TRACE(cfg);
    gpumem::pinned_pool<cuda_host_device> p(host, config(cfg));
    const cudaStream_t stream = host.gpu().create_stream();
    auto* src = static_cast<unsigned char*>(p.allocate(MiB));
    auto* dst = static_cast<unsigned char*>(p.allocate(MiB));
    std::memset(src, 0x42, MiB);
    std::memset(dst, 0, MiB);
    void* device_buffer = nullptr;
    ASSERT_EQ(cudaMalloc(&device_buffer, MiB), cudaSuccess);
    // An upload (DMA from pinned memory on a GPU) and a pinned-to-pinned copy, whose result can
    // be checked on a GPU and under the CUDA simulator alike (which keeps no device data).
    ASSERT_EQ(cudaMemcpyAsync(device_buffer, src, MiB, cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(dst, src, MiB, cudaMemcpyHostToHost, stream), cudaSuccess);
    p.record_event(src, stream);
    p.deallocate(src);
    EXPECT_EQ(p.pending_blocks() + p.cached_blocks(), 1u);
    // Once the stream has passed the event, the block is reused.
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    auto* again = static_cast<unsigned char*>(p.allocate(MiB));
    EXPECT_EQ(again, src);
    EXPECT_EQ(dst[0], 0x42);
    EXPECT_EQ(dst[MiB - 1], 0x42);
    p.deallocate(dst);
    p.deallocate(again);
    p.empty_cache();
    const host_stats st = p.stats();
    EXPECT_EQ(st.num_host_alloc, 2);
    EXPECT_EQ(st.num_host_free, 2);
    EXPECT_EQ(st.host_alloc_time.count, 2);
    p.check_invariants();
    ASSERT_EQ(cudaFree(device_buffer), cudaSuccess);
    host.gpu().destroy_stream(stream);
  }
}

}  // namespace
