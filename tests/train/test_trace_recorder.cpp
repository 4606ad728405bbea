// gpumem::torch::cpu_trace_recorder: LibTorch's CPU allocations as a gpumem trace.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <stdexcept>

#include "gpumem/torch/trace_recorder.hpp"
#include "gpumem/trace/replay.hpp"

namespace {

TEST(CpuTraceRecorder, RecordsEveryStorageWithItsSizeAndRelease) {
  gpumem::allocation_trace trace;
  torch::Tensor survivor;
  {
    gpumem::torch::cpu_trace_recorder recorder;
    torch::Tensor a = torch::empty({1000}, torch::kFloat);  // 4000 bytes
    {
      torch::Tensor b = torch::empty({10, 10}, torch::kDouble);  // 800 bytes, freed at once
    }
    survivor = torch::empty({3}, torch::kInt64);  // 24 bytes, alive after the recording
    a = torch::Tensor();
    trace = recorder.stop();
    EXPECT_TRUE(recorder.stop().events.empty());  // once
  }
  ASSERT_EQ(trace.events.size(), 7u);
  using K = gpumem::trace_event_kind;
  EXPECT_EQ(trace.events[0].kind, K::alloc);
  EXPECT_EQ(trace.events[0].size, 4000u);
  EXPECT_EQ(trace.events[1].size, 800u);
  EXPECT_EQ(trace.events[2].kind, K::free_requested);
  EXPECT_EQ(trace.events[2].address, trace.events[1].address);
  EXPECT_EQ(trace.events[3].kind, K::free_completed);
  EXPECT_EQ(trace.events[4].size, 24u);
  EXPECT_EQ(trace.events[5].kind, K::free_requested);
  EXPECT_EQ(trace.events[5].address, trace.events[0].address);
  EXPECT_NO_THROW(gpumem::validate_trace(trace));
  // Replayable: the peak is the two first tensors together.
  const auto result = gpumem::replay_trace(gpumem::compile_trace(trace), {});
  EXPECT_TRUE(result.completed);
  EXPECT_EQ(result.peak_requested, 4800u);
  survivor = torch::Tensor();  // freed into LibTorch's own allocator, unrecorded
  EXPECT_EQ(c10::GetAllocator(c10::DeviceType::CPU)->allocate(8).get() != nullptr, true);
}

TEST(CpuTraceRecorder, OneAtATimeAndRawAllocationsWork) {
  gpumem::torch::cpu_trace_recorder recorder;
  EXPECT_THROW(gpumem::torch::cpu_trace_recorder second, std::logic_error);
  c10::Allocator* cpu = c10::GetAllocator(c10::DeviceType::CPU);
  void* p = cpu->raw_allocate(64);
  cpu->raw_deallocate(p);
  const auto trace = recorder.stop();
  ASSERT_EQ(trace.events.size(), 3u);
  EXPECT_EQ(trace.events[0].size, 64u);
}

}  // namespace
