// The CUDA simulator (tools/cudasim): a program linked against the toolkit's real libcudart and
// driver stub, run on the simulated libcudart.so.13 / libcuda.so.1 through LD_LIBRARY_PATH.
//
// ctest runs this executable several times under the simulator (label cudasim), once per set of
// GPUMEM_SIM_* settings, which are read once per process: GPUMEM_CUDASIM_TEST names the set
// ("api", "faults", "random", "bad_setting") and selects the tests written for it; every other
// test skips with a message. Run alone (as the per-test entries gtest discovers), everything
// skips.
#include <gtest/gtest.h>

#ifdef GPUMEM_TEST_CUDASIM

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gpumem/device/simulated_device.hpp"
#include "gpumem_cudasim.h"

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

std::string mode() {
  const char* m = std::getenv("GPUMEM_CUDASIM_TEST");
  return m != nullptr ? m : "";
}

#define GPUMEM_REQUIRE_SIM_MODE(m)                                                          \
  do {                                                                                      \
    if (mode() != (m)) {                                                                    \
      GTEST_SKIP() << "runs on the CUDA simulator with GPUMEM_CUDASIM_TEST=" << (m)         \
                   << " (ctest -L cudasim sets it, with LD_LIBRARY_PATH and GPUMEM_SIM_*)"; \
    }                                                                                       \
  } while (false)

// The simulator's own functions: found only when the simulated libcuda.so.1 is loaded.
gpumemSimGetCounters_t counters_function() {
  return reinterpret_cast<gpumemSimGetCounters_t>(
      ::dlsym(RTLD_DEFAULT, GPUMEM_SIM_GET_COUNTERS_NAME));
}

gpumemSimCounters counters() {
  gpumemSimCounters c{};
  const gpumemSimGetCounters_t get = counters_function();
  EXPECT_NE(get, nullptr);
  if (get != nullptr) {
    EXPECT_EQ(get(&c, sizeof c), 0);
  }
  return c;
}

void reset_counters() {
  const auto reset = reinterpret_cast<gpumemSimResetCounters_t>(
      ::dlsym(RTLD_DEFAULT, GPUMEM_SIM_RESET_COUNTERS_NAME));
  ASSERT_NE(reset, nullptr);
  ASSERT_EQ(reset(), 0);
}

std::size_t env_size(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? gpumem::parse_size(v) : 0;
}

double env_seconds(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::strtod(v, nullptr) : 0.0;
}

std::uintptr_t address(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

// ---------------------------------------------------------------------------------------------
// GPUMEM_CUDASIM_TEST=api: GPUMEM_SIM_MEMORY, GPUMEM_SIM_EVENT_DELAY and GPUMEM_SIM_LOG are set
// ---------------------------------------------------------------------------------------------

class CudaSim : public ::testing::Test {
 protected:
  void SetUp() override {
    GPUMEM_REQUIRE_SIM_MODE("api");
    ASSERT_NE(counters_function(), nullptr)
        << "gpumemSimGetCounters not found: the program is not running on the simulator";
    memory_ = env_size("GPUMEM_SIM_MEMORY");
    delay_ = env_seconds("GPUMEM_SIM_EVENT_DELAY");
    ASSERT_GT(memory_, 0u) << "GPUMEM_SIM_MEMORY must be set for this test";
    ASSERT_GT(delay_, 0.0) << "GPUMEM_SIM_EVENT_DELAY must be set for this test";
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    (void)cudaGetLastError();
  }
  void TearDown() override {
    if (IsSkipped()) return;
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a test left an error behind";
    const gpumemSimCounters c = counters();
    EXPECT_EQ(c.live_segments, 0u) << "a test leaked device memory";
    EXPECT_EQ(c.bytes_in_use, 0u);
  }

  std::size_t memory_ = 0;
  double delay_ = 0;
};

TEST_F(CudaSim, RunsOnTheSimulatorWithTheConfiguredMemory) {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  EXPECT_EQ(total_bytes, memory_);  // exactly GPUMEM_SIM_MEMORY: no real GPU has that much
  EXPECT_EQ(free_bytes, memory_);
  EXPECT_EQ(counters().total_memory, memory_);

  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_EQ(prop.totalGlobalMem, memory_);
  EXPECT_NE(std::string(prop.name).find("gpumem simulated GPU"), std::string::npos) << prop.name;
  EXPECT_EQ(prop.major, 9);
  EXPECT_EQ(prop.warpSize, 32);
  EXPECT_EQ(prop.unifiedAddressing, 1);
  EXPECT_EQ(cudaGetDeviceProperties(&prop, 1), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetDeviceProperties(nullptr, 0), cudaErrorInvalidValue);
  (void)cudaGetLastError();

  int version = 0;
  ASSERT_EQ(cudaRuntimeGetVersion(&version), cudaSuccess);
  EXPECT_EQ(version, CUDART_VERSION);
  ASSERT_EQ(cudaDriverGetVersion(&version), cudaSuccess);
  EXPECT_EQ(version, CUDA_VERSION);
}

TEST_F(CudaSim, DevicesAndAttributes) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 1);
  int device = -1;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, 0);
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaSetDevice(1), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);

  int value = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&value, cudaDevAttrWarpSize, 0), cudaSuccess);
  EXPECT_EQ(value, 32);
  ASSERT_EQ(cudaDeviceGetAttribute(&value, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  EXPECT_EQ(value, 9);
  ASSERT_EQ(cudaDeviceGetAttribute(&value, cudaDevAttrMemoryPoolsSupported, 0), cudaSuccess);
  EXPECT_EQ(value, 0);  // cudaMallocAsync is not simulated
  EXPECT_EQ(cudaDeviceGetAttribute(&value, static_cast<cudaDeviceAttr>(200), 0),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaDeviceGetAttribute(&value, cudaDevAttrWarpSize, 3), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);

  int can = 1;
  ASSERT_EQ(cudaDeviceCanAccessPeer(&can, 0, 0), cudaSuccess);
  EXPECT_EQ(can, 0);
  EXPECT_EQ(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync), cudaSuccess);
  unsigned flags = 0;
  ASSERT_EQ(cudaGetDeviceFlags(&flags), cudaSuccess);
  EXPECT_EQ(flags, static_cast<unsigned>(cudaDeviceScheduleBlockingSync));
  EXPECT_EQ(cudaInitDevice(0, 0, 0), cudaSuccess);
}

TEST_F(CudaSim, MallocAndFreeAreCounted) {
  reset_counters();
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 3 * MiB), cudaSuccess);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(address(p) % 512, 0u);
  gpumemSimCounters c = counters();
  EXPECT_EQ(c.calls.malloc, 1u);
  EXPECT_EQ(c.bytes_in_use, 4 * MiB);  // rounded up to 2 MiB pages
  EXPECT_EQ(c.live_segments, 1u);

  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  EXPECT_EQ(free_bytes, memory_ - 4 * MiB);

  cudaPointerAttributes attributes;
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, p), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attributes.device, 0);

  ASSERT_EQ(cudaFree(p), cudaSuccess);
  c = counters();
  EXPECT_EQ(c.calls.free, 1u);
  EXPECT_EQ(c.calls.mem_get_info, 1u);
  EXPECT_EQ(c.peak_bytes_in_use, 4 * MiB);

  void* zero = &free_bytes;
  EXPECT_EQ(cudaMalloc(&zero, 0), cudaSuccess);
  EXPECT_EQ(zero, nullptr);
  EXPECT_EQ(cudaFree(nullptr), cudaSuccess);
  EXPECT_EQ(cudaMalloc(nullptr, MiB), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

TEST_F(CudaSim, FreeOfAnUnknownPointerFailsAndTheErrorIsSticky) {
  int local = 0;
  EXPECT_EQ(cudaFree(&local), cudaErrorInvalidValue);
  // Sticky: a successful call leaves the last error; cudaPeekAtLastError keeps it too.
  int count = 0;
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);

  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, MiB), cudaSuccess);
  EXPECT_EQ(cudaFree(static_cast<char*>(p) + 512), cudaErrorInvalidValue);  // inside a segment
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue);  // twice
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);

  // The last error belongs to the thread that made the call.
  std::thread([] {
    EXPECT_EQ(cudaFree(reinterpret_cast<void*>(0x10)), cudaErrorInvalidValue);
  }).join();
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
}

TEST_F(CudaSim, OutOfMemoryBeyondTheConfiguredMemory) {
  reset_counters();
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, memory_ + 2 * MiB), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(counters().out_of_memory, 1u);

  void* most = nullptr;
  ASSERT_EQ(cudaMalloc(&most, memory_ - 8 * MiB), cudaSuccess);
  void* more = nullptr;
  EXPECT_EQ(cudaMalloc(&more, 10 * MiB), cudaErrorMemoryAllocation);
  ASSERT_EQ(cudaMalloc(&more, 8 * MiB), cudaSuccess);  // exactly what is left
  std::size_t free_bytes = 1;
  std::size_t total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  EXPECT_EQ(free_bytes, 0u);
  EXPECT_EQ(cudaFree(more), cudaSuccess);
  EXPECT_EQ(cudaFree(most), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(counters().out_of_memory, 2u);
}

TEST_F(CudaSim, Streams) {
  cudaStream_t a = nullptr;
  cudaStream_t b = nullptr;
  cudaStream_t c = nullptr;
  ASSERT_EQ(cudaStreamCreate(&a), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithPriority(&c, cudaStreamDefault, -100), cudaSuccess);
  EXPECT_NE(a, nullptr);
  EXPECT_NE(a, b);
  EXPECT_EQ(counters().live_streams, 3u);

  unsigned flags = 7;
  ASSERT_EQ(cudaStreamGetFlags(b, &flags), cudaSuccess);
  EXPECT_EQ(flags, static_cast<unsigned>(cudaStreamNonBlocking));
  int least = 1;
  int greatest = 1;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  EXPECT_EQ(least, 0);
  EXPECT_LT(greatest, 0);
  int priority = 0;
  ASSERT_EQ(cudaStreamGetPriority(c, &priority), cudaSuccess);
  EXPECT_EQ(priority, greatest);  // clamped, as CUDA does
  unsigned long long id_a = 0;
  unsigned long long id_b = 0;
  ASSERT_EQ(cudaStreamGetId(a, &id_a), cudaSuccess);
  ASSERT_EQ(cudaStreamGetId(b, &id_b), cudaSuccess);
  EXPECT_NE(id_a, id_b);
  int device = -1;
  ASSERT_EQ(cudaStreamGetDevice(a, &device), cudaSuccess);
  EXPECT_EQ(device, 0);
  cudaStream_t bad = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&bad, 0x40), cudaErrorInvalidValue);

  for (cudaStream_t s :
       {a, b, static_cast<cudaStream_t>(nullptr), cudaStreamLegacy, cudaStreamPerThread}) {
    EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
    EXPECT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusNone);
    status = cudaStreamCaptureStatusActive;
    unsigned long long capture_id = 7;
    EXPECT_EQ(cudaStreamGetCaptureInfo(s, &status, &capture_id), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  }
  cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeRelaxed;
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&capture_mode), cudaSuccess);
  EXPECT_EQ(capture_mode, cudaStreamCaptureModeGlobal);
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&capture_mode), cudaSuccess);
  EXPECT_EQ(capture_mode, cudaStreamCaptureModeRelaxed);

  EXPECT_EQ(cudaStreamDestroy(a), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(a), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamQuery(a), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamSynchronize(a), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamDestroy(nullptr), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamDestroy(b), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(c), cudaSuccess);
  EXPECT_EQ(counters().live_streams, 0u);
}

TEST_F(CudaSim, EventsCompleteAfterTheConfiguredDelay) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t start = nullptr;
  cudaEvent_t end = nullptr;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&end, cudaEventBlockingSync), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(start), cudaSuccess);  // never recorded: complete

  const auto recorded = std::chrono::steady_clock::now();
  ASSERT_EQ(cudaEventRecord(start, s), cudaSuccess);
  // Before completion: "not ready", which is not an error (the last error stays clear).
  EXPECT_EQ(cudaEventQuery(start), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(end, s), cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, end), cudaErrorNotReady);

  // Once the delay has passed on the wall clock, both are complete.
  std::this_thread::sleep_until(recorded + std::chrono::duration<double>(delay_ + 0.05));
  EXPECT_EQ(cudaEventQuery(start), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(end), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, end), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  EXPECT_LT(ms, 1000.0f);

  // Waiting does not sleep: it completes the work at once.
  const auto before = std::chrono::steady_clock::now();
  ASSERT_EQ(cudaEventRecord(start, s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(start), cudaErrorNotReady);
  EXPECT_EQ(cudaEventSynchronize(start), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(start), cudaSuccess);
  ASSERT_EQ(cudaEventRecordWithFlags(end, s, cudaEventRecordExternal), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(end), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(end, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(end), cudaSuccess);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count(),
            delay_);

  // Another stream waits for an event.
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreate(&other), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(start, s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(other, start, 0), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(other), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamSynchronize(other), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(start), cudaSuccess);
  EXPECT_EQ(counters().stream_wait_event, 1u);

  EXPECT_EQ(cudaEventDestroy(start), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(end), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(other), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(counters().live_events, 0u);
}

TEST_F(CudaSim, EventErrors) {
  cudaEvent_t untimed = nullptr;
  cudaEvent_t timed = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&timed), cudaSuccess);
  float ms = 0;
  EXPECT_EQ(cudaEventElapsedTime(&ms, timed, timed), cudaErrorInvalidResourceHandle);  // unrecorded
  ASSERT_EQ(cudaEventRecord(untimed, nullptr), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(timed, nullptr), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(untimed), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, untimed, timed), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventElapsedTime(nullptr, timed, timed), cudaErrorInvalidValue);

  cudaEvent_t bad = nullptr;
  EXPECT_EQ(cudaEventCreateWithFlags(&bad, cudaEventInterprocess), cudaErrorInvalidValue);
  EXPECT_EQ(cudaEventCreateWithFlags(&bad, 0x100), cudaErrorInvalidValue);
  EXPECT_EQ(cudaEventRecordWithFlags(timed, nullptr, 0x10), cudaErrorInvalidValue);
  cudaStream_t gone = nullptr;
  ASSERT_EQ(cudaStreamCreate(&gone), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(gone), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(timed, gone), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamWaitEvent(nullptr, reinterpret_cast<cudaEvent_t>(0x1234), 0),
            cudaErrorInvalidResourceHandle);

  EXPECT_EQ(cudaEventDestroy(untimed), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(untimed), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventQuery(untimed), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventSynchronize(untimed), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventRecord(untimed, nullptr), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventDestroy(timed), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
}

TEST_F(CudaSim, PinnedAndRegisteredHostMemoryIsRealMemory) {
  reset_counters();
  void* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, 3 * 4096 + 17, cudaHostAllocMapped), cudaSuccess);
  ASSERT_NE(pinned, nullptr);
  EXPECT_EQ(address(pinned) % 4096, 0u);
  std::memset(pinned, 0xab, 3 * 4096 + 17);  // real memory
  EXPECT_EQ(static_cast<unsigned char*>(pinned)[3 * 4096 + 16], 0xab);
  void* device_view = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(&device_view, static_cast<char*>(pinned) + 100, 0),
            cudaSuccess);
  EXPECT_EQ(device_view, static_cast<char*>(pinned) + 100);
  unsigned flags = 0;
  ASSERT_EQ(cudaHostGetFlags(&flags, pinned), cudaSuccess);
  EXPECT_EQ(flags, static_cast<unsigned>(cudaHostAllocMapped));
  cudaPointerAttributes attributes;
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, pinned), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);
  EXPECT_EQ(attributes.hostPointer, pinned);
  EXPECT_EQ(cudaFree(pinned), cudaErrorInvalidValue);  // not device memory
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);

  void* simple = nullptr;
  ASSERT_EQ(cudaMallocHost(&simple, 100), cudaSuccess);
  EXPECT_EQ(counters().host_bytes, 3 * 4096 + 17 + 100u);
  EXPECT_EQ(cudaFreeHost(simple), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaErrorInvalidValue);  // twice
  EXPECT_EQ(cudaFreeHost(nullptr), cudaSuccess);
  EXPECT_EQ(cudaHostAlloc(&simple, 64, 0x80), cudaErrorInvalidValue);

  std::vector<char> buffer(1 << 16);
  ASSERT_EQ(cudaHostRegister(buffer.data(), buffer.size(), cudaHostRegisterDefault), cudaSuccess);
  EXPECT_EQ(cudaHostRegister(buffer.data() + 4096, 4096, 0), cudaErrorHostMemoryAlreadyRegistered);
  ASSERT_EQ(cudaHostGetDevicePointer(&device_view, buffer.data() + 5, 0), cudaSuccess);
  EXPECT_EQ(device_view, buffer.data() + 5);
  int local = 0;
  EXPECT_EQ(cudaPointerGetAttributes(&attributes, &local), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeUnregistered);
  EXPECT_EQ(cudaHostGetDevicePointer(&device_view, &local, 0), cudaErrorInvalidValue);
  EXPECT_EQ(cudaHostUnregister(buffer.data() + 8), cudaErrorHostMemoryNotRegistered);
  EXPECT_EQ(cudaHostUnregister(buffer.data()), cudaSuccess);
  EXPECT_EQ(cudaHostUnregister(buffer.data()), cudaErrorHostMemoryNotRegistered);
  EXPECT_EQ(cudaHostRegister(nullptr, 64, 0), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);

  const gpumemSimCounters c = counters();
  EXPECT_EQ(c.host_alloc, 2u);
  EXPECT_EQ(c.host_free, 2u);
  EXPECT_EQ(c.host_register, 1u);
  EXPECT_EQ(c.host_unregister, 1u);
  EXPECT_EQ(c.host_bytes, 0u);
}

TEST_F(CudaSim, CopiesTouchOnlyHostMemory) {
  reset_counters();
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, MiB), cudaSuccess);
  std::vector<unsigned char> src(4096, 7);
  std::vector<unsigned char> dst(4096, 1);
  ASSERT_EQ(cudaMemcpy(dst.data(), src.data(), 4096, cudaMemcpyHostToHost), cudaSuccess);
  EXPECT_EQ(dst[4095], 7);
  ASSERT_EQ(cudaMemcpy(d, src.data(), 4096, cudaMemcpyHostToDevice), cudaSuccess);
  std::fill(dst.begin(), dst.end(), 1);
  ASSERT_EQ(cudaMemcpy(dst.data(), d, 4096, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(dst[0], 1);  // device memory holds nothing: the copy is only counted
  ASSERT_EQ(cudaMemcpy(d, static_cast<char*>(d) + 4096, 4096, cudaMemcpyDefault), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d, src.data(), 100, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, MiB), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d, 0, 10, s), cudaSuccess);

  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 64), cudaSuccess);
  ASSERT_EQ(cudaMemset(pinned, 0x5a, 64), cudaSuccess);  // pinned host memory is really set
  EXPECT_EQ(static_cast<unsigned char*>(pinned)[63], 0x5a);
  EXPECT_EQ(cudaMemset(pinned, 0, 65), cudaErrorInvalidValue);      // past its end
  EXPECT_EQ(cudaMemset(dst.data(), 0, 16), cudaErrorInvalidValue);  // pageable memory
  EXPECT_EQ(cudaMemcpy(dst.data(), src.data(), 16, static_cast<cudaMemcpyKind>(7)),
            cudaErrorInvalidMemcpyDirection);
  EXPECT_EQ(cudaMemcpy(nullptr, src.data(), 16, cudaMemcpyHostToHost), cudaErrorInvalidValue);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(d, src.data(), 100, cudaMemcpyHostToDevice, s),
            cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaMemsetAsync(d, 0, 10, s), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);

  const gpumemSimCounters c = counters();
  EXPECT_EQ(c.memcpy_calls, 5u);  // the failed calls are not counted
  EXPECT_EQ(c.memcpy_device_calls, 4u);
  EXPECT_EQ(c.memcpy_bytes, 4 * 4096 + 100u);
  EXPECT_EQ(c.memset_calls, 3u);
  EXPECT_EQ(c.memset_bytes, MiB + 10 + 64);
  ASSERT_EQ(cudaFreeHost(pinned), cudaSuccess);
  ASSERT_EQ(cudaFree(d), cudaSuccess);
}

TEST_F(CudaSim, ErrorNamesAndStrings) {
  EXPECT_STREQ(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
  EXPECT_STREQ(cudaGetErrorString(cudaSuccess), "no error");
  EXPECT_STREQ(cudaGetErrorName(cudaErrorNotSupported), "cudaErrorNotSupported");
  EXPECT_STREQ(cudaGetErrorString(static_cast<cudaError_t>(1000)), "unrecognized error code");

  const char* text = nullptr;
  ASSERT_EQ(cuGetErrorName(CUDA_ERROR_INVALID_HANDLE, &text), CUDA_SUCCESS);
  EXPECT_STREQ(text, "CUDA_ERROR_INVALID_HANDLE");
  ASSERT_EQ(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &text), CUDA_SUCCESS);
  EXPECT_STREQ(text, "out of memory");
  EXPECT_EQ(cuGetErrorString(static_cast<CUresult>(1000), &text), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(text, nullptr);
}

TEST_F(CudaSim, UnimplementedCallsReturnNotSupportedAndAreReportedOnce) {
  reset_counters();
  ::testing::internal::CaptureStderr();
  void* p = nullptr;
  EXPECT_EQ(cudaMallocAsync(&p, 1024, nullptr), cudaErrorNotSupported);
  EXPECT_EQ(cudaMallocAsync(&p, 1024, nullptr), cudaErrorNotSupported);
  EXPECT_EQ(cudaGetLastError(), cudaErrorNotSupported);
  CUstream stream = nullptr;
  EXPECT_EQ(cuStreamCreate(&stream, 0), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(cuStreamCreate(&stream, 0), CUDA_ERROR_NOT_SUPPORTED);
  const std::string err = ::testing::internal::GetCapturedStderr();
  const auto occurrences = [&](const std::string& what) {
    std::size_t n = 0;
    for (auto at = err.find(what); at != std::string::npos; at = err.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(occurrences("cudaMallocAsync is not implemented"), 1u) << err;
  EXPECT_EQ(occurrences("cuStreamCreate is not implemented"), 1u) << err;
  EXPECT_EQ(counters().unimplemented, 4u);
}

// ---------------------------------------------------------------------------------------------
// The driver API
// ---------------------------------------------------------------------------------------------

TEST_F(CudaSim, DriverDevicesAndContexts) {
  ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  EXPECT_EQ(cuInit(1), CUDA_ERROR_INVALID_VALUE);
  int version = 0;
  ASSERT_EQ(cuDriverGetVersion(&version), CUDA_SUCCESS);
  EXPECT_EQ(version, CUDA_VERSION);
  int count = 0;
  ASSERT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
  EXPECT_EQ(count, 1);
  CUdevice dev = -1;
  ASSERT_EQ(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  EXPECT_EQ(dev, 0);
  EXPECT_EQ(cuDeviceGet(&dev, 1), CUDA_ERROR_INVALID_DEVICE);
  char name[256] = {};
  ASSERT_EQ(cuDeviceGetName(name, sizeof name, 0), CUDA_SUCCESS);
  EXPECT_NE(std::string(name).find("gpumem simulated GPU"), std::string::npos) << name;
  char short_name[7] = {};
  ASSERT_EQ(cuDeviceGetName(short_name, sizeof short_name, 0), CUDA_SUCCESS);
  EXPECT_STREQ(short_name, "gpumem");
  std::size_t total = 0;
  ASSERT_EQ(cuDeviceTotalMem(&total, 0), CUDA_SUCCESS);
  EXPECT_EQ(total, memory_);
  int value = 0;
  ASSERT_EQ(
      cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
      CUDA_SUCCESS);
  EXPECT_EQ(value, 1);
  ASSERT_EQ(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0),
            CUDA_SUCCESS);
  EXPECT_GT(value, 0);
  EXPECT_EQ(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MAX, 0), CUDA_ERROR_INVALID_VALUE);

  // The runtime made the primary context current on this thread; a new thread has none.
  CUcontext current = nullptr;
  ASSERT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_NE(current, nullptr);
  std::thread([&] {
    CUcontext none = reinterpret_cast<CUcontext>(0x1);
    ASSERT_EQ(cuCtxGetCurrent(&none), CUDA_SUCCESS);
    EXPECT_EQ(none, nullptr);
    std::size_t f = 0;
    std::size_t t = 0;
    EXPECT_EQ(cuMemGetInfo(&f, &t), CUDA_ERROR_INVALID_CONTEXT);
    CUcontext primary = nullptr;
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
    EXPECT_EQ(primary, current);
    unsigned flags = 1;
    int active = 0;
    ASSERT_EQ(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
    EXPECT_EQ(active, 1);
    ASSERT_EQ(cuCtxSetCurrent(primary), CUDA_SUCCESS);
    ASSERT_EQ(cuMemGetInfo(&f, &t), CUDA_SUCCESS);
    EXPECT_EQ(t, memory_);
    CUdevice ctx_dev = -1;
    ASSERT_EQ(cuCtxGetDevice(&ctx_dev), CUDA_SUCCESS);
    EXPECT_EQ(ctx_dev, 0);
    EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT_EQ(cuCtxSetCurrent(reinterpret_cast<CUcontext>(0x1234)), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  }).join();
}

TEST_F(CudaSim, DriverMemAllocAndFree) {
  ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc(&p, 5 * MiB), CUDA_SUCCESS);
  EXPECT_NE(p, 0u);
  EXPECT_EQ(counters().bytes_in_use, 6 * MiB);
  EXPECT_EQ(cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
  void* runtime_view = reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
  EXPECT_EQ(cuMemFree(p + 512), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cudaFree(runtime_view), cudaSuccess);  // one device behind both APIs
  EXPECT_EQ(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr huge = 0;
  EXPECT_EQ(cuMemAlloc(&huge, memory_ + 2 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
}

TEST_F(CudaSim, DriverVirtualMemoryManagement) {
  ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  reset_counters();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;  // as PyTorch asks
  std::size_t g = 0;
  ASSERT_EQ(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_SUCCESS);
  EXPECT_EQ(g, 2 * MiB);
  ASSERT_EQ(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
            CUDA_SUCCESS);
  EXPECT_EQ(g, 2 * MiB);

  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemAddressReserve(&va, 8 * g, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(va % g, 0u);
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(cuMemCreate(&h, 2 * g, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(counters().bytes_in_use, 2 * g);
  ASSERT_EQ(cuMemMap(va, 2 * g, 0, h, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemMap(va + 4 * g, g, 0, h, 0), CUDA_SUCCESS);              // the same pages, twice
  EXPECT_EQ(cuMemMap(va + 6 * g, g, g, h, 0), CUDA_ERROR_INVALID_VALUE);  // offset must be 0
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(cuMemSetAccess(va, 2 * g, &access, 1), CUDA_SUCCESS);
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  ASSERT_EQ(cuMemGetInfo(&free_bytes, &total_bytes), CUDA_SUCCESS);
  EXPECT_EQ(total_bytes, memory_);
  EXPECT_EQ(free_bytes, memory_ - 2 * g);

  // Misuse is rejected as the driver rejects it, and changes nothing.
  EXPECT_EQ(cuMemMap(va, g, 0, h, 0), CUDA_ERROR_INVALID_VALUE);              // already mapped
  EXPECT_EQ(cuMemMap(va + 6 * g, g / 2, 0, h, 0), CUDA_ERROR_INVALID_VALUE);  // not granular
  EXPECT_EQ(cuMemMap(va + 7 * g, 2 * g, 0, h, 0), CUDA_ERROR_INVALID_VALUE);  // past the end
  EXPECT_EQ(cuMemMap(va + 6 * g, g, 0, 999, 0), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuMemUnmap(va, g), CUDA_ERROR_INVALID_VALUE);            // part of a mapping
  EXPECT_EQ(cuMemAddressFree(va, 8 * g), CUDA_ERROR_INVALID_VALUE);  // still mapped
  CUmemAllocationProp other = prop;
  other.location.id = 1;
  CUmemGenericAllocationHandle h2 = 0;
  EXPECT_EQ(cuMemCreate(&h2, g, &other, 0), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cuMemCreate(&h2, g + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemCreate(&h2, memory_ + g, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);

  gpumemSimCounters c = counters();
  EXPECT_EQ(c.calls.address_reserve, 1u);
  EXPECT_EQ(c.calls.mem_create, 2u);
  EXPECT_EQ(c.calls.mem_map, 2u);
  EXPECT_EQ(c.calls.set_access, 1u);
  EXPECT_EQ(c.live_mappings, 2u);

  ASSERT_EQ(cuMemRelease(h), CUDA_SUCCESS);  // still mapped: freed with the last mapping
  EXPECT_EQ(cuMemRelease(h), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(counters().bytes_in_use, 2 * g);
  ASSERT_EQ(cuMemUnmap(va, 2 * g), CUDA_SUCCESS);
  ASSERT_EQ(cuMemUnmap(va + 4 * g, g), CUDA_SUCCESS);
  EXPECT_EQ(counters().bytes_in_use, 0u);
  ASSERT_EQ(cuMemAddressFree(va, 8 * g), CUDA_SUCCESS);
  c = counters();
  EXPECT_EQ(c.live_reservations, 0u);
  EXPECT_EQ(c.live_physical, 0u);
}

TEST_F(CudaSim, DriverEntryPoints) {
  ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  ASSERT_EQ(
      cuGetProcAddress("cuMemCreate", &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status),
      CUDA_SUCCESS);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  EXPECT_EQ(fn, reinterpret_cast<void*>(&cuMemCreate));

  // The version decides which variant: cuMemGetInfo is cuMemGetInfo_v2 from CUDA 3.2 on.
  ASSERT_EQ(cuGetProcAddress("cuMemGetInfo", &fn, 12000, 0, &status), CUDA_SUCCESS);
  std::size_t f = 0;
  std::size_t t = 0;
  ASSERT_EQ(reinterpret_cast<PFN_cuMemGetInfo_v3020>(fn)(&f, &t), CUDA_SUCCESS);
  EXPECT_EQ(t, memory_);
  void* sync12 = nullptr;
  void* sync13 = nullptr;
  ASSERT_EQ(cuGetProcAddress("cuCtxSynchronize", &sync12, 12000, 0, &status), CUDA_SUCCESS);
  ASSERT_EQ(cuGetProcAddress("cuCtxSynchronize", &sync13, 13000, 0, &status), CUDA_SUCCESS);
  EXPECT_NE(sync12, sync13);
  EXPECT_EQ(reinterpret_cast<PFN_cuCtxSynchronize_v13000>(sync13)(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuGetProcAddress("cuMemCreate", &fn, 9000, 0, &status), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(cuGetProcAddress("cuNoSuchFunction", &fn, CUDA_VERSION, 0, &status),
            CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(fn, nullptr);
  // An exported function the simulator does not implement: its stub.
  ASSERT_EQ(cuGetProcAddress("cuStreamCreate", &fn, CUDA_VERSION, 0, &status), CUDA_SUCCESS);
  ASSERT_NE(fn, nullptr);
  CUstream stream = nullptr;
  EXPECT_EQ(reinterpret_cast<PFN_cuStreamCreate_v2000>(fn)(&stream, 0), CUDA_ERROR_NOT_SUPPORTED);

  // The runtime hands out the same functions.
  cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
  ASSERT_EQ(cudaGetDriverEntryPointByVersion("cuMemMap", &fn, 12000, cudaEnableDefault, &query),
            cudaSuccess);
  EXPECT_EQ(query, cudaDriverEntryPointSuccess);
  EXPECT_EQ(fn, reinterpret_cast<void*>(&cuMemMap));
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  ASSERT_EQ(cudaGetDriverEntryPoint("cuMemAddressReserve", &fn, cudaEnableDefault, &query),
            cudaSuccess);
  EXPECT_EQ(fn, reinterpret_cast<void*>(&cuMemAddressReserve));
  // A symbol that does not exist is not an error for the runtime: a null function.
  ASSERT_EQ(cudaGetDriverEntryPoint("cuNoSuchFunction", &fn, cudaEnableDefault, &query),
            cudaSuccess);
#pragma GCC diagnostic pop
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(query, cudaDriverEntryPointSymbolNotFound);
  EXPECT_EQ(cudaGetDriverEntryPointByVersion(nullptr, &fn, 12000, 0, &query),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

TEST_F(CudaSim, TheLogRecordsCalls) {
  const char* path = std::getenv("GPUMEM_SIM_LOG");
  if (path == nullptr || std::string(path) == "stderr") GTEST_SKIP() << "GPUMEM_SIM_LOG is no file";
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 12345), cudaSuccess);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path;
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("cudaMalloc(&ptr, 12345) = cudaSuccess"), std::string::npos);
  const auto started = text.str().find("started: ");
  ASSERT_NE(started, std::string::npos);
  EXPECT_NE(text.str().find("GPUMEM_SIM_MEMORY=", started), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// GPUMEM_CUDASIM_TEST=faults: GPUMEM_SIM_FAIL_NTH=2, GPUMEM_SIM_FAIL_ABOVE=1GiB
// ---------------------------------------------------------------------------------------------

TEST(CudaSimFaults, TheNthCallAndCallsAboveASizeFail) {
  GPUMEM_REQUIRE_SIM_MODE("faults");
  ASSERT_EQ(std::getenv("GPUMEM_SIM_FAIL_NTH"), std::string("2"));
  ASSERT_EQ(env_size("GPUMEM_SIM_FAIL_ABOVE"), GiB);
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  ASSERT_EQ(cudaMalloc(&a, MiB), cudaSuccess);                    // fallible call 1
  EXPECT_EQ(cudaMalloc(&b, MiB), cudaErrorMemoryAllocation);      // 2: injected
  ASSERT_EQ(cudaMalloc(&c, MiB), cudaSuccess);                    // 3
  EXPECT_EQ(cudaMalloc(&b, 2 * GiB), cudaErrorMemoryAllocation);  // above 1 GiB
  ASSERT_EQ(cudaMalloc(&b, GiB), cudaSuccess);                    // not above
  const gpumemSimCounters counts = counters();
  EXPECT_EQ(counts.injected_faults, 2u);
  EXPECT_EQ(counts.out_of_memory, 0u);
  EXPECT_EQ(counts.calls.malloc, 5u);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  for (void* p : {a, b, c}) EXPECT_EQ(cudaFree(p), cudaSuccess);
}

// ---------------------------------------------------------------------------------------------
// GPUMEM_CUDASIM_TEST=random: GPUMEM_SIM_FAIL_PROBABILITY and GPUMEM_SIM_SEED
// ---------------------------------------------------------------------------------------------

TEST(CudaSimFaults, RandomFailuresFollowTheSeed) {
  GPUMEM_REQUIRE_SIM_MODE("random");
  const char* p = std::getenv("GPUMEM_SIM_FAIL_PROBABILITY");
  const char* seed = std::getenv("GPUMEM_SIM_SEED");
  ASSERT_NE(p, nullptr);
  ASSERT_NE(seed, nullptr);
  // The same faults as a simulated device built here with the same settings.
  gpumem::simulated_device::options o;
  o.capacity = 8 * GiB;
  o.faults.fail_probability = std::strtod(p, nullptr);
  o.faults.seed = std::strtoull(seed, nullptr, 10);
  gpumem::simulated_device reference(o);
  std::size_t failures = 0;
  for (int i = 0; i < 64; ++i) {
    void* expected = reference.allocate(MiB);
    void* q = nullptr;
    const cudaError_t e = cudaMalloc(&q, MiB);
    EXPECT_EQ(e == cudaSuccess, expected != nullptr) << "call " << i + 1;
    if (e == cudaSuccess) {
      EXPECT_EQ(cudaFree(q), cudaSuccess);
    }
    if (expected != nullptr) reference.deallocate(expected, MiB);
    failures += e == cudaSuccess ? 0 : 1;
  }
  EXPECT_GT(failures, 0u);
  EXPECT_LT(failures, 64u);
  EXPECT_EQ(counters().injected_faults, failures);
  (void)cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------
// GPUMEM_CUDASIM_TEST=bad_setting: GPUMEM_SIM_MEMORY is not a size
// ---------------------------------------------------------------------------------------------

TEST(CudaSimBadSetting, IsReportedOnceAndEveryCallFails) {
  GPUMEM_REQUIRE_SIM_MODE("bad_setting");
  const std::string value = std::getenv("GPUMEM_SIM_MEMORY");
  ::testing::internal::CaptureStderr();
  int count = 5;
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaErrorInitializationError);
  EXPECT_EQ(count, 0);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, MiB), cudaErrorInitializationError);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInitializationError);
  EXPECT_EQ(cuInit(0), CUDA_ERROR_NOT_INITIALIZED);
  std::size_t f = 0;
  std::size_t t = 0;
  EXPECT_EQ(cuMemGetInfo(&f, &t), CUDA_ERROR_NOT_INITIALIZED);
  gpumemSimCounters c{};
  ASSERT_NE(counters_function(), nullptr);
  EXPECT_EQ(counters_function()(&c, sizeof c), -1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("GPUMEM_SIM_MEMORY=\"" + value + "\""), std::string::npos) << err;
  EXPECT_EQ(err.find("cannot start"), err.rfind("cannot start")) << "reported more than once";
  // Functions that need no device still work.
  EXPECT_STREQ(cudaGetErrorName(cudaErrorInitializationError), "cudaErrorInitializationError");
  int version = 0;
  EXPECT_EQ(cudaRuntimeGetVersion(&version), cudaSuccess);
}

}  // namespace

#else  // !GPUMEM_TEST_CUDASIM

TEST(CudaSim, NotBuilt) {
  GTEST_SKIP() << "the CUDA simulator is built with the tools (GPUMEM_BUILD_TOOLS=ON)";
}

#endif
