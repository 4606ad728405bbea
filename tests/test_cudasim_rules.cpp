// The CUDA simulator's rules (tools/cudasim/README.md, "What the simulator checks"): work in
// stream order on simulated time, and the violations it reports — work on unmapped or
// inaccessible memory (a sticky cudaErrorIllegalAddress), memory unmapped under work the host has
// not seen complete, races between unordered streams. Each rule has a test that breaks it and one
// that keeps it with zero violations.
//
// ctest runs this executable once per set of GPUMEM_SIM_* settings (GPUMEM_CUDASIM_TEST names
// it, see tests/CMakeLists.txt): "rules" (work takes no time), "time" (long kernels, a slow
// bus), "strict" (GPUMEM_SIM_STRICT=abort), "bad_devices" (a bad GPUMEM_SIM_DEVICES), "gpumem"
// (gpumem's own CUDA code under the rules). Everything skips elsewhere.
#include <gtest/gtest.h>

#ifdef GPUMEM_TEST_CUDASIM

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "cudasim_support.hpp"
#include "gpumem/config.hpp"
#include "gpumem/core/caching_allocator.hpp"
#include "gpumem/device/cuda_device.hpp"
#include "gpumem/device/cuda_vmm_device.hpp"
#include "gpumem/host/cuda_host_device.hpp"
#include "gpumem/host/pinned_pool.hpp"

namespace {

using namespace cudasim_test;  // NOLINT: the tests' helpers

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string hex(const void* p) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%#lx",
                static_cast<unsigned long>(reinterpret_cast<std::uintptr_t>(p)));
  return buffer;
}

// ---------------------------------------------------------------------------------------------
// GPUMEM_CUDASIM_TEST=rules: GPUMEM_SIM_KERNEL_TIME=0, GPUMEM_SIM_BANDWIDTH=0 (work takes no time)
// ---------------------------------------------------------------------------------------------

class CudaSimRules : public ::testing::Test {
 protected:
  void SetUp() override {
    GPUMEM_REQUIRE_SIM_MODE("rules");
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    reset_violations();
    ASSERT_EQ(cudaStreamCreateWithFlags(&a_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&b_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (IsSkipped()) return;
    EXPECT_EQ(cudaStreamDestroy(a_), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(b_), cudaSuccess);
    EXPECT_EQ(violations(), 0u) << "unexpected violation: " << last_violation();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a test left an error behind";
    const gpumemSimCounters c = counters();
    EXPECT_EQ(c.live_segments, 0u) << "a test leaked device memory";
    EXPECT_EQ(c.live_mappings, 0u);
  }

  cudaStream_t a_ = nullptr;
  cudaStream_t b_ = nullptr;
};

TEST_F(CudaSimRules, WorkOnAllocatedMemoryIsFine) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 4 * MiB), cudaSuccess);
  const gpumemSimCounters before = counters();
  EXPECT_EQ(launch_work(a_, {writes(p, 4 * MiB)}), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(p, 0, MiB, a_), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(static_cast<char*>(p) + MiB, p, MiB, cudaMemcpyDeviceToDevice, a_),
            cudaSuccess);
  // The legacy stream does not wait for a non-blocking stream: synchronise before reading back.
  EXPECT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  std::vector<char> host(4096);
  EXPECT_EQ(cudaMemcpy(host.data(), p, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  const gpumemSimCounters after = counters();
  EXPECT_EQ(after.work_launches - before.work_launches, 1u);
  EXPECT_EQ(after.pending_works, 0u);  // the host has seen all of it complete
  EXPECT_EQ(after.violations, 0u);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

TEST_F(CudaSimRules, WorkOnFreedMemoryFaultsTheDevice) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, MiB), cudaSuccess);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  // The launch itself succeeds (the fault happens on the GPU)...
  EXPECT_EQ(launch_work(a_, {writes(p, MiB)}), cudaSuccess);
  gpumemSimCounters c = counters();
  EXPECT_EQ(c.violations, 1u);
  EXPECT_EQ(c.violations_unmapped, 1u);
  EXPECT_EQ(c.faulted_devices, 1u);
  const std::string text = last_violation();
  EXPECT_TRUE(contains(text, "unmapped memory: gpumemSimLaunchWork on stream ")) << text;
  EXPECT_TRUE(contains(text, "writes [" + hex(p) + ", ")) << text;
  EXPECT_TRUE(contains(text, "(1048576 bytes)")) << text;
  EXPECT_TRUE(contains(text, "not allocated or mapped on device 0")) << text;
  // ...and the next synchronising call reports it, as do the calls after it: it is sticky.
  EXPECT_EQ(cudaStreamSynchronize(a_), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
  void* q = nullptr;
  EXPECT_EQ(cudaMalloc(&q, MiB), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaStreamQuery(b_), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  // Tests clear it.
  reset_violations();
  c = counters();
  EXPECT_EQ(c.violations, 0u);
  EXPECT_EQ(c.faulted_devices, 0u);
  EXPECT_EQ(last_violation(), "");
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST_F(CudaSimRules, WorkPastTheEndOfASegmentIsReported) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 4 * MiB), cudaSuccess);
  EXPECT_EQ(
      cudaMemcpyAsync(static_cast<char*>(p) + 2 * MiB, p, 4 * MiB, cudaMemcpyDeviceToDevice, a_),
      cudaSuccess);
  EXPECT_EQ(counters().violations_unmapped, 1u);
  const std::string text = last_violation();
  EXPECT_TRUE(contains(text, "cudaMemcpyAsync")) << text;
  EXPECT_TRUE(contains(text, "writes [" + hex(static_cast<char*>(p) + 4 * MiB))) << text;
  reset_violations();
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

TEST_F(CudaSimRules, WorkOnPageableHostMemoryIsReportedAndPinnedMemoryIsFine) {
  std::vector<char> pageable(4096);
  EXPECT_EQ(launch_work(a_, {reads(pageable.data(), pageable.size())}), cudaSuccess);
  EXPECT_EQ(counters().violations_unmapped, 1u);
  EXPECT_TRUE(contains(last_violation(), "neither device memory nor pinned host memory"))
      << last_violation();
  reset_violations();

  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 4096), cudaSuccess);
  EXPECT_EQ(launch_work(a_, {reads(pinned, 4096)}), cudaSuccess);
  // Copies from pageable memory are staged by the driver: nothing to report.
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 4096), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(d, pageable.data(), 4096, cudaMemcpyHostToDevice, a_), cudaSuccess);
  EXPECT_EQ(violations(), 0u) << last_violation();
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
}

TEST_F(CudaSimRules, VmmMemoryNeedsAccessGrantedByCuMemSetAccess) {
  vmm_memory m(0, 2 * MiB, {});
  EXPECT_EQ(launch_work(a_, {writes(m.ptr(), MiB)}), cudaSuccess);
  EXPECT_EQ(counters().violations_inaccessible, 1u);
  EXPECT_TRUE(contains(last_violation(), "mapped without cuMemSetAccess for device 0"))
      << last_violation();
  EXPECT_EQ(cudaStreamSynchronize(a_), cudaErrorIllegalAddress);
  (void)cudaGetLastError();
  reset_violations();

  ASSERT_EQ(m.grant(0), CUDA_SUCCESS);
  EXPECT_EQ(launch_work(a_, {writes(m.ptr(), 2 * MiB)}), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(m.ptr(), 0, 2 * MiB, a_), cudaSuccess);
  EXPECT_EQ(violations(), 0u) << last_violation();
  // PROT_NONE takes it away again.
  ASSERT_EQ(m.grant(0, CU_MEM_ACCESS_FLAGS_PROT_NONE), CUDA_SUCCESS);
  EXPECT_EQ(launch_work(a_, {reads(m.ptr(), 4096)}), cudaSuccess);
  EXPECT_EQ(counters().violations_inaccessible, 1u);
  reset_violations();
  EXPECT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
}

TEST_F(CudaSimRules, UnmappingUnderWorkTheHostHasNotSeenCompleteIsReported) {
  vmm_memory m(0, 4 * MiB, {0});
  EXPECT_EQ(launch_work(a_, {writes(m.ptr(), MiB)}), cudaSuccess);
  EXPECT_EQ(counters().pending_works, 1u);
  // The work has ended on the timeline (it takes no time), but nothing told the host so.
  EXPECT_EQ(m.unmap(), CUDA_SUCCESS);
  const gpumemSimCounters c = counters();
  EXPECT_EQ(c.violations_in_flight, 1u);
  EXPECT_EQ(c.faulted_devices, 0u);  // it had ended: no fault, but still a violation
  const std::string text = last_violation();
  EXPECT_TRUE(contains(text, "in flight: cuMemUnmap(" + hex(m.ptr()))) << text;
  EXPECT_TRUE(contains(text, "gpumemSimLaunchWork on stream")) << text;
  EXPECT_TRUE(contains(text, "which the host has not seen complete")) << text;
  reset_violations();
  EXPECT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
}

TEST_F(CudaSimRules, WhatTellsTheHostThatWorkIsComplete) {
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  struct way {
    const char* name;
    std::function<void()> observe;
  };
  const std::vector<way> ways = {
      {"cudaStreamSynchronize", [&] { ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess); }},
      {"cudaStreamQuery", [&] { ASSERT_EQ(cudaStreamQuery(a_), cudaSuccess); }},
      {"cudaEventSynchronize",
       [&] {
         ASSERT_EQ(cudaEventRecord(e, a_), cudaSuccess);
         ASSERT_EQ(cudaEventSynchronize(e), cudaSuccess);
       }},
      {"cudaEventQuery",
       [&] {
         ASSERT_EQ(cudaEventRecord(e, a_), cudaSuccess);
         ASSERT_EQ(cudaEventQuery(e), cudaSuccess);
       }},
      {"an event after later work of the stream",
       [&] {
         ASSERT_EQ(launch_work(a_, {}), cudaSuccess);
         ASSERT_EQ(cudaEventRecord(e, a_), cudaSuccess);
         ASSERT_EQ(cudaEventQuery(e), cudaSuccess);
       }},
      {"a stream that waited for it",
       [&] {
         ASSERT_EQ(cudaEventRecord(e, a_), cudaSuccess);
         ASSERT_EQ(cudaStreamWaitEvent(b_, e, 0), cudaSuccess);
         ASSERT_EQ(cudaStreamSynchronize(b_), cudaSuccess);
       }},
      {"cudaDeviceSynchronize", [&] { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess); }},
      {"cudaFree (which synchronises)",
       [&] {
         void* p = nullptr;
         ASSERT_EQ(cudaMalloc(&p, 512), cudaSuccess);
         ASSERT_EQ(cudaFree(p), cudaSuccess);
       }},
  };
  for (const way& w : ways) {
    SCOPED_TRACE(w.name);
    vmm_memory m(0, 2 * MiB, {0});
    ASSERT_EQ(launch_work(a_, {writes(m.ptr(), 2 * MiB)}), cudaSuccess);
    w.observe();
    EXPECT_EQ(m.unmap(), CUDA_SUCCESS);
    EXPECT_EQ(violations(), 0u) << last_violation();
  }
  // What does not: synchronising another stream, or an event recorded before the work.
  vmm_memory m(0, 2 * MiB, {0});
  ASSERT_EQ(cudaEventRecord(e, a_), cudaSuccess);
  ASSERT_EQ(launch_work(a_, {writes(m.ptr(), 2 * MiB)}), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(b_), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(e), cudaSuccess);
  EXPECT_EQ(m.unmap(), CUDA_SUCCESS);
  EXPECT_EQ(counters().violations_in_flight, 1u);
  reset_violations();
  EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
}

TEST_F(CudaSimRules, CudaFreeUnderWorkInFlightIsFineBecauseItSynchronises) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, MiB), cudaSuccess);
  ASSERT_EQ(launch_work(a_, {writes(p, MiB)}), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(p, 1, MiB, b_), cudaSuccess);  // a race, reported
  EXPECT_EQ(counters().violations_race, 1u);
  reset_violations();
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(violations(), 0u);
  EXPECT_EQ(counters().pending_works, 0u);
}

TEST_F(CudaSimRules, UnorderedStreamsTouchingTheSameBytesRace) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 4 * MiB), cudaSuccess);
  char* c = static_cast<char*>(p);
  ASSERT_EQ(launch_work(a_, {writes(c, MiB)}), cudaSuccess);
  ASSERT_EQ(launch_work(b_, {reads(c + MiB - 16, 64)}), cudaSuccess);
  EXPECT_EQ(counters().violations_race, 1u);
  const std::string text = last_violation();
  EXPECT_TRUE(contains(text, "race: gpumemSimLaunchWork on stream")) << text;
  EXPECT_TRUE(contains(text, "reads [" + hex(c + MiB - 16))) << text;
  EXPECT_TRUE(contains(text, "writes [" + hex(c))) << text;
  EXPECT_TRUE(contains(text, "no event, wait or synchronisation orders the two")) << text;
  reset_violations();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // Kept: an event orders them; two readers; disjoint bytes; the host saw the first end.
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(launch_work(a_, {writes(c, MiB)}), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, a_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b_, e, 0), cudaSuccess);
  ASSERT_EQ(launch_work(b_, {writes(c, MiB)}), cudaSuccess);
  ASSERT_EQ(launch_work(a_, {reads(c + MiB, MiB)}), cudaSuccess);
  ASSERT_EQ(launch_work(b_, {reads(c + MiB, MiB)}), cudaSuccess);
  ASSERT_EQ(launch_work(a_, {writes(c + 3 * MiB, 16)}), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(b_), cudaSuccess);
  ASSERT_EQ(launch_work(a_, {writes(c + MiB, MiB)}), cudaSuccess);
  EXPECT_EQ(violations(), 0u) << last_violation();
  // The order an event gave is the work before its record, not after.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, a_), cudaSuccess);
  ASSERT_EQ(launch_work(a_, {writes(c, 16)}), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b_, e, 0), cudaSuccess);
  ASSERT_EQ(launch_work(b_, {reads(c, 16)}), cudaSuccess);
  EXPECT_EQ(counters().violations_race, 1u);
  reset_violations();
  EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

TEST_F(CudaSimRules, OnePageMappedAtTwoAddressesRacesThroughEither) {
  // gpumem's stitch policy maps a free physical page at a second address: work through the two
  // addresses touches the same bytes, and must be ordered as if it used one address.
  vmm_memory m(0, 2 * MiB, {0});
  CUdeviceptr second = 0;
  ASSERT_EQ(cuMemAddressReserve(&second, 2 * MiB, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemMap(second, 2 * MiB, 0, m.handle, 0), CUDA_SUCCESS);
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = 0;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(cuMemSetAccess(second, 2 * MiB, &desc, 1), CUDA_SUCCESS);
  char* first = static_cast<char*>(m.ptr());
  char* other = static_cast<char*>(as_pointer(second));

  ASSERT_EQ(launch_work(a_, {writes(first + MiB, 4096)}), cudaSuccess);
  ASSERT_EQ(launch_work(b_, {reads(other + MiB + 1024, 16)}), cudaSuccess);
  EXPECT_EQ(counters().violations_race, 1u);
  const std::string text = last_violation();
  EXPECT_TRUE(contains(text, "reads [" + hex(other + MiB + 1024))) << text;
  EXPECT_TRUE(contains(text, "writes [" + hex(first + MiB))) << text;
  EXPECT_TRUE(contains(text, "the same physical memory")) << text;
  reset_violations();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // Kept: ordered by an event (what stitch's cudaStreamWaitEvent does); other bytes of the page.
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(launch_work(a_, {writes(first, MiB)}), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, a_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b_, e, 0), cudaSuccess);
  ASSERT_EQ(launch_work(b_, {writes(other, MiB)}), cudaSuccess);
  ASSERT_EQ(launch_work(a_, {writes(first + MiB, 64)}), cudaSuccess);
  EXPECT_EQ(violations(), 0u) << last_violation();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
  EXPECT_EQ(cuMemUnmap(second, 2 * MiB), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAddressFree(second, 2 * MiB), CUDA_SUCCESS);
}

TEST_F(CudaSimRules, TheLegacyStreamOrdersBlockingStreamsOnly) {
  cudaStream_t blocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, MiB), cudaSuccess);
  ASSERT_EQ(launch_work(blocking, {writes(p, MiB)}), cudaSuccess);
  ASSERT_EQ(launch_work(nullptr, {writes(p, MiB)}), cudaSuccess);   // waits for `blocking`
  ASSERT_EQ(launch_work(blocking, {writes(p, MiB)}), cudaSuccess);  // waits for the legacy one
  EXPECT_EQ(violations(), 0u) << last_violation();
  ASSERT_EQ(launch_work(a_, {writes(p, MiB)}), cudaSuccess);  // a non-blocking stream does not
  EXPECT_EQ(counters().violations_race, 1u);
  reset_violations();
  EXPECT_EQ(cudaStreamDestroy(blocking), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

TEST_F(CudaSimRules, CopiesAndFillsSynchroniseTheHostAsCudaDocuments) {
  std::vector<char> host(4096);
  {
    // cudaMemset of device memory is asynchronous to the host.
    vmm_memory m(0, 2 * MiB, {0});
    ASSERT_EQ(cudaMemset(m.ptr(), 0, MiB), cudaSuccess);
    EXPECT_EQ(m.unmap(), CUDA_SUCCESS);
    EXPECT_EQ(counters().violations_in_flight, 1u);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // else later unmaps report it again
    reset_violations();
  }
  {
    // A copy to host memory returns once it has completed (and the legacy stream before it).
    vmm_memory m(0, 2 * MiB, {0});
    ASSERT_EQ(cudaMemset(m.ptr(), 0, MiB), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(host.data(), m.ptr(), host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(m.unmap(), CUDA_SUCCESS);
    EXPECT_EQ(violations(), 0u) << last_violation();
  }
  {
    // From pageable memory: the stream is synchronised before the copy, not after it.
    vmm_memory m(0, 2 * MiB, {0});
    ASSERT_EQ(cudaMemcpy(m.ptr(), host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(m.unmap(), CUDA_SUCCESS);
    EXPECT_EQ(counters().violations_in_flight, 1u);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // else later unmaps report it again
    reset_violations();
  }
  {
    // cudaMemcpyAsync to pageable memory returns once the copy has completed...
    vmm_memory m(0, 2 * MiB, {0});
    ASSERT_EQ(cudaMemcpyAsync(host.data(), m.ptr(), host.size(), cudaMemcpyDeviceToHost, a_),
              cudaSuccess);
    EXPECT_EQ(m.unmap(), CUDA_SUCCESS);
    EXPECT_EQ(violations(), 0u) << last_violation();
  }
  {
    // ...to pinned memory it does not.
    void* pinned = nullptr;
    ASSERT_EQ(cudaMallocHost(&pinned, 4096), cudaSuccess);
    vmm_memory m(0, 2 * MiB, {0});
    ASSERT_EQ(cudaMemcpyAsync(pinned, m.ptr(), 4096, cudaMemcpyDeviceToHost, a_), cudaSuccess);
    EXPECT_EQ(m.unmap(), CUDA_SUCCESS);
    EXPECT_EQ(counters().violations_in_flight, 1u);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // else later unmaps report it again
    reset_violations();
    ASSERT_EQ(cudaFreeHost(pinned), cudaSuccess);
  }
  {
    // Device to device: no host synchronisation at all.
    vmm_memory m(0, 2 * MiB, {0});
    ASSERT_EQ(cudaMemcpy(m.ptr(), static_cast<char*>(m.ptr()) + MiB, MiB, cudaMemcpyDeviceToDevice),
              cudaSuccess);
    EXPECT_EQ(m.unmap(), CUDA_SUCCESS);
    EXPECT_EQ(counters().violations_in_flight, 1u);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // else later unmaps report it again
    reset_violations();
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST_F(CudaSimRules, KernelLaunchesAreWorkThatTouchesNothingKnown) {
  const gpumemSimCounters before = counters();
  const void* kernel = reinterpret_cast<const void*>(&reset_violations);  // any non-null address
  EXPECT_EQ(cudaLaunchKernel(kernel, dim3(1), dim3(32), nullptr, 0, a_), cudaSuccess);
  EXPECT_EQ(cudaLaunchKernel(nullptr, dim3(1), dim3(32), nullptr, 0, a_),
            cudaErrorInvalidDeviceFunction);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDeviceFunction);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(2);
  config.blockDim = dim3(64);
  config.stream = b_;
  EXPECT_EQ(cudaLaunchKernelExC(&config, kernel, nullptr), cudaSuccess);
  const auto function = reinterpret_cast<CUfunction>(const_cast<void*>(kernel));
  EXPECT_EQ(cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, a_, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuLaunchKernel(nullptr, 1, 1, 1, 32, 1, 1, 0, a_, nullptr, nullptr),
            CUDA_ERROR_INVALID_HANDLE);
  // What launch configuration code asks (CUB's, in PyTorch's cumsum and nonzero).
  cudaFuncAttributes attr{};
  ASSERT_EQ(cudaFuncGetAttributes(&attr, kernel), cudaSuccess);
  EXPECT_EQ(attr.maxThreadsPerBlock, 1024);
  EXPECT_GT(attr.numRegs, 0);
  int blocks = 0;
  ASSERT_EQ(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, 256, 0), cudaSuccess);
  EXPECT_EQ(blocks, 8);
  EXPECT_EQ(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536),
            cudaSuccess);
  EXPECT_EQ(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, 0, 0),
            cudaErrorInvalidValue);
  (void)cudaGetLastError();
  const gpumemSimCounters after = counters();
  EXPECT_EQ(after.kernel_launches - before.kernel_launches, 3u);
  EXPECT_EQ(after.pending_works, 0u);  // nothing known is touched: nothing to remember
  EXPECT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
}

TEST_F(CudaSimRules, LaunchWorkChecksItsArguments) {
  const auto launch = sim_function<gpumemSimLaunchWork_t>(GPUMEM_SIM_LAUNCH_WORK_NAME);
  ASSERT_NE(launch, nullptr);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, MiB), cudaSuccess);
  const gpumemSimRange ok_range{p, MiB, GPUMEM_SIM_READ_WRITE};
  const gpumemSimRange bad_access{p, MiB, 4};
  EXPECT_EQ(launch(a_, nullptr, 0, 0.0), cudaSuccess);
  EXPECT_EQ(launch(a_, &ok_range, 1, 0.0), cudaSuccess);
  EXPECT_EQ(launch(a_, nullptr, 1, 0.0), cudaErrorInvalidValue);
  EXPECT_EQ(launch(a_, &bad_access, 1, 0.0), cudaErrorInvalidValue);
  EXPECT_EQ(launch(a_, &ok_range, 1, -1.0), cudaErrorInvalidValue);
  EXPECT_EQ(launch(a_, &ok_range, 1, std::numeric_limits<double>::infinity()),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch(reinterpret_cast<CUstream>(std::uintptr_t{0x1234}), &ok_range, 1, 0.0),
            cudaErrorInvalidResourceHandle);
  EXPECT_EQ(violations(), 0u);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

TEST_F(CudaSimRules, TheLastViolationIsCutToTheBuffer) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, MiB), cudaSuccess);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(p, 0, 16, a_), cudaSuccess);  // checked too: freed memory
  const auto get = sim_function<gpumemSimGetLastViolation_t>(GPUMEM_SIM_GET_LAST_VIOLATION_NAME);
  ASSERT_NE(get, nullptr);
  char small[8] = {'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x'};
  const std::size_t n = get(small, sizeof small);
  EXPECT_GT(n, sizeof small);
  EXPECT_STREQ(small, "unmappe");
  EXPECT_EQ(get(nullptr, 0), n);
  // Counting is not resetting: gpumemSimResetCounters keeps violations.
  const auto reset = sim_function<gpumemSimResetCounters_t>(GPUMEM_SIM_RESET_COUNTERS_NAME);
  ASSERT_NE(reset, nullptr);
  ASSERT_EQ(reset(), 0);
  EXPECT_EQ(violations(), 1u);
  reset_violations();
  EXPECT_EQ(get(small, sizeof small), 0u);
  EXPECT_STREQ(small, "");
}

// ---------------------------------------------------------------------------------------------
// GPUMEM_CUDASIM_TEST=time: GPUMEM_SIM_KERNEL_TIME=1000, GPUMEM_SIM_BANDWIDTH=1e9 (a kernel lasts
// longer than any test runs: what a query sees never depends on how fast the machine is)
// ---------------------------------------------------------------------------------------------

class CudaSimTime : public ::testing::Test {
 protected:
  void SetUp() override {
    GPUMEM_REQUIRE_SIM_MODE("time");
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    reset_violations();
    ASSERT_EQ(cudaStreamCreateWithFlags(&a_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&b_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&start_), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&end_), cudaSuccess);
  }
  void TearDown() override {
    if (IsSkipped()) return;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaEventDestroy(start_), cudaSuccess);
    EXPECT_EQ(cudaEventDestroy(end_), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(a_), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(b_), cudaSuccess);
    EXPECT_EQ(violations(), 0u) << last_violation();
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }

  // Milliseconds between start_ and end_, once both completed.
  float elapsed_ms() {
    EXPECT_EQ(cudaEventSynchronize(end_), cudaSuccess);
    float ms = -1;
    EXPECT_EQ(cudaEventElapsedTime(&ms, start_, end_), cudaSuccess);
    return ms;
  }

  cudaStream_t a_ = nullptr;
  cudaStream_t b_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t end_ = nullptr;
};

// Once a stream's work ends after the host clock, its later work starts exactly when the work
// before it ends: elapsed times between such events do not depend on the wall clock.
void launch_kernel(cudaStream_t s) {
  const void* kernel = reinterpret_cast<const void*>(&reset_violations);  // any non-null address
  ASSERT_EQ(cudaLaunchKernel(kernel, dim3(1), dim3(1), nullptr, 0, s), cudaSuccess);
}

TEST_F(CudaSimTime, AKernelTakesTheKernelTimeAndWaitingDoesNotSleep) {
  const auto wall = std::chrono::steady_clock::now();
  const unsigned long long clock_before = counters().host_clock_ns;
  ASSERT_EQ(cudaEventRecord(start_, a_), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(start_), cudaSuccess);  // nothing before it
  launch_kernel(a_);
  EXPECT_EQ(cudaStreamQuery(a_), cudaErrorNotReady);
  ASSERT_EQ(cudaEventRecord(start_, a_), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(start_), cudaErrorNotReady);
  launch_kernel(a_);
  ASSERT_EQ(cudaEventRecord(end_, a_), cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start_, end_), cudaErrorNotReady);
  EXPECT_FLOAT_EQ(elapsed_ms(), 1000.0f * 1000.0f);
  EXPECT_EQ(cudaStreamQuery(a_), cudaSuccess);
  // The host clock jumped over both kernels; the wall clock did not wait for them.
  EXPECT_GE(counters().host_clock_ns - clock_before, 2000ull * 1000 * 1000 * 1000);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count(), 60.0);
}

TEST_F(CudaSimTime, CopiesAndFillsTakeBytesOverTheBandwidth) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 2 * GiB), cudaSuccess);
  launch_kernel(a_);
  ASSERT_EQ(cudaEventRecord(start_, a_), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(p, 0, GiB, a_), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(static_cast<char*>(p) + GiB, p, GiB, cudaMemcpyDeviceToDevice, a_),
            cudaSuccess);
  ASSERT_EQ(cudaEventRecord(end_, a_), cudaSuccess);
  EXPECT_NEAR(elapsed_ms(), 2.0 * static_cast<double>(GiB) / 1e9 * 1000.0, 1.0);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

TEST_F(CudaSimTime, WorkStartsAfterWhatItWaitsFor) {
  // Stream b waits for a's work; its own work then ends its duration later.
  cudaEvent_t mid = nullptr;
  ASSERT_EQ(cudaEventCreate(&mid), cudaSuccess);
  launch_kernel(a_);
  ASSERT_EQ(cudaEventRecord(start_, a_), cudaSuccess);
  ASSERT_EQ(launch_work(a_, {}, 30.0), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(mid, a_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b_, mid, 0), cudaSuccess);
  ASSERT_EQ(launch_work(b_, {}, 12.5), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(end_, b_), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(b_), cudaErrorNotReady);
  EXPECT_NEAR(elapsed_ms(), 42500.0, 1.0);
  // Synchronising b waited for a's work too: the host knows both ended.
  EXPECT_EQ(cudaEventQuery(mid), cudaSuccess);
  launch_kernel(a_);
  EXPECT_EQ(cudaStreamQuery(a_), cudaErrorNotReady);
  EXPECT_EQ(cudaEventDestroy(mid), cudaSuccess);
}

TEST_F(CudaSimTime, UnmappingUnderRunningWorkFaultsTheDevice) {
  vmm_memory m(0, 2 * MiB, {0});
  ASSERT_EQ(launch_work(a_, {reads(m.ptr(), 2 * MiB)}, 100.0), cudaSuccess);
  EXPECT_EQ(m.unmap(), CUDA_SUCCESS);  // the work is still running: the GPU would fault
  const gpumemSimCounters c = counters();
  EXPECT_EQ(c.violations_in_flight, 1u);
  EXPECT_EQ(c.faulted_devices, 1u);
  EXPECT_EQ(cudaStreamSynchronize(a_), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  reset_violations();
}

// ---------------------------------------------------------------------------------------------
// GPUMEM_CUDASIM_TEST=strict: GPUMEM_SIM_STRICT=abort
// ---------------------------------------------------------------------------------------------

TEST(CudaSimStrict, AViolationAbortsTheProcess) {
  GPUMEM_REQUIRE_SIM_MODE("strict");
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, MiB), cudaSuccess);
  ASSERT_EQ(launch_work(nullptr, {writes(p, MiB)}), cudaSuccess);  // not a violation
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_DEATH((void)launch_work(nullptr, {writes(p, MiB)}),
               "cudasim violation: unmapped memory.*GPUMEM_SIM_STRICT=abort: aborting");
  EXPECT_EQ(violations(), 0u);  // the violation happened in the child process
}

// ---------------------------------------------------------------------------------------------
// GPUMEM_CUDASIM_TEST=bad_devices: GPUMEM_SIM_DEVICES=0
// ---------------------------------------------------------------------------------------------

TEST(CudaSimBadDevices, IsReportedAndEveryCallFails) {
  GPUMEM_REQUIRE_SIM_MODE("bad_devices");
  ::testing::internal::CaptureStderr();
  int count = 5;
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaErrorInitializationError);
  EXPECT_EQ(cuInit(0), CUDA_ERROR_NOT_INITIALIZED);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(err, "GPUMEM_SIM_DEVICES=\"0\": from 1 to 64 devices")) << err;
}

// ---------------------------------------------------------------------------------------------
// GPUMEM_CUDASIM_TEST=gpumem: gpumem's own CUDA code under the rules. Work on each block is
// simulated with gpumemSimLaunchWork; the allocators must keep every rule: no violation at all.
// Run twice: with work that takes no time ("gpumem"), and with work that outlasts the test
// ("gpumem_slow", GPUMEM_CUDASIM_WORK_SECONDS=100 and a slow bus), so that no event completes
// unless the host waits for it.
// ---------------------------------------------------------------------------------------------

double work_seconds() {
  const char* v = std::getenv("GPUMEM_CUDASIM_WORK_SECONDS");
  return v != nullptr ? std::strtod(v, nullptr) : 0.0;
}

class CudaSimGpumem : public ::testing::Test {
 protected:
  void SetUp() override {
    if (mode() != "gpumem_slow") GPUMEM_REQUIRE_SIM_MODE("gpumem");
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    reset_violations();
  }
  void TearDown() override {
    if (IsSkipped()) return;
    EXPECT_EQ(violations(), 0u) << last_violation();
    EXPECT_EQ(counters().bytes_in_use, 0u);
  }
};

gpumem::allocator_config policy(const char* name) {
  gpumem::allocator_config c;
  c.policy = std::string(name) == "classic"      ? gpumem::allocator_policy::classic
             : std::string(name) == "expandable" ? gpumem::allocator_policy::expandable
                                                 : gpumem::allocator_policy::stitch;
  return c;
}

// A training-step-like pattern: blocks used on their own stream and on a side stream
// (record_stream), freed while the work is queued, reused, and the cache emptied between steps.
template <class Device>
void run_steps(Device& device, const char* name) {
  SCOPED_TRACE(name);
  gpumem::caching_allocator<Device> alloc(device, policy(name));
  cudaStream_t main = device.create_stream();
  cudaStream_t side = device.create_stream();
  for (int step = 0; step < 4; ++step) {
    std::vector<void*> blocks;
    for (std::size_t size : {std::size_t{512}, 3 * MiB, 25 * MiB, 7 * MiB, 64 * MiB}) {
      void* p = alloc.allocate(size, main);
      ASSERT_EQ(launch_work(main, {writes(p, size)}, work_seconds()), cudaSuccess);
      blocks.push_back(p);
    }
    // The side stream reads two blocks after the main stream wrote them.
    cudaEvent_t e = nullptr;
    ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(e, main), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(side, e, 0), cudaSuccess);
    ASSERT_EQ(
        launch_work(side, {reads(blocks[2], 25 * MiB), reads(blocks[4], 64 * MiB)}, work_seconds()),
        cudaSuccess);
    alloc.record_stream(blocks[2], side);
    alloc.record_stream(blocks[4], side);
    ASSERT_EQ(cudaEventDestroy(e), cudaSuccess);
    for (void* p : blocks) alloc.deallocate(p);
    // Reuse at once, on the main stream, with new work.
    for (std::size_t size : {25 * MiB, 64 * MiB, 9 * MiB}) {
      void* p = alloc.allocate(size, main);
      ASSERT_EQ(launch_work(main, {writes(p, size)}, work_seconds()), cudaSuccess);
      alloc.deallocate(p);
    }
    if (step % 2 == 1) alloc.empty_cache();
  }
  alloc.empty_cache();
  device.destroy_stream(main);
  device.destroy_stream(side);
}

TEST_F(CudaSimGpumem, CachingAllocatorOnCudaDevice) {
  gpumem::cuda_device device(0);
  run_steps(device, "classic");
}

TEST_F(CudaSimGpumem, CachingAllocatorOnCudaVmmDevice) {
  gpumem::cuda_vmm_device device(0);
  for (const char* name : {"classic", "expandable", "stitch"}) run_steps(device, name);
}

TEST_F(CudaSimGpumem, AForgottenRecordStreamIsARace) {
  // The control: the same allocator, used wrongly (the side stream's use is not recorded), is
  // caught, so the tests above can fail.
  gpumem::cuda_vmm_device device(0);
  gpumem::caching_allocator<gpumem::cuda_vmm_device> alloc(device, policy("expandable"));
  cudaStream_t main = device.create_stream();
  cudaStream_t side = device.create_stream();
  void* p = alloc.allocate(8 * MiB, main);
  ASSERT_EQ(launch_work(side, {reads(p, 8 * MiB)}), cudaSuccess);
  alloc.deallocate(p);
  void* q = alloc.allocate(8 * MiB, main);
  ASSERT_EQ(q, p);
  ASSERT_EQ(launch_work(main, {writes(q, 8 * MiB)}), cudaSuccess);
  EXPECT_EQ(counters().violations_race, 1u);
  reset_violations();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // or empty_cache unmaps under the read
  alloc.deallocate(q);
  alloc.empty_cache();
  device.destroy_stream(main);
  device.destroy_stream(side);
}

TEST_F(CudaSimGpumem, PinnedPoolReusesBlocksOnlyAfterTheirCopies) {
  gpumem::cuda_host_device host(0);
  gpumem::allocator_config config;
  gpumem::pinned_pool<gpumem::cuda_host_device> pool(host, config);
  const cudaStream_t upload = host.gpu().create_stream();
  const cudaStream_t download = host.gpu().create_stream();
  void* device_buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&device_buffer, 4 * MiB), cudaSuccess);
  cudaEvent_t uploaded = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&uploaded, cudaEventDisableTiming), cudaSuccess);
  for (int round = 0; round < 6; ++round) {
    // Upload from a pinned block, give it back at once (recorded), then download into the next
    // block the pool hands out: reusing the first block before its upload is known complete
    // would be a race on the pinned memory.
    void* src = pool.allocate(4 * MiB);
    ASSERT_EQ(cudaMemcpyAsync(device_buffer, src, 4 * MiB, cudaMemcpyHostToDevice, upload),
              cudaSuccess);
    ASSERT_EQ(cudaEventRecord(uploaded, upload), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(download, uploaded, 0), cudaSuccess);  // the device buffer
    pool.record_event(src, upload);
    pool.deallocate(src);
    void* dst = pool.allocate(4 * MiB);
    ASSERT_EQ(cudaMemcpyAsync(dst, device_buffer, 4 * MiB, cudaMemcpyDeviceToHost, download),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(download), cudaSuccess);
    pool.record_event(dst, download);
    pool.deallocate(dst);
  }
  pool.empty_cache();
  ASSERT_EQ(cudaEventDestroy(uploaded), cudaSuccess);
  ASSERT_EQ(cudaFree(device_buffer), cudaSuccess);
  host.gpu().destroy_stream(upload);
  host.gpu().destroy_stream(download);
}

}  // namespace

#else  // !GPUMEM_TEST_CUDASIM

TEST(CudaSimRules, NotBuilt) {
  GTEST_SKIP() << "the CUDA simulator is built with the tools (GPUMEM_BUILD_TOOLS=ON)";
}

#endif
