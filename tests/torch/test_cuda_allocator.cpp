// gpumem::torch::cuda_allocator installed as PyTorch's CUDA allocator and exercised through
// PyTorch's own C++ entry points (c10::cuda::CUDACachingAllocator::*, c10::GetAllocator), on the
// CUDA simulator: what PyTorch reports must equal what gpumem and the simulator count.
//
// The environment variable GPUMEM_TORCH_TEST_CONF is the configuration installed (ctest runs this
// program once per policy); GPUMEM_TORCH_TEST_MODE=too_late runs only the installation-order test,
// GPUMEM_TORCH_TEST_MODE=oom_snapshot only the tests of the oom_snapshot key (its configuration
// sets the key, on a small simulated device), GPUMEM_TORCH_TEST_MODE=pytorch_ipc only PyTorch's own
// allocator's IPC handles (gpumem not installed), GPUMEM_TORCH_TEST_MODE=fabric only the sharing
// of VMM memory with fabric handles (the simulator with an IMEX channel) and =fabric_refused the
// refusal of expandable_segments_handle_type:fabric where the GPU has no fabric access.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_set>
#include <vector>

#include <gtest/gtest.h>

#include <c10/cuda/CUDAStream.h>

#include "gpumem/torch/cuda_allocator.hpp"
#include "gpumem/trace/detail/pickle.hpp"
#include "gpumem/trace/pytorch_snapshot.hpp"
#include "gpumem/trace/replay.hpp"
#include "gpumem_cudasim.h"

// Exported by libc10_cuda.so, declared in no installed header.
namespace c10::cuda::_internal {
C10_CUDA_API void setHasPrimaryContext(bool (*func)(DeviceIndex));
}

namespace {

namespace c10_alloc = c10::cuda::CUDACachingAllocator;
using gpumem::torch::cuda_allocator;
using Action = c10_alloc::TraceEntry::Action;

constexpr std::size_t MiB = std::size_t{1} << 20;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

gpumemSimCounters sim() {
  auto get =
      reinterpret_cast<gpumemSimGetCounters_t>(dlsym(RTLD_DEFAULT, GPUMEM_SIM_GET_COUNTERS_NAME));
  gpumemSimCounters c{};
  if (get == nullptr || get(&c, sizeof c) != 0)
    ADD_FAILURE() << "not running on the CUDA simulator";
  return c;
}

constexpr std::size_t all = 0;  // StatType::AGGREGATE

bool too_late_mode() {
  return env("GPUMEM_TORCH_TEST_MODE") == "too_late";
}

bool oom_snapshot_mode() {
  return env("GPUMEM_TORCH_TEST_MODE") == "oom_snapshot";
}

class Installed : public ::testing::Test {
 protected:
  void SetUp() override {
    if (too_late_mode()) GTEST_SKIP() << "the too_late run checks installation order only";
    if (oom_snapshot_mode()) GTEST_SKIP() << "the oom_snapshot run checks that key only";
    if (env("GPUMEM_TORCH_TEST_MODE") == "pytorch_ipc") GTEST_SKIP() << "PyTorch's allocator runs";
    if (env("GPUMEM_TORCH_TEST_MODE").rfind("fabric", 0) == 0) {
      GTEST_SKIP() << "the fabric runs check fabric handles only";
    }
    ASSERT_NE(gpumem::torch::installed(), nullptr);
    a_ = gpumem::torch::installed();
    c10_alloc::emptyCache();
    c10_alloc::resetPeakStats(0);
    c10_alloc::resetAccumulatedStats(0);
  }
  void TearDown() override {
    if (a_ != nullptr) a_->default_pool(0).check_invariants();
  }
  bool classic() const { return a_->default_pool(0).policy() == gpumem::allocator_policy::classic; }
  cuda_allocator* a_ = nullptr;
};

// --- installation
// ---------------------------------------------------------------------------------

TEST_F(Installed, GpumemIsPyTorchsCudaAllocator) {
  EXPECT_EQ(c10_alloc::get(), static_cast<c10_alloc::CUDAAllocator*>(a_));
  EXPECT_EQ(c10_alloc::name(), "gpumem");
  EXPECT_EQ(c10::GetAllocator(c10::DeviceType::CUDA), static_cast<c10::Allocator*>(a_));
  EXPECT_TRUE(c10_alloc::get()->initialized());
  EXPECT_EQ(a_->config().to_string(),
            gpumem::allocator_config::resolve(env("GPUMEM_TORCH_TEST_CONF")).to_string());
}

TEST_F(Installed, InstallingTwiceIsAClearError) {
  try {
    gpumem::torch::install("");
    FAIL() << "a second install succeeded";
  } catch (const gpumem::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("already"), std::string::npos) << e.what();
  }
  EXPECT_EQ(gpumem::torch::installed(), a_);
}

TEST(InstallOrder, InstallingAfterPyTorchsAllocatorStartedIsAClearError) {
  if (!too_late_mode()) GTEST_SKIP() << "runs with GPUMEM_TORCH_TEST_MODE=too_late";
  c10_alloc::init(1);  // what PyTorch does when CUDA starts
  void* p = c10_alloc::raw_alloc(1024);
  try {
    gpumem::torch::install("");
    FAIL() << "installing over an initialised allocator succeeded";
  } catch (const gpumem::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("too late"), std::string::npos) << e.what();
  }
  EXPECT_EQ(gpumem::torch::installed(), nullptr);
  EXPECT_NE(c10_alloc::name(), "gpumem");
  c10_alloc::raw_delete(p);  // PyTorch's allocator still works
}

// --- allocation and statistics
// --------------------------------------------------------------------

TEST_F(Installed, RawAllocAndDeleteAreWhatGpumemAndPyTorchsStatsCount) {
  const gpumemSimCounters before = sim();
  std::vector<void*> ptrs;
  for (std::size_t size : {std::size_t{512}, 3 * MiB, 25 * MiB, 100 * MiB + 7}) {
    ptrs.push_back(c10_alloc::raw_alloc(size));
    ASSERT_NE(ptrs.back(), nullptr);
  }
  const auto torch_stats = c10_alloc::getDeviceStats(0);
  const gpumem::device_stats own = a_->default_pool(0).stats();
  EXPECT_EQ(torch_stats.allocation[all].current, 4);
  EXPECT_EQ(torch_stats.requested_bytes[all].current, 512 + 3 * MiB + 25 * MiB + 100 * MiB + 7);
  for (std::size_t t = 0; t < 3; ++t) {
    EXPECT_EQ(torch_stats.allocated_bytes[t].current, own.allocated_bytes[t].current);
    EXPECT_EQ(torch_stats.reserved_bytes[t].current, own.reserved_bytes[t].current);
    EXPECT_EQ(torch_stats.segment[t].current, own.segment[t].current);
    EXPECT_EQ(torch_stats.active_bytes[t].peak, own.active_bytes[t].peak);
  }
  EXPECT_EQ(torch_stats.num_device_alloc, own.num_device_alloc);
  // The simulator saw exactly the device memory PyTorch reports as reserved.
  const gpumemSimCounters after = sim();
  EXPECT_EQ(after.bytes_in_use - before.bytes_in_use,
            static_cast<unsigned long long>(torch_stats.reserved_bytes[all].current));
  const unsigned long long device_allocs = (after.calls.malloc - before.calls.malloc) +
                                           (after.calls.mem_create - before.calls.mem_create);
  EXPECT_EQ(device_allocs, static_cast<unsigned long long>(torch_stats.num_device_alloc));
  for (void* p : ptrs) c10_alloc::raw_delete(p);
  const auto freed = c10_alloc::getDeviceStats(0);
  EXPECT_EQ(freed.allocated_bytes[all].current, 0);
  EXPECT_EQ(freed.allocation[all].freed, 4);
  EXPECT_GT(freed.reserved_bytes[all].current, 0);  // cached
  c10_alloc::emptyCache();
  EXPECT_EQ(c10_alloc::getDeviceStats(0).reserved_bytes[all].current, 0);
  EXPECT_EQ(sim().bytes_in_use, before.bytes_in_use);
}

TEST_F(Installed, AllocateGivesACudaDataPtrOnTheCurrentStream) {
  c10::Allocator* cuda = c10::GetAllocator(c10::DeviceType::CUDA);
  c10::DataPtr p = cuda->allocate(4 * MiB);
  ASSERT_NE(p.get(), nullptr);
  EXPECT_EQ(p.device(), c10::Device(c10::DeviceType::CUDA, 0));
  EXPECT_EQ(p.get_deleter(), cuda->raw_deleter());
  EXPECT_TRUE(a_->default_pool(0).owns(p.get()));
  EXPECT_EQ(a_->default_pool(0).allocation_size(p.get()), 4 * MiB);
  p.clear();
  EXPECT_EQ(c10_alloc::getDeviceStats(0).allocation[all].current, 0);
  c10::DataPtr empty = cuda->allocate(0);
  EXPECT_EQ(empty.get(), nullptr);
}

TEST_F(Installed, PeaksAndTotalsResetAsInPyTorch) {
  void* p = c10_alloc::raw_alloc(30 * MiB);
  c10_alloc::raw_delete(p);
  auto s = c10_alloc::getDeviceStats(0);
  EXPECT_GE(s.allocated_bytes[all].peak, static_cast<int64_t>(30 * MiB));
  EXPECT_EQ(s.allocation[all].allocated, 1);
  c10_alloc::resetPeakStats(0);
  c10_alloc::resetAccumulatedStats(0);
  s = c10_alloc::getDeviceStats(0);
  EXPECT_EQ(s.allocated_bytes[all].peak, 0);
  EXPECT_EQ(s.allocation[all].allocated, 0);
  EXPECT_EQ(s.num_device_alloc, 0);
}

TEST_F(Installed, MemoryFractionCapsReservedMemoryAndOomIsPyTorchsError) {
  ASSERT_DOUBLE_EQ(c10_alloc::getMemoryFraction(0), 1.0);
  c10_alloc::setMemoryFraction(0.25, 0);  // of the simulated 16 GiB
  EXPECT_DOUBLE_EQ(c10_alloc::getMemoryFraction(0), 0.25);
  // PyTorch's arguments: device, the bytes asked of the device, the memory allowed (the cap),
  // the device's free memory.
  using observation = std::tuple<int64_t, size_t, size_t, size_t>;
  std::vector<observation> observed;
  static std::vector<observation>* seen = nullptr;
  seen = &observed;
  c10_alloc::attachOutOfMemoryObserver(
      [](int64_t device, size_t alloc_size, size_t allowed, size_t free_bytes) {  // stays attached
        if (seen != nullptr) seen->emplace_back(device, alloc_size, allowed, free_bytes);
      });
  const int64_t ooms = c10_alloc::getDeviceStats(0).num_ooms;
  try {
    c10_alloc::raw_alloc(5ull * 1024 * MiB);
    FAIL() << "5 GiB fit under a 4 GiB cap";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("Tried to allocate"), std::string::npos) << what;
    EXPECT_NE(what.find("fraction"), std::string::npos) << what;  // gpumem's diagnosis
  }
  ASSERT_EQ(observed.size(), 1u);
  EXPECT_EQ(std::get<0>(observed[0]), 0);
  EXPECT_EQ(std::get<1>(observed[0]), 5ull * 1024 * MiB);  // the segment or pages it needed
  EXPECT_EQ(std::get<2>(observed[0]), 4ull * 1024 * MiB);  // the fraction's cap, not 16 GiB
  EXPECT_GT(std::get<3>(observed[0]), 0u);
  seen = nullptr;
  EXPECT_EQ(c10_alloc::getDeviceStats(0).num_ooms, ooms + 1);
  EXPECT_THROW(c10_alloc::setMemoryFraction(1.5, 0), c10::Error);
  c10_alloc::setMemoryFraction(1.0, 0);
  void* p = c10_alloc::raw_alloc(5ull * 1024 * MiB);  // fits again
  c10_alloc::raw_delete(p);
}

// throw_on_cudamalloc_oom (PyTorch 2.12): the run installed with it refuses, before any device call
// and keeping the cache, a request that would take reserved memory past the device (no fraction
// set: the limit is all 16 GiB); the rejection observers get PyTorch's arguments. The other runs
// release the cache and serve the same request.
TEST_F(Installed, ThrowOnCudaMallocOomRefusesBeforeTheDeviceWhenConfigured) {
  using observation = std::tuple<int64_t, size_t, size_t, size_t>;
  std::vector<observation> observed;
  static std::vector<observation>* seen = nullptr;
  seen = &observed;
#if GPUMEM_TORCH_AT_LEAST(2, 12)
  static std::once_flag attach;
  std::call_once(attach, [] {
    c10_alloc::attachOomRejectionObserver(  // stays attached
        [](int64_t device, size_t alloc_size, size_t total_allocated, size_t device_total) {
          if (seen != nullptr)
            seen->emplace_back(device, alloc_size, total_allocated, device_total);
        });
  });
#else
  (void)seen;  // no rejection observers before torch 2.12
#endif
  constexpr std::size_t GiB = 1024 * MiB;
  c10_alloc::raw_delete(c10_alloc::raw_alloc(6 * GiB));  // 6 GiB cached
  const int64_t ooms = c10_alloc::getDeviceStats(0).num_ooms;
  const gpumemSimCounters before = sim();
  if (a_->config().throw_on_cudamalloc_oom) {
    void* p = nullptr;
    try {
      p = c10_alloc::raw_alloc(12 * GiB);  // 6 + 12 GiB > 16 GiB
    } catch (const c10::OutOfMemoryError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("preemptively rejected"), std::string::npos) << what;
    }
    if (p != nullptr) {
      c10_alloc::raw_delete(p);
      ADD_FAILURE() << "12 GiB was not refused";
    }
    const gpumemSimCounters after = sim();
    EXPECT_EQ(after.calls.malloc + after.calls.mem_create + after.calls.mem_get_info +
                  after.calls.free + after.calls.mem_unmap,
              before.calls.malloc + before.calls.mem_create + before.calls.mem_get_info +
                  before.calls.free + before.calls.mem_unmap);
    EXPECT_EQ(a_->default_pool(0).stats().num_oom_rejections, 1);
    EXPECT_EQ(c10_alloc::getDeviceStats(0).num_ooms, ooms);  // not an ordinary out-of-memory
    EXPECT_EQ(c10_alloc::getDeviceStats(0).reserved_bytes[all].current,
              static_cast<int64_t>(6 * GiB));  // the cache was kept
#if GPUMEM_TORCH_AT_LEAST(2, 12)
    EXPECT_EQ(c10_alloc::getDeviceStats(0).num_oom_rejections, 1);
    ASSERT_EQ(observed.size(), 1u);
    EXPECT_EQ(observed[0], observation(0, 12 * GiB, 6 * GiB, 16 * GiB));
#endif
  } else {
    void* p = c10_alloc::raw_alloc(12 * GiB);
    EXPECT_NE(p, nullptr);
    c10_alloc::raw_delete(p);
    EXPECT_EQ(a_->default_pool(0).stats().num_oom_rejections, 0);
    EXPECT_TRUE(observed.empty());
  }
  seen = nullptr;
  c10_alloc::emptyCache();
}

TEST_F(Installed, CacheInfoIsTheLargestFreeBlockOrTheDevicesFreeMemory) {
  void* p = c10_alloc::raw_alloc(64 * MiB);
  c10_alloc::raw_delete(p);  // a cached 64 MiB block
  size_t largest = 1;
  c10_alloc::cacheInfo(0, &largest);
  EXPECT_GE(largest, 64 * MiB);
  EXPECT_EQ(largest, a_->default_pool(0).summary_numbers().largest_free_block);
  size_t guess = 0;  // 0: start from the device's free memory, as PyTorch
  c10_alloc::cacheInfo(0, &guess);
  EXPECT_EQ(guess, sim().total_memory - sim().bytes_in_use);
}

TEST_F(Installed, RecordStreamDefersReuseUntilTheStreamsWorkIsDone) {
  // The simulator completes events GPUMEM_SIM_EVENT_DELAY (0.3 s) after they are recorded.
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  c10::DataPtr p = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(2 * MiB);
  c10_alloc::recordStream(p, side);
  p.clear();
  EXPECT_EQ(c10_alloc::getDeviceStats(0).active[all].current, 1);  // waits for `side`
  // The simulated clock may run ahead of the wall clock (an earlier stream wait jumps it to the
  // awaited completion), so poll for up to 3 s rather than sleeping the delay once.
  for (int i = 0; i < 30 && c10_alloc::getDeviceStats(0).active[all].current != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    c10_alloc::raw_delete(c10_alloc::raw_alloc(512));  // retires completed events
  }
  EXPECT_EQ(c10_alloc::getDeviceStats(0).active[all].current, 0);
  c10::DataPtr foreign(nullptr, c10::Device(c10::DeviceType::CUDA, 0));
  c10_alloc::recordStream(foreign, side);  // not gpumem's: ignored, as PyTorch does
}

// --- snapshots, history and trackers
// --------------------------------------------------------------

TEST_F(Installed, ASizeNoDeviceHasIsPyTorchsOneExabyteError) {
  const auto ooms = c10_alloc::getDeviceStats(0).num_ooms;
  try {
    c10_alloc::raw_alloc(std::size_t{1} << 61);
    ADD_FAILURE() << "2 EiB were allocated";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("Tried to allocate more than 1EB memory"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(c10_alloc::getDeviceStats(0).num_ooms, ooms);  // as in PyTorch: no statistic moves
}

TEST_F(Installed, SnapshotSegmentsAndBlocksMatchGpumemsOwn) {
  void* p = c10_alloc::raw_alloc(3 * MiB);
  void* q = c10_alloc::raw_alloc(700);
  const c10_alloc::SnapshotInfo info = c10_alloc::snapshot();
  std::size_t reserved = 0;
  std::size_t allocated_blocks = 0;
  for (const auto& seg : info.segments) {
    EXPECT_EQ(seg.device, 0);
    std::size_t sum = 0;
    for (const auto& b : seg.blocks) {
      sum += b.size;
      allocated_blocks += b.allocated ? 1 : 0;
    }
    EXPECT_EQ(sum, seg.total_size);
    EXPECT_EQ(seg.is_expandable, !classic());
    reserved += seg.total_size;
  }
  EXPECT_EQ(allocated_blocks, 2u);
  EXPECT_EQ(reserved,
            static_cast<std::size_t>(c10_alloc::getDeviceStats(0).reserved_bytes[all].current));
  // The settings, with the policy that ran named: what gpumem-replay's --config recorded replays.
  const auto recorded =
      gpumem::allocator_config::parse(info.config_metadata.last_allocator_settings);
  EXPECT_EQ(recorded.policy, a_->default_pool(0).policy());
  auto asked = a_->config();
  asked.policy = recorded.policy;
  EXPECT_EQ(recorded, asked) << info.config_metadata.last_allocator_settings;
  c10_alloc::raw_delete(p);
  c10_alloc::raw_delete(q);
}

void record_history(bool on) {
#if GPUMEM_TORCH_AT_LEAST(2, 11)
  c10_alloc::recordHistory(on, nullptr, on ? 1000 : 0,
                           on ? c10_alloc::RecordContext::ALLOC : c10_alloc::RecordContext::NEVER,
                           true, {});
#else
  c10_alloc::recordHistory(on, nullptr, on ? 1000 : 0,
                           on ? c10_alloc::RecordContext::ALLOC : c10_alloc::RecordContext::NEVER,
                           true);
#endif
}

TEST_F(Installed, SnapshotsAndHistoryCountAPageStitchMapsTwiceOnce) {
  // A 50 MiB block stitched from the pages of a freed 60 MiB one while a 20 MiB block keeps part
  // of its range: under stitch those pages are mapped at two addresses and must be listed once.
  // A 100 MiB limit makes stitch reuse the freed pages instead of mapping new ones (the classic
  // policy would run out of memory there: the other policies run without a limit).
  const bool stitch = a_->default_pool(0).policy() == gpumem::allocator_policy::stitch;
  if (stitch) c10_alloc::setMemoryFraction(100.0 / (16 * 1024), 0);  // of the simulated 16 GiB
  const auto reserved_now = [] {
    return static_cast<std::int64_t>(c10_alloc::getDeviceStats(0).reserved_bytes[all].current);
  };
  const std::int64_t reserved_before = reserved_now();
  record_history(true);
  void* big = c10_alloc::raw_alloc(60 * MiB);
  c10_alloc::raw_delete(big);
  void* keep = c10_alloc::raw_alloc(20 * MiB);
  void* stitched = c10_alloc::raw_alloc(50 * MiB);
  if (stitch) {
    std::size_t mapped = 0, counted = 0;
    for (const auto& seg : a_->default_pool(0).snapshot()) {
      mapped += seg.mapped_size;
      counted += seg.reserved_size;
    }
    EXPECT_GT(mapped, counted) << "the workload no longer maps a page twice under stitch";
  }
  std::size_t listed = 0;
  std::size_t allocated = 0;
  for (const auto& seg : c10_alloc::snapshot().segments) {
    listed += seg.total_size;
    allocated += seg.allocated_size;
  }
  const c10::CachingDeviceAllocator::DeviceStats stats = c10_alloc::getDeviceStats(0);
  EXPECT_EQ(listed, static_cast<std::size_t>(stats.reserved_bytes[all].current));
  EXPECT_EQ(allocated, static_cast<std::size_t>(stats.allocated_bytes[all].current));
  // The history's segment entries follow reserved memory too (memory_viz rebuilds it from them),
  // at every entry.
  c10_alloc::raw_delete(keep);
  c10_alloc::raw_delete(stitched);
  c10_alloc::emptyCache();
  std::int64_t net = 0;
  const c10_alloc::SnapshotInfo history = c10_alloc::snapshot();
  for (const auto& e : history.device_traces[0]) {
    const auto size = static_cast<std::int64_t>(e.size_);
    if (e.action_ == Action::SEGMENT_ALLOC || e.action_ == Action::SEGMENT_MAP) net += size;
    if (e.action_ == Action::SEGMENT_FREE || e.action_ == Action::SEGMENT_UNMAP) net -= size;
    EXPECT_LE(reserved_before + net, stitch ? 100 * std::int64_t{MiB} : std::int64_t{16} << 30);
  }
  EXPECT_EQ(reserved_before + net, reserved_now());
  record_history(false);
  c10_alloc::setMemoryFraction(1.0, 0);
}

TEST_F(Installed, HistoryRecordsPyTorchsTraceEntries) {
#if GPUMEM_TORCH_AT_LEAST(2, 11)
  c10_alloc::recordHistory(true, nullptr, 100, c10_alloc::RecordContext::ALLOC, true, {});
#else
  c10_alloc::recordHistory(true, nullptr, 100, c10_alloc::RecordContext::ALLOC, true);
#endif
  EXPECT_TRUE(c10_alloc::isHistoryEnabled());
  void* p = c10_alloc::raw_alloc(5 * MiB);
  c10_alloc::raw_delete(p);
  c10_alloc::emptyCache();
  const auto traces = c10_alloc::snapshot().device_traces;
  ASSERT_EQ(traces.size(), 1u);
  std::vector<Action> actions;
  for (const auto& e : traces[0]) actions.push_back(e.action_);
  const Action grow = classic() ? Action::SEGMENT_ALLOC : Action::SEGMENT_MAP;
  const Action shrink = classic() ? Action::SEGMENT_FREE : Action::SEGMENT_UNMAP;
  ASSERT_GE(actions.size(), 5u);
  EXPECT_EQ(actions.front(), grow);
  EXPECT_EQ(actions.back(), shrink);
  const auto alloc = std::find(actions.begin(), actions.end(), Action::ALLOC);
  ASSERT_NE(alloc, actions.end());
  const auto& entry = traces[0][static_cast<std::size_t>(alloc - actions.begin())];
  EXPECT_EQ(entry.addr_, reinterpret_cast<std::size_t>(p));
  EXPECT_EQ(entry.size_, 5 * MiB);
  EXPECT_NE(std::find(actions.begin(), actions.end(), Action::FREE_COMPLETED), actions.end());
#if GPUMEM_TORCH_AT_LEAST(2, 11)
  // skip_actions leaves entries out; a bounded history keeps the newest.
  c10_alloc::recordHistory(true, nullptr, 2, c10_alloc::RecordContext::ALLOC, true,
                           {"free_requested", "free_completed"});
  for (int i = 0; i < 3; ++i) c10_alloc::raw_delete(c10_alloc::raw_alloc(1024));
  const auto kept = c10_alloc::snapshot().device_traces[0];
  ASSERT_EQ(kept.size(), 2u);
  for (const auto& e : kept) EXPECT_EQ(e.action_, Action::ALLOC);
  c10_alloc::recordHistory(false, nullptr, 0, c10_alloc::RecordContext::NEVER, true, {});
#else
  c10_alloc::recordHistory(false, nullptr, 0, c10_alloc::RecordContext::NEVER, true);
#endif
  EXPECT_FALSE(c10_alloc::isHistoryEnabled());
}

#if GPUMEM_TORCH_AT_LEAST(2, 11)
TEST_F(Installed, HistoryCarriesCompileContextUserMetadataAndAnnotations) {
  c10_alloc::recordAnnotation({{"name", "before history"}});  // not recorded: no history yet
  record_history(true);
  std::string context = "graph 7";
  c10_alloc::pushCompileContext(context);
  c10_alloc::setUserMetadata("step 3");
  EXPECT_EQ(c10_alloc::getUserMetadata(), "step 3");
  c10_alloc::recordAnnotation({{"name", "forward"}, {"stage", "START"}});
  void* p = c10_alloc::raw_alloc(1 * MiB);
  c10_alloc::popCompileContext();
  c10_alloc::popCompileContext();  // popping an empty stack is harmless, as in PyTorch
  c10_alloc::setUserMetadata("");
  void* q = c10_alloc::raw_alloc(1 * MiB);
#if GPUMEM_TORCH_AT_LEAST(2, 15)
  EXPECT_TRUE(c10_alloc::supportsUserMetadata());
  c10_alloc::get()->annotateMemory(p, "weights");
#endif
  const c10_alloc::SnapshotInfo info = c10_alloc::snapshot();
  const auto entry_for = [&](void* ptr) -> const c10_alloc::TraceEntry* {
    for (const auto& e : info.device_traces[0]) {
      if (e.action_ == Action::ALLOC && e.addr_ == reinterpret_cast<std::size_t>(ptr)) return &e;
    }
    return nullptr;
  };
  const c10_alloc::TraceEntry* with = entry_for(p);
  const c10_alloc::TraceEntry* without = entry_for(q);
  ASSERT_NE(with, nullptr);
  ASSERT_NE(without, nullptr);
  EXPECT_EQ(with->compile_context_, "graph 7");
  EXPECT_EQ(with->user_metadata_, "step 3");
  EXPECT_EQ(without->compile_context_, "");
  EXPECT_EQ(without->user_metadata_, "");
  ASSERT_EQ(info.external_annotations.size(), 1u);
  EXPECT_EQ(info.external_annotations[0].metadata_.at("name"), "forward");
  EXPECT_EQ(info.external_annotations[0].metadata_.at("stage"), "START");
#if GPUMEM_TORCH_AT_LEAST(2, 15)
  const auto annotated =
      std::find_if(info.device_traces[0].begin(), info.device_traces[0].end(),
                   [](const c10_alloc::TraceEntry& e) { return e.action_ == Action::ANNOTATE; });
  ASSERT_NE(annotated, info.device_traces[0].end());
  EXPECT_EQ(annotated->addr_, reinterpret_cast<std::size_t>(p));
  EXPECT_EQ(annotated->user_metadata_, "weights");
  EXPECT_EQ(annotated->size_, 1 * MiB);
#endif
  // A snapshot without traces has neither entries nor annotations.
  const c10_alloc::SnapshotInfo bare = a_->snapshot({0, 0}, /*include_traces=*/false);
  EXPECT_TRUE(bare.device_traces.empty() || bare.device_traces[0].empty());
  EXPECT_TRUE(bare.external_annotations.empty());
  c10_alloc::raw_delete(p);
  c10_alloc::raw_delete(q);
  record_history(false);
  EXPECT_TRUE(c10_alloc::snapshot().external_annotations.empty());  // PyTorch clears both
}
#endif

std::vector<c10_alloc::TraceEntry>* tracked = nullptr;

TEST_F(Installed, TraceTrackersSeeEverySegmentChange) {
  static std::vector<c10_alloc::TraceEntry> entries;
  tracked = &entries;
  static bool attached = false;
  if (!attached) {
    c10_alloc::attachAllocatorTraceTracker([](const c10_alloc::TraceEntry& e) {
      if (tracked != nullptr) tracked->push_back(e);
    });
    attached = true;
  }
  void* p = c10_alloc::raw_alloc(40 * MiB);
  c10_alloc::raw_delete(p);
  c10_alloc::emptyCache();
  tracked = nullptr;
  std::size_t grown = 0;
  std::size_t shrunk = 0;
  for (const auto& e : entries) {
    if (e.action_ == Action::SEGMENT_ALLOC || e.action_ == Action::SEGMENT_MAP) grown += e.size_;
    if (e.action_ == Action::SEGMENT_FREE || e.action_ == Action::SEGMENT_UNMAP) shrunk += e.size_;
  }
  EXPECT_GE(grown, 40 * MiB);
  EXPECT_EQ(grown, shrunk);
}

// --- CUDA-graph private pools
// ---------------------------------------------------------------------

bool all_streams_pool(cudaStream_t) {
  return true;
}

TEST_F(Installed, PrivatePoolsServeOnlyTheirStreamsAndAreReleased) {
  const gpumemSimCounters before = sim();
  c10::cuda::CUDAStream capture = c10::cuda::getStreamFromPool();
  const cudaStream_t captured = capture.stream();
  const c10::cuda::MempoolId_t pool{7, 0};
  c10_alloc::beginAllocateToPool(0, pool, [captured](cudaStream_t s) { return s == captured; });
  EXPECT_EQ(c10_alloc::getPoolUseCount(0, pool), 1);
  void* in_pool = c10_alloc::raw_alloc_with_stream(6 * MiB, captured);
  void* outside = c10_alloc::raw_alloc_with_stream(6 * MiB, nullptr);
  c10_alloc::endAllocateToPool(0, pool);
  EXPECT_FALSE(a_->default_pool(0).owns(in_pool));
  EXPECT_TRUE(a_->default_pool(0).owns(outside));
  EXPECT_TRUE(c10_alloc::checkPoolLiveAllocations(0, pool, {in_pool}));
  EXPECT_FALSE(c10_alloc::checkPoolLiveAllocations(0, pool, {}));
  bool found = false;
  for (const auto& seg : c10_alloc::snapshot(pool).segments) {
    EXPECT_EQ(seg.owner_private_pool_id, pool);
    for (const auto& b : seg.blocks) found |= b.allocated;
  }
  EXPECT_TRUE(found);
  // Both allocators' blocks count in the device's statistics.
  EXPECT_EQ(c10_alloc::getDeviceStats(0).allocation[all].current, 2);
  c10_alloc::raw_delete(in_pool);
  c10_alloc::raw_delete(outside);
  c10_alloc::releasePool(0, pool);
  EXPECT_EQ(c10_alloc::getPoolUseCount(0, pool), 0);
  c10_alloc::emptyCache();
  EXPECT_EQ(sim().bytes_in_use, before.bytes_in_use);  // the pool's memory went back
  EXPECT_THROW(c10_alloc::endAllocateToPool(0, pool), c10::Error);
}

// CUDA-graph trees' checkpoints of a graph pool: the restore frees what the pool holds now and
// hands the checkpointed blocks back as DataPtrs whose deleter frees them (PyTorch's
// CheckpointDelta); the device statistics count them again.
TEST_F(Installed, APoolReturnsToItsCheckpoint) {
  const c10::cuda::MempoolId_t pool{11, 0};
  c10_alloc::beginAllocateToPool(0, pool, all_streams_pool);
  void* kept = c10_alloc::raw_alloc(3 * MiB);
  void* small = c10_alloc::raw_alloc(4096);
  void* dies = c10_alloc::raw_alloc(700 * 1024);
  c10_alloc::endAllocateToPool(0, pool);
  c10_alloc::raw_delete(dies);
  const auto stats_at_checkpoint = c10_alloc::getDeviceStats(0);
  const auto state = c10_alloc::getCheckpointState(0, pool);
  ASSERT_NE(state, nullptr);

  c10_alloc::raw_delete(kept);  // dead since the checkpoint
  c10_alloc::beginAllocateToPool(0, pool, all_streams_pool);
  void* later = c10_alloc::raw_alloc(25 * MiB);  // allocated since: stale at the restore
  c10_alloc::endAllocateToPool(0, pool);
  c10_alloc::CheckpointDelta delta = c10_alloc::setCheckpointPoolState(0, state);
  EXPECT_EQ(std::set<void*>(delta.ptrs_freed.begin(), delta.ptrs_freed.end()),
            (std::set<void*>{small, later}));
  std::set<void*> handed_back;
  for (const c10::DataPtr& d : delta.dataptrs_allocd) {
    handed_back.insert(d.get());
    EXPECT_EQ(d.get_deleter(), c10_alloc::get()->raw_deleter());
    EXPECT_EQ(d.device(), c10::Device(c10::DeviceType::CUDA, 0));
  }
  EXPECT_EQ(handed_back, (std::set<void*>{kept, small}));
  EXPECT_TRUE(c10_alloc::checkPoolLiveAllocations(0, pool, {kept, small}));
  const auto restored = c10_alloc::getDeviceStats(0);
  EXPECT_EQ(restored.allocation[all].current, stats_at_checkpoint.allocation[all].current);
  EXPECT_EQ(restored.allocated_bytes[all].current,
            stats_at_checkpoint.allocated_bytes[all].current);
  for (const auto& seg : c10_alloc::snapshot(pool).segments) {
    EXPECT_EQ(seg.owner_private_pool_id, pool);
  }
  delta.dataptrs_allocd.clear();  // their deleters free both blocks
  EXPECT_TRUE(c10_alloc::checkPoolLiveAllocations(0, pool, {}));
  EXPECT_EQ(c10_alloc::getDeviceStats(0).allocation[all].current, 0);

  // A state gpumem did not make, and a pool no longer in use, are refused.
  EXPECT_THROW(c10_alloc::setCheckpointPoolState(0, std::make_shared<c10_alloc::AllocatorState>()),
               c10::Error);
  EXPECT_THROW(c10_alloc::getCheckpointState(0, {12, 0}), c10::Error);
  c10_alloc::releasePool(0, pool);  // one use per beginAllocateToPool, as in PyTorch
  c10_alloc::releasePool(0, pool);
  EXPECT_THROW(c10_alloc::getCheckpointState(0, pool), c10::Error);
  EXPECT_THROW(c10_alloc::setCheckpointPoolState(0, state), c10::Error);
  c10_alloc::emptyCache();
}

// What torch.cuda.graph does around a capture: beginAllocateToPool, cudaStreamBeginCapture,
// allocations and frees (one of a default-pool tensor recorded on the capture stream), the end,
// endAllocateToPool, replays. During the capture gpumem queries and records no event and skips
// empty_cache; the graph's pool keeps its memory through empty_cache while the graph lives; once
// released and empty, empty_cache returns it.
TEST_F(Installed, ACaptureQueriesNoEventAndTheGraphsPoolStaysPut) {
  const gpumemSimCounters before = sim();
  c10::cuda::CUDAStream capture = c10::cuda::getStreamFromPool();
  const cudaStream_t captured = capture.stream();
  void* outside = c10_alloc::raw_alloc_with_stream(6 * MiB, nullptr);  // an earlier tensor
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const c10::cuda::MempoolId_t pool{8, 0};
  c10_alloc::beginAllocateToPool(0, pool, [captured](cudaStream_t s) { return s == captured; });
  ASSERT_EQ(cudaStreamBeginCapture(captured, cudaStreamCaptureModeGlobal), cudaSuccess);
  const gpumemSimCounters start = sim();
  void* tmp = c10_alloc::raw_alloc_with_stream(10 * MiB, captured);
  ASSERT_EQ(cudaMemsetAsync(tmp, 0, 10 * MiB, captured), cudaSuccess);
  // (The graph itself does not touch `outside`: freed during the capture, its memory goes back to
  // the default pool afterwards, where a replay must not use it, as with PyTorch's allocator.)
  {
    c10::DataPtr tensor(outside, outside, &gpumem::torch::detail::raw_delete,
                        c10::Device(c10::DeviceType::CUDA, 0));
    c10_alloc::recordStream(tensor, capture);  // tensor.record_stream(capture stream)
    (void)tensor.release_context();            // raw_delete below frees it
  }
  c10_alloc::raw_delete(outside);  // deferred to the capture's end
  c10_alloc::raw_delete(tmp);
  void* out = c10_alloc::raw_alloc_with_stream(10 * MiB, captured);  // reuses tmp's memory
  ASSERT_EQ(cudaMemsetAsync(out, 1, 10 * MiB, captured), cudaSuccess);
  c10_alloc::emptyCache();  // skipped during the capture, as PyTorch skips it
  const gpumemSimCounters during = sim();
  EXPECT_EQ(during.calls.event_query, start.calls.event_query);
  EXPECT_EQ(during.calls.event_record, start.calls.event_record);
  EXPECT_EQ(during.calls.free, start.calls.free);
  EXPECT_EQ(during.calls.mem_unmap, start.calls.mem_unmap);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(captured, &graph), cudaSuccess);
  c10_alloc::endAllocateToPool(0, pool);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, captured), cudaSuccess);
  c10_alloc::emptyCache();  // the live graph's pool keeps its memory
  ASSERT_EQ(cudaGraphLaunch(exec, captured), cudaSuccess);
  c10_alloc::raw_delete(c10_alloc::raw_alloc(512));  // records the deferred event
  EXPECT_GT(sim().calls.event_record, during.calls.event_record);
  ASSERT_EQ(cudaStreamSynchronize(captured), cudaSuccess);
  EXPECT_EQ(sim().violations, 0u);
  ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  c10_alloc::releasePool(0, pool);  // CUDAGraph::reset; `out` (its output) lives on
  c10_alloc::emptyCache();
  EXPECT_FALSE(c10_alloc::snapshot(pool).segments.empty());
  c10_alloc::raw_delete(out);  // the last block of the released pool
  c10_alloc::emptyCache();
  EXPECT_TRUE(c10_alloc::snapshot(pool).segments.empty());
  EXPECT_EQ(sim().bytes_in_use, before.bytes_in_use);
}

// The memory fraction counts the private pools' memory, as PyTorch's does.
TEST_F(Installed, TheMemoryFractionCountsPrivatePools) {
  c10_alloc::setMemoryFraction(0.25, 0);  // 4 GiB of the simulated 16
  const c10::cuda::MempoolId_t pool{9, 0};
  c10_alloc::beginAllocateToPool(0, pool, all_streams_pool);
  void* in_pool = c10_alloc::raw_alloc(3ull * 1024 * MiB);
  c10_alloc::endAllocateToPool(0, pool);
  EXPECT_THROW(c10_alloc::raw_alloc(2ull * 1024 * MiB), c10::OutOfMemoryError);
  c10_alloc::raw_delete(in_pool);
  c10_alloc::releasePool(0, pool);
  c10_alloc::emptyCache();
  void* p = c10_alloc::raw_alloc(2ull * 1024 * MiB);
  c10_alloc::raw_delete(p);
  c10_alloc::setMemoryFraction(1.0, 0);
  c10_alloc::emptyCache();
}

// --- torch.cuda.MemPool and use_mem_pool
// -----------------------------------------------------------

// A new pool id, as at::cuda::MemPool makes (user-created pools have first == 0).
c10::cuda::MempoolId_t next_pool_id() {
  static std::atomic<decltype(c10::cuda::MempoolId_t{}.second)> next{1u << 20};
  return {0, next++};
}

// What at::cuda::MemPool's destructor calls (torch 2.11, aten/src/ATen/cuda/MemPool.cpp). It runs
// in a destructor: an exception from any of these ends the program. The pool calls go through
// c10_alloc::get(), whose virtual functions every supported torch has.
void destroy_mempool(c10::cuda::MempoolId_t id) {
#if GPUMEM_TORCH_AT_LEAST(2, 11)
  c10_alloc::get()->setUseOnOOM(0, id, false);
#endif
  c10_alloc::releasePool(0, id);
  c10_alloc::get()->emptyCache(id);
}

bool all_streams(cudaStream_t) {
  return true;
}

TEST_F(Installed, AMemPoolIsMadeUsedAndDestroyedAsPyTorchDoes) {
  const gpumemSimCounters before = sim();
  const auto id = next_pool_id();
  c10_alloc::get()->createOrIncrefPool(0, id);  // MemPool()
  EXPECT_EQ(c10_alloc::getPoolUseCount(0, id), 1);
  c10_alloc::beginAllocateToPool(0, id, all_streams);  // with torch.cuda.use_mem_pool(pool):
  EXPECT_EQ(c10_alloc::getPoolUseCount(0, id), 2);
  void* p = c10_alloc::raw_alloc(4 * MiB);
  c10_alloc::endAllocateToPool(0, id);
  c10_alloc::releasePool(0, id);
  EXPECT_EQ(c10_alloc::getPoolUseCount(0, id), 1);
  EXPECT_FALSE(a_->default_pool(0).owns(p));
  EXPECT_TRUE(c10_alloc::checkPoolLiveAllocations(0, id, {p}));
  EXPECT_NO_THROW(destroy_mempool(id));  // del pool, while the pool still holds p
  EXPECT_EQ(c10_alloc::getPoolUseCount(0, id), 0);
  EXPECT_TRUE(c10_alloc::checkPoolLiveAllocations(0, id, {p}));  // p stays valid
  c10_alloc::raw_delete(p);
  EXPECT_FALSE(c10_alloc::snapshot(id).segments.empty());  // cached by the dead pool
  c10_alloc::emptyCache();                                 // torch.cuda.empty_cache()
  EXPECT_TRUE(c10_alloc::snapshot(id).segments.empty());
  EXPECT_EQ(sim().bytes_in_use, before.bytes_in_use);
  // A pool destroyed empty gives its memory back at once.
  const auto empty = next_pool_id();
  c10_alloc::get()->createOrIncrefPool(0, empty);
  c10_alloc::beginAllocateToPool(0, empty, all_streams);
  c10_alloc::raw_delete(c10_alloc::raw_alloc(4 * MiB));
  c10_alloc::endAllocateToPool(0, empty);
  c10_alloc::releasePool(0, empty);
  EXPECT_NO_THROW(destroy_mempool(empty));
  EXPECT_EQ(sim().bytes_in_use, before.bytes_in_use);
}

void set_use_on_oom(c10::cuda::MempoolId_t id, bool use) {
#if GPUMEM_TORCH_AT_LEAST(2, 11)
  c10_alloc::get()->setUseOnOOM(0, id, use);
#else
  if (use) c10_alloc::get()->setUseOnOOM(0, id);
#endif
}

// Allocates `bytes` into pool `id` (with torch.cuda.use_mem_pool(pool): ...).
void* alloc_in_pool(c10::cuda::MempoolId_t id, std::size_t bytes) {
  c10_alloc::beginAllocateToPool(0, id, all_streams);
  void* p = nullptr;
  try {
    p = c10_alloc::raw_alloc(bytes);
  } catch (...) {
    c10_alloc::endAllocateToPool(0, id);
    c10_alloc::releasePool(0, id);
    throw;
  }
  c10_alloc::endAllocateToPool(0, id);
  c10_alloc::releasePool(0, id);
  return p;
}

std::size_t reserved_now() {
  return static_cast<std::size_t>(c10_alloc::getDeviceStats(0).reserved_bytes[all].current);
}

// MemPool(use_on_oom=True), PyTorch's try_mempool_fallback: when the device (here the memory
// fraction) refuses a default-pool miss, a cached block of a pool marked use-on-OOM serves it,
// before the default pool frees any of its own cache, and belongs to that pool. A pool not marked,
// unmarked, or dead lends nothing; an allocation into a private pool never borrows.
TEST_F(Installed, APoolMarkedUseOnOomLendsItsCachedBlocksBeforeTheCacheIsFreed) {
  // Stitch maps the default pool's free pages for another stream without asking the device: only
  // the other policies leave a default-pool cache that a miss must free.
  const bool stitch = a_->default_pool(0).policy() == gpumem::allocator_policy::stitch;
  const auto lender = next_pool_id();
  const auto other = next_pool_id();
  c10_alloc::get()->createOrIncrefPool(0, lender);
  set_use_on_oom(lender, true);
  c10_alloc::get()->createOrIncrefPool(0, other);
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  // 40 MiB cached by each pool, and (not stitch) 40 MiB by the default pool on another stream.
  const std::size_t allowed = (stitch ? 80 : 120) * MiB;
  c10_alloc::setMemoryFraction(static_cast<double>(allowed) / (16.0 * 1024 * MiB), 0);
  void* lent = alloc_in_pool(lender, 40 * MiB);
  void* kept = alloc_in_pool(other, 40 * MiB);
  c10_alloc::raw_delete(lent);
  c10_alloc::raw_delete(kept);
  if (!stitch) c10_alloc::raw_delete(c10_alloc::raw_alloc_with_stream(40 * MiB, side.stream()));
  ASSERT_EQ(reserved_now(), allowed);

  void* c = c10_alloc::raw_alloc(30 * MiB);  // no room: the lender's block serves it
  EXPECT_EQ(c, lent);
  EXPECT_TRUE(c10_alloc::checkPoolLiveAllocations(0, lender, {c}));
  EXPECT_FALSE(a_->default_pool(0).owns(c));
  const auto stats = c10_alloc::getDeviceStats(0);
  EXPECT_EQ(stats.num_ooms, 0);
  EXPECT_EQ(stats.num_alloc_retries, 0);
  EXPECT_EQ(reserved_now(), allowed);  // nothing freed: the default pool's cache is still there
  EXPECT_EQ(stats.allocated_bytes[all].current, static_cast<int64_t>(30 * MiB));  // split off

  // The other pool lends nothing: the default pool frees its cache and retries, or runs out.
  if (stitch) {
    EXPECT_THROW(c10_alloc::raw_alloc(30 * MiB), c10::OutOfMemoryError);
  } else {
    void* d = c10_alloc::raw_alloc(30 * MiB);
    EXPECT_TRUE(a_->default_pool(0).owns(d));
    EXPECT_EQ(c10_alloc::getDeviceStats(0).num_alloc_retries, 1);
    c10_alloc::raw_delete(d);
  }
  EXPECT_TRUE(c10_alloc::checkPoolLiveAllocations(0, other, {}));
  EXPECT_FALSE(c10_alloc::snapshot(other).segments.empty());

  c10_alloc::raw_delete(c);  // back to the lender's cache
  EXPECT_TRUE(c10_alloc::checkPoolLiveAllocations(0, lender, {}));
  EXPECT_FALSE(c10_alloc::snapshot(lender).segments.empty());

  // An allocation into a private pool never borrows.
  EXPECT_THROW(alloc_in_pool(other, 60 * MiB), c10::OutOfMemoryError);

  // Unmarked, the pool lends nothing; marked again, it does.
  c10_alloc::emptyCache();  // the default pool's cache
  const std::size_t room = allowed - reserved_now();
  void* filler = room > 0 ? c10_alloc::raw_alloc(room) : nullptr;
  set_use_on_oom(lender, false);
  EXPECT_THROW(c10_alloc::raw_alloc(30 * MiB), c10::OutOfMemoryError);
  set_use_on_oom(lender, true);
  void* again = c10_alloc::raw_alloc(30 * MiB);
  EXPECT_EQ(again, lent);
  c10_alloc::raw_delete(again);

  // Dead (MemPool destroyed; torch < 2.11 calls no setUseOnOOM(false)), it lends nothing: the
  // out-of-memory retry returns its cache instead and the default pool allocates anew.
  c10_alloc::releasePool(0, lender);
  void* after = c10_alloc::raw_alloc(30 * MiB);
  EXPECT_TRUE(a_->default_pool(0).owns(after));
  EXPECT_TRUE(c10_alloc::snapshot(lender).segments.empty());
  c10_alloc::raw_delete(after);
  if (filler != nullptr) c10_alloc::raw_delete(filler);
  EXPECT_NO_THROW(destroy_mempool(other));
  c10_alloc::setMemoryFraction(1.0, 0);
  c10_alloc::emptyCache();
}

#if GPUMEM_TORCH_AT_LEAST(2, 10)  // setNoSplit
// MemPool(no_split=True): every allocation of the pool is a whole segment, or a whole cached
// block, under every policy; a plain pool splits its segments.
TEST_F(Installed, ANoSplitPoolNeverSplitsABlock) {
  const auto whole = next_pool_id();
  const auto plain = next_pool_id();
  c10_alloc::get()->createOrIncrefPool(0, whole);
  c10_alloc::get()->setNoSplit(0, whole);
  c10_alloc::get()->createOrIncrefPool(0, plain);
  std::vector<void*> ptrs;
  for (const auto& id : {whole, plain}) {
    for (std::size_t bytes : {4 * MiB, 4 * MiB, std::size_t{1000}}) {
      ptrs.push_back(alloc_in_pool(id, bytes));
    }
  }
  const auto segments = c10_alloc::snapshot(whole).segments;
  ASSERT_EQ(segments.size(), 3u);
  std::vector<std::size_t> sizes;
  for (const auto& seg : segments) {
    EXPECT_FALSE(seg.is_expandable);
    ASSERT_EQ(seg.blocks.size(), 1u);
    EXPECT_TRUE(seg.blocks[0].allocated);
    sizes.push_back(seg.total_size);
  }
  std::sort(sizes.begin(), sizes.end());
  // PyTorch's segment sizes: 2 MiB for a small request, 20 MiB for one of 1 to 10 MiB.
  EXPECT_EQ(sizes, (std::vector<std::size_t>{2 * MiB, 20 * MiB, 20 * MiB}));
  std::size_t plain_blocks = 0;
  for (const auto& seg : c10_alloc::snapshot(plain).segments) plain_blocks += seg.blocks.size();
  EXPECT_GT(plain_blocks, 3u);  // the plain pool's segments were split
  // A freed block is reused whole by a smaller request.
  c10_alloc::raw_delete(ptrs[0]);
  const int64_t segments_before = c10_alloc::getDeviceStats(0).segment[all].current;
  void* reused = alloc_in_pool(whole, 3 * MiB);
  EXPECT_EQ(reused, ptrs[0]);
  EXPECT_EQ(c10_alloc::getDeviceStats(0).segment[all].current, segments_before);
  for (const auto& seg : c10_alloc::snapshot(whole).segments) {
    EXPECT_EQ(seg.blocks.size(), 1u);
  }
  ptrs[0] = reused;
  for (void* p : ptrs) c10_alloc::raw_delete(p);
  EXPECT_NO_THROW(destroy_mempool(whole));
  EXPECT_NO_THROW(destroy_mempool(plain));
  EXPECT_TRUE(c10_alloc::snapshot(whole).segments.empty());
}
#endif

// torch.cuda.caching_allocator_enable(False): each allocation is its own cudaMalloc and its free a
// cudaFree, outside the statistics; memory keeps the way it was allocated across the switch.
TEST_F(Installed, WithCachingDisabledEachAllocationIsACudaMallocOfItsOwn) {
  c10::Allocator* alloc = c10::GetAllocator(c10::DeviceType::CUDA);
  void* cached = c10_alloc::raw_alloc(MiB);  // before: from the cache
  const int64_t allocations = c10_alloc::getDeviceStats(0).allocation[all].current;
  c10_alloc::get()->enable(false);
  EXPECT_FALSE(c10_alloc::get()->isEnabled());
  const gpumemSimCounters before = sim();
  void* raw = c10_alloc::raw_alloc(3 * MiB);
  c10::DataPtr tensor = alloc->allocate(5 * MiB);
  void* released = alloc->raw_allocate(7 * MiB);
  const gpumemSimCounters during = sim();
  EXPECT_EQ(during.calls.malloc, before.calls.malloc + 3);
  EXPECT_GE(during.bytes_in_use, before.bytes_in_use + 15 * MiB);
  EXPECT_EQ(c10_alloc::getDeviceStats(0).allocation[all].current, allocations);
  c10_alloc::recordStream(tensor, c10::cuda::getStreamFromPool());  // nothing to record
  c10_alloc::raw_delete(cached);  // back to its pool, not to the device
  EXPECT_EQ(sim().calls.free, during.calls.free);
  EXPECT_EQ(c10_alloc::getDeviceStats(0).allocation[all].current, allocations - 1);
  c10_alloc::raw_delete(raw);  // cudaFree at once
  EXPECT_EQ(sim().calls.free, during.calls.free + 1);
  EXPECT_THROW(c10_alloc::raw_alloc(64ull * 1024 * MiB), c10::OutOfMemoryError);  // 16 GiB sim
  c10_alloc::get()->enable(true);
  EXPECT_TRUE(c10_alloc::get()->isEnabled());
  tensor.clear();                   // allocated while disabled: cudaFree'd now
  alloc->raw_deallocate(released);  // likewise
  EXPECT_EQ(sim().calls.free, during.calls.free + 3);
  EXPECT_EQ(sim().bytes_in_use, before.bytes_in_use);
  EXPECT_THROW(c10_alloc::raw_delete(raw), c10::Error);  // already freed
  void* p = c10_alloc::raw_alloc(MiB);                   // cached again
  EXPECT_TRUE(a_->default_pool(0).owns(p));
  c10_alloc::raw_delete(p);
}

TEST_F(Installed, ReleasingAPoolNeverThrowsAndSaysWhatWentWrong) {
  ::testing::internal::CaptureStderr();
  EXPECT_NO_THROW(c10_alloc::releasePool(0, {0, 987654321}));  // unknown to gpumem
  const auto id = next_pool_id();
  c10_alloc::get()->createOrIncrefPool(0, id);
  c10_alloc::releasePool(0, id);
  EXPECT_NO_THROW(c10_alloc::releasePool(0, id));  // once more than it was used
  EXPECT_NO_THROW(c10_alloc::get()->emptyCache({0, 987654321}));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("gpumem: releasePool: pool (0, 987654321) is not in use"), std::string::npos)
      << err;
  EXPECT_EQ(c10_alloc::getPoolUseCount(0, id), 0);
}

TEST_F(Installed, NestedPoolsAllocateIntoTheMostRecentlyBegun) {
  const auto outer = next_pool_id();
  const auto inner = next_pool_id();
  const auto side_pool = next_pool_id();
  c10_alloc::get()->createOrIncrefPool(0, outer);  // made first, begun first
  c10_alloc::get()->createOrIncrefPool(0, inner);
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  const cudaStream_t side_stream = side.stream();
  c10_alloc::beginAllocateToPool(0, outer, all_streams);
  void* a = c10_alloc::raw_alloc(MiB);
  c10_alloc::beginAllocateToPool(0, inner, all_streams);
  void* b = c10_alloc::raw_alloc(MiB);
  // Begun later but only for the side stream: the other streams' allocations stay in `inner`.
  c10_alloc::beginAllocateToPool(0, side_pool,
                                 [side_stream](cudaStream_t s) { return s == side_stream; });
  void* c = c10_alloc::raw_alloc(MiB);
  void* d = c10_alloc::raw_alloc_with_stream(MiB, side_stream);
  c10_alloc::endAllocateToPool(0, side_pool);
  c10_alloc::endAllocateToPool(0, inner);
  void* e = c10_alloc::raw_alloc(MiB);
  c10_alloc::endAllocateToPool(0, outer);
  void* f = c10_alloc::raw_alloc(MiB);
  // Ended out of order (two threads' contexts): the one still begun keeps its allocations.
  c10_alloc::beginAllocateToPool(0, outer, all_streams);
  c10_alloc::beginAllocateToPool(0, inner, all_streams);
  c10_alloc::endAllocateToPool(0, outer);
  void* g = c10_alloc::raw_alloc(MiB);
  c10_alloc::endAllocateToPool(0, inner);
  EXPECT_TRUE(c10_alloc::checkPoolLiveAllocations(0, outer, {a, e}));
  EXPECT_TRUE(c10_alloc::checkPoolLiveAllocations(0, inner, {b, c, g}));
  EXPECT_TRUE(c10_alloc::checkPoolLiveAllocations(0, side_pool, {d}));
  EXPECT_TRUE(a_->default_pool(0).owns(f));
  for (void* p : {a, b, c, d, e, f, g}) c10_alloc::raw_delete(p);
  for (const auto& id : {outer, inner, side_pool}) {
    while (c10_alloc::getPoolUseCount(0, id) > 0) c10_alloc::releasePool(0, id);
  }
  c10_alloc::emptyCache();
  for (const auto& id : {outer, inner, side_pool}) {
    EXPECT_TRUE(c10_alloc::snapshot(id).segments.empty());
  }
}

TEST_F(Installed, OutOfMemoryReturnsTheCacheOfDeadPoolsAndTriesAgain) {
  const auto id = next_pool_id();  // a CUDA graph's pool, say, after the graph was reset
  c10_alloc::beginAllocateToPool(0, id, all_streams);
  void* in_pool = c10_alloc::raw_alloc(10ull * 1024 * MiB);  // of the simulated 16 GiB
  c10_alloc::endAllocateToPool(0, id);
  c10_alloc::releasePool(0, id);   // dead
  c10_alloc::raw_delete(in_pool);  // 10 GiB cached by the dead pool
  void* p = nullptr;
  if (a_->config().throw_on_cudamalloc_oom) {
    // Refused before any retry, as PyTorch refuses it: the dead pool keeps its cache until
    // empty_cache().
    EXPECT_THROW(c10_alloc::raw_alloc(10ull * 1024 * MiB), c10::OutOfMemoryError);
    EXPECT_FALSE(c10_alloc::snapshot(id).segments.empty());
    c10_alloc::emptyCache();
  }
  EXPECT_NO_THROW(p = c10_alloc::raw_alloc(10ull * 1024 * MiB));
  EXPECT_TRUE(a_->default_pool(0).owns(p));
  EXPECT_TRUE(c10_alloc::snapshot(id).segments.empty());  // the dead pool went away
  c10_alloc::raw_delete(p);
}

TEST_F(Installed, FreeingThroughADataPtrNeverThrows) {
  // A DataPtr's deleter runs in destructors: a bad pointer is reported, never thrown.
  EXPECT_EXIT(
      {
        int local = 0;
        c10::DataPtr foreign(&local, &local,
                             c10::GetAllocator(c10::DeviceType::CUDA)->raw_deleter(),
                             c10::Device(c10::DeviceType::CUDA, 0));
        foreign.clear();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "freeing a CUDA tensor's memory: invalid device pointer");
}

// --- bad input
// --------------------------------------------------------------------------------------

TEST_F(Installed, FreeingAForeignPointerIsAClearErrorAndChangesNothing) {
  void* p = c10_alloc::raw_alloc(1024);
  int local = 0;
  try {
    c10_alloc::raw_delete(&local);
    FAIL() << "freed a host pointer";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not allocated by gpumem"), std::string::npos);
  }
  c10_alloc::raw_delete(p);
  EXPECT_THROW(c10_alloc::raw_delete(p), c10::Error);  // twice
  EXPECT_EQ(c10_alloc::getDeviceStats(0).allocation[all].current, 0);
}

TEST_F(Installed, WhatGpumemCannotDoSaysSo) {
  auto says_not_supported = [](auto&& call) {
    try {
      call();
      return std::string("no error");
    } catch (const c10::Error& e) {
      return std::string(e.what());
    }
  };
  void* p = c10_alloc::raw_alloc(1 * MiB);
  const std::string ipc = says_not_supported([p] { c10_alloc::shareIpcHandle(p); });
  if (classic()) {
    // The simulator has no CUDA IPC: the CUDA error comes through as PyTorch's.
    EXPECT_NE(ipc.find("CUDA"), std::string::npos) << ipc;
  } else {
    EXPECT_EQ(ipc, "no error");  // shared as an expandable segment (tests below)
  }
  c10_alloc::raw_delete(p);
  EXPECT_THROW(c10_alloc::getIpcDevPtr("short"), c10::Error);
  EXPECT_THROW(c10_alloc::getDeviceStats(5), c10::Error);  // one simulated GPU
}

#if GPUMEM_TORCH_AT_LEAST(2, 9)
// --- expandable_segments at run time (torch.cuda.memory._set_allocator_settings)
// ------------------------------------------------

// Whether sharing `p` took the cudaMalloc path of IPC (cudaIpcGetMemHandle, a 'c' handle). The
// simulator lacks cudaIpcGetMemHandle: reaching it is a CUDA error and one unimplemented call.
bool shared_as_cuda_malloc(void* p) {
  const auto unimplemented = sim().unimplemented;
  try {
    const c10_alloc::ShareableHandle h = c10_alloc::shareIpcHandle(p);
    return h.handle.size() > 1 && h.handle[1] == 'c';
  } catch (const c10::Error& e) {
    const std::string message = e.what();
    return message.find("not supported by gpumem") == std::string::npos &&
           sim().unimplemented == unimplemented + 1;
  }
}

// The snapshot's segment holding `p`.
c10_alloc::SegmentInfo segment_holding(void* p) {
  const auto address = reinterpret_cast<std::size_t>(p);
  for (const auto& seg : c10_alloc::snapshot().segments) {
    if (seg.address <= address && address < seg.address + seg.total_size) return seg;
  }
  ADD_FAILURE() << "no segment holds " << p;
  return {};
}

// Legacy segments are off after each test, whatever it asked for.
struct legacy_segments_off {
  cuda_allocator* a;
  ~legacy_segments_off() { a->set_legacy_segments(false); }
};

// What users do around code that needs cudaMalloc memory (custom all-reduce buffers, DeepEP,
// UCX): expandable_segments:False before it, :True after, as PyTorch's own allocator reads the
// setting at each allocation.
TEST_F(Installed, ExpandableSegmentsFalseAtRunTimeGivesCudaMallocSegmentsUntilSetBack) {
  if (classic()) GTEST_SKIP() << "classic: every segment is a cudaMalloc one";
  legacy_segments_off off{a_};
  void* before = c10_alloc::raw_alloc(3 * MiB);  // the configured policy's
  EXPECT_FALSE(shared_as_cuda_malloc(before));
  EXPECT_TRUE(segment_holding(before).is_expandable);

  c10::CachingAllocator::setAllocatorSettings("expandable_segments:False");
  EXPECT_TRUE(a_->legacy_segments());
  const gpumemSimCounters start = sim();
  void* legacy = c10_alloc::raw_alloc(3 * MiB);
  EXPECT_EQ(sim().calls.malloc, start.calls.malloc + 1);  // one cudaMalloc segment
  EXPECT_EQ(sim().calls.address_reserve, start.calls.address_reserve);
  EXPECT_EQ(sim().calls.mem_create, start.calls.mem_create);
  const c10_alloc::SegmentInfo seg = segment_holding(legacy);
  EXPECT_FALSE(seg.is_expandable);
  EXPECT_EQ(seg.owner_private_pool_id, (c10::cuda::MempoolId_t{0, 0}));
  EXPECT_TRUE(shared_as_cuda_malloc(legacy));
  std::size_t base_size = 0;
  EXPECT_EQ(c10_alloc::get()->getBaseAllocation(legacy, &base_size),
            reinterpret_cast<void*>(seg.address));
  EXPECT_EQ(base_size, seg.total_size);

  // PyTorch's statistics count both kinds of segment, as PyTorch counts all of its own.
  auto stats = c10_alloc::getDeviceStats(0);
  const gpumem::device_stats main = a_->default_pool(0).stats();
  EXPECT_EQ(stats.allocation[all].current, 2);
  EXPECT_EQ(stats.allocated_bytes[all].current,
            main.allocated_bytes[all].current + static_cast<int64_t>(3 * MiB));
  EXPECT_EQ(stats.reserved_bytes[all].current,
            main.reserved_bytes[all].current + static_cast<int64_t>(seg.total_size));
  EXPECT_EQ(stats.segment[all].current, main.segment[all].current + 1);

  c10_alloc::raw_delete(before);  // allocated before the switch, freed while it is on
  EXPECT_EQ(a_->default_pool(0).stats().allocation[all].current, 0);

  c10::CachingAllocator::setAllocatorSettings("expandable_segments:True");
  EXPECT_FALSE(a_->legacy_segments());
  void* after = c10_alloc::raw_alloc(3 * MiB);
  EXPECT_TRUE(segment_holding(after).is_expandable);
  EXPECT_FALSE(shared_as_cuda_malloc(after));
  EXPECT_EQ(sim().calls.malloc, start.calls.malloc + 1);

  c10_alloc::raw_delete(legacy);  // freed after switching back: where it came from
  stats = c10_alloc::getDeviceStats(0);
  EXPECT_EQ(stats.allocation[all].current, 1);
  EXPECT_EQ(stats.allocated_bytes[all].current,
            a_->default_pool(0).stats().allocated_bytes[all].current);
  c10_alloc::emptyCache();  // returns the cudaMalloc segment too
  EXPECT_EQ(sim().calls.free, start.calls.free + 1);
  EXPECT_EQ(sim().live_segments, start.live_segments);
  EXPECT_EQ(c10_alloc::getDeviceStats(0).reserved_bytes[all].current,
            a_->default_pool(0).stats().reserved_bytes[all].current);
  c10_alloc::raw_delete(after);
}

TEST_F(Installed, OnlySettingsThatNameExpandableSegmentsSwitchLegacySegments) {
  legacy_segments_off off{a_};
  c10::CachingAllocator::setAllocatorSettings("expandable_segments:False");
  EXPECT_TRUE(a_->legacy_segments());
  c10::CachingAllocator::setAllocatorSettings("roundup_power2_divisions:[256:4,>:1]");
  EXPECT_TRUE(a_->legacy_segments());
  c10::CachingAllocator::setAllocatorSettings("max_split_size_mb:40, expandable_segments : True");
  EXPECT_FALSE(a_->legacy_segments());
  EXPECT_THROW(c10::CachingAllocator::setAllocatorSettings("expandable_segments:maybe"),
               c10::Error);
  EXPECT_FALSE(a_->legacy_segments());
}

// The sizing keys as PyTorch's run-time parse leaves them (what _set_allocator_settings calls):
// from the next allocation, with the keys it does not name reset (the three PyTorch resets) or
// kept; memory_stats' max_split_size stays the value the GPU started with.
TEST_F(Installed, SizingSettingsAtRunTimeActFromTheNextAllocation) {
  struct reset {
    ~reset() { c10::CachingAllocator::setAllocatorSettings(""); }
  } reset_settings;
  c10::CachingAllocator::setAllocatorSettings("");
  const int64_t max_split_at_start = c10_alloc::getDeviceStats(0).max_split_size;
  auto allocated_by = [](std::size_t size) {
    const int64_t before = c10_alloc::getDeviceStats(0).allocated_bytes[all].current;
    void* p = c10_alloc::raw_alloc(size);
    const int64_t grew = c10_alloc::getDeviceStats(0).allocated_bytes[all].current - before;
    c10_alloc::raw_delete(p);
    return static_cast<std::size_t>(grew);
  };
  EXPECT_EQ(allocated_by(84 * MiB), 84 * MiB);
  c10::CachingAllocator::setAllocatorSettings("roundup_power2_divisions:4");
  EXPECT_EQ(allocated_by(84 * MiB), 96 * MiB);
  c10::CachingAllocator::setAllocatorSettings("max_split_size_mb:40,max_non_split_rounding_mb:60");
  EXPECT_EQ(allocated_by(84 * MiB), 84 * MiB);  // the divisions were reset
  EXPECT_EQ(a_->run_time_settings().max_split_size, 40 * MiB);
  EXPECT_EQ(a_->run_time_settings().max_non_split_rounding, 60 * MiB);
  EXPECT_EQ(c10_alloc::getDeviceStats(0).max_split_size, max_split_at_start);
  c10::CachingAllocator::setAllocatorSettings(
      "garbage_collection_threshold:0.5,roundup_power2_divisions:[64:8,>:1]");
  EXPECT_EQ(allocated_by(100 * MiB + 1), 104 * MiB);
  EXPECT_EQ(a_->run_time_settings().max_split_size, std::numeric_limits<std::size_t>::max());
  EXPECT_EQ(a_->run_time_settings().max_non_split_rounding, 60 * MiB);  // not reset by PyTorch
  EXPECT_DOUBLE_EQ(a_->run_time_settings().garbage_collection_threshold, 0.5);
  EXPECT_EQ(a_->config().max_split_size, std::numeric_limits<std::size_t>::max());  // install's
}

// gpumem's own switch, and a pool's policy, whatever the setting: the default pool only.
TEST_F(Installed, LegacySegmentsLeavePrivatePoolsAndClassicAlone) {
  legacy_segments_off off{a_};
  const auto pool = next_pool_id();
  c10_alloc::get()->createOrIncrefPool(0, pool);
  a_->set_legacy_segments(true);
  void* in_pool = alloc_in_pool(pool, 3 * MiB);
  void* in_default = c10_alloc::raw_alloc(3 * MiB);
  EXPECT_EQ(segment_holding(in_pool).is_expandable, !classic());
  EXPECT_FALSE(segment_holding(in_default).is_expandable);
  c10_alloc::raw_delete(in_pool);
  c10_alloc::raw_delete(in_default);
  destroy_mempool(pool);
  EXPECT_EQ(c10_alloc::getDeviceStats(0).allocation[all].current, 0);
}
#endif

// --- IPC (torch.multiprocessing) of the VMM policies' memory
// ------------------------------------------------------------------

// PyTorch's expandable-segment handle: version 2 (torch 2.12 and older) or 3, 'e', {pid, 4 zero
// bytes, page size, pages}, from version 3 {handle type (1: POSIX file descriptors), 4 padding
// bytes}, then one int (a file descriptor of the producer) per page, or with handle type 2 one
// 64-byte fabric handle per page.
struct vmm_handle {
  int version = 0;
  char type = 0;
  std::int32_t pid = 0;
  std::uint32_t zero = 0;
  std::uint64_t page_size = 0;
  std::uint64_t pages = 0;
  std::int32_t handle_type = 0;  // version 3
  std::size_t header = 0;        // 0: too short to be a handle
  std::size_t payload = 0;       // the bytes after the header
  std::vector<int> fds;          // parse_vmm_handle only
};

// The version PyTorch's allocator of the torch under test writes and reads.
constexpr int pytorchs_vmm_handle_version = GPUMEM_TORCH_AT_LEAST(2, 13) ? 3 : 2;

// The header of any 'e' handle, whatever its payload.
vmm_handle parse_vmm_header(const std::string& h) {
  vmm_handle out;
  if (h.size() < 26) {
    ADD_FAILURE() << "a handle of " << h.size() << " bytes";
    return out;
  }
  out.version = h[0];
  out.type = h[1];
  std::memcpy(&out.pid, h.data() + 2, 4);
  std::memcpy(&out.zero, h.data() + 6, 4);
  std::memcpy(&out.page_size, h.data() + 10, 8);
  std::memcpy(&out.pages, h.data() + 18, 8);
  out.header = 26;
  if (out.version == 3) {
    std::memcpy(&out.handle_type, h.data() + 26, 4);
    out.header += 8;
  }
  out.payload = h.size() - std::min(h.size(), out.header);
  return out;
}

// A handle of POSIX file descriptors: the header and one descriptor per page.
vmm_handle parse_vmm_handle(const std::string& h) {
  vmm_handle out = parse_vmm_header(h);
  if (out.header == 0) return out;
  EXPECT_EQ(h.size(), out.header + 4 * out.pages);
  for (std::size_t i = out.header; i + 4 <= h.size(); i += 4) {
    std::int32_t fd = 0;
    std::memcpy(&fd, h.data() + i, 4);
    out.fds.push_back(fd);
  }
  return out;
}

// `count` physical pages of `page` bytes made and exported as PyTorch's ExpandableSegment makes
// them: a POSIX file descriptor each. release() closes the descriptors and frees the pages.
struct exported_pages {
  exported_pages(std::size_t page, int count) {
    for (int i = 0; i < count; ++i) {
      pages.push_back(producer.create_physical(page));
      fds.push_back(producer.export_handle(pages.back()));
    }
  }
  void release() {
    for (std::size_t i = 0; i < pages.size(); ++i) {
      ::close(fds[i]);
      producer.release_physical(pages[i]);
    }
  }
  gpumem::cuda_vmm_device producer{0};
  std::vector<gpumem::cuda_vmm_device::physical_handle> pages;
  std::vector<int> fds;
};

std::string make_vmm_handle(int version, std::int32_t pid, std::uint64_t page_size,
                            const std::vector<int>& fds, std::size_t bytes_per_handle = 4,
                            std::int32_t handle_type = 1) {
  std::string h;
  h.push_back(static_cast<char>(version));
  h.push_back('e');
  const std::uint32_t zero = 0;
  const std::uint64_t pages = fds.size();
  h.append(reinterpret_cast<const char*>(&pid), 4);
  h.append(reinterpret_cast<const char*>(&zero), 4);
  h.append(reinterpret_cast<const char*>(&page_size), 8);
  h.append(reinterpret_cast<const char*>(&pages), 8);
  if (version >= 3) {
    h.append(reinterpret_cast<const char*>(&handle_type), 4);
    h.append(reinterpret_cast<const char*>(&zero), 4);
  }
  for (const int fd : fds) {
    std::string one(bytes_per_handle, '\0');
    std::memcpy(one.data(), &fd, sizeof fd);
    h += one;
  }
  return h;
}

bool fd_open(int fd) {
  return ::fcntl(fd, F_GETFD) != -1;
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
    return "no error";
  } catch (const c10::Error& e) {
    return e.what();
  }
}

TEST_F(Installed, VmmMemoryIsSharedAsPyTorchsExpandableSegmentHandles) {
  if (classic()) GTEST_SKIP() << "classic memory is shared with cudaIpcGetMemHandle ('c')";
  const bool stitch = a_->default_pool(0).policy() == gpumem::allocator_policy::stitch;
  // A small block (a 2 MiB page) and a large one (stitch: 2 MiB pages; expandable: 20 MiB ones).
  for (const std::size_t size : {std::size_t{4096}, 5 * MiB + 12345}) {
    SCOPED_TRACE(size);
    void* keep = c10_alloc::raw_alloc(size);  // so that `p` starts inside a page
    void* p = c10_alloc::raw_alloc(size);
    const c10_alloc::ShareableHandle shared = c10_alloc::shareIpcHandle(p);
    const vmm_handle h = parse_vmm_handle(shared.handle);
    EXPECT_EQ(h.version, pytorchs_vmm_handle_version);
    EXPECT_EQ(h.type, 'e');
    EXPECT_EQ(h.pid, ::getpid());
    EXPECT_EQ(h.zero, 0u);
    EXPECT_EQ(h.handle_type, h.version == 3 ? 1 : 0);  // 1: POSIX file descriptors
    const std::size_t page = size <= MiB || stitch ? 2 * MiB : 20 * MiB;
    EXPECT_EQ(h.page_size, page);
    ASSERT_GE(shared.offset, 0);
    const auto offset = static_cast<std::size_t>(shared.offset);
    EXPECT_LT(offset, page);
    EXPECT_EQ(h.pages, (offset + size + page - 1) / page);
    for (const int fd : h.fds) EXPECT_TRUE(fd_open(fd)) << fd;
    // Shared again: the same descriptors (kept per block), so the same handle.
    EXPECT_EQ(c10_alloc::shareIpcHandle(p).handle, shared.handle);

    const gpumemSimCounters before = sim();
    std::shared_ptr<void> opened = c10_alloc::getIpcDevPtr(shared.handle);
    ASSERT_NE(opened.get(), nullptr);
    EXPECT_NE(opened.get(), p);
    const gpumemSimCounters after = sim();
    EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);  // the producer's pages, no new memory
    EXPECT_EQ(after.live_mappings, before.live_mappings + h.pages);
    EXPECT_EQ(after.live_reservations, before.live_reservations + 1);
    // Mapped and accessible over the whole block (the strict simulator checks every byte).
    void* data = static_cast<char*>(opened.get()) + offset;
    ASSERT_EQ(cudaMemset(data, 0x5a, size), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    // Opened again while open: the same mapping.
    std::shared_ptr<void> again = c10_alloc::getIpcDevPtr(shared.handle);
    EXPECT_EQ(again.get(), opened.get());
    EXPECT_EQ(sim().live_mappings, after.live_mappings);
    opened.reset();
    EXPECT_EQ(sim().live_mappings, after.live_mappings);
    again.reset();  // the last user: unmapped, the range freed
    EXPECT_EQ(sim().live_mappings, before.live_mappings);
    EXPECT_EQ(sim().live_reservations, before.live_reservations);
    EXPECT_EQ(sim().bytes_in_use, before.bytes_in_use);
    // Freeing the block closes its descriptors.
    c10_alloc::raw_delete(p);
    for (const int fd : h.fds) EXPECT_FALSE(fd_open(fd)) << fd;
    c10_alloc::raw_delete(keep);
  }
}

TEST_F(Installed, AnExpandableSegmentHandleAsPyTorchWritesItOpens) {
  // Pages made and exported as PyTorch's ExpandableSegment does, in PyTorch's layout.
  const std::size_t page = 2 * MiB;
  exported_pages exported(page, 3);
  const std::vector<int>& fds = exported.fds;
  const gpumemSimCounters before = sim();
  for (const int version : {2, 3}) {
    SCOPED_TRACE(version);
    std::shared_ptr<void> opened =
        c10_alloc::getIpcDevPtr(make_vmm_handle(version, ::getpid(), page, fds));
    EXPECT_EQ(sim().live_mappings, before.live_mappings + 3);
    EXPECT_EQ(sim().bytes_in_use, before.bytes_in_use);
    ASSERT_EQ(cudaMemset(opened.get(), 0x11, 3 * page), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  EXPECT_EQ(sim().live_mappings, before.live_mappings);
  exported.release();
  EXPECT_EQ(sim().live_physical, before.live_physical - 3);
}

TEST_F(Installed, AnExpandableSegmentHandleThatCannotBeOpenedSaysWhy) {
  gpumem::cuda_vmm_device producer(0);
  const std::size_t page = 2 * MiB;
  const auto h = producer.create_physical(page);
  const int fd = producer.export_handle(h);
  const std::int32_t self = ::getpid();
  const gpumemSimCounters before = sim();
  // A version gpumem does not know.
  std::string e = error_of([&] { c10_alloc::getIpcDevPtr(make_vmm_handle(4, self, page, {fd})); });
  EXPECT_NE(e.find("version 4"), std::string::npos) << e;
  EXPECT_NE(e.find("policy:classic"), std::string::npos) << e;
  // Fabric handles (64 bytes each in version 2; named by the handle type in version 3).
  e = error_of([&] { c10_alloc::getIpcDevPtr(make_vmm_handle(2, self, page, {fd}, 64)); });
  EXPECT_NE(e.find("fabric"), std::string::npos) << e;
  e = error_of([&] { c10_alloc::getIpcDevPtr(make_vmm_handle(3, self, page, {fd}, 64, 2)); });
  EXPECT_NE(e.find("fabric"), std::string::npos) << e;
  EXPECT_NE(e.find("expandable_segments:False"), std::string::npos) << e;
  // A handle type that version 3 does not define.
  e = error_of([&] { c10_alloc::getIpcDevPtr(make_vmm_handle(3, self, page, {fd}, 4, 7)); });
  EXPECT_NE(e.find("handle type 7"), std::string::npos) << e;
  // A producer that has exited.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  e = error_of([&] { c10_alloc::getIpcDevPtr(make_vmm_handle(2, child, page, {fd})); });
  EXPECT_NE(e.find("pidfd_open"), std::string::npos) << e;
  EXPECT_NE(e.find("exited"), std::string::npos) << e;
  // A descriptor the producer closed (the tensor was freed before it was opened).
  e = error_of([&] { c10_alloc::getIpcDevPtr(make_vmm_handle(2, self, page, {fd, 999})); });
  EXPECT_NE(e.find("pidfd_getfd"), std::string::npos) << e;
  EXPECT_NE(e.find("freed"), std::string::npos) << e;
  EXPECT_NE(e.find("policy:classic"), std::string::npos) << e;
  // A descriptor that names no exported memory.
  e = error_of([&] { c10_alloc::getIpcDevPtr(make_vmm_handle(2, self, page, {0})); });
  EXPECT_NE(e.find("cuMemImportFromShareableHandle"), std::string::npos) << e;
  // Nothing was left mapped, imported or open.
  EXPECT_EQ(sim().live_mappings, before.live_mappings);
  EXPECT_EQ(sim().live_reservations, before.live_reservations);
  ::close(fd);
  producer.release_physical(h);
}

// A forked child opens `shared`, writes `size` bytes at its offset and exits 0 printing `said`
// and its process id (its simulated GPU is a copy of the parent's, so the memory is there too).
void expect_a_child_opens_and_writes(const c10_alloc::ShareableHandle& shared, std::size_t size,
                                     const std::string& said) {
  EXPECT_EXIT(
      {
        std::shared_ptr<void> opened = c10_alloc::getIpcDevPtr(shared.handle);
        void* data = static_cast<char*>(opened.get()) + shared.offset;
        if (cudaMemset(data, 0x22, size) != cudaSuccess) std::exit(2);
        if (cudaDeviceSynchronize() != cudaSuccess) std::exit(3);
        opened.reset();
        std::fprintf(stderr, "%s %d\n", said.c_str(), static_cast<int>(::getpid()));
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), said);
}

TEST_F(Installed, AnotherProcessOpensTheHandleWithPidfdGetfd) {
  if (classic()) GTEST_SKIP() << "classic memory is shared with cudaIpcGetMemHandle ('c')";
  void* p = c10_alloc::raw_alloc(5 * MiB);
  const c10_alloc::ShareableHandle shared = c10_alloc::shareIpcHandle(p);
  // Under Yama's ptrace_scope 1 only an ancestor may take descriptors: let the child.
  (void)::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  // The forked child takes the parent's descriptors (its simulated GPU is a copy of the
  // parent's, so the memory they name is there too).
  expect_a_child_opens_and_writes(shared, 5 * MiB, "opened in process");
  c10_alloc::raw_delete(p);
}

// --- Fabric handles (GPUMEM_TORCH_TEST_MODE=fabric: GPUMEM_SIM_FABRIC=imex, a VMM policy)

class FabricHandles : public ::testing::Test {
 protected:
  void SetUp() override {
    if (env("GPUMEM_TORCH_TEST_MODE") != "fabric") GTEST_SKIP() << "runs with mode fabric";
    ASSERT_NE(gpumem::torch::installed(), nullptr);
    c10_alloc::emptyCache();
  }
};

// An 'e' handle whose payload is 64-byte fabric handles (read by the tests from its size).
vmm_handle parse_fabric_handle(const std::string& h) {
  vmm_handle out = parse_vmm_header(h);
  if (out.header != 0 && out.type != 'e') ADD_FAILURE() << "not an expandable-segment handle";
  return out;
}

TEST_F(FabricHandles, VmmMemoryIsSharedAsFabricHandlesThatAnotherProcessOpens) {
  const std::size_t size = 5 * MiB + 12345;
  void* keep = c10_alloc::raw_alloc(4096);
  void* p = c10_alloc::raw_alloc(size);
  const c10_alloc::ShareableHandle shared = c10_alloc::shareIpcHandle(p);
  const vmm_handle h = parse_fabric_handle(shared.handle);
  EXPECT_EQ(h.version, pytorchs_vmm_handle_version);
  if (h.version == 3) {
    EXPECT_EQ(h.handle_type, 2);  // PyTorch's FABRIC_HANDLE
  }
  ASSERT_GT(h.pages, 0u);
  EXPECT_EQ(h.payload, h.pages * 64);  // one CUmemFabricHandle per page
  const gpumemSimCounters before = sim();
  std::shared_ptr<void> opened = c10_alloc::getIpcDevPtr(shared.handle);
  ASSERT_NE(opened.get(), nullptr);
  EXPECT_NE(opened.get(), p);
  EXPECT_EQ(sim().bytes_in_use, before.bytes_in_use);  // the producer's pages, no new memory
  EXPECT_EQ(sim().live_mappings, before.live_mappings + h.pages);
  void* data = static_cast<char*>(opened.get()) + shared.offset;
  ASSERT_EQ(cudaMemset(data, 0x5a, size), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  opened.reset();
  EXPECT_EQ(sim().live_mappings, before.live_mappings);
  // Another process imports the bytes as they are: no descriptor to take, no ptrace permission.
  expect_a_child_opens_and_writes(shared, size, "opened fabric handles in process");
  c10_alloc::raw_delete(p);
  c10_alloc::raw_delete(keep);
}

TEST_F(FabricHandles, AVersion2HandleOfFabricHandlesOpens) {
  // Torch 2.12 and older name no handle type: 64 bytes a page are fabric handles.
  const std::size_t page = 2 * MiB;
  gpumem::cuda_vmm_device producer(0, gpumem::cuda_vmm_device::shareable_handle::fabric);
  std::vector<gpumem::cuda_vmm_device::physical_handle> pages;
  std::string handle{char{2}, 'e'};
  const std::int32_t pid = ::getpid();
  const std::uint32_t zero = 0;
  const std::uint64_t count = 2;
  handle.append(reinterpret_cast<const char*>(&pid), 4);
  handle.append(reinterpret_cast<const char*>(&zero), 4);
  handle.append(reinterpret_cast<const char*>(&page), 8);
  handle.append(reinterpret_cast<const char*>(&count), 8);
  for (std::uint64_t i = 0; i < count; ++i) {
    pages.push_back(producer.create_physical(page));
    const gpumem::fabric_handle bytes = producer.export_fabric_handle(pages.back());
    handle.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  const gpumemSimCounters before = sim();
  {
    std::shared_ptr<void> opened = c10_alloc::getIpcDevPtr(handle);
    EXPECT_EQ(sim().live_mappings, before.live_mappings + count);
    EXPECT_EQ(sim().bytes_in_use, before.bytes_in_use);
    ASSERT_EQ(cudaMemset(opened.get(), 0x11, count * page), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  EXPECT_EQ(sim().live_mappings, before.live_mappings);
  for (const auto h : pages) producer.release_physical(h);
}

TEST(FabricFollowsPyTorch, PyTorchsHandleTypeSetFromCppIsFollowed) {
  // Mode fabric_pytorch_posix_fd: fabric access, gpumem's key left at auto, and PyTorch's setting
  // (CUDAAllocatorConfig::set_expandable_segments_handle_type, before the first allocation)
  // POSIX_FD.
  if (env("GPUMEM_TORCH_TEST_MODE") != "fabric_pytorch_posix_fd") GTEST_SKIP() << "its own mode";
  void* p = c10_alloc::raw_alloc(3 * MiB);
  const vmm_handle h = parse_fabric_handle(c10_alloc::shareIpcHandle(p).handle);
  if (h.version == 3) {
    EXPECT_EQ(h.handle_type, 1);  // POSIX_FD
  }
  EXPECT_EQ(h.payload, h.pages * 4);  // a file descriptor a page
  c10_alloc::raw_delete(p);
}

TEST(FabricRefused, FabricHandlesAskedForWithoutFabricAccessAreAClearError) {
  if (env("GPUMEM_TORCH_TEST_MODE") != "fabric_refused") GTEST_SKIP() << "mode fabric_refused";
  ASSERT_NE(gpumem::torch::installed(), nullptr);
  // As PyTorch 2.13 and newer: the GPU's first allocation refuses, saying how to get out.
  const std::string e = error_of([] { c10_alloc::raw_alloc(MiB); });
  EXPECT_NE(e.find("does not support fabric access"), std::string::npos) << e;
  EXPECT_NE(e.find("expandable_segments_handle_type:posix_fd"), std::string::npos) << e;
}

// --- PyTorch's own allocator and gpumem's expandable-segment handles
// -----------------------------------------------------------------------------------------------
// GPUMEM_TORCH_TEST_MODE=pytorch_ipc runs these with PyTorch's allocator (expandable_segments:True)
// and gpumem not installed: PyTorch writes the layout gpumem writes and reads, and opens a handle
// laid out as gpumem writes it. (Each process has its own simulated GPU, so one allocator's handle
// cannot be opened by the other in a second process here.)

bool pytorch_ipc_mode() {
  return env("GPUMEM_TORCH_TEST_MODE") == "pytorch_ipc";
}

// Starts PyTorch's allocator with POSIX file descriptors as its expandable segments' handle type:
// from torch 2.13 it otherwise asks the GPU whether it has fabric access first, which needs
// PyTorch's peer-access cache (set up by torch's Python module, not here).
void init_pytorchs_allocator() {
#if GPUMEM_TORCH_AT_LEAST(2, 13)
  c10_alloc::CUDAAllocatorConfig::set_expandable_segments_handle_type(
      c10_alloc::Expandable_Segments_Handle_Type::POSIX_FD);
#endif
  c10_alloc::init(1);
}

TEST(PyTorchsAllocator, WritesTheExpandableSegmentLayoutGpumemReads) {
  if (!pytorch_ipc_mode()) GTEST_SKIP() << "runs with GPUMEM_TORCH_TEST_MODE=pytorch_ipc";
  ASSERT_EQ(gpumem::torch::installed(), nullptr);
  init_pytorchs_allocator();
  ASSERT_NE(c10_alloc::name(), "gpumem");
  for (const std::size_t size : {std::size_t{4096}, 5 * MiB + 12345}) {
    SCOPED_TRACE(size);
    void* keep = c10_alloc::raw_alloc(size);
    void* p = c10_alloc::raw_alloc(size);
    const c10_alloc::ShareableHandle shared = c10_alloc::shareIpcHandle(p);
    const vmm_handle h = parse_vmm_handle(shared.handle);
    EXPECT_EQ(h.version, pytorchs_vmm_handle_version);
    EXPECT_EQ(h.type, 'e');
    EXPECT_EQ(h.pid, ::getpid());
    if (h.version == 2) {
      EXPECT_EQ(h.zero, 0u);  // torch 2.15 leaves the padding uninitialised
    }
    EXPECT_EQ(h.handle_type, h.version == 3 ? 1 : 0);           // 1: POSIX file descriptors
    const std::size_t page = size <= MiB ? 2 * MiB : 20 * MiB;  // gpumem's expandable pages
    EXPECT_EQ(h.page_size, page);
    ASSERT_GE(shared.offset, 0);
    const auto offset = static_cast<std::size_t>(shared.offset);
    EXPECT_LT(offset, page);
    EXPECT_EQ(h.pages, (offset + size + page - 1) / page);
    for (const int fd : h.fds) EXPECT_TRUE(fd_open(fd)) << fd;
    c10_alloc::raw_delete(p);
    c10_alloc::raw_delete(keep);
  }
}

TEST(PyTorchsAllocator, OpensAnExpandableSegmentHandleLaidOutAsGpumemWritesIt) {
  if (!pytorch_ipc_mode()) GTEST_SKIP() << "runs with GPUMEM_TORCH_TEST_MODE=pytorch_ipc";
  init_pytorchs_allocator();
  // Three 2 MiB pages, as stitch shares a block on part of a range.
  const std::size_t page = 2 * MiB;
  exported_pages exported(page, 3);
  const std::vector<int>& fds = exported.fds;
  const gpumemSimCounters before = sim();
  {
    std::shared_ptr<void> opened = c10_alloc::getIpcDevPtr(
        make_vmm_handle(pytorchs_vmm_handle_version, ::getpid(), page, fds));
    ASSERT_NE(opened.get(), nullptr);
    EXPECT_EQ(sim().live_mappings, before.live_mappings + 3);
    EXPECT_EQ(sim().bytes_in_use, before.bytes_in_use);
    ASSERT_EQ(cudaMemset(opened.get(), 0x11, 3 * page), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  EXPECT_EQ(sim().live_mappings, before.live_mappings);
  exported.release();
}

TEST_F(Installed, MemorySummaryIsPyTorchsTableWithGpumemsSection) {
  void* p = c10_alloc::raw_alloc(10 * MiB);
  const std::string summary = a_->memory_summary(0);
  EXPECT_NE(summary.find("CUDA memory summary"), std::string::npos) << summary;
  EXPECT_NE(summary.find("Allocated memory"), std::string::npos);
  EXPECT_NE(summary.find("policy"), std::string::npos);
  c10_alloc::raw_delete(p);
}

// --- snapshot on out-of-memory (oom_snapshot:DIR)
// ---------------------------------------------------------

class OomSnapshot : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!oom_snapshot_mode()) GTEST_SKIP() << "runs with GPUMEM_TORCH_TEST_MODE=oom_snapshot";
    a_ = gpumem::torch::installed();
    ASSERT_NE(a_, nullptr);
    dir_ = a_->config().oom_snapshot;
    ASSERT_FALSE(dir_.empty()) << "GPUMEM_TORCH_TEST_CONF must set oom_snapshot";
    c10_alloc::emptyCache();
  }

  // The snapshots in the directory, by name.
  std::vector<std::filesystem::path> pickles() const {
    std::vector<std::filesystem::path> found;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
      found.push_back(entry.path());
    }
    std::sort(found.begin(), found.end());
    return found;
  }

  // Asks for `bytes`, which must fail with PyTorch's out-of-memory error; returns what was said on
  // stderr meanwhile.
  static std::string out_of_memory(std::size_t bytes) {
    testing::internal::CaptureStderr();
    bool raised = false;
    try {
      c10_alloc::raw_alloc(bytes);
    } catch (const c10::OutOfMemoryError&) {
      raised = true;
    }
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_TRUE(raised) << bytes << " bytes fit";
    return err;
  }

  cuda_allocator* a_ = nullptr;
  std::string dir_;
};

// The device traces of a snapshot file, as written.
std::size_t device_trace_length(const std::filesystem::path& path, int device) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto root = gpumem::detail::unpickle(bytes);
  return root.find("device_traces")
      ->as_list()
      .at(static_cast<std::size_t>(device))
      .as_list()
      .size();
}

// The oom events in a snapshot file's trace of `device`.
std::size_t count_oom_events(const std::filesystem::path& path, int device) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto root = gpumem::detail::unpickle(bytes);
  std::size_t n = 0;
  for (const auto& e :
       root.find("device_traces")->as_list().at(static_cast<std::size_t>(device)).as_list()) {
    if (e.find("action")->as_str() == "oom") ++n;
  }
  return n;
}

TEST_F(OomSnapshot, TheSnapshotReplaysToTheRequestThatFailed) {
  std::filesystem::remove_all(dir_);  // made again by the snapshot
  ASSERT_EQ(setenv("RANK", "3", 1), 0);
  // On the 1 GiB device: 300 MiB freed (cached), 100 MiB and a small block live, then 950 MiB,
  // which does not fit even once the cache is returned.
  void* a = c10_alloc::raw_alloc(300 * MiB);
  void* b = c10_alloc::raw_alloc(100 * MiB);
  void* c = c10_alloc::raw_alloc(1000);
  c10_alloc::raw_delete(a);
  const std::size_t failing = 950 * MiB + 123;
  const std::string err = out_of_memory(failing);

  const auto files = pickles();
  ASSERT_EQ(files.size(), 1u) << err;
  const std::string name = files.front().filename().string();
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  const std::string prefix = "rank3-" + gpumem::torch::detail::file_name_safe(host) + "-pid" +
                             std::to_string(getpid()) + "-oom1";
  EXPECT_EQ(name, prefix + ".pickle");
  // One line: where, and the command that replays it.
  const std::string path = std::filesystem::absolute(files.front()).lexically_normal().string();
  EXPECT_NE(err.find("snapshot written to " + path + "; replay it with: gpumem-replay " + path),
            std::string::npos)
      << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  // The key records its own history: PyTorch's stays off.
  EXPECT_FALSE(a_->isHistoryEnabled());

  // The failing request is the oom event with its size: the reader makes it the recorded
  // out-of-memory, and a replay under the recorded settings fails there too.
  const gpumem::allocation_trace trace = gpumem::read_pytorch_snapshot(path);
  ASSERT_TRUE(trace.recorded_oom_event.has_value());
  EXPECT_EQ(trace.events.at(*trace.recorded_oom_event).size, failing);
  ASSERT_TRUE(trace.device_memory.has_value());
  const auto recorded = gpumem::allocator_config::parse(trace.recorded_config);
  EXPECT_EQ(recorded.policy, a_->default_pool(0).policy()) << trace.recorded_config;
  gpumem::replay_options ro;
  ro.device_memory = static_cast<std::size_t>(*trace.device_memory);
  ro.config = recorded;
  const auto compiled = gpumem::compile_trace(trace);
  const gpumem::replay_result r = gpumem::replay_trace(compiled, ro);
  EXPECT_FALSE(r.completed);
  EXPECT_EQ(r.oom_event_index, trace.recorded_oom_event);
  c10_alloc::raw_delete(b);
  c10_alloc::raw_delete(c);
  ASSERT_EQ(unsetenv("RANK"), 0);
}

TEST_F(OomSnapshot, TheHistoryIsTheNewestEventsUpToTheLimit) {
  std::filesystem::remove_all(dir_);
  const std::size_t limit = a_->config().oom_snapshot_max_entries;
  ASSERT_LT(limit, 200u) << "the test configuration sets a small oom_snapshot_max_entries";
  void* kept = c10_alloc::raw_alloc(64 * MiB);
  for (int i = 0; i < 100; ++i) c10_alloc::raw_delete(c10_alloc::raw_alloc(MiB + i));
  const std::string err = out_of_memory(2048 * MiB);
  const auto files = pickles();
  ASSERT_EQ(files.size(), 1u) << err;
  EXPECT_EQ(device_trace_length(files.front(), 0), limit);
  // What the ring lost is rebuilt from the segments: the snapshot still replays to its failure.
  const gpumem::allocation_trace trace = gpumem::read_pytorch_snapshot(files.front().string());
  ASSERT_TRUE(trace.recorded_oom_event.has_value());
  EXPECT_EQ(trace.events.at(*trace.recorded_oom_event).size, 2048 * MiB);
  c10_alloc::raw_delete(kept);
}

TEST_F(OomSnapshot, AFailureToWriteIsALineOnStderrAndTheErrorStillRaised) {
  std::filesystem::remove_all(dir_);
  std::ofstream(dir_) << "a file where the directory should be";
  const std::string err = out_of_memory(4096 * MiB);  // raises PyTorch's error all the same
  EXPECT_NE(err.find("the snapshot was not written to " + dir_), std::string::npos) << err;
  std::filesystem::remove(dir_);
}

// A program that caught an out-of-memory error and went on: the next snapshot replays to the new
// failure, past the one it caught (whose request allocated nothing).
TEST_F(OomSnapshot, AnEarlierCaughtOutOfMemoryIsLeftOutOfTheHistory) {
  std::filesystem::remove_all(dir_);
  std::ofstream(dir_) << "no snapshot for the first one";
  out_of_memory(4096 * MiB);
  std::filesystem::remove(dir_);
  void* live = c10_alloc::raw_alloc(10 * MiB);
  const std::string err = out_of_memory(3000 * MiB);
  const auto files = pickles();
  ASSERT_EQ(files.size(), 1u) << err;
  EXPECT_EQ(count_oom_events(files.front(), 0), 1u);
  const gpumem::allocation_trace trace = gpumem::read_pytorch_snapshot(files.front().string());
  ASSERT_TRUE(trace.recorded_oom_event.has_value());
  EXPECT_EQ(trace.events.at(*trace.recorded_oom_event).size, 3000 * MiB);
  gpumem::replay_options ro;
  ro.device_memory = static_cast<std::size_t>(trace.device_memory.value_or(0));
  ro.config = gpumem::allocator_config::parse(trace.recorded_config);
  const gpumem::replay_result r = gpumem::replay_trace(gpumem::compile_trace(trace), ro);
  EXPECT_FALSE(r.completed);
  EXPECT_EQ(r.oom_event_index, trace.recorded_oom_event);
  c10_alloc::raw_delete(live);
}

// Runs after the tests above, which wrote three snapshots in this process.
TEST_F(OomSnapshot, AProcessWritesAtMostThreeSnapshotsAndOverwritesNone) {
  std::filesystem::remove_all(dir_);
  std::size_t written = 0;
  std::string err;
  for (int i = 0; i < 4 && err.find("no snapshot written") == std::string::npos; ++i) {
    err = out_of_memory(4096 * MiB);
    if (err.find("snapshot written to") != std::string::npos) ++written;
  }
  EXPECT_NE(err.find("no snapshot written (this process wrote 3 already"), std::string::npos)
      << err;
  EXPECT_EQ(pickles().size(), written);
  EXPECT_NE(out_of_memory(4096 * MiB).find("no snapshot written"), std::string::npos);
  EXPECT_EQ(pickles().size(), written);
}

bool has_primary_context(c10::DeviceIndex) {
  return true;
}

class InstallGpumem : public ::testing::Environment {
 public:
  void SetUp() override {
    // libtorch_cuda installs this hook in a full PyTorch; with c10 alone the test does.
    c10::cuda::_internal::setHasPrimaryContext(&has_primary_context);
    if (too_late_mode() || env("GPUMEM_TORCH_TEST_MODE") == "pytorch_ipc") return;
    if (env("GPUMEM_TORCH_TEST_MODE") == "fabric_pytorch_posix_fd") {
      c10_alloc::CUDAAllocatorConfig::set_expandable_segments_handle_type(
          c10_alloc::Expandable_Segments_Handle_Type::POSIX_FD);
    }
    gpumem::torch::install(env("GPUMEM_TORCH_TEST_CONF"));
  }
};

const auto* const install_once = ::testing::AddGlobalTestEnvironment(new InstallGpumem);

}  // namespace
