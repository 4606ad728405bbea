// Several simulated devices (GPUMEM_SIM_DEVICES): each with its own memory, address range,
// primary context, streams and events; the current device per thread; peer access for cudaMalloc
// memory and cuMemSetAccess for VMM memory; peer copies; address space as large as a GPU's.
//
// ctest runs it with GPUMEM_CUDASIM_TEST=multidevice, GPUMEM_SIM_DEVICES=4 and 80 GiB devices
// (label multidevice; work takes no time). Everything skips elsewhere.
#include <gtest/gtest.h>

#ifdef GPUMEM_TEST_CUDASIM

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cudasim_support.hpp"

namespace {

using namespace cudasim_test;  // NOLINT: the tests' helpers

constexpr int devices = 4;

class CudaSimMultiDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    GPUMEM_REQUIRE_SIM_MODE("multidevice");
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    reset_violations();
  }
  void TearDown() override {
    if (IsSkipped()) return;
    for (int d = 0; d < devices; ++d) {
      EXPECT_EQ(cudaSetDevice(d), cudaSuccess);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const gpumemSimCounters c = counters(d);
      EXPECT_EQ(c.bytes_in_use, 0u) << "device " << d << " leaked memory";
      EXPECT_EQ(c.live_reservations, 0u) << "device " << d;
      EXPECT_EQ(c.live_streams, 0u) << "device " << d;
    }
    EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
    EXPECT_EQ(violations(), 0u) << last_violation();
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a test left an error behind";
  }
};

CUcontext primary(int d) {
  CUcontext ctx = nullptr;
  EXPECT_EQ(cuDevicePrimaryCtxRetain(&ctx, d), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(d), CUDA_SUCCESS);
  return ctx;
}

TEST_F(CudaSimMultiDevice, DevicesAndTheCurrentDevicePerThread) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, devices);
  ASSERT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
  EXPECT_EQ(count, devices);
  CUdevice dev = -1;
  ASSERT_EQ(cuDeviceGet(&dev, 3), CUDA_SUCCESS);
  EXPECT_EQ(dev, 3);
  EXPECT_EQ(cuDeviceGet(&dev, devices), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cudaSetDevice(devices), cudaErrorInvalidDevice);
  (void)cudaGetLastError();

  ASSERT_EQ(cudaSetDevice(2), cudaSuccess);
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 2);
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
  EXPECT_EQ(ctx, primary(2));  // the runtime's device is the current context's
  EXPECT_NE(primary(2), primary(1));
  ASSERT_EQ(cuCtxGetDevice(&dev), CUDA_SUCCESS);
  EXPECT_EQ(dev, 2);
  // Another thread starts on device 0.
  std::thread([] {
    int d = -1;
    ASSERT_EQ(cudaGetDevice(&d), cudaSuccess);
    EXPECT_EQ(d, 0);
  }).join();
  // The driver's context stack moves the runtime too.
  ASSERT_EQ(cuCtxPushCurrent(primary(1)), CUDA_SUCCESS);
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 1);
  CUcontext popped = nullptr;
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  EXPECT_EQ(popped, primary(1));
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 2);
  ASSERT_EQ(cuCtxSetCurrent(primary(3)), CUDA_SUCCESS);
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 3);
  EXPECT_EQ(cuCtxSetCurrent(reinterpret_cast<CUcontext>(std::uintptr_t{0x1234})),
            CUDA_ERROR_INVALID_CONTEXT);

  // The devices differ in their PCI bus id and UUID only.
  cudaDeviceProp p0{};
  cudaDeviceProp p1{};
  ASSERT_EQ(cudaGetDeviceProperties(&p0, 0), cudaSuccess);
  ASSERT_EQ(cudaGetDeviceProperties(&p1, 1), cudaSuccess);
  EXPECT_NE(p0.pciBusID, p1.pciBusID);
  EXPECT_NE(std::string(p0.uuid.bytes, 16), std::string(p1.uuid.bytes, 16));
  EXPECT_EQ(p0.totalGlobalMem, p1.totalGlobalMem);
  int can = -1;
  ASSERT_EQ(cudaDeviceCanAccessPeer(&can, 0, 1), cudaSuccess);
  EXPECT_EQ(can, 1);
  ASSERT_EQ(cudaDeviceCanAccessPeer(&can, 1, 1), cudaSuccess);
  EXPECT_EQ(can, 0);
  ASSERT_EQ(cuDeviceCanAccessPeer(&can, 3, 2), CUDA_SUCCESS);
  EXPECT_EQ(can, 1);
}

TEST_F(CudaSimMultiDevice, EachDeviceHasItsOwnMemoryAtItsOwnAddresses) {
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
  std::vector<void*> blocks;
  for (int d = 0; d < devices; ++d) {
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    void* p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, (d + 1) * GiB), cudaSuccess);
    blocks.push_back(p);
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    ranges.emplace_back(a, a + (d + 1) * GiB);
    std::size_t free_bytes = 0;
    std::size_t total = 0;
    ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
    EXPECT_EQ(total, 80 * GiB);
    EXPECT_EQ(total - free_bytes, (d + 1) * GiB) << "device " << d;
    EXPECT_EQ(counters(d).bytes_in_use, (d + 1) * GiB);
    ASSERT_EQ(cuMemGetInfo(&free_bytes, &total), CUDA_SUCCESS);
    EXPECT_EQ(total - free_bytes, (d + 1) * GiB) << "device " << d;
  }
  EXPECT_EQ(counters().bytes_in_use, 10 * GiB);
  EXPECT_EQ(counters().devices, static_cast<unsigned long long>(devices));
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i - 1].second, ranges[i].first) << "addresses of two devices overlap";
  }
  for (int d = 0; d < devices; ++d) {
    cudaPointerAttributes a{};
    ASSERT_EQ(cudaPointerGetAttributes(&a, blocks[static_cast<std::size_t>(d)]), cudaSuccess);
    EXPECT_EQ(a.type, cudaMemoryTypeDevice);
    EXPECT_EQ(a.device, d);
  }
  // Any device's memory can be freed from any current device.
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  for (void* p : blocks) EXPECT_EQ(cudaFree(p), cudaSuccess);
}

TEST_F(CudaSimMultiDevice, ReservationsAreAsLargeAsAGpusAddressSpace) {
  // PyTorch's expandable segments reserve 9/8 of the device per stream and pool: ten streams on
  // an 80 GiB device reserve 900 GiB.
  CUdeviceptr va[10] = {};
  const std::size_t size = 90 * GiB;
  for (CUdeviceptr& v : va) ASSERT_EQ(cuMemAddressReserve(&v, size, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(counters(0).live_reservations, 10u);
  for (CUdeviceptr v : va) EXPECT_EQ(cuMemAddressFree(v, size), CUDA_SUCCESS);
  // A range of 1 TiB: more than a dozen devices' memory (and within what sanitizers leave).
  CUdeviceptr huge = 0;
  ASSERT_EQ(cuMemAddressReserve(&huge, 1024 * GiB, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAddressFree(huge, 1024 * GiB), CUDA_SUCCESS);
}

TEST_F(CudaSimMultiDevice, StreamsAndEventsBelongToTheirDevice) {
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t s1 = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e1 = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming), cudaSuccess);
  void* p1 = nullptr;
  ASSERT_EQ(cudaMalloc(&p1, MiB), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s0 = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e0 = nullptr;
  ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
  int device = -1;
  ASSERT_EQ(cudaStreamGetDevice(s1, &device), cudaSuccess);
  EXPECT_EQ(device, 1);

  // Recording an event on another device's stream, launching work on a stream of another device
  // than the current one: invalid handles, as CUDA answers.
  EXPECT_EQ(cudaEventRecord(e0, s1), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(launch_work(s1, {writes(p1, MiB)}), cudaErrorInvalidResourceHandle);
  const void* kernel = reinterpret_cast<const void*>(&reset_violations);
  EXPECT_EQ(cudaLaunchKernel(kernel, dim3(1), dim3(1), nullptr, 0, s1),
            cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
  cudaEvent_t e0b = nullptr;
  ASSERT_EQ(cudaEventCreate(&e0b), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaEvent_t e1t = nullptr;
  ASSERT_EQ(cudaEventCreate(&e1t), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e1t, s1), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e0, s0), cudaSuccess);
  float ms = 0;
  EXPECT_EQ(cudaEventElapsedTime(&ms, e0, e1t), cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();

  // Waiting for another device's event is how devices are ordered; synchronising one device
  // does not tell the host about another's work.
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(launch_work(s1, {writes(p1, MiB)}), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e1, s1), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(s0, e1, 0), cudaSuccess);
  void* p0 = nullptr;
  ASSERT_EQ(cudaMalloc(&p0, MiB), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(p0, p1, MiB, cudaMemcpyDeviceToDevice, s0), cudaSuccess);
  EXPECT_EQ(violations(), 0u) << last_violation();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // device 0 only
  {
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    vmm_memory m(1, 2 * MiB, {1});
    ASSERT_EQ(launch_work(s1, {writes(m.ptr(), MiB)}), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(m.unmap(), CUDA_SUCCESS);
    EXPECT_EQ(counters().violations_in_flight, 1u);
    reset_violations();
  }
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s1), cudaSuccess);  // any device's stream, from any device
  EXPECT_EQ(cudaEventDestroy(e1), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(e1t), cudaSuccess);
  EXPECT_EQ(cudaFree(p1), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s0), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(e0), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(e0b), cudaSuccess);
  EXPECT_EQ(cudaFree(p0), cudaSuccess);
}

TEST_F(CudaSimMultiDevice, PeerAccessToCudaMallocMemory) {
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  void* p1 = nullptr;
  ASSERT_EQ(cudaMalloc(&p1, MiB), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  // Without peer access, a kernel of device 0 cannot touch device 1's memory.
  ASSERT_EQ(launch_work(nullptr, {reads(p1, MiB)}), cudaSuccess);
  EXPECT_EQ(counters().violations_inaccessible, 1u);
  EXPECT_NE(last_violation().find("device 0 has no peer access to it"), std::string::npos)
      << last_violation();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
  (void)cudaGetLastError();
  reset_violations();

  EXPECT_EQ(cudaDeviceDisablePeerAccess(1), cudaErrorPeerAccessNotEnabled);
  EXPECT_EQ(cudaDeviceEnablePeerAccess(0, 0), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaDeviceEnablePeerAccess(1, 1), cudaErrorInvalidValue);
  ASSERT_EQ(cudaDeviceEnablePeerAccess(1, 0), cudaSuccess);
  EXPECT_EQ(cudaDeviceEnablePeerAccess(1, 0), cudaErrorPeerAccessAlreadyEnabled);
  (void)cudaGetLastError();
  ASSERT_EQ(launch_work(nullptr, {reads(p1, MiB)}), cudaSuccess);
  EXPECT_EQ(violations(), 0u) << last_violation();
  // It is one way: device 1 still cannot touch device 0's memory.
  void* p0 = nullptr;
  ASSERT_EQ(cudaMalloc(&p0, MiB), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(launch_work(nullptr, {reads(p0, MiB)}), cudaSuccess);
  EXPECT_EQ(counters().violations_inaccessible, 1u);
  reset_violations();
  // The driver's calls do the same, per context.
  ASSERT_EQ(cuCtxEnablePeerAccess(primary(0), 0), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxEnablePeerAccess(primary(0), 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  ASSERT_EQ(launch_work(nullptr, {reads(p0, MiB)}), cudaSuccess);
  EXPECT_EQ(violations(), 0u) << last_violation();
  ASSERT_EQ(cuCtxDisablePeerAccess(primary(0)), CUDA_SUCCESS);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaDeviceDisablePeerAccess(1), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaFree(p0), cudaSuccess);
  EXPECT_EQ(cudaFree(p1), cudaSuccess);
}

TEST_F(CudaSimMultiDevice, VmmMemoryIsAccessibleFromTheDevicesGrantedAccess) {
  ASSERT_EQ(cudaSetDevice(2), cudaSuccess);
  vmm_memory m(2, 4 * MiB, {2});
  ASSERT_EQ(cudaSetDevice(3), cudaSuccess);
  // Peer access does not apply to VMM memory...
  ASSERT_EQ(cudaDeviceEnablePeerAccess(2, 0), cudaSuccess);
  ASSERT_EQ(launch_work(nullptr, {writes(m.ptr(), MiB)}), cudaSuccess);
  EXPECT_EQ(counters().violations_inaccessible, 1u);
  EXPECT_NE(last_violation().find("without cuMemSetAccess for device 3"), std::string::npos)
      << last_violation();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
  (void)cudaGetLastError();
  reset_violations();
  // ...cuMemSetAccess with the device as the location does.
  ASSERT_EQ(m.grant(3), CUDA_SUCCESS);
  ASSERT_EQ(launch_work(nullptr, {writes(m.ptr(), 4 * MiB)}), cudaSuccess);
  EXPECT_EQ(violations(), 0u) << last_violation();
  EXPECT_EQ(m.grant(devices), CUDA_ERROR_INVALID_DEVICE);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaDeviceDisablePeerAccess(2), cudaSuccess);
  // Memory of one device mapped in a range reserved on another is not simulated.
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemMap(va, 2 * MiB, 0, m.handle, 0), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(cuMemAddressFree(va, 2 * MiB), CUDA_SUCCESS);
  ASSERT_EQ(cudaSetDevice(2), cudaSuccess);
}

TEST_F(CudaSimMultiDevice, PeerCopies) {
  void* p0 = nullptr;
  void* p2 = nullptr;
  ASSERT_EQ(cudaSetDevice(2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&p2, MiB), cudaSuccess);
  cudaStream_t s2 = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&p0, MiB), cudaSuccess);
  cudaStream_t s0 = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking), cudaSuccess);
  const gpumemSimCounters before = counters();
  // No peer access is needed for copies.
  ASSERT_EQ(cudaMemcpyPeerAsync(p2, 2, p0, 0, MiB, s0), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyPeer(p0, 0, p2, 2, MiB), cudaSuccess);
  EXPECT_EQ(counters().memcpy_peer_calls - before.memcpy_peer_calls, 2u);
  EXPECT_EQ(cudaMemcpyPeerAsync(p2, 1, p0, 0, MiB, s0), cudaErrorInvalidValue);  // not device 1's
  EXPECT_EQ(cudaMemcpyPeerAsync(p2, 9, p0, 0, MiB, s0), cudaErrorInvalidDevice);
  (void)cudaGetLastError();
  EXPECT_EQ(violations(), 0u) << last_violation();
  // A copy into device 2's memory and device 2's own work on it, unordered: a race.
  ASSERT_EQ(cudaMemcpyPeerAsync(p2, 2, p0, 0, MiB, s0), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(2), cudaSuccess);
  ASSERT_EQ(launch_work(s2, {reads(p2, 4096)}), cudaSuccess);
  EXPECT_EQ(counters().violations_race, 1u);
  reset_violations();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s2), cudaSuccess);
  EXPECT_EQ(cudaFree(p2), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s0), cudaSuccess);
  EXPECT_EQ(cudaFree(p0), cudaSuccess);
}

}  // namespace

#else  // !GPUMEM_TEST_CUDASIM

TEST(CudaSimMultiDevice, NotBuilt) {
  GTEST_SKIP() << "the CUDA simulator is built with the tools (GPUMEM_BUILD_TOOLS=ON)";
}

#endif
